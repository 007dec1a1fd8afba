// One decode step of a Llama-family model (one token, batch 1) in one persistent kernel.
//
// Why: a 1B-shape step through separate kernels leaves the memory pipe idle at every kernel's
// start and tail (its small matrices ran at 35-59% of the copy ceiling, docs/gpu.md). Here one
// block per SM runs every phase of every layer, separated by grid barriers.
//
// Per layer, five phases and (at most) five barriers:
//   A  RMSNorm (each block on its own copy of x) -> q/k/v GEMV -> RoPE; k, v into the cache
//   B  attention over the cache in chunks of ATT_T positions (online-softmax partials); the last
//      chunk of each KV head to finish merges them
//   C  output GEMV + residual
//   D  RMSNorm -> gate/up GEMV -> silu(gate) * up
//   E  down GEMV + residual
// then the final norm and the LM head (logits in bf16).
//
// Three grid barriers a layer, not five, and the rest of the layout measured on an H200 (docs/gpu.md;
// what was tried and dropped is listed there):
//   - no barrier between A and B: each block counts the q/k/v pairs it finished per KV head
//     (sync[2 + h]), and an attention item waits only for its own head's count. It loads the cache
//     rows older than this step before that wait.
//   - barriers as one release add and acquire loads.
//   - no merging block: every block merges all heads' chunk partials (bf16, normalised by their
//     chunk's sum: half the bytes) as it loads the output projection's input.
//   - each warp loads its first unit of the next GEMV into registers while a barrier waits, and each
//     RMSNorm's weights are loaded during the barrier before it, so that after the barrier a norm
//     waits only for its x.
//   - blocks start their merge loads and their atomic adds at different rows, so that 132 blocks do
//     not all ask the same L2 lines at once.
// Two variants follow the model's shape (megakernel.py says which shapes take them):
//   FUSED  D and E in one phase, with no barrier: a block's gate/up features feed its own slice of
//          the down projection's inner dimension (split-K over W2 transposed, contiguous per
//          feature), added into acc[layer % 2] with vector atomics. The next layer forms
//          x = resid + acc. fp32 atomics add in any order: the draft's last bits vary run to run
//          (a draft's numerics never reach the output).
//   WIDE   a merging thread takes 4 or 8 values of one head (one load a chunk) and up to MG chunks a
//          round; the lanes of a head load one chunk's (max, sum) each and share the chunks' weights
//          by shuffles. One round of loads up to 16 chunks (1024 positions), where the plain merge
//          takes one per 8. MG narrows where 16 would spill registers.
//
// Numerics: fp32 products, bf16 rounding where the torch layer rounds (linear outputs, norms,
// residual adds, silu); the softmax in fp32. Not bit-equal to the fused Triton kernels: it serves
// single-token steps of a *draft*, whose numerics never reach the output (the target decides).
//
// Compiled at run time by NVRTC, with the model's sizes as macros (D, H, HKV, HD, FF, NT, U, QKV_BIAS,
// O_BIAS, FUSED, WIDE and optionally MG). No headers: bf16 is handled as raw 16-bit patterns.

typedef unsigned short bf16;
typedef unsigned long long u64;

#define NW (NT / 32)
#define RED 4096                 // floats of per-unit sums one GEMV batch holds (and of its row sums)
#define G (H / HKV)
#define HALF (HD / 2)
#define XS (FF > D ? (FF > H * HD ? FF : H * HD) : (D > H * HD ? D : H * HD))
#define NEG_INF __int_as_float(0xff800000)
#define BARRIERS (4 - FUSED)     // grid barriers a layer
#define ACT_MAX 256              // FUSED: gate/up features a block may own (FF / grid)
#define ATT_T 64                 // cache positions per attention work item
#define WV (H * HD / NT >= 8 ? 8 : 4)  // WIDE: values of one head a merging thread takes (8 or 4 bf16: one load a chunk)
#define LPH (HD / WV)            // WIDE: lanes that share one head
#ifndef MG
#define MG (LPH < 16 ? LPH : 16) // WIDE: chunks merged per round of loads
#endif
static_assert(!WIDE || ((LPH & (LPH - 1)) == 0 && LPH <= 32 && MG <= LPH && (H * HD / WV) % 32 == 0),
              "WIDE does not take this head shape");

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }

struct alignas(16) U4 { unsigned x, y, z, w; };
struct alignas(16) F4 { float x, y, z, w; };

struct Layer {
  const bf16 *wqkv, *bqkv, *wo, *bo, *attn_norm, *ffn_norm, *w13, *w2, *w2t;  // w2t: [FF][D] (FUSED)
  bf16 *k_cache, *v_cache;
};

struct Params {
  const Layer* layers;
  const bf16 *embed, *final_norm, *lm_head, *cos, *sin;
  const long long *token, *pos;
  float *resid, *q, *part, *act, *acc;  // acc: [2][D] down-projection sums (FUSED)
  bf16 *logits, *hidden;
  u64* sync;   // [0] barrier arrivals, [1] launches finished, [2 + h] q/k/v pairs of KV head h done; all grow forever
  int* flag;   // set to 1 if a barrier gave up waiting (the step's results are then garbage)
  float eps;
  int n_layers, slots, vocab, max_chunks;
};

#ifdef PARAMS_SIZE  // the host's ctypes mirror of Params has this size: the layouts agree
static_assert(sizeof(Params) == PARAMS_SIZE, "megakernel.py's _Params does not match Params");
#endif

// -- small helpers -------------------------------------------------------------------------------
__device__ __forceinline__ float lo(unsigned u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float hi(unsigned u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ float b2f(bf16 h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ __forceinline__ bf16 f2b(float f) {  // round to nearest even, as torch does
  unsigned u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return (bf16)(u >> 16);
}
__device__ __forceinline__ float rb(float f) { return b2f(f2b(f)); }

// Weights never change: read-only path, not kept in L1.
__device__ __forceinline__ U4 ldw(const bf16* p) {
  U4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}
// Activations are rewritten every phase by other blocks: read them from L2 (L1 is not coherent).
__device__ __forceinline__ float ldcg(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ U4 ldcg4(const void* p) {
  U4 r;
  asm volatile("ld.global.cg.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p) : "memory");
  return r;
}
__device__ __forceinline__ F4 ldcg_f4(const float* p) {
  F4 r;
  asm volatile("ld.global.cg.v4.f32 {%0,%1,%2,%3}, [%4];"
               : "=f"(r.x), "=f"(r.y), "=f"(r.z), "=f"(r.w) : "l"(p) : "memory");
  return r;
}
__device__ __forceinline__ uint2 ldcg_u2(const void* p) {
  uint2 r;
  asm volatile("ld.global.cg.v2.u32 {%0,%1}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(p) : "memory");
  return r;
}
__device__ __forceinline__ u64 ld_acquire(const u64* p) {
  u64 v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Every thread gets the block's sum (added in a fixed order: deterministic).
__device__ float block_sum(float v, float* scratch) {
  v = warp_sum(v);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  float t = 0.f;
  for (int i = 0; i < NW; ++i) t += scratch[i];
  __syncthreads();
  return t;
}

__device__ __forceinline__ float dot8(U4 w, const float* x) {
  F4 a = *(const F4*)x, b = *(const F4*)(x + 4);
  float s = lo(w.x) * a.x;
  s = fmaf(hi(w.x), a.y, s); s = fmaf(lo(w.y), a.z, s); s = fmaf(hi(w.y), a.w, s);
  s = fmaf(lo(w.z), b.x, s); s = fmaf(hi(w.z), b.y, s); s = fmaf(lo(w.w), b.z, s);
  s = fmaf(hi(w.w), b.w, s);
  return s;
}

// [begin, end) of n items for block b of nb, balanced.
__device__ __forceinline__ int split(int n, int b, int nb) { return (int)((long long)n * b / nb); }

// Spin (thread 0) until *counter >= target; never hang: give up after a while and flag it.
__device__ void spin_until(const Params& p, const u64* counter, u64 target) {
  unsigned spins = 0;
  while (ld_acquire(counter) < target) {
    if (++spins > (1u << 22)) { atomicExch(p.flag, 1); break; }
  }
}

// Grid barrier in two halves: arrivals count up forever; barrier `target` waits for its total. Work that
// does not depend on the barrier (the next GEMV's first weights, the next norm's weights) goes between
// arrive and wait. arrive releases this block's writes (ordered before it by the block barrier).
__device__ void arrive(const Params& p) {
  __syncthreads();
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u64 [%0], 1;" :: "l"(p.sync) : "memory");
  }
}

__device__ void wait(const Params& p, u64 target) {
  if (threadIdx.x == 0) spin_until(p, p.sync, target);
  __syncthreads();
}

// -- GEMV ----------------------------------------------------------------------------------------
// out[r] = W[map(r), :] . xs for the block's logical rows r in [0, n); xs: K floats in shared memory.
// Work is cut in units of U chunks of one row (a chunk: 512 bytes, 16 per lane); warp w takes units
// w, w + NW, ... (balanced even when rows are few), loads the next unit before it sums this one,
// and reduces a unit once. Rows go in batches of RED / P; epi(b0, rows, row_sums) gets each batch.
template <int K, typename Map>
__device__ __forceinline__ void load_unit(U4* dst, const bf16* W, Map map, int b0, int unit) {
  constexpr int P = K / 256 / U;
  const bf16* src = W + (u64)map(b0 + unit / P) * K + (unit % P) * U * 256 + (threadIdx.x & 31) * 8;
#pragma unroll
  for (int v = 0; v < U; ++v) dst[v] = ldw(src + v * 256);
}

// While a barrier waits: each warp loads its first unit of the next GEMV (W, n rows through map)
// into registers, which the GEMV then starts from.
struct Early {
  bool ready;  // `first` holds this warp's first unit of the next GEMV (block-uniform)
  U4 first[U];
};

template <int K, typename Map>
__device__ __forceinline__ void gemv_early(Early& early, const bf16* W, int n, Map map) {
  constexpr int P = K / 256 / U;
  const int warp = threadIdx.x >> 5;
  early.ready = true;
  if (warp < imin(n, RED / P) * P) load_unit<K>(early.first, W, map, 0, warp);
}

template <int K>
__device__ __forceinline__ float unit_dot(const U4* w, const float* xs, int unit) {
  constexpr int P = K / 256 / U;
  const float* x = xs + (unit % P) * U * 256 + (threadIdx.x & 31) * 8;
  float acc = 0.f;
#pragma unroll
  for (int v = 0; v < U; ++v) acc += dot8(w[v], x + v * 256);
  return warp_sum(acc);
}

template <int K, typename Map, typename Epi>
__device__ void gemv(const bf16* __restrict__ W, const float* xs, int n, Map map, float* red, float* outs,
                     Early& early, Epi epi) {
  constexpr int P = K / 256 / U;
  constexpr int BATCH = RED / P;
  static_assert(K % (256 * U) == 0, "a row must be a whole number of units");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int b0 = 0; b0 < n; b0 += BATCH) {
    const int rows = imin(BATCH, n - b0), units = rows * P;
    const int mine = units > warp ? (units - warp + NW - 1) / NW : 0;  // this warp's units: warp + k NW
    U4 cur[U], nxt[U];
    if (b0 == 0 && early.ready) {
      if (mine > 0) {
#pragma unroll
        for (int v = 0; v < U; ++v) cur[v] = early.first[v];
      }
      early.ready = false;
    } else if (0 < mine) {
      load_unit<K>(cur, W, map, b0, warp);
    }
    for (int k = 0; k < mine; ++k) {
      const int u = warp + k * NW;
      if (k + 1 < mine) load_unit<K>(nxt, W, map, b0, u + NW);
      const float s = unit_dot<K>(cur, xs, u);
      if (lane == 0) red[u] = s;
#pragma unroll
      for (int v = 0; v < U; ++v) cur[v] = nxt[v];
    }
    __syncthreads();
    for (int r = threadIdx.x; r < rows; r += NT) {
      float t = 0.f;
#pragma unroll
      for (int e = 0; e < P; ++e) t += red[r * P + e];
      outs[r] = t;
    }
    __syncthreads();
    epi(b0, rows, outs);
    __syncthreads();
  }
}

// xs[i] = bf16(g[i] * bf16(x[i] * rstd)) for the D values of x (fp32 buffer or a bf16 row; with `add`,
// x = bf16(src + bf16(add)), the residual add of a FUSED down projection). All loads are issued
// before the first use: one memory latency, not D / NT of them.
#define NORM_PER ((D + NT - 1) / NT)
struct NormWeights { float w[NORM_PER]; };  // a thread's norm weights, loaded during the barrier before

__device__ __forceinline__ void norm_weights(NormWeights& nw, const bf16* g) {
#pragma unroll
  for (int t = 0; t < NORM_PER; ++t) {
    const int i = threadIdx.x + t * NT;
    nw.w[t] = i < D ? b2f(g[i]) : 0.f;
  }
}

__device__ __forceinline__ void load_normed(float* xs, const float* src, const bf16* src_b, const float* add,
                                            const bf16* g, float eps, float* scratch, const NormWeights& nw) {
  constexpr int PER = NORM_PER;
  float v[PER], w[PER], a[PER];
#pragma unroll
  for (int t = 0; t < PER; ++t) {
    const int i = threadIdx.x + t * NT;
    v[t] = 0.f;
    w[t] = nw.w[t];
    a[t] = 0.f;
    if (i < D) {
      v[t] = src ? ldcg(src + i) : b2f(src_b[i]);
      if (add) a[t] = ldcg(add + i);
    }
  }
  if (add) {
#pragma unroll
    for (int t = 0; t < PER; ++t) v[t] = rb(v[t] + rb(a[t]));
  }
  float ss = 0.f;
#pragma unroll
  for (int t = 0; t < PER; ++t) ss = fmaf(v[t], v[t], ss);
  const float rstd = rsqrtf(block_sum(ss, scratch) / D + eps);
#pragma unroll
  for (int t = 0; t < PER; ++t) {
    const int i = threadIdx.x + t * NT;
    if (i < D) xs[i] = rb(w[t] * rb(v[t] * rstd));
  }
  __syncthreads();
}

// xs[i] = src[i] for n <= N floats written by other blocks (loads first, then the stores).
template <int N>
__device__ void load_vector(float* xs, const float* src) {
  constexpr int PER = (N + NT - 1) / NT;
  float v[PER];
#pragma unroll
  for (int t = 0; t < PER; ++t) {
    const int i = threadIdx.x + t * NT;
    v[t] = i < N ? ldcg(src + i) : 0.f;
  }
#pragma unroll
  for (int t = 0; t < PER; ++t) {
    const int i = threadIdx.x + t * NT;
    if (i < N) xs[i] = v[t];
  }
  __syncthreads();
}

// FUSED: acc[r] += sum over this block's features f in [f0, f0 + nf) of act[f - f0] * W2[r][f], for
// every row r: its slice of the down projection's inner dimension. W2T[f] (row f of W2 transposed)
// is D contiguous values, so a block streams one contiguous range. Thread t keeps 8 rows (column
// group t % CG) of feature lane t / CG; the lanes are summed in shared memory (`red`: FL * D = 8 NT
// floats) and each 4 rows go out as one vector atomic add.
#define CG (D / 8)
#define FL (NT / CG)
#define DB 4  // features a thread has in flight per batch (two batches: this one summed, the next loading)
__device__ void down_partial(const bf16* __restrict__ w2t, const float* act, int f0, int nf, float* red,
                             float* acc) {
  static_assert(!FUSED || (NT % CG == 0 && FL * D <= RED), "FUSED needs D / 8 to divide the block's threads");
  const int cg = threadIdx.x % CG, fl = threadIdx.x / CG;
  const bf16* base = w2t + (u64)f0 * D + cg * 8;
  const int mine = nf > fl ? (nf - fl + FL - 1) / FL : 0;  // this thread's features: fl, fl + FL, ...
  float a[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) a[e] = 0.f;
  U4 cur[DB], nxt[DB];
#pragma unroll
  for (int j = 0; j < DB; ++j)
    if (j < mine) cur[j] = ldw(base + (u64)(fl + j * FL) * D);
  for (int k0 = 0; k0 < mine; k0 += DB) {
#pragma unroll
    for (int j = 0; j < DB; ++j)
      if (k0 + DB + j < mine) nxt[j] = ldw(base + (u64)(fl + (k0 + DB + j) * FL) * D);
#pragma unroll
    for (int j = 0; j < DB; ++j) {
      if (k0 + j < mine) {
        const float x = act[fl + (k0 + j) * FL];
        const U4 w = cur[j];
        a[0] = fmaf(lo(w.x), x, a[0]); a[1] = fmaf(hi(w.x), x, a[1]);
        a[2] = fmaf(lo(w.y), x, a[2]); a[3] = fmaf(hi(w.y), x, a[3]);
        a[4] = fmaf(lo(w.z), x, a[4]); a[5] = fmaf(hi(w.z), x, a[5]);
        a[6] = fmaf(lo(w.w), x, a[6]); a[7] = fmaf(hi(w.w), x, a[7]);
      }
    }
#pragma unroll
    for (int j = 0; j < DB; ++j) cur[j] = nxt[j];
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) red[fl * D + cg * 8 + e] = a[e];
  __syncthreads();
  for (int k = threadIdx.x; k < D / 4; k += NT) {
    const int r4 = (k + blockIdx.x * 32) % (D / 4);
    float t[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      t[e] = 0.f;
      for (int l = 0; l < FL; ++l) t[e] += red[l * D + r4 * 4 + e];
    }
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};"
                 :: "l"(acc + r4 * 4), "f"(t[0]), "f"(t[1]), "f"(t[2]), "f"(t[3]) : "memory");
  }
}

// -- the phases ----------------------------------------------------------------------------------
// q/k/v rows come in RoPE pairs (j, j + HD/2) of one head slot; pair p -> head slot p / HALF.
struct QkvMap {
  int p0;
  __device__ int operator()(int lr) const {
    const int p = p0 + (lr >> 1);
    return (p / HALF) * HD + (p % HALF) + (lr & 1) * HALF;
  }
};
struct PairMap {  // gate row i and up row FF + i
  int i0;
  __device__ int operator()(int lr) const { return i0 + (lr >> 1) + (lr & 1) * FF; }
};
struct RangeMap {
  int r0;
  __device__ int operator()(int lr) const { return r0 + lr; }
};

__device__ void phase_qkv(const Params& p, const Layer& L, const float* xs, const float* rope, int pos,
                          float* red, float* outs, Early& early) {
  constexpr int PAIRS = (H + 2 * HKV) * HALF;
  const int p0 = split(PAIRS, blockIdx.x, gridDim.x), p1 = split(PAIRS, blockIdx.x + 1, gridDim.x);
  const QkvMap map{p0};
  gemv<D>(L.wqkv, xs, 2 * (p1 - p0), map, red, outs, early, [&](int b0, int rows, const float* o) {
    for (int i = threadIdx.x; i < rows / 2; i += NT) {
      const int lr = b0 + 2 * i, pair = p0 + lr / 2, hs = pair / HALF, j = pair % HALF;
      float a = o[2 * i], b = o[2 * i + 1];
#if QKV_BIAS
      a += b2f(L.bqkv[hs * HD + j]);
      b += b2f(L.bqkv[hs * HD + j + HALF]);
#endif
      a = rb(a);
      b = rb(b);
      if (hs < H + HKV) {  // rotate q and k: (a, b) -> (a cos - b sin, b cos + a sin)
        const float c1 = rope[j], s1 = rope[HD + j], c2 = rope[j + HALF], s2 = rope[HD + j + HALF];
        const float a2 = rb(a * c1 - b * s1), b2 = rb(b * c2 + a * s2);
        a = a2;
        b = b2;
      }
      if (hs < H) {
        p.q[hs * HD + j] = a;
        p.q[hs * HD + j + HALF] = b;
      } else {
        const int kvh = hs < H + HKV ? hs - H : hs - H - HKV;
        bf16* cache = hs < H + HKV ? L.k_cache : L.v_cache;
        const u64 at = ((u64)kvh * p.slots + pos) * HD + j;
        cache[at] = f2b(a);
        cache[at + HALF] = f2b(b);
      }
    }
  });
}

// After the q/k/v phase, add this block's finished pairs [q0, q1) to their KV heads' counts
// (sync[2 + h]; a head's q slots, its k slot and its v slot). Cumulative fence first: the q values
// and cache rows written by the whole block are visible before any count.
__device__ void count_qkv_pairs(const Params& p, int q0, int q1) {
  __syncthreads();
  if (threadIdx.x == 0 && q0 < q1) {
    __threadfence();
    for (int s = q0 / HALF; s * HALF < q1; ++s) {
      const int n = imin(q1, (s + 1) * HALF) - imax(q0, s * HALF);
      const int kvh = s < H ? s / G : (s < H + HKV ? s - H : s - H - HKV);
      atomicAdd(p.sync + 2 + kvh, (u64)n);
    }
  }
}

// One work item = one KV head over ATT_T cache positions, for its G query heads: its online-softmax
// partial (its mean, bf16; max and sum) goes to p.part, which every block merges as it loads the
// output projection's input (load_merged). An item first loads the cache rows older than `pos` (written by earlier steps), then waits
// until its head's q/k/v pairs are all done (count `flow_target`), then loads q and row `pos`.
__device__ void phase_attention(const Params& p, const Layer& L, int pos, float* sm, u64 flow_target) {
  float* qs = sm;                        // [G][HD]
  float* ks = qs + G * HD;               // [ATT_T][HD + 1] (padded: conflict-free column reads)
  float* vs = ks + ATT_T * (HD + 1);     // [ATT_T][HD]
  float* ps = vs + ATT_T * HD;           // [G][ATT_T]
  float* stat = ps + G * ATT_T;          // [G][2]
  const float scale_log2 = 1.4426950408889634f * rsqrtf((float)HD);
  const int nch = (pos + ATT_T) / ATT_T;
  constexpr int VEC = ATT_T * HD / 8;    // 16-byte pieces of a K (or V) chunk
  constexpr int QPER = (G * HD + NT - 1) / NT, KPER = (VEC + NT - 1) / NT;
  for (int item = blockIdx.x; item < HKV * nch; item += gridDim.x) {
    const int kvh = item / nch, ch = item % nch, base = ch * ATT_T;
    // Issue every load before the first use: one memory latency, not three.
    float qv[QPER];
    U4 kv[KPER], vv[KPER];
#pragma unroll
    for (int t = 0; t < KPER; ++t) {
      const int i = threadIdx.x + t * NT, r = i / (HD / 8), c = (i % (HD / 8)) * 8;
      const U4 zero = {0u, 0u, 0u, 0u};
      kv[t] = zero;
      vv[t] = zero;
      if (i < VEC && base + r < pos) {
        const u64 at = ((u64)kvh * p.slots + base + r) * HD + c;
        kv[t] = ldcg4(L.k_cache + at);
        vv[t] = ldcg4(L.v_cache + at);
      }
    }
    if (threadIdx.x == 0) spin_until(p, p.sync + 2 + kvh, flow_target);
    __syncthreads();
#pragma unroll
    for (int t = 0; t < KPER; ++t) {
      const int i = threadIdx.x + t * NT, r = i / (HD / 8), c = (i % (HD / 8)) * 8;
      if (i < VEC && base + r == pos) {
        const u64 at = ((u64)kvh * p.slots + base + r) * HD + c;
        kv[t] = ldcg4(L.k_cache + at);
        vv[t] = ldcg4(L.v_cache + at);
      }
    }
#pragma unroll
    for (int t = 0; t < QPER; ++t) {
      const int i = threadIdx.x + t * NT;
      if (i < G * HD) qv[t] = ldcg(p.q + kvh * G * HD + i);
    }
#pragma unroll
    for (int t = 0; t < QPER; ++t) {
      const int i = threadIdx.x + t * NT;
      if (i < G * HD) qs[i] = qv[t];
    }
#pragma unroll
    for (int t = 0; t < KPER; ++t) {
      const int i = threadIdx.x + t * NT, r = i / (HD / 8), c = (i % (HD / 8)) * 8;
      if (i < VEC) {
        const unsigned kw[4] = {kv[t].x, kv[t].y, kv[t].z, kv[t].w};
        const unsigned vw[4] = {vv[t].x, vv[t].y, vv[t].z, vv[t].w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          ks[r * (HD + 1) + c + 2 * e] = lo(kw[e]);
          ks[r * (HD + 1) + c + 2 * e + 1] = hi(kw[e]);
          vs[r * HD + c + 2 * e] = lo(vw[e]);
          vs[r * HD + c + 2 * e + 1] = hi(vw[e]);
        }
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * ATT_T; i += NT) {
      const int g = i / ATT_T, r = i % ATT_T;
      float s = NEG_INF;
      if (base + r <= pos) {
        s = 0.f;
        for (int d = 0; d < HD; ++d) s = fmaf(qs[g * HD + d], ks[r * (HD + 1) + d], s);
        s *= scale_log2;
      }
      ps[i] = s;
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int g = warp; g < G; g += NW) {
      float m = NEG_INF;
      for (int r = lane; r < ATT_T; r += 32) m = fmaxf(m, ps[g * ATT_T + r]);
      m = warp_max(m);
      float l = 0.f;
      for (int r = lane; r < ATT_T; r += 32) {
        const float e = exp2f(ps[g * ATT_T + r] - m);
        ps[g * ATT_T + r] = e;
        l += e;
      }
      l = warp_sum(l);
      if (lane == 0) { stat[2 * g] = m; stat[2 * g + 1] = l; }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * HD; i += NT) {
      const int g = i / HD, d = i % HD;
      float a = 0.f;
      for (int r = 0; r < ATT_T; ++r) a = fmaf(ps[g * ATT_T + r], vs[r * HD + d], a);
      const u64 slot = (u64)(kvh * G + g) * p.max_chunks + ch;  // acc [H][chunks][HD], then (max, sum) [H][chunks][2]
      ((bf16*)p.part)[slot * HD + d] = f2b(a / stat[2 * g + 1]);  // a chunk's sum is >= 1 (its max's term)
      if (d == 0) {
        float* st = p.part + (u64)H * p.max_chunks * HD + slot * 2;
        st[0] = stat[2 * g];
        st[1] = stat[2 * g + 1];
      }
    }
    __syncthreads();
  }
}

// xs[h * HD + d] = query head h's attention output, merged from its chunks' partials as the output
// projection loads its input. Every block merges every head: one round of loads, where one merging
// block would cost a count and two rounds. A thread takes 4 consecutive d of one head, chunks 8
// at a time (rescaled between groups as an online softmax does; one group up to 8 * ATT_T positions).
__device__ void load_merged(const Params& p, float* xs, int nch) {
  constexpr int QUADS = H * HD / 4;
  const float* stats = p.part + (u64)H * p.max_chunks * HD;
  for (int k = threadIdx.x; k < QUADS; k += NT) {
    const int qd = (k + blockIdx.x * 32) % QUADS;
    const int hq = qd / (HD / 4), d = (qd % (HD / 4)) * 4;
    const bf16* acc16 = (const bf16*)p.part + (u64)hq * p.max_chunks * HD + d;
    const float* st = stats + (u64)hq * p.max_chunks * 2;
    float M = NEG_INF, L = 0.f, A[4] = {0.f, 0.f, 0.f, 0.f};
    for (int c0 = 0; c0 < nch; c0 += 8) {
      F4 v[8];
      float m[8], l[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        m[u] = NEG_INF;
        l[u] = 0.f;
        v[u] = F4{0.f, 0.f, 0.f, 0.f};
        if (c0 + u < nch) {
          const uint2 h = ldcg_u2(acc16 + (u64)(c0 + u) * HD);
          v[u] = F4{lo(h.x), hi(h.x), lo(h.y), hi(h.y)};
          m[u] = ldcg(st + 2 * (c0 + u));
          l[u] = ldcg(st + 2 * (c0 + u) + 1);
        }
      }
      float top = M;
#pragma unroll
      for (int u = 0; u < 8; ++u) top = fmaxf(top, m[u]);
      const float keep = exp2f(M - top);  // 0 for the first group (M = -inf, top finite)
      L *= keep;
#pragma unroll
      for (int e = 0; e < 4; ++e) A[e] *= keep;
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        if (c0 + u < nch) {
          const float w = exp2f(m[u] - top) * l[u];  // v is the chunk's mean: weigh it by the chunk's sum
          L += w;
          A[0] = fmaf(w, v[u].x, A[0]); A[1] = fmaf(w, v[u].y, A[1]);
          A[2] = fmaf(w, v[u].z, A[2]); A[3] = fmaf(w, v[u].w, A[3]);
        }
      }
      M = top;
    }
    const float inv = 1.f / L;
#pragma unroll
    for (int e = 0; e < 4; ++e) xs[hq * HD + d + e] = rb(A[e] * inv);
  }
  __syncthreads();
}

// WIDE: load_merged with a thread on WV consecutive values of one head (one 8- or 16-byte load a
// chunk) and MG chunks a round. The LPH lanes of a head load one chunk's (max, sum) each; the round's
// max, its weight sum and each chunk's weight go between them by shuffles, so that a round is 1 + MG
// loads a lane: one round at 512 positions (9 chunks) where load_merged takes two.
__device__ __forceinline__ void load_values(unsigned* w, const bf16* at) {
#if WV == 8
  const U4 v = ldcg4(at);
  w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
#else
  const uint2 v = ldcg_u2(at);
  w[0] = v.x; w[1] = v.y;
#endif
}

__device__ void load_merged_wide(const Params& p, float* xs, int nch) {
  constexpr int PIECES = H * HD / WV;
  const float* stats = p.part + (u64)H * p.max_chunks * HD;
  const int sub = threadIdx.x % LPH;
  for (int k = threadIdx.x; k < PIECES; k += NT) {  // warp-uniform: PIECES is a multiple of 32
    const int od = (k + blockIdx.x * 32) % PIECES;
    const int hq = od / LPH, d = (od % LPH) * WV;
    const bf16* acc16 = (const bf16*)p.part + (u64)hq * p.max_chunks * HD + d;
    const float* st = stats + (u64)hq * p.max_chunks * 2;
    float M = NEG_INF, L = 0.f, A[WV];
#pragma unroll
    for (int e = 0; e < WV; ++e) A[e] = 0.f;
    for (int c0 = 0; c0 < nch; c0 += MG) {
      uint2 ml = make_uint2(__float_as_uint(NEG_INF), 0u);
      if (sub < MG && c0 + sub < nch) ml = ldcg_u2(st + 2 * (c0 + sub));
      unsigned v[MG][WV / 2];
#pragma unroll
      for (int u = 0; u < MG; ++u) {
#pragma unroll
        for (int e = 0; e < WV / 2; ++e) v[u][e] = 0u;
        if (c0 + u < nch) load_values(v[u], acc16 + (u64)(c0 + u) * HD);
      }
      // each lane's chunk: its weight against the round's max (v is the chunk's mean: weigh it by the
      // chunk's sum); max and sum over the head's lanes by shuffles, each weight passed round by one
      const float mine = __uint_as_float(ml.x);
      float top = mine;
#pragma unroll
      for (int o = LPH / 2; o > 0; o >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, o));
      top = fmaxf(top, M);
      const float keep = exp2f(M - top);  // 0 for the first round (M = -inf, top finite)
      const float w_mine = exp2f(mine - top) * __uint_as_float(ml.y);  // 0 where the lane has no chunk
      float w_sum = w_mine;
#pragma unroll
      for (int o = LPH / 2; o > 0; o >>= 1) w_sum += __shfl_xor_sync(0xffffffffu, w_sum, o);
      L = L * keep + w_sum;
#pragma unroll
      for (int e = 0; e < WV; ++e) A[e] *= keep;
#pragma unroll
      for (int u = 0; u < MG; ++u) {
        const float w = __shfl_sync(0xffffffffu, w_mine, u, LPH);  // 0 past the last chunk (v is 0 there too)
#pragma unroll
        for (int e = 0; e < WV / 2; ++e) {
          A[2 * e] = fmaf(w, lo(v[u][e]), A[2 * e]);
          A[2 * e + 1] = fmaf(w, hi(v[u][e]), A[2 * e + 1]);
        }
      }
      M = top;
    }
    const float inv = 1.f / L;
#pragma unroll
    for (int e = 0; e < WV; ++e) xs[hq * HD + d + e] = rb(A[e] * inv);
  }
  __syncthreads();
}

extern "C" __global__ void __launch_bounds__(NT, 1) megakernel_step(Params p) {
  extern __shared__ float smem[];
  float* xs = smem;                      // the GEMV input vector
  float* red = xs + XS;                  // per-unit sums of a GEMV batch
  float* outs = red + RED;               // its row sums
  float* scratch = outs + RED;           // block sums
  float* rope = scratch + 32;            // cos, sin at this step's position [2][HD]
  float* act_s = rope + 2 * HD;          // FUSED: this block's gate/up features [ACT_MAX]
  float* att = act_s + ACT_MAX;          // attention scratch (phase_attention)
  __shared__ u64 s_launch;
  Early early{false, {}};
  if (threadIdx.x == 0) s_launch = ld_acquire(p.sync + 1);
  __syncthreads();
  const u64 nb = gridDim.x, launch = s_launch;
  u64 barrier = launch * BARRIERS * p.n_layers;
  const int pos = (int)p.pos[0];
  for (int i = threadIdx.x; i < HD; i += NT) {
    rope[i] = b2f(p.cos[(u64)pos * HD + i]);
    rope[HD + i] = b2f(p.sin[(u64)pos * HD + i]);
  }
  const bf16* emb = p.embed + (u64)p.token[0] * D;
  const int b = blockIdx.x, B = gridDim.x;
  const int o0 = split(D, b, B), o1 = split(D, b + 1, B);       // output / down projection rows
  const int f0 = split(FF, b, B), f1 = split(FF, b + 1, B);     // gate/up pairs
  const int v0 = split(p.vocab, b, B), v1 = split(p.vocab, b + 1, B);  // LM head rows
  constexpr int PAIRS = (H + 2 * HKV) * HALF;
  const int q0 = split(PAIRS, b, B), q1 = split(PAIRS, b + 1, B);
  NormWeights nw;
  norm_weights(nw, p.layers[0].attn_norm);
  gemv_early<D>(early, p.layers[0].wqkv, 2 * (q1 - q0), QkvMap{q0});

  for (int l = 0; l < p.n_layers; ++l) {
    const Layer& L = p.layers[l];
    const bool head = l == 0;
    // FUSED: this layer's down projection adds into acc[l % 2]; the last layer's into acc[(l - 1) % 2]
    float* acc_now = p.acc + (l & 1) * D;
    const float* acc_before = head || !FUSED ? nullptr : p.acc + ((l + 1) & 1) * D;
    // A: norm, q/k/v, RoPE, cache
    load_normed(xs, head ? nullptr : p.resid, emb, acc_before, L.attn_norm, p.eps, scratch, nw);
    phase_qkv(p, L, xs, rope, pos, red, outs, early);
    count_qkv_pairs(p, q0, q1);
    // B: attention
    phase_attention(p, L, pos, att, (launch * p.n_layers + l + 1) * (u64)((G + 2) * HALF));
    ++barrier;
    arrive(p);
    gemv_early<H * HD>(early, L.wo, o1 - o0, RangeMap{o0});
    wait(p, barrier * nb);
    // C: output projection, residual
#if WIDE
    load_merged_wide(p, xs, (pos + ATT_T) / ATT_T);
#else
    load_merged(p, xs, (pos + ATT_T) / ATT_T);
#endif
    gemv<H * HD>(L.wo, xs, o1 - o0, RangeMap{o0}, red, outs, early, [&](int b0, int rows, const float* o) {
      for (int i = threadIdx.x; i < rows; i += NT) {
        const int r = o0 + b0 + i;
        float y = o[i];
#if O_BIAS
        y += b2f(L.bo[r]);
#endif
        float x = head ? b2f(emb[r]) : ldcg(p.resid + r);
        if (acc_before) x = rb(x + rb(ldcg(acc_before + r)));
        p.resid[r] = rb(x + rb(y));
        if (FUSED) acc_now[r] = 0.f;  // its last readers were the previous layer's phases A and C
      }
    });
    ++barrier;
    arrive(p);
    norm_weights(nw, L.ffn_norm);
    gemv_early<D>(early, L.w13, 2 * (f1 - f0), PairMap{f0});
    wait(p, barrier * nb);
    // D: norm, gate/up, SwiGLU
    load_normed(xs, p.resid, nullptr, nullptr, L.ffn_norm, p.eps, scratch, nw);
    gemv<D>(L.w13, xs, 2 * (f1 - f0), PairMap{f0}, red, outs, early, [&](int b0, int rows, const float* o) {
      for (int i = threadIdx.x; i < rows / 2; i += NT) {
        const float g = rb(o[2 * i]), u = rb(o[2 * i + 1]);
        const float a = rb(rb(g / (1.f + expf(-g))) * u);
        if (FUSED) act_s[b0 / 2 + i] = a;
        else p.act[f0 + b0 / 2 + i] = a;
      }
    });
#if FUSED
    // E: this block's split-K part of the down projection, straight from its own features
    down_partial(L.w2t, act_s, f0, f1 - f0, red, acc_now);
#else
    ++barrier;
    arrive(p);
    gemv_early<FF>(early, L.w2, o1 - o0, RangeMap{o0});
    wait(p, barrier * nb);
    // E: down projection, residual
    load_vector<FF>(xs, p.act);
    gemv<FF>(L.w2, xs, o1 - o0, RangeMap{o0}, red, outs, early, [&](int b0, int rows, const float* o) {
      for (int i = threadIdx.x; i < rows; i += NT) {
        const int r = o0 + b0 + i;
        p.resid[r] = rb(ldcg(p.resid + r) + rb(o[i]));
      }
    });
#endif
    ++barrier;
    arrive(p);
    norm_weights(nw, l + 1 < p.n_layers ? p.layers[l + 1].attn_norm : p.final_norm);
    if (l + 1 < p.n_layers) {
      gemv_early<D>(early, p.layers[l + 1].wqkv, 2 * (q1 - q0), QkvMap{q0});
    } else {
      gemv_early<D>(early, p.lm_head, v1 - v0, RangeMap{v0});
    }
    wait(p, barrier * nb);
  }
  // The final norm and the LM head.
  if (b == 0 && threadIdx.x == 0) atomicAdd(p.sync + 1, 1ull);  // every block has read the launch count
  load_normed(xs, p.resid, nullptr, FUSED ? p.acc + ((p.n_layers + 1) & 1) * D : nullptr, p.final_norm, p.eps,
              scratch, nw);
  if (b == 0)
    for (int i = threadIdx.x; i < D; i += NT) p.hidden[i] = f2b(xs[i]);
  gemv<D>(p.lm_head, xs, v1 - v0, RangeMap{v0}, red, outs, early, [&](int b0, int rows, const float* o) {
    for (int i = threadIdx.x; i < rows; i += NT) p.logits[v0 + b0 + i] = f2b(o[i]);
  });
}
