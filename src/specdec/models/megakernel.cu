// One decode step of a Llama-family model (one token, batch 1) in one persistent kernel.
//
// Why: a 1B-shape step through separate kernels leaves the memory pipe idle at every kernel's
// start and tail (its small matrices ran at 35-59% of the copy ceiling, docs/gpu.md). Here one
// block per SM runs every phase of every layer, separated by grid barriers.
//
// Per layer, five phases and five barriers:
//   A  RMSNorm (each block on its own copy of x) -> q/k/v GEMV -> RoPE; k, v into the cache
//   B  attention over the cache in chunks of ATT_T positions (online-softmax partials); the last
//      chunk of each KV head to finish merges them
//   C  output GEMV + residual
//   D  RMSNorm -> gate/up GEMV -> silu(gate) * up
//   E  down GEMV + residual
// then the final norm and the LM head (logits in bf16).
//
// With PRE > 0, each warp's first PRE units of the next GEMV are bulk-copied (TMA) into shared
// memory between a barrier's arrival and its wait. On an H200 that made the step slower (1.09 ms
// against 0.93 at PRE = 0, docs/gpu.md), so PRE defaults to 0.
//
// Numerics: fp32 products, bf16 rounding where the torch layer rounds (linear outputs, norms,
// residual adds, silu); the softmax in fp32. Not bit-equal to the fused Triton kernels: it serves
// single-token steps of a *draft*, whose numerics never reach the output (the target decides).
//
// Compiled at run time by NVRTC, with the model's sizes as macros (D, H, HKV, HD, FF, NT, U, PRE,
// TIMING, QKV_BIAS, O_BIAS). No headers: bf16 is handled as raw 16-bit patterns.

typedef unsigned short bf16;
typedef unsigned long long u64;

#define NW (NT / 32)
#define RED 4096                 // floats of per-unit sums one GEMV batch holds (and of its row sums)
#define G (H / HKV)
#define HALF (HD / 2)
#define XS (FF > D ? (FF > H * HD ? FF : H * HD) : (D > H * HD ? D : H * HD))
#define NEG_INF __int_as_float(0xff800000)
#ifndef TIMING
#define TIMING 0
#endif
#ifndef PRE
#define PRE 0                    // GEMV units per warp copied into shared memory before a barrier
#endif
#define PRE_U4 (PRE * NW * U * 32)     // their 16-byte slots
#define MARKS (10 * 64)                 // TIMING: where the in-phase marks start (after the barrier stamps)
#define TIMES (15 * 64 + 2)             // TIMING: stamps per block: 2 per barrier, 5 marks a layer, start, end
#define ATT_T 64                 // cache positions per attention work item
#define MERGE_UNROLL 8           // partial-merge loads in flight per output value
#define ATT_FLOATS (G * HD + ATT_T * (HD + 1) + ATT_T * HD + G * ATT_T + 2 * G + 4)

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }

struct alignas(16) U4 { unsigned x, y, z, w; };
struct alignas(16) F4 { float x, y, z, w; };

struct Layer {
  const bf16 *wqkv, *bqkv, *wo, *bo, *attn_norm, *ffn_norm, *w13, *w2;
  bf16 *k_cache, *v_cache;
};

struct Params {
  const Layer* layers;
  const bf16 *embed, *final_norm, *lm_head, *cos, *sin;
  const long long *token, *pos;
  float *resid, *q, *part, *act, *attn;
  bf16 *logits, *hidden;
  u64* sync;   // [0] barrier arrivals (grows forever), [1] launches finished
  int* flag;   // set to 1 if a barrier gave up waiting (the step's results are then garbage)
  long long* times;  // TIMING builds: per block, %globaltimer at each barrier's arrival and departure
  int* counts;       // [HKV] attention items finished per KV head (the last one merges and resets it)
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
__device__ __forceinline__ u64 ld_acquire(const u64* p) {
  u64 v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ long long global_ns() {
  long long t;
  asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t));
  return t;
}
// TIMING builds: block time stamp `slot` (after a block-wide sync, so the whole block is there).
__device__ __forceinline__ void mark(const Params& p, int slot) {
#if TIMING
  __syncthreads();
  if (threadIdx.x == 0) p.times[(u64)blockIdx.x * TIMES + MARKS + slot] = global_ns();
#endif
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

// Grid barrier in two halves: arrivals count up forever; barrier `target` waits for its total. Work that
// does not depend on the barrier (the next GEMV's weight copies) goes between arrive and wait: after
// the fence, so that the fence does not wait for those copies.
__device__ void arrive(const Params& p, int index) {
  __syncthreads();
  if (threadIdx.x == 0) {
#if TIMING
    p.times[(u64)blockIdx.x * TIMES + 2 * index] = global_ns();
#endif
    __threadfence();
    atomicAdd(p.sync, 1ull);
  }
}

__device__ void wait(const Params& p, u64 target, int index) {
  if (threadIdx.x == 0) {
    unsigned spins = 0;
    while (ld_acquire(p.sync) < target) {
      if (++spins > (1u << 22)) { atomicExch(p.flag, 1); break; }  // never hang: flag it
    }
    __threadfence();
#if TIMING
    p.times[(u64)blockIdx.x * TIMES + 2 * index + 1] = global_ns();
#endif
  }
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

// Before a barrier: bulk-copy (TMA) each warp's first PRE units of the next GEMV into shared memory:
// weights do not depend on the barrier, so HBM streams while the barrier waits and the phase starts
// on chip. A unit is one contiguous 512 * U-byte piece of a row: one copy instruction (issued by
// warp 0; an mbarrier counts the bytes in). Slot of (unit k of warp w, load v, lane):
// ((k * NW + w) * U + v) * 32 + lane.
struct Prefetch {
  U4* buf;
  unsigned mbar;   // shared address of the mbarrier
  unsigned phase;  // parity of its current phase
  bool pending;    // copies issued and not yet waited for (block-uniform)
};

template <int K, typename Map>
__device__ __forceinline__ void gemv_begin(Prefetch& pf, const bf16* W, int n, Map map) {
  constexpr int P = K / 256 / U;
  const int units = imin(imin(n, RED / P) * P, PRE * NW);
  pf.pending = units > 0;
  if (threadIdx.x < 32 && units > 0) {  // warp 0 issues: the byte count first, then a copy per lane
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // after generic writes to the buffer
    if (threadIdx.x == 0)
      asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                   :: "r"(pf.mbar), "r"(units * U * 512) : "memory");
    __syncwarp();
    for (int u = threadIdx.x; u < units; u += 32) {
      const int k = u / NW, w = u % NW;  // unit u = w + k * NW is warp w's k-th
      const bf16* src = W + (u64)map(u / P) * K + (u % P) * U * 256;
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                   :: "r"((unsigned)__cvta_generic_to_shared(pf.buf + (k * NW + w) * U * 32)), "l"(src),
                      "r"(U * 512), "r"(pf.mbar) : "memory");
    }
  }
}

__device__ __forceinline__ void prefetch_wait(Prefetch& pf) {
  unsigned done = 0;
  while (!done)
    asm volatile("{ .reg .pred ok; mbarrier.try_wait.parity.shared::cta.b64 ok, [%1], %2; selp.u32 %0, 1, 0, ok; }"
                 : "=r"(done) : "r"(pf.mbar), "r"(pf.phase) : "memory");
  pf.phase ^= 1u;
  pf.pending = false;
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
                     Prefetch& pf, Epi epi) {
  constexpr int P = K / 256 / U;
  constexpr int BATCH = RED / P;
  const U4* pre = pf.buf;
  static_assert(K % (256 * U) == 0, "a row must be a whole number of units");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int b0 = 0; b0 < n; b0 += BATCH) {
    const int rows = imin(BATCH, n - b0), units = rows * P;
    const int mine = units > warp ? (units - warp + NW - 1) / NW : 0;  // this warp's units: warp + k NW
    const int k0 = b0 == 0 && pf.pending ? imin(PRE, mine) : 0;        // the first k0 are in `pre`
    U4 cur[U], nxt[U];
    if (k0 < mine) load_unit<K>(cur, W, map, b0, warp + k0 * NW);      // in flight while those are summed
    if (b0 == 0 && pf.pending) {
      prefetch_wait(pf);
      for (int k = 0; k < k0; ++k) {
        U4 w[U];
#pragma unroll
        for (int v = 0; v < U; ++v) w[v] = pre[((k * NW + warp) * U + v) * 32 + lane];
        const float s = unit_dot<K>(w, xs, warp + k * NW);
        if (lane == 0) red[warp + k * NW] = s;
      }
    }
    for (int k = k0; k < mine; ++k) {
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

// xs[i] = bf16(g[i] * bf16(x[i] * rstd)) for the D values of x (fp32 buffer or a bf16 row). All loads
// are issued before the first use: one memory latency, not D / NT of them.
__device__ void load_normed(float* xs, const float* src, const bf16* src_b, const bf16* g, float eps,
                            float* scratch) {
  constexpr int PER = (D + NT - 1) / NT;
  float v[PER], w[PER];
#pragma unroll
  for (int t = 0; t < PER; ++t) {
    const int i = threadIdx.x + t * NT;
    v[t] = 0.f;
    w[t] = 0.f;
    if (i < D) {
      v[t] = src ? ldcg(src + i) : b2f(src_b[i]);
      w[t] = b2f(g[i]);
    }
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
                          float* red, float* outs, Prefetch& pre) {
  constexpr int PAIRS = (H + 2 * HKV) * HALF;
  const int p0 = split(PAIRS, blockIdx.x, gridDim.x), p1 = split(PAIRS, blockIdx.x + 1, gridDim.x);
  const QkvMap map{p0};
  gemv<D>(L.wqkv, xs, 2 * (p1 - p0), map, red, outs, pre, [&](int b0, int rows, const float* o) {
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

// The last item of a KV head to finish merges its chunks: attn[h * HD + d] for its G query heads.
__device__ void merge_head(const Params& p, int kvh, int nch, float* sm) {
  float* mstat = sm;                     // [G][nch]
  float* weight = mstat + G * nch;       // [G][nch]
  float* lsum = weight + G * nch;        // [G][nch]
  float* inv = lsum + G * nch;           // [G]
  const float* part = p.part + (u64)kvh * G * p.max_chunks * (HD + 2);
  for (int i = threadIdx.x; i < G * nch; i += NT) {
    const float* at = part + ((u64)(i / nch) * p.max_chunks + i % nch) * (HD + 2) + HD;
    const float m = ldcg(at), l = ldcg(at + 1);
    mstat[i] = m;
    lsum[i] = l;
  }
  __syncthreads();
  for (int g = threadIdx.x; g < G; g += NT) {
    float m = NEG_INF;
    for (int c = 0; c < nch; ++c) m = fmaxf(m, mstat[g * nch + c]);
    float l = 0.f;
    for (int c = 0; c < nch; ++c) {
      const float w = exp2f(mstat[g * nch + c] - m);
      weight[g * nch + c] = w;
      l += w * lsum[g * nch + c];
    }
    inv[g] = 1.f / l;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < G * HD; i += NT) {
    const int g = i / HD, d = i % HD;
    float acc = 0.f;
    for (int c0 = 0; c0 < nch; c0 += MERGE_UNROLL) {
      float v[MERGE_UNROLL];
#pragma unroll
      for (int u = 0; u < MERGE_UNROLL; ++u)
        v[u] = c0 + u < nch ? ldcg(part + ((u64)g * p.max_chunks + c0 + u) * (HD + 2) + d) : 0.f;
#pragma unroll
      for (int u = 0; u < MERGE_UNROLL; ++u)
        if (c0 + u < nch) acc = fmaf(weight[g * nch + c0 + u], v[u], acc);
    }
    p.attn[(kvh * G + g) * HD + d] = rb(acc * inv[g]);
  }
  __syncthreads();
}

// One work item = one KV head over ATT_T cache positions, for its G query heads: its online-softmax
// partial (acc, max, sum) goes to p.part; the KV head's last item merges them (merge_head).
__device__ void phase_attention(const Params& p, const Layer& L, int pos, float* sm) {
  float* qs = sm;                        // [G][HD]
  float* ks = qs + G * HD;               // [ATT_T][HD + 1] (padded: conflict-free column reads)
  float* vs = ks + ATT_T * (HD + 1);     // [ATT_T][HD]
  float* ps = vs + ATT_T * HD;           // [G][ATT_T]
  float* stat = ps + G * ATT_T;          // [G][2]
  int* last = (int*)(stat + 2 * G);
  float* merge = sm + ATT_FLOATS;        // merge_head's scratch
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
    for (int t = 0; t < QPER; ++t) {
      const int i = threadIdx.x + t * NT;
      if (i < G * HD) qv[t] = ldcg(p.q + kvh * G * HD + i);
    }
#pragma unroll
    for (int t = 0; t < KPER; ++t) {
      const int i = threadIdx.x + t * NT, r = i / (HD / 8), c = (i % (HD / 8)) * 8;
      const U4 zero = {0u, 0u, 0u, 0u};
      kv[t] = zero;
      vv[t] = zero;
      if (i < VEC && base + r <= pos) {
        const u64 at = ((u64)kvh * p.slots + base + r) * HD + c;
        kv[t] = ldcg4(L.k_cache + at);
        vv[t] = ldcg4(L.v_cache + at);
      }
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
      float* dst = p.part + ((u64)(kvh * G + g) * p.max_chunks + ch) * (HD + 2);
      dst[d] = a;
      if (d == 0) { dst[HD] = stat[2 * g]; dst[HD + 1] = stat[2 * g + 1]; }
    }
    __syncthreads();
    if (threadIdx.x == 0) {  // the last of this head's items to finish merges them
      __threadfence();
      *last = atomicAdd(p.counts + kvh, 1) == nch - 1;
      __threadfence();
    }
    __syncthreads();
    if (*last) {
      merge_head(p, kvh, nch, merge);
      if (threadIdx.x == 0) p.counts[kvh] = 0;  // every item of this head has counted: ready for the next layer
    }
    __syncthreads();
  }
}

extern "C" __global__ void __launch_bounds__(NT, 1) megakernel_step(Params p) {
  extern __shared__ float smem[];
  float* xs = smem;                      // the GEMV input vector
  float* red = xs + XS;                  // per-unit sums of a GEMV batch
  float* outs = red + RED;               // its row sums
  float* scratch = outs + RED;           // block sums
  float* rope = scratch + 32;            // cos, sin at this step's position [2][HD]
  float* att = rope + 2 * HD;            // attention and merge scratch ...
  __shared__ u64 s_launch;
  __shared__ alignas(8) u64 s_mbar;
  Prefetch pre{(U4*)att, (unsigned)__cvta_generic_to_shared(&s_mbar), 0u, false};  // att is 16-byte aligned
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(pre.mbar) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if (threadIdx.x == 0) s_launch = ld_acquire(p.sync + 1);
  __syncthreads();
  const u64 nb = gridDim.x, per_launch = (u64)5 * p.n_layers;
  u64 barrier = s_launch * per_launch;
  const u64 first_barrier = barrier + 1;
#if TIMING
  if (threadIdx.x == 0) p.times[(u64)blockIdx.x * TIMES + TIMES - 2] = global_ns();
#endif
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
  gemv_begin<D>(pre, p.layers[0].wqkv, 2 * (q1 - q0), QkvMap{q0});

  for (int l = 0; l < p.n_layers; ++l) {
    const Layer& L = p.layers[l];
    const bool head = l == 0;
    // A: norm, q/k/v, RoPE, cache
    load_normed(xs, head ? nullptr : p.resid, emb, L.attn_norm, p.eps, scratch);
    mark(p, 5 * l);
    phase_qkv(p, L, xs, rope, pos, red, outs, pre);
    mark(p, 5 * l + 1);
    ++barrier;
    arrive(p, (int)(barrier - first_barrier));
    wait(p, barrier * nb, (int)(barrier - first_barrier));
    // B: attention
    phase_attention(p, L, pos, att);
    ++barrier;
    arrive(p, (int)(barrier - first_barrier));
    gemv_begin<H * HD>(pre, L.wo, o1 - o0, RangeMap{o0});
    wait(p, barrier * nb, (int)(barrier - first_barrier));
    // C: output projection, residual
    load_vector<H * HD>(xs, p.attn);
    mark(p, 5 * l + 2);
    gemv<H * HD>(L.wo, xs, o1 - o0, RangeMap{o0}, red, outs, pre, [&](int b0, int rows, const float* o) {
      for (int i = threadIdx.x; i < rows; i += NT) {
        const int r = o0 + b0 + i;
        float y = o[i];
#if O_BIAS
        y += b2f(L.bo[r]);
#endif
        const float x = head ? b2f(emb[r]) : ldcg(p.resid + r);
        p.resid[r] = rb(x + rb(y));
      }
    });
    ++barrier;
    arrive(p, (int)(barrier - first_barrier));
    gemv_begin<D>(pre, L.w13, 2 * (f1 - f0), PairMap{f0});
    wait(p, barrier * nb, (int)(barrier - first_barrier));
    // D: norm, gate/up, SwiGLU
    load_normed(xs, p.resid, nullptr, L.ffn_norm, p.eps, scratch);
    mark(p, 5 * l + 3);
    gemv<D>(L.w13, xs, 2 * (f1 - f0), PairMap{f0}, red, outs, pre, [&](int b0, int rows, const float* o) {
      for (int i = threadIdx.x; i < rows / 2; i += NT) {
        const float g = rb(o[2 * i]), u = rb(o[2 * i + 1]);
        p.act[f0 + b0 / 2 + i] = rb(rb(g / (1.f + expf(-g))) * u);
      }
    });
    ++barrier;
    arrive(p, (int)(barrier - first_barrier));
    gemv_begin<FF>(pre, L.w2, o1 - o0, RangeMap{o0});
    wait(p, barrier * nb, (int)(barrier - first_barrier));
    // E: down projection, residual
    load_vector<FF>(xs, p.act);
    mark(p, 5 * l + 4);
    gemv<FF>(L.w2, xs, o1 - o0, RangeMap{o0}, red, outs, pre, [&](int b0, int rows, const float* o) {
      for (int i = threadIdx.x; i < rows; i += NT) {
        const int r = o0 + b0 + i;
        p.resid[r] = rb(ldcg(p.resid + r) + rb(o[i]));
      }
    });
    ++barrier;
    arrive(p, (int)(barrier - first_barrier));
    if (l + 1 < p.n_layers)
      gemv_begin<D>(pre, p.layers[l + 1].wqkv, 2 * (q1 - q0), QkvMap{q0});
    else
      gemv_begin<D>(pre, p.lm_head, v1 - v0, RangeMap{v0});
    wait(p, barrier * nb, (int)(barrier - first_barrier));
  }
  // The final norm and the LM head.
  if (b == 0 && threadIdx.x == 0) atomicAdd(p.sync + 1, 1ull);  // every block has read the launch count
  load_normed(xs, p.resid, nullptr, p.final_norm, p.eps, scratch);
  if (b == 0)
    for (int i = threadIdx.x; i < D; i += NT) p.hidden[i] = f2b(xs[i]);
  gemv<D>(p.lm_head, xs, v1 - v0, RangeMap{v0}, red, outs, pre, [&](int b0, int rows, const float* o) {
    for (int i = threadIdx.x; i < rows; i += NT) p.logits[v0 + b0 + i] = f2b(o[i]);
  });
#if TIMING
  if (threadIdx.x == 0) p.times[(u64)blockIdx.x * TIMES + TIMES - 1] = global_ns();
#endif
}
