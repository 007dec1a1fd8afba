"""Fused decode kernels in Triton for the native Llama path on CUDA: one decoder layer in nine launches.

A decode step at batch 1 reads every weight once; what costs time beyond that is the number of
kernels (each pays a launch and a ramp-up/tail of a few microseconds inside a CUDA graph) and
matrix-vector products that leave bandwidth unused on small matrices. Measured on an H200 the
torch-compiled layer lost ~40 us per layer to this, for the 8B and the 1B shape alike
(docs/gpu.md). Here a layer is:

1. `rms_norm`, then `gemv`: the fused q/k/v matrix (+ bias);
2. `rope_and_cache`: RoPE on q and k, k and v written into the cache at their positions;
3. `attention`: softmax(q k^T) v over the cache, causal by position, split over the cache in
   chunks (online softmax per chunk, then a combine kernel: two launches);
4. `gemv(residual=x)`: the output projection with the residual add in its epilogue;
5. `rms_norm`, then `gemv(swiglu=True)`: the fused gate/up matrix and silu(gate) * up;
6. `gemv(residual=h)`: the down projection with the residual add.

Exactness by construction: every kernel computes each token row with the same tile sizes and the
same reduction order whatever the number of rows (row blocks are always ROWS = 16 wide; the
tensor-core products treat rows independently; the tile tuner is keyed on the matrix shape only, so a
1-token step and a verify step of the same model use one configuration). So row i of a verify
pass gets bit-for-bit the logits a single-token step would give (checked on an H200 by `specdec
bench gpu`), and greedy speculative output equals plain greedy output in bf16 too, with no padded
rows. The attention runs to the last row's position; blocks and chunks that a row may not see
are fully masked and change nothing (their weight is exactly 0, the others' exactly 1).

Launches: on Hopper and later every kernel is launched with programmatic dependent launch (PDL):
it is scheduled while the previous kernel finishes and waits on the GPU for its inputs, which in
a CUDA graph removes most of the gap between kernels (an H200 1B-shape step 4% faster, 8B 1%).

The elementwise epilogues round where torch rounds (bf16 after the matmul, after silu, after the
residual add), as does the norm, so results stay within bf16 noise of the torch path. Runs on the CPU through
Triton's interpreter (TRITON_INTERPRET=1, fp32/fp16 only) for the tests.
"""

from __future__ import annotations

import contextlib
import math
import os

import torch
import triton
import triton.language as tl

ROWS = 16  # token rows per program: the smallest tensor-core tile, fixed so numerics never depend on n


# (BLOCK_N, BLOCK_K, warps, stages, split-K): the tiles the tuner tries for each matrix shape.
TILES = [(16, 256, 4, 4, 1), (16, 512, 4, 3, 1), (32, 256, 4, 4, 1), (32, 128, 4, 5, 1), (64, 128, 4, 4, 1),
         (64, 256, 8, 3, 1), (16, 128, 4, 6, 1), (128, 128, 8, 3, 1), (32, 512, 8, 3, 1), (64, 128, 8, 5, 1),
         (16, 256, 4, 4, 2), (16, 256, 4, 4, 4), (32, 256, 4, 4, 2), (32, 256, 4, 4, 4), (16, 512, 4, 3, 2),
         (16, 512, 4, 3, 4), (32, 128, 4, 5, 2), (64, 128, 4, 4, 2)]
INTERPRETER_TILE = (16, 32, 4, 1, 1)  # Triton's interpreter (the CPU tests) cannot time: one fixed tile
# Split-K tile counters per device, zeroed once and reset by the kernels: GEMVs on one device share
# them, so they must run one after another (one stream, as the engine's steps do).
MAX_TILES = 1 << 15


@triton.jit
def _wait_for_inputs(PDL: tl.constexpr):
    """Programmatic dependent launch (Hopper on): this kernel may have been scheduled while the
    previous one was finishing; wait until that one has completed and its writes are visible.
    Nothing before this call may touch what earlier kernels write."""
    if PDL:
        tl.extra.cuda.gdc_wait()


@triton.jit
def _let_next_start(PDL: tl.constexpr):
    """Let the next kernel be scheduled now (it waits in _wait_for_inputs), so that its launch
    overlaps this kernel's tail. Called after a GEMV's weight loop, not at its start: the next
    kernel's programs would otherwise sit on the SMs for the whole GEMV (measured 16-18% slower)."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()


@triton.jit
def _start_short_kernel(PDL: tl.constexpr):
    """A short kernel (norm, RoPE, attention): wait for its inputs, then let the next one get ready."""
    _wait_for_inputs(PDL)
    _let_next_start(PDL)


@triton.jit
def _gemv_epilogue(acc, acc_up, b_ptr, r_ptr, y_ptr, rm, rn, row_ok, col_ok, N,
                   HAS_BIAS: tl.constexpr, RESIDUAL: tl.constexpr, SWIGLU: tl.constexpr):
    dtype = y_ptr.dtype.element_ty
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    out = acc.to(dtype)
    if SWIGLU:  # silu(gate) * up, rounded as torch rounds each op
        gate = out.to(tl.float32)
        act = (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32)
        out = (act * acc_up.to(dtype).to(tl.float32)).to(dtype)
    ptrs = rm[:, None] * N + rn[None, :]
    mask = row_ok[:, None] & col_ok[None, :]
    if RESIDUAL:
        res = tl.load(r_ptr + ptrs, mask=mask, other=0.0).to(tl.float32)
        out = (res + out.to(tl.float32)).to(dtype)
    tl.store(y_ptr + ptrs, out, mask=mask)


@triton.heuristics({"EVEN_K": lambda a: a["K"] % a["BLOCK_K"] == 0})
@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, r_ptr, y_ptr, part_ptr, count_ptr, M, N, K, k_per_split,
                 HAS_BIAS: tl.constexpr, RESIDUAL: tl.constexpr, SWIGLU: tl.constexpr,
                 PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 SPLIT: tl.constexpr, EVEN_K: tl.constexpr, PDL: tl.constexpr = 0):
    """y[m, n] = epilogue(sum_k x[m, k] * w[n, k]); with SWIGLU, w has 2N rows (gate, up).

    SPLIT > 1 (split-K, for matrices too small to keep every SM streaming): program (m, n, s) sums
    the s-th slice of K into an fp32 partial; the program that finishes its tile last (an atomic
    count) adds the SPLIT partials in the fixed order 0..SPLIT-1 and runs the epilogue, so the
    result is deterministic and a row's arithmetic still does not depend on the row count.

    Nothing but loads and tensor-core products in the loop: RMSNorm stays a kernel of its own.
    Measured on an H200 (docs/gpu.md), a norm in this kernel cost more than its launch saves: a
    first pass over x ~8 us per matrix (serial before the first weight load), and the norm folded
    into the loop (rstd applied to the accumulator at the end) slowed the weight stream itself."""
    pid_m, pid_n, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    row_ok = rm < M
    col_ok = rn < N
    _wait_for_inputs(PDL)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_first = split * k_per_split
    for k0 in range(k_first, tl.minimum(k_first + k_per_split, K), BLOCK_K):
        kk = k0 + rk
        if EVEN_K:
            x_mask = row_ok[:, None]
            w_mask = col_ok[:, None]
        else:
            x_mask = row_ok[:, None] & (kk < K)[None, :]
            w_mask = col_ok[:, None] & (kk < K)[None, :]
        x = tl.load(x_ptr + rm[:, None] * K + kk[None, :], mask=x_mask, other=0.0)
        w = tl.load(w_ptr + rn[:, None] * K + kk[None, :], mask=w_mask, other=0.0)
        acc += tl.dot(x, tl.trans(w), input_precision=PRECISION)
        if SWIGLU:
            w_up = tl.load(w_ptr + (rn + N)[:, None] * K + kk[None, :], mask=w_mask, other=0.0)
            acc_up += tl.dot(x, tl.trans(w_up), input_precision=PRECISION)
    _let_next_start(PDL)
    if SPLIT == 1:
        _gemv_epilogue(acc, acc_up, b_ptr, r_ptr, y_ptr, rm, rn, row_ok, col_ok, N, HAS_BIAS, RESIDUAL, SWIGLU)
    else:
        rows = tl.num_programs(0) * BLOCK_M
        parts: tl.constexpr = 2 if SWIGLU else 1
        cell = rm[:, None] * N + rn[None, :]  # partials: [SPLIT, parts, rows, N] fp32
        tl.store(part_ptr + (split * parts * rows) * N + cell, acc, mask=col_ok[None, :])
        if SWIGLU:
            tl.store(part_ptr + ((split * parts + 1) * rows) * N + cell, acc_up, mask=col_ok[None, :])
        tl.debug_barrier()  # every thread's partial is written before the count says so
        tile = pid_n * tl.num_programs(0) + pid_m
        if tl.atomic_add(count_ptr + tile, 1, sem="acq_rel") == SPLIT - 1:  # the last of the tile
            total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            total_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for s in tl.static_range(SPLIT):
                total += tl.load(part_ptr + (s * parts * rows) * N + cell, mask=col_ok[None, :], other=0.0,
                                 cache_modifier=".cg")
                if SWIGLU:
                    total_up += tl.load(part_ptr + ((s * parts + 1) * rows) * N + cell, mask=col_ok[None, :],
                                        other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(count_ptr + tile, 0)  # ready for the next GEMV (kernels run one after another)
            _gemv_epilogue(total, total_up, b_ptr, r_ptr, y_ptr, rm, rn, row_ok, col_ok, N,
                           HAS_BIAS, RESIDUAL, SWIGLU)


_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
PDL_MODES = {"off": 0, "on": 1}
_pdl_override: list[str] = []


@contextlib.contextmanager
def programmatic_launch(mode: str):
    """Launch (and capture) kernels in this block with programmatic dependent launch 'on' or 'off'
    instead of the default (for side-by-side timing)."""
    if mode not in PDL_MODES:
        raise ValueError(f"PDL mode must be one of {sorted(PDL_MODES)}, not {mode!r}")
    _pdl_override.append(mode)
    try:
        yield
    finally:
        _pdl_override.pop()


def pdl_mode(device: torch.device) -> str:
    """'on': programmatic dependent launch (each kernel is scheduled during the previous one's tail
    and waits on the GPU for its inputs; inside a CUDA graph this saves the gap between kernels),
    on Hopper and later; 'off' elsewhere, in the interpreter, or with SPECDEC_PDL=off. Measured
    side by side by `specdec bench gpu` and benchmarks/gpu_pdl.py (docs/gpu.md)."""
    wanted = _pdl_override[-1] if _pdl_override else os.environ.get("SPECDEC_PDL", "on")
    if wanted not in PDL_MODES:
        raise ValueError(f"SPECDEC_PDL must be one of {sorted(PDL_MODES)}, not {wanted!r}")
    if (_INTERPRETED or device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 9
            or not hasattr(tl.extra.cuda, "gdc_wait")):
        return "off"
    return wanted


def _launch_options(device: torch.device) -> dict:
    level = PDL_MODES[pdl_mode(device)]
    return {"PDL": level, "launch_pdl": True} if level else {"PDL": 0}


_chosen_tiles: dict[tuple, tuple] = {}  # (N, K, flags, dtype, device) -> the tile the tuner picked


_counters: dict[torch.device, torch.Tensor] = {}


def _tile_counters(device: torch.device) -> torch.Tensor:
    """Zeros, made once per device (outside any graph capture: the warm-up runs come first); each
    split-K tile counts its finished slices here and its last program sets it back to 0."""
    if device not in _counters:
        _counters[device] = torch.zeros(MAX_TILES, dtype=torch.int32, device=device)
    return _counters[device]


def _precision(x: torch.Tensor) -> str:
    """fp32 products in full precision (the CPU tests); bf16/fp16 ignore the setting."""
    return "ieee" if x.dtype == torch.float32 else "tf32"


def gemv(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
         residual: torch.Tensor | None = None, swiglu: bool = False) -> torch.Tensor:
    """x [n, K] @ w[N', K].T for a few rows n, with optional bias, silu(gate) * up over the two
    halves of w's rows (N = N' / 2), and residual add."""
    x = x.contiguous()
    m, k = x.shape
    n = w.shape[0] // 2 if swiglu else w.shape[0]
    flags = dict(HAS_BIAS=bias is not None, RESIDUAL=residual is not None, SWIGLU=swiglu)
    args = (bias, None if residual is None else residual.contiguous())

    def launch(weight, tile):
        y = torch.empty(m, n, dtype=x.dtype, device=x.device)
        b, res = (y if a is None else a for a in args)  # unused operands: any pointer (never read)
        block_n, block_k, warps, stages, split = tile
        # Row blocks vary fastest: the programs of one weight tile run side by side and share its
        # reads through L2, so a pass of more than 16 rows does not stream the weights again per block.
        grid = (triton.cdiv(m, ROWS), triton.cdiv(n, block_n), split)
        k_per_split = triton.cdiv(triton.cdiv(k, split), block_k) * block_k
        parts = y
        if split > 1:
            parts = torch.empty(split, 2 if swiglu else 1, grid[0] * ROWS, n, dtype=torch.float32, device=x.device)
            if grid[0] * grid[1] > MAX_TILES:
                raise ValueError(f"split-K GEMV of {grid[0] * grid[1]} tiles: more than MAX_TILES")
        _gemv_kernel[grid](
            x, weight, b, res, y, parts, _tile_counters(x.device), m, n, k, k_per_split, **flags,
            PRECISION=_precision(x), BLOCK_M=ROWS, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT=split,
            num_warps=warps, num_stages=stages, **_launch_options(x.device))
        return y

    key = (n, k, tuple(flags.values()), x.dtype, x.device)
    if key not in _chosen_tiles:
        _chosen_tiles[key] = INTERPRETER_TILE if _INTERPRETED else _tune(launch, w)
    return launch(w, _chosen_tiles[key])


def _tune(launch, w: torch.Tensor) -> tuple:
    """The fastest tile for this matrix shape, timed as the model runs it: inside a CUDA graph
    (no host launch cost, which would swamp a 5-us kernel) and streaming weights that are not in
    L2 (copies cycled through, 64 MB or more in all). Keyed on the shape, never on the row count,
    so every step of a model uses one tile (the exactness above needs that)."""
    if torch.cuda.is_current_stream_capturing():  # cannot time inside someone's capture: the first tile
        return TILES[0]
    copies = [w] + [w.clone() for _ in range(min(7, -(-(64 << 20) // (w.numel() * w.element_size())) - 1))]
    timings = {}
    for tile in TILES:
        try:
            launch(w, tile)  # compile outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(2):
                    for weight in copies:
                        launch(weight, tile)
            graph.replay()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(5):
                graph.replay()
            end.record()
            end.synchronize()
            timings[tile] = start.elapsed_time(end)
        except Exception:  # noqa: BLE001 - a tile that does not fit this GPU (shared memory, registers)
            continue
    if not timings:
        raise RuntimeError("no GEMV tile compiled on this GPU")
    return min(timings, key=timings.get)


@triton.jit
def _rope_cache_kernel(qkv_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, k_cache_ptr, v_cache_ptr, S,
                       H: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr, PDL: tl.constexpr = 0):
    """Program (m, head) for head in [0, H + 2 HKV): q heads rotated into q, k heads rotated into the
    cache, v heads copied into the cache, at slot pos[m]. cos/sin: [n, HD] (halves repeated)."""
    _start_short_kernel(PDL)
    m = tl.program_id(0)
    head = tl.program_id(1)
    dtype = qkv_ptr.dtype.element_ty
    half: tl.constexpr = HD // 2
    d = tl.arange(0, half)
    src = qkv_ptr + m * (H + 2 * HKV) * HD + head * HD
    x1 = tl.load(src + d)
    x2 = tl.load(src + half + d)
    slot = tl.load(pos_ptr + m)
    if head < H + HKV:
        c = tl.load(cos_ptr + m * HD + d).to(tl.float32)
        s = tl.load(sin_ptr + m * HD + d).to(tl.float32)
        a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
        # x * cos + rotate_half(x) * sin, each product rounded as torch does
        y1 = ((a1 * c).to(dtype).to(tl.float32) + (-a2 * s).to(dtype).to(tl.float32)).to(dtype)
        y2 = ((a2 * c).to(dtype).to(tl.float32) + (a1 * s).to(dtype).to(tl.float32)).to(dtype)
        if head < H:
            dst = q_ptr + (m * H + head) * HD
        else:
            dst = k_cache_ptr + ((head - H) * S + slot) * HD
        tl.store(dst + d, y1)
        tl.store(dst + half + d, y2)
    else:
        dst = v_cache_ptr + ((head - H - HKV) * S + slot) * HD
        tl.store(dst + d, x1)
        tl.store(dst + half + d, x2)


def rope_and_cache(qkv, cos, sin, pos, k_cache, v_cache, n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """qkv [n, (H + 2 Hkv) hd] -> rotated q [n, H * hd]; rotated k and v go to the caches [Hkv, S, hd]."""
    n = qkv.shape[0]
    hd = k_cache.shape[-1]
    q = torch.empty(n, n_heads * hd, dtype=qkv.dtype, device=qkv.device)
    _rope_cache_kernel[(n, n_heads + 2 * n_kv_heads)](
        qkv.contiguous(), cos.contiguous(), sin.contiguous(), pos, q, k_cache, v_cache, k_cache.shape[1],
        H=n_heads, HKV=n_kv_heads, HD=hd, **_launch_options(qkv.device))
    return q


CHUNK = 128  # cache slots per attention program (split-KV): a 512-token context is 4-5 programs per KV head


@triton.jit
def _attention_chunk_kernel(q_ptr, k_ptr, v_ptr, pos_ptr, acc_ptr, ml_ptr, M, S, R, scale_log2,
                            H: tl.constexpr, G: tl.constexpr, HD: tl.constexpr, PRECISION: tl.constexpr,
                            BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, CHUNK_S: tl.constexpr,
                            PDL: tl.constexpr = 0):
    """Program (kv head, chunk of CHUNK_S slots, row block): the unnormalised softmax(q k^T) v of
    its rows over its chunk, with their running max and sum, for the combine kernel. Rows are
    (token m, query head g of this KV head): r = m * G + g; a row sees the slots <= its position.
    Chunks past the last token's position do nothing (the combine kernel stops before them)."""
    _start_short_kernel(PDL)
    kvh = tl.program_id(0)
    chunk = tl.program_id(1)
    r = tl.program_id(2) * BLOCK_R + tl.arange(0, BLOCK_R)
    end = tl.load(pos_ptr + M - 1) + 1  # the last token has the largest position
    first = chunk * CHUNK_S
    if first < end:
        m = r // G
        valid = m < M
        head = kvh * G + r % G
        d = tl.arange(0, HD)
        q = tl.load(q_ptr + (m * H + head)[:, None] * HD + d[None, :], mask=valid[:, None], other=0.0)
        row_pos = tl.load(pos_ptr + m, mask=valid, other=0)
        m_i = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
        acc = tl.zeros([BLOCK_R, HD], dtype=tl.float32)
        base = kvh * S * HD
        for s0 in range(first, tl.minimum(first + CHUNK_S, end), BLOCK_S):
            s = s0 + tl.arange(0, BLOCK_S)
            kv_off = base + s[:, None] * HD + d[None, :]
            keys = tl.load(k_ptr + kv_off, mask=(s < S)[:, None], other=0.0)
            scores = tl.dot(q, tl.trans(keys), input_precision=PRECISION) * scale_log2  # [R, BLOCK_S]
            scores = tl.where(s[None, :] <= row_pos[:, None], scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            # A row that sees nothing of this chunk keeps m = -inf, l = 0, acc = 0 (no NaN from -inf - -inf).
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(scores - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            values = tl.load(v_ptr + kv_off, mask=(s < S)[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(values.dtype), values, input_precision=PRECISION)
            m_i = m_new
        slot = (kvh * tl.num_programs(1) + chunk) * R + r  # [BLOCK_R] rows of this (head, chunk)
        tl.store(acc_ptr + slot[:, None] * HD + d[None, :], acc)
        tl.store(ml_ptr + slot * 2, m_i)
        tl.store(ml_ptr + slot * 2 + 1, l_i)


@triton.jit
def _attention_combine_kernel(acc_ptr, ml_ptr, pos_ptr, out_ptr, M, R, n_chunks,
                              H: tl.constexpr, G: tl.constexpr, HD: tl.constexpr,
                              BLOCK_R: tl.constexpr, CHUNK_S: tl.constexpr, PDL: tl.constexpr = 0):
    """Program (kv head, row block): merge the chunks in order (a chunk a row cannot see adds
    exactly nothing), normalise, write [n, H * hd]."""
    _start_short_kernel(PDL)
    kvh = tl.program_id(0)
    r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    m = r // G
    valid = m < M
    head = kvh * G + r % G
    d = tl.arange(0, HD)
    used = (tl.load(pos_ptr + M - 1) + CHUNK_S) // CHUNK_S  # chunks up to the last position
    m_run = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    l_run = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, HD], dtype=tl.float32)
    for c in range(0, used):
        slot = (kvh * n_chunks + c) * R + r
        m_c = tl.load(ml_ptr + slot * 2)
        l_c = tl.load(ml_ptr + slot * 2 + 1)
        m_new = tl.maximum(m_run, m_c)  # finite from chunk 0 on: every row sees slot 0
        a = tl.exp2(m_run - m_new)
        b = tl.exp2(m_c - m_new)
        l_run = l_run * a + l_c * b
        acc = acc * a[:, None] + tl.load(acc_ptr + slot[:, None] * HD + d[None, :]) * b[:, None]
        m_run = m_new
    out = (acc / l_run[:, None]).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + (m * H + head)[:, None] * HD + d[None, :], out, mask=valid[:, None])


def attention(q, k_cache, v_cache, pos, n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """q [n, H * hd] at positions pos [n] (consecutive) -> [n, H * hd] over the cached k, v.

    Split over the cache (flash-decoding): one program per KV head, chunk of CHUNK slots and
    block of 16 rows, then a combine kernel; a single loop over a 512-token cache per KV head took
    ~10 us a layer on an H200 (7% of an 8B step), for 8 programs on 132 SMs."""
    n = q.shape[0]
    hd, slots = k_cache.shape[-1], k_cache.shape[1]
    group = n_heads // n_kv_heads
    row_blocks = triton.cdiv(n * group, ROWS)
    rows, n_chunks = row_blocks * ROWS, triton.cdiv(slots, CHUNK)
    partial = torch.empty(n_kv_heads * n_chunks * rows, hd, dtype=torch.float32, device=q.device)
    max_sum = torch.empty(n_kv_heads * n_chunks * rows, 2, dtype=torch.float32, device=q.device)
    _attention_chunk_kernel[(n_kv_heads, n_chunks, row_blocks)](
        q, k_cache, v_cache, pos, partial, max_sum, n, slots, rows, math.log2(math.e) / math.sqrt(hd),
        H=n_heads, G=group, HD=hd, PRECISION=_precision(q), BLOCK_R=ROWS, BLOCK_S=64, CHUNK_S=CHUNK,
        num_warps=4, **_launch_options(q.device))
    out = torch.empty_like(q)
    _attention_combine_kernel[(n_kv_heads, row_blocks)](
        partial, max_sum, pos, out, n, rows, n_chunks, H=n_heads, G=group, HD=hd, BLOCK_R=ROWS, CHUNK_S=CHUNK,
        num_warps=4, **_launch_options(q.device))
    return out


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, y_ptr, D, eps, BLOCK: tl.constexpr, PDL: tl.constexpr = 0):
    _start_short_kernel(PDL)
    row = tl.program_id(0)
    d = tl.arange(0, BLOCK)
    ok = d < D
    x = tl.load(x_ptr + row * D + d, mask=ok, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    w = tl.load(w_ptr + d, mask=ok, other=0.0).to(tl.float32)
    y = ((x * rstd).to(y_ptr.dtype.element_ty).to(tl.float32) * w).to(y_ptr.dtype.element_ty)
    tl.store(y_ptr + row * D + d, y, mask=ok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """llama_net.rms_norm in one kernel (a row per program)."""
    x = x.contiguous()
    y = torch.empty_like(x)
    _rms_norm_kernel[(x.shape[0],)](x, weight, y, x.shape[1], eps, BLOCK=triton.next_power_of_2(x.shape[1]),
                                    **_launch_options(x.device))
    return y


def supports(arch) -> str | None:
    """Why this arch cannot take the fused kernels, or None."""
    hd = arch.head_dim
    if hd < 16 or hd & (hd - 1):  # tensor-core tiles over the head dim
        return f"head dim {hd} is not a power of two >= 16"
    return None


def fused_layer_step(x, attn_norm, wqkv, bqkv, wo, bo, ffn_norm, w13, w2, k_cache, v_cache, pos, mask,
                     cos, sin, kv_len, n_heads, n_kv_heads, eps, math_attention=False) -> torch.Tensor:
    """llama_net.layer_step in nine kernels (same signature; mask, kv_len and math_attention are not
    needed: the attention kernel masks by position and stops at the last one)."""
    qkv = gemv(rms_norm(x, attn_norm, eps), wqkv, bias=bqkv)
    q = rope_and_cache(qkv, cos, sin, pos, k_cache, v_cache, n_heads, n_kv_heads)
    out = attention(q, k_cache, v_cache, pos, n_heads, n_kv_heads)
    h = gemv(out, wo, bias=bo, residual=x)
    act = gemv(rms_norm(h, ffn_norm, eps), w13, swiglu=True)
    return gemv(act, w2, residual=h)
