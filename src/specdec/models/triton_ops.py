"""Fused decode kernels in Triton for the native Llama path on CUDA: one decoder layer in six launches.

A decode step at batch 1 reads every weight once; what costs time beyond that is the number of
kernels (each pays a launch and a ramp-up/tail of a few microseconds inside a CUDA graph) and
matrix-vector products that leave bandwidth unused on small matrices. Measured on an H200 the
torch-compiled layer lost ~40 us per layer to this, for the 8B and the 1B shape alike
(docs/gpu.md). Here a layer is:

1. `qkv_rope`: the fused q/k/v matrix (+ bias) with RoPE in its epilogue; q out, k and v straight
   into the cache at their positions;
2. `attention`: softmax(q k^T) v over the cache, causal by position, split over the cache in
   chunks (online softmax per chunk, then a combine kernel: two launches);
3. `gemv_then_norm(residual=x)`: the output projection with the residual add in its epilogue;
4. `gemv(swiglu=True)`: the fused gate/up matrix and silu(gate) * up;
5. `gemv_then_norm(residual=h)`: the down projection with the residual add.

RMSNorm has no kernel: rms_norm(x) @ W.T = rstd * ((x * g) @ W.T). The epilogue that writes x
also writes x * g (g: the next norm's weight) and x's sum of squares over its column tile
(`NormInput`); the next GEMV adds those sums in a fixed order for each row's rstd and scales its
accumulator before rounding. `embed` does the same for the first layer (it also gathers the
embedding rows), and `forward` runs a whole step. Three launches a layer fewer than the
nine before (a norm before each of two GEMVs, RoPE on its own): an H200 step 4% faster, 1B and 8B
shapes alike (docs/gpu.md).

Exactness by construction: every kernel computes each token row with the same tile sizes and the
same reduction order whatever the number of rows (row blocks are always ROWS = 16 wide; the
tensor-core products treat rows independently; the tile tuner is keyed on the matrix shape only, so a
1-token step and a verify step of the same model use one configuration; a load that feeds a sum
has the same layout whatever the row count, see `_rstd`). So row i of a verify
pass gets bit-for-bit the logits a single-token step would give (checked on an H200 by `specdec
bench gpu`), and greedy speculative output equals plain greedy output in bf16 too, with no padded
rows. The attention runs to the last row's position; blocks and chunks that a row may not see
are fully masked and change nothing (their weight is exactly 0, the others' exactly 1).

Launches: on Hopper and later every kernel is launched with programmatic dependent launch (PDL):
it is scheduled while the previous kernel finishes and waits on the GPU for its inputs, which in
a CUDA graph removes most of the gap between kernels (an H200 1B-shape step 4% faster, 8B 1%).

The elementwise epilogues round where torch rounds (bf16 after the matmul, after silu, after the
residual add), so results stay within bf16 noise of the torch path (the folded norm rounds once
where torch rounds twice: x * g, then the product). Runs on the CPU through
Triton's interpreter (TRITON_INTERPRET=1, fp32/fp16 only) for the tests.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

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
def _gemv_loop(x_ptr, w_ptr, rm, rn, rn2, row_ok, col_ok, K, k_first, k_stop, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, TWO: tl.constexpr,
               PRECISION: tl.constexpr):
    """sum over k in [k_first, k_stop) of x[rm, k] * w[rn, k] ([rows, cols] fp32), and of w[rn2, k]
    too when TWO. Nothing but loads and tensor-core products in the loop: a norm or scale applied to
    x here slowed the weight stream itself (docs/gpu.md), so inputs come normalised or scaled."""
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_first, k_stop, BLOCK_K):
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
        if TWO:
            w2 = tl.load(w_ptr + rn2[:, None] * K + kk[None, :], mask=w_mask, other=0.0)
            acc2 += tl.dot(x, tl.trans(w2), input_precision=PRECISION)
    return acc, acc2


@triton.jit
def _split_k_sum(acc, acc2, part_ptr, count_ptr, split, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 TWO: tl.constexpr, SPLIT: tl.constexpr):
    """-> (whether this program completes its tile, the tile's sums). SPLIT > 1: each of the tile's
    programs (m, n, s) leaves an fp32 partial; the one that brings the tile's count to SPLIT (an
    atomic count) adds them in the fixed order 0..SPLIT-1, so the result is deterministic and a row's
    arithmetic does not depend on the row count, and sets the count back to 0 for the next GEMV."""
    if SPLIT == 1:
        done = True
        total = acc
        total2 = acc2
    else:
        rows = tl.num_programs(0) * BLOCK_M
        cols = tl.num_programs(1) * BLOCK_N
        cell = ((tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M))[:, None] * cols
                + (tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N))[None, :])  # partials: [SPLIT, 2, rows, cols]
        tl.store(part_ptr + (split * 2 * rows) * cols + cell, acc)
        if TWO:
            tl.store(part_ptr + ((split * 2 + 1) * rows) * cols + cell, acc2)
        tl.debug_barrier()  # every thread's partial is written before the count says so
        tile = tl.program_id(1) * tl.num_programs(0) + tl.program_id(0)
        done = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel") == SPLIT - 1  # the last of the tile
        total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        total2 = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        if done:
            for s in tl.static_range(SPLIT):
                total += tl.load(part_ptr + (s * 2 * rows) * cols + cell, cache_modifier=".cg")
                if TWO:
                    total2 += tl.load(part_ptr + ((s * 2 + 1) * rows) * cols + cell, cache_modifier=".cg")
            tl.atomic_xchg(count_ptr + tile, 0)  # ready for the next GEMV (kernels run one after another)
    return done, total, total2


@triton.jit
def _rstd(sq_ptr, rm, row_ok, T, eps, D, T_BLOCK: tl.constexpr):
    """1 / rms of rows rm of a [M, D] input from its T per-tile sums of squares (sq: [M, T]):
    RMSNorm without a kernel of its own (the kernel that wrote the input left them). sq is row-major
    so that this load has one layout, hence one order of the sum, whatever M is: laid out [T, M], its
    layout followed M's specialisation (M = 1 against 9), and on an H200 a verify pass then no longer
    gave single steps' bits."""
    t = tl.arange(0, T_BLOCK)
    parts = tl.load(sq_ptr + rm[:, None] * T + t[None, :], mask=row_ok[:, None] & (t < T)[None, :], other=0.0)
    return 1.0 / tl.sqrt(tl.sum(parts, axis=1) / D + eps)


@triton.jit
def _gemv_epilogue(acc, acc_up, b_ptr, r_ptr, y_ptr, g_ptr, scaled_ptr, sq_out_ptr, rm, rn, row_ok, col_ok, M, N,
                   HAS_BIAS: tl.constexpr, RESIDUAL: tl.constexpr, SWIGLU: tl.constexpr, EMIT: tl.constexpr):
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
    if EMIT:  # the next RMSNorm's input: y * its weight, and y's sum of squares over this tile's columns
        o32 = tl.where(mask, out.to(tl.float32), 0.0)
        g = tl.load(g_ptr + rn, mask=col_ok, other=0.0).to(tl.float32)
        tl.store(scaled_ptr + ptrs, (o32 * g[None, :]).to(dtype), mask=mask)
        tl.store(sq_out_ptr + rm * tl.num_programs(1) + tl.program_id(1), tl.sum(o32 * o32, axis=1), mask=row_ok)


@triton.heuristics({"EVEN_K": lambda a: a["K"] % a["BLOCK_K"] == 0})
@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, r_ptr, y_ptr, sq_in_ptr, g_ptr, scaled_ptr, sq_out_ptr, part_ptr, count_ptr,
                 M, N, K, k_per_split, T_in, eps,
                 HAS_BIAS: tl.constexpr, RESIDUAL: tl.constexpr, SWIGLU: tl.constexpr, NORMED: tl.constexpr,
                 EMIT: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, SPLIT: tl.constexpr, EVEN_K: tl.constexpr, T_BLOCK: tl.constexpr = 1,
                 PDL: tl.constexpr = 0):
    """y[m, n] = epilogue(sum_k x[m, k] * w[n, k]); with SWIGLU, w has 2N rows (gate, up).

    NORMED: x is rms_norm's input times the norm weight, and the accumulator is scaled by each
    row's rstd (from the sums of squares sq_in, [M, T_in]) before rounding: rms_norm(x0) @ w.T =
    rstd * ((x0 * g) @ w.T). EMIT: also write y * g and y's sums of squares per column tile
    ([M, N / BLOCK_N]), the next NORMED GEMV's inputs. SPLIT > 1 (split-K, for matrices too small to
    keep every SM streaming): see _split_k_sum."""
    pid_m, pid_n, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rm < M
    col_ok = rn < N
    _wait_for_inputs(PDL)
    k_first = split * k_per_split
    acc, acc_up = _gemv_loop(x_ptr, w_ptr, rm, rn, rn + N, row_ok, col_ok, K, k_first,
                             tl.minimum(k_first + k_per_split, K), BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, SWIGLU, PRECISION)
    _let_next_start(PDL)
    done, acc, acc_up = _split_k_sum(acc, acc_up, part_ptr, count_ptr, split, BLOCK_M, BLOCK_N, SWIGLU, SPLIT)
    if done:
        if NORMED:
            rstd = _rstd(sq_in_ptr, rm, row_ok, T_in, eps, K, T_BLOCK)[:, None]
            acc *= rstd
            acc_up *= rstd
        _gemv_epilogue(acc, acc_up, b_ptr, r_ptr, y_ptr, g_ptr, scaled_ptr, sq_out_ptr, rm, rn, row_ok, col_ok,
                       M, N, HAS_BIAS, RESIDUAL, SWIGLU, EMIT)


@triton.heuristics({"EVEN_K": lambda a: a["K"] % a["BLOCK_K"] == 0})
@triton.jit
def _qkv_rope_kernel(x_ptr, w_ptr, b_ptr, sq_ptr, cos_ptr, sin_ptr, pos_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
                     part_ptr, count_ptr, M, K, S, k_per_split, T_in, eps,
                     H: tl.constexpr, HKV: tl.constexpr, HD: tl.constexpr, HAS_BIAS: tl.constexpr,
                     PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     SPLIT: tl.constexpr, EVEN_K: tl.constexpr, T_BLOCK: tl.constexpr = 1, PDL: tl.constexpr = 0):
    """The q/k/v GEMV of normalised x (as _gemv_kernel's NORMED) with RoPE in its epilogue: program
    (m, n, s) takes the same BLOCK_N columns of both halves of one head, so it holds each pair that
    RoPE rotates together; q heads go to q [M, H * hd], k and v heads into the caches [Hkv, S, hd]
    at slot pos[m]. cos/sin: the net's tables [S, hd], read at each row's position."""
    half: tl.constexpr = HD // 2
    per_head: tl.constexpr = half // BLOCK_N
    pid_m, pid_n, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    head = pid_n // per_head
    d = (pid_n % per_head) * BLOCK_N + tl.arange(0, BLOCK_N)  # columns within the first half of the head
    rn = head * HD + d
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rm < M
    _wait_for_inputs(PDL)
    k_first = split * k_per_split
    acc1, acc2 = _gemv_loop(x_ptr, w_ptr, rm, rn, rn + half, row_ok, rn >= 0, K, k_first,
                            tl.minimum(k_first + k_per_split, K), BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, True, PRECISION)
    _let_next_start(PDL)
    done, acc1, acc2 = _split_k_sum(acc1, acc2, part_ptr, count_ptr, split, BLOCK_M, BLOCK_N, True, SPLIT)
    if done:
        dtype = q_ptr.dtype.element_ty
        rstd = _rstd(sq_ptr, rm, row_ok, T_in, eps, K, T_BLOCK)[:, None]
        y1 = acc1 * rstd
        y2 = acc2 * rstd
        if HAS_BIAS:
            y1 += tl.load(b_ptr + rn).to(tl.float32)[None, :]
            y2 += tl.load(b_ptr + rn + half).to(tl.float32)[None, :]
        x1 = y1.to(dtype)
        x2 = y2.to(dtype)
        slot = tl.load(pos_ptr + rm, mask=row_ok, other=0)
        mask = row_ok[:, None]
        if head < H + HKV:  # q or k: x * cos + rotate_half(x) * sin, each product rounded as torch does
            c = tl.load(cos_ptr + slot[:, None] * HD + d[None, :], mask=mask, other=0.0).to(tl.float32)
            s = tl.load(sin_ptr + slot[:, None] * HD + d[None, :], mask=mask, other=0.0).to(tl.float32)
            a1 = x1.to(tl.float32)
            a2 = x2.to(tl.float32)
            r1 = ((a1 * c).to(dtype).to(tl.float32) + (-a2 * s).to(dtype).to(tl.float32)).to(dtype)
            r2 = ((a2 * c).to(dtype).to(tl.float32) + (a1 * s).to(dtype).to(tl.float32)).to(dtype)
            if head < H:
                dst = q_ptr + rm[:, None] * (H * HD) + head * HD + d[None, :]
            else:
                dst = k_cache_ptr + ((head - H) * S + slot[:, None]) * HD + d[None, :]
            tl.store(dst, r1, mask=mask)
            tl.store(dst + half, r2, mask=mask)
        else:
            dst = v_cache_ptr + ((head - H - HKV) * S + slot[:, None]) * HD + d[None, :]
            tl.store(dst, x1, mask=mask)
            tl.store(dst + half, x2, mask=mask)


_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def uses_pdl(device: torch.device) -> bool:
    """Programmatic dependent launch on Hopper and later (each kernel is scheduled during the
    previous one's tail and waits on the GPU for its inputs; in a CUDA graph this saves the gap
    between kernels: an H200 1B-shape step 4% faster, 8B 1%, the logits bit for bit the same;
    results/gpu-h200-pdl-modes.txt); plain launches elsewhere and in the interpreter."""
    return (not _INTERPRETED and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9
            and hasattr(tl.extra.cuda, "gdc_wait"))


def _launch_options(device: torch.device) -> dict:
    return {"PDL": 1, "launch_pdl": True} if uses_pdl(device) else {"PDL": 0}


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


@dataclass(frozen=True)
class NormInput:
    """The input of rms_norm(x) @ w.T without a norm kernel: `scaled` = x * g [n, D] (g: the norm's
    weight) and x's sums of squares per column tile, `sq` [n, T]; the GEMV scales its accumulator by
    rstd = 1 / sqrt(sum(sq) / D + eps) (both written by the kernel that wrote x)."""
    scaled: torch.Tensor
    sq: torch.Tensor
    eps: float


def _split_parts(grid: tuple[int, int, int], block_n: int, device: torch.device) -> torch.Tensor:
    """fp32 partials [split, 2, rows, cols] of a split-K launch over `grid` (unsplit: any tensor, never written)."""
    row_blocks, col_blocks, split = grid
    if split == 1:
        return _tile_counters(device)
    if row_blocks * col_blocks > MAX_TILES:
        raise ValueError(f"split-K GEMV of {row_blocks * col_blocks} tiles: more than MAX_TILES")
    return torch.empty(split, 2, row_blocks * ROWS, col_blocks * block_n, dtype=torch.float32, device=device)


def _gemv(x: torch.Tensor | NormInput, w, bias, residual, swiglu: bool, next_norm: torch.Tensor | None):
    """The one GEMV launcher (see gemv): -> y [n, N], y * next_norm [n, N], sums of squares [n, T]
    (the last two only with next_norm)."""
    normed = x if isinstance(x, NormInput) else None
    x = (normed.scaled if normed is not None else x).contiguous()
    m, k = x.shape
    n = w.shape[0] // 2 if swiglu else w.shape[0]
    flags = dict(HAS_BIAS=bias is not None, RESIDUAL=residual is not None, SWIGLU=swiglu,
                 NORMED=normed is not None, EMIT=next_norm is not None)
    t_in = normed.sq.shape[1] if normed is not None else 1
    operands = (bias, None if residual is None else residual.contiguous(), None if normed is None else normed.sq,
                next_norm)
    out = {}

    def launch(weight, tile):
        block_n, block_k, warps, stages, split = tile
        y = torch.empty(m, n, dtype=x.dtype, device=x.device)
        # Row blocks vary fastest: the programs of one weight tile run side by side and share its
        # reads through L2, so a pass of more than 16 rows does not stream the weights again per block.
        grid = (triton.cdiv(m, ROWS), triton.cdiv(n, block_n), split)
        scaled = torch.empty_like(y) if next_norm is not None else y
        sq_out = torch.empty(m, grid[1], dtype=torch.float32, device=x.device) if next_norm is not None else y
        b, res, sq, g = (y if a is None else a for a in operands)  # unused operands: any pointer (never read)
        _gemv_kernel[grid](
            x, weight, b, res, y, sq, g, scaled, sq_out, _split_parts(grid, block_n, x.device),
            _tile_counters(x.device), m, n, k, triton.cdiv(triton.cdiv(k, split), block_k) * block_k, t_in,
            0.0 if normed is None else normed.eps, **flags, PRECISION=_precision(x), BLOCK_M=ROWS, BLOCK_N=block_n,
            BLOCK_K=block_k, SPLIT=split, T_BLOCK=triton.next_power_of_2(t_in), num_warps=warps,
            num_stages=stages, **_launch_options(x.device))
        out.update(y=y, scaled=scaled, sq=sq_out)
        return y

    key = (n, k, tuple(flags.values()), x.dtype, x.device)
    if key not in _chosen_tiles:
        _chosen_tiles[key] = INTERPRETER_TILE if _INTERPRETED else _tune(launch, w)
    launch(w, _chosen_tiles[key])
    return out["y"], out["scaled"], out["sq"]


def gemv(x: torch.Tensor | NormInput, w: torch.Tensor, bias: torch.Tensor | None = None,
         residual: torch.Tensor | None = None, swiglu: bool = False) -> torch.Tensor:
    """x [n, K] @ w[N', K].T for a few rows n, with optional bias, silu(gate) * up over the two
    halves of w's rows (N = N' / 2), and residual add. x may be a NormInput: then this is
    rms_norm(x0) @ w.T, the norm folded into the accumulator."""
    return _gemv(x, w, bias, residual, swiglu, None)[0]


def gemv_then_norm(x: torch.Tensor | NormInput, w: torch.Tensor, next_norm: torch.Tensor, eps: float,
                   bias: torch.Tensor | None = None, residual: torch.Tensor | None = None):
    """gemv, and the input of the next RMSNorm (weight next_norm) from the same epilogue:
    -> (y [n, N], NormInput of y)."""
    y, scaled, sq = _gemv(x, w, bias, residual, False, next_norm)
    return y, NormInput(scaled, sq, eps)


def cold_copies(w: torch.Tensor) -> list[torch.Tensor]:
    """w and clones of it, 64 MB or more in all (at most 8): a timing loop cycling them reads
    weights from HBM, as a model's step does, not from L2."""
    return [w] + [w.clone() for _ in range(min(7, -(-(64 << 20) // (w.numel() * w.element_size())) - 1))]


def _tune(launch, w: torch.Tensor, tiles: list[tuple] = TILES) -> tuple:
    """The fastest tile for this matrix shape, timed as the model runs it: inside a CUDA graph
    (no host launch cost, which would swamp a 5-us kernel) and streaming weights that are not in
    L2 (copies cycled through, 64 MB or more in all). Keyed on the shape, never on the row count,
    so every step of a model uses one tile (the exactness above needs that)."""
    if torch.cuda.is_current_stream_capturing():  # cannot time inside someone's capture: the first tile
        return tiles[0]
    copies = cold_copies(w)
    timings = {}
    for tile in tiles:
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


def qkv_rope(inp: NormInput, w: torch.Tensor, bias: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
             pos: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, n_heads: int,
             n_kv_heads: int) -> torch.Tensor:
    """rms_norm(x) @ wqkv.T (+ bias) with RoPE, in one kernel: -> rotated q [n, H * hd]; rotated k and
    v go to the caches [Hkv, S, hd] at slots pos [n]. cos, sin: the tables [S, hd]."""
    x = inp.scaled.contiguous()
    m, k = x.shape
    hd, slots = k_cache.shape[-1], k_cache.shape[1]
    heads = n_heads + 2 * n_kv_heads
    t_in = inp.sq.shape[1]
    q = torch.empty(m, n_heads * hd, dtype=x.dtype, device=x.device)

    def launch(weight, tile):
        block_n, block_k, warps, stages, split = tile
        grid = (triton.cdiv(m, ROWS), heads * (hd // 2 // block_n), split)
        _qkv_rope_kernel[grid](
            x, weight, weight if bias is None else bias, inp.sq, cos, sin, pos, q, k_cache, v_cache,
            _split_parts(grid, block_n, x.device), _tile_counters(x.device), m, k, slots,
            triton.cdiv(triton.cdiv(k, split), block_k) * block_k, t_in, inp.eps, H=n_heads, HKV=n_kv_heads, HD=hd,
            HAS_BIAS=bias is not None, PRECISION=_precision(x), BLOCK_M=ROWS, BLOCK_N=block_n, BLOCK_K=block_k,
            SPLIT=split, T_BLOCK=triton.next_power_of_2(t_in), num_warps=warps, num_stages=stages,
            **_launch_options(x.device))
        return q

    key = ("qkv-rope", heads * hd, k, hd, bias is not None, x.dtype, x.device)
    if key not in _chosen_tiles:  # a tile holds columns of one half of a head: BLOCK_N divides hd / 2
        tiles = [t for t in TILES if (hd // 2) % t[0] == 0]
        _chosen_tiles[key] = INTERPRETER_TILE if _INTERPRETED else _tune(launch, w, tiles)
    return launch(w, _chosen_tiles[key])


@triton.jit
def _embed_kernel(tokens_ptr, table_ptr, g_ptr, x_ptr, scaled_ptr, sq_ptr, D, BLOCK: tl.constexpr,
                  PDL: tl.constexpr = 0):
    """Program m: x[m] = table[tokens[m]], x[m] * g and x[m]'s sum of squares (one tile: the row)."""
    _start_short_kernel(PDL)
    row = tl.program_id(0)
    d = tl.arange(0, BLOCK)
    ok = d < D
    token = tl.load(tokens_ptr + row)
    x = tl.load(table_ptr + token * D + d, mask=ok, other=0.0)
    tl.store(x_ptr + row * D + d, x, mask=ok)
    x32 = x.to(tl.float32)
    g = tl.load(g_ptr + d, mask=ok, other=0.0).to(tl.float32)
    tl.store(scaled_ptr + row * D + d, (x32 * g).to(x_ptr.dtype.element_ty), mask=ok)
    tl.store(sq_ptr + row, tl.sum(x32 * x32, axis=0))


def embed(tokens: torch.Tensor, table: torch.Tensor, norm: torch.Tensor, eps: float) -> tuple[torch.Tensor, NormInput]:
    """tokens [n] -> their rows of the embedding table [n, D], and the first layer's NormInput."""
    n, d = tokens.shape[0], table.shape[1]
    x = torch.empty(n, d, dtype=table.dtype, device=table.device)
    scaled = torch.empty_like(x)
    sq = torch.empty(n, 1, dtype=torch.float32, device=table.device)
    _embed_kernel[(n,)](tokens, table, norm, x, scaled, sq, d, BLOCK=triton.next_power_of_2(d),
                        **_launch_options(table.device))
    return x, NormInput(scaled, sq, eps)


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
    if hd < 32 or hd & (hd - 1):  # tensor-core tiles of 16 columns in each half of a head
        return f"head dim {hd} is not a power of two >= 32"
    return None


def fused_layer_step(x: torch.Tensor, inp: NormInput, block, pos: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor, arch, next_norm: torch.Tensor | None) -> tuple[torch.Tensor, NormInput | None]:
    """One decoder layer in six kernels: x [n, D] (and its NormInput) -> the layer's output and the
    next layer's NormInput (next_norm: that layer's attn_norm; None after the last layer)."""
    eps = arch.norm_eps
    q = qkv_rope(inp, block.wqkv.weight, block.wqkv.bias, cos, sin, pos, block.k_cache, block.v_cache,
                 arch.n_heads, arch.n_kv_heads)
    out = attention(q, block.k_cache, block.v_cache, pos, arch.n_heads, arch.n_kv_heads)
    h, h_in = gemv_then_norm(out, block.wo.weight, block.ffn_norm, eps, bias=block.wo.bias, residual=x)
    act = gemv(h_in, block.w13.weight, swiglu=True)
    if next_norm is None:
        return gemv(act, block.w2.weight, residual=h), None
    return gemv_then_norm(act, block.w2.weight, next_norm, eps, residual=h)


def forward(net, tokens: torch.Tensor, pos: torch.Tensor,
            capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """LlamaNet.forward_static through these kernels: tokens, pos [n] -> logits [n, V], features
    [n, (len(capture) + 1) * D] (the outputs of the layers in `capture`, then the final-norm features)."""
    a = net.arch
    layers = net.layers
    x, inp = embed(tokens, net.embed.weight, layers[0].attn_norm, a.norm_eps)
    captured = []
    for i, block in enumerate(layers):
        next_norm = layers[i + 1].attn_norm if i + 1 < len(layers) else None
        x, inp = fused_layer_step(x, inp, block, pos, net.cos, net.sin, a, next_norm)
        if i in capture:
            captured.append(x)  # a new tensor per layer: nothing overwrites it
    hidden = rms_norm(x, net.norm, a.norm_eps)  # [n, D]
    features = torch.cat(captured + [hidden], dim=-1) if captured else hidden
    return gemv(hidden, net.lm_weight()), features
