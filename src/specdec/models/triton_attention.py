"""Decode attention in Triton over a cache that holds one sequence or many (flash-decoding).

The query rows of a pass are (token m of a sequence, query head g of a KV head): r = m * G + g,
taken in blocks of ROWS rows that never mix sequences. A block table says, for block b, where its
sequence's tokens start in the pass (tok0), how many it has (ntok), which of the sequence's
rows the block starts at (r0, a multiple of ROWS) and where the sequence's cache starts (base):
token m at position p (inside its own sequence) sees the cache slots base .. base + p.

Programs (KV head, block, chunk of CHUNK slots) compute the unnormalised softmax(q k^T) v of
their rows over their chunk, with the running max and sum (online softmax); a combine program per
(KV head, block) merges the chunks in order. A sequence's rows fall into the same blocks, at the
same lanes, and see the same chunks whatever shares the pass, so a token gets the same bits alone
(NativeLlama's one sequence at slot 0) or in any batch of a slot cache (NativeSlots): rule 6 of
the design. Chunks and rows a row may not see are fully masked and change nothing (their weight is
exactly 0, the others' exactly 1).

A draft tree's rows (AttentionRows.parents) sit at positions start + depth but are cached at
start + row, so masking the keys off a row's path would leave its visible keys at other lanes,
with masked ones between, than the single step of its path sees in its contiguous cache: other
bits. Instead a row reads through its path: in the tiles from the root's position on, lane
start + d holds the key and value of its path's row at depth d (a gather per token of the block;
its G query rows share it), so each tile, lane for lane, is the one the single step reads, and
the tiles before the root are shared and read as for causal rows. A walk up the parents gives the
path (as many loads as the tree is deep), so the pass's metadata grows by one int per row, not a
map per row. Causal blocks take none of this: they load what they loaded before (the block's end
now comes from its table row, not from rope), and their tree loop runs no iteration.

One sequence runs a grid over every (block, chunk) with the chunks past its end doing nothing (the
graph of a step does not know the cache length); a ragged batch brings a work list of the (block,
chunk) pairs that exist (its host knows every length), run by a fixed number of programs: a grid
over every slot of 64 sequences would be mostly empty programs.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from specdec.models.triton_ops import ROWS, _launch_options, _precision, _start_short_kernel

CHUNK = 128  # cache slots per attention program (split-KV): a 512-token context is 4-5 programs per KV head
BLOCK_FIELDS = 5  # a block table row: tok0, ntok, r0, base, span (see AttentionRows)


@triton.jit
def _block(blocks_ptr, rope_ptr, b, M, BLOCK_R: tl.constexpr, ONE: tl.constexpr):
    """Block b's (tok0, ntok, r0, base, end, tail): from the table, or with ONE (a single causal
    sequence of M tokens from slot 0) from b itself, sparing a single step's kernels the dependent
    loads. end: the block's sequence's last position + 1 (chunks and tiles from it on are empty);
    tail: a tree's root position (its rows' keys from there on are read along their paths), -1
    for causal rows. A causal block costs the loads it always did (its end was rope's last entry)."""
    if ONE:
        tok0 = 0
        ntok = M
        r0 = b * BLOCK_R
        base = 0
        end = tl.load(rope_ptr + M - 1) + 1
        tail = -1
    else:
        tok0 = tl.load(blocks_ptr + b * 5)
        ntok = tl.load(blocks_ptr + b * 5 + 1)
        r0 = tl.load(blocks_ptr + b * 5 + 2)
        base = tl.load(blocks_ptr + b * 5 + 3)
        span = tl.load(blocks_ptr + b * 5 + 4)
        end = tl.abs(span)
        tail = -1
        if span < 0:
            tail = tl.load(rope_ptr + tok0)  # row 0 of a tree is its root, at the cache's length
    return tok0, ntok, r0, base, end, tail


@triton.jit
def _online_softmax(raw, s, row_pos, m_i, l_i, scale_log2):
    """One tile of the online softmax: raw q.k [R, BLOCK_S] of keys at positions s [BLOCK_S] ->
    (p [R, BLOCK_S], alpha [R] the old accumulator's factor, new m [R], new l [R]). The causal
    and the tree tiles share this code, so that they round alike."""
    scores = raw * scale_log2
    scores = tl.where(s[None, :] <= row_pos[:, None], scores, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(scores, axis=1))
    # A row that sees nothing of this tile keeps m = -inf, l = 0, acc = 0 (no NaN from -inf - -inf).
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(scores - m_safe[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, axis=1)


@triton.jit
def _path_offsets(rope_ptr, parents_ptr, kvh, S, base, tok0, t, tail, s, HD: tl.constexpr):
    """Where token t of a tree (row t of the sequence whose row 0 is pass token tok0) reads its keys
    and values at positions s [BLOCK_S]: (element offsets [BLOCK_S, HD], ok [BLOCK_S, 1]).
    Position tail + d is t's path's row at depth d, cached at base + tail + that row; positions
    before tail are the cache itself; positions past t's own are masked. So the tile holds, lane
    for lane, what a single step of t's path reads from its contiguous cache."""
    depth = tl.load(rope_ptr + tok0 + t) - tail
    lane_depth = s - tail
    row = tl.where(lane_depth == depth, t, -1)
    cur = t
    for up in range(1, depth + 1):  # from t up to the root: as many steps as the tree is deep
        cur = tl.load(parents_ptr + tok0 + cur)
        row = tl.where(lane_depth == depth - up, cur, row)
    slot = tl.where(lane_depth < 0, base + s, base + tail + row)
    ok = ((lane_depth < 0) | (row >= 0))[:, None]
    return (kvh * S + slot)[:, None] * HD + tl.arange(0, HD)[None, :], ok


@triton.jit
def _attend_chunk(q_ptr, k_ptr, v_ptr, rope_ptr, parents_ptr, acc_ptr, ml_ptr, S, NB, n_chunks, scale_log2,
                  kvh, b, chunk, tok0, ntok, r0, base, end, tail, H: tl.constexpr, G: tl.constexpr,
                  HD: tl.constexpr, PRECISION: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr,
                  CHUNK_S: tl.constexpr):
    """Block b's rows over chunk `chunk` of its sequence's cache (see the module docstring)."""
    first = chunk * CHUNK_S
    if (ntok > 0) & (first < end):
        r = r0 + tl.arange(0, BLOCK_R)
        m = r // G
        valid = m < ntok
        head = kvh * G + r % G
        d = tl.arange(0, HD)
        q = tl.load(q_ptr + ((tok0 + m) * H + head)[:, None] * HD + d[None, :], mask=valid[:, None], other=0.0)
        row_pos = tl.load(rope_ptr + tok0 + m, mask=valid, other=0)
        m_i = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_R], dtype=tl.float32)
        acc = tl.zeros([BLOCK_R, HD], dtype=tl.float32)
        stop = tl.minimum(first + CHUNK_S, end)
        split = stop  # tiles from `split` on hold a tree's rows: read along each token's path
        if tail >= 0:
            split = tl.minimum(stop, first + (tl.maximum(tail, first) - first) // BLOCK_S * BLOCK_S)
        for s0 in range(first, split, BLOCK_S):
            s = s0 + tl.arange(0, BLOCK_S)
            kv_off = (kvh * S + base + s)[:, None] * HD + d[None, :]
            inside = (base + s < S)[:, None]
            keys = tl.load(k_ptr + kv_off, mask=inside, other=0.0)
            raw = tl.dot(q, tl.trans(keys), input_precision=PRECISION)  # [R, BLOCK_S]
            p, alpha, m_i, l_i = _online_softmax(raw, s, row_pos, m_i, l_i, scale_log2)
            values = tl.load(v_ptr + kv_off, mask=inside, other=0.0)
            acc = tl.dot(p.to(values.dtype), values, acc * alpha[:, None], input_precision=PRECISION)
        # A tree's tiles: one gather of keys (and of values) per token of the block, its G rows
        # taking their products from it alone. Each row gets its own tile's dot and the others' exact
        # zeros (p is 0 off its token), so its arithmetic is the causal tile's above.
        t_lo = r0 // G
        t_hi = tl.minimum(ntok, (r0 + BLOCK_R + G - 1) // G)
        for s0 in range(split, stop, BLOCK_S):
            s = s0 + tl.arange(0, BLOCK_S)
            raw = tl.zeros([BLOCK_R, BLOCK_S], dtype=tl.float32)
            for t in range(t_lo, t_hi):
                off, ok = _path_offsets(rope_ptr, parents_ptr, kvh, S, base, tok0, t, tail, s, HD)
                keys = tl.load(k_ptr + off, mask=ok, other=0.0)
                raw = tl.where((m == t)[:, None], tl.dot(q, tl.trans(keys), input_precision=PRECISION), raw)
            p, alpha, m_i, l_i = _online_softmax(raw, s, row_pos, m_i, l_i, scale_log2)
            acc = acc * alpha[:, None]
            for t in range(t_lo, t_hi):
                off, ok = _path_offsets(rope_ptr, parents_ptr, kvh, S, base, tok0, t, tail, s, HD)
                values = tl.load(v_ptr + off, mask=ok, other=0.0)
                mine = tl.where((m == t)[:, None], p, 0.0).to(values.dtype)
                acc = tl.dot(mine, values, acc, input_precision=PRECISION)
        slot = ((kvh * NB + b) * n_chunks + chunk) * BLOCK_R + tl.arange(0, BLOCK_R)
        tl.store(acc_ptr + slot[:, None] * HD + d[None, :], acc)
        tl.store(ml_ptr + slot * 2, m_i)
        tl.store(ml_ptr + slot * 2 + 1, l_i)


@triton.jit
def _attention_chunk_kernel(q_ptr, k_ptr, v_ptr, rope_ptr, parents_ptr, blocks_ptr, work_ptr, count_ptr, acc_ptr,
                            ml_ptr, S, NB, n_chunks, M, scale_log2, H: tl.constexpr, G: tl.constexpr,
                            HD: tl.constexpr, PRECISION: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr,
                            CHUNK_S: tl.constexpr, WORKLIST: tl.constexpr, ONE: tl.constexpr, PDL: tl.constexpr = 0):
    """Grid (KV head, chunk, block), or with WORKLIST (KV head, P): program p runs the work list's
    (block, chunk) pairs p, p + P, ... of the count_ptr[0] there are. ONE: see _block."""
    _start_short_kernel(PDL)
    kvh = tl.program_id(0)
    if WORKLIST:
        for i in range(tl.program_id(1), tl.load(count_ptr), tl.num_programs(1)):
            b = tl.load(work_ptr + 2 * i)
            tok0, ntok, r0, base, end, tail = _block(blocks_ptr, rope_ptr, b, M, BLOCK_R, ONE)
            _attend_chunk(q_ptr, k_ptr, v_ptr, rope_ptr, parents_ptr, acc_ptr, ml_ptr, S, NB, n_chunks, scale_log2,
                          kvh, b, tl.load(work_ptr + 2 * i + 1), tok0, ntok, r0, base, end, tail, H, G, HD,
                          PRECISION, BLOCK_R, BLOCK_S, CHUNK_S)
    else:
        b = tl.program_id(2)
        tok0, ntok, r0, base, end, tail = _block(blocks_ptr, rope_ptr, b, M, BLOCK_R, ONE)
        _attend_chunk(q_ptr, k_ptr, v_ptr, rope_ptr, parents_ptr, acc_ptr, ml_ptr, S, NB, n_chunks, scale_log2,
                      kvh, b, tl.program_id(1), tok0, ntok, r0, base, end, tail, H, G, HD, PRECISION, BLOCK_R,
                      BLOCK_S, CHUNK_S)


@triton.jit
def _attention_combine_kernel(acc_ptr, ml_ptr, rope_ptr, blocks_ptr, out_ptr, NB, n_chunks, M,
                              H: tl.constexpr, G: tl.constexpr, HD: tl.constexpr, BLOCK_R: tl.constexpr,
                              CHUNK_S: tl.constexpr, ONE: tl.constexpr, PDL: tl.constexpr = 0):
    """Program (kv head, block): merge the block's chunks in order (a chunk a row cannot see adds
    exactly nothing), normalise, write its rows of out [T, H * hd]."""
    _start_short_kernel(PDL)
    kvh = tl.program_id(0)
    b = tl.program_id(1)
    tok0, ntok, r0, _, end, _ = _block(blocks_ptr, rope_ptr, b, M, BLOCK_R, ONE)
    if ntok > 0:
        r = r0 + tl.arange(0, BLOCK_R)
        m = r // G
        valid = m < ntok
        head = kvh * G + r % G
        d = tl.arange(0, HD)
        used = (end + CHUNK_S - 1) // CHUNK_S  # chunks up to the last position
        m_run = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
        l_run = tl.zeros([BLOCK_R], dtype=tl.float32)
        acc = tl.zeros([BLOCK_R, HD], dtype=tl.float32)
        for c in range(0, used):
            slot = ((kvh * NB + b) * n_chunks + c) * BLOCK_R + tl.arange(0, BLOCK_R)
            m_c = tl.load(ml_ptr + slot * 2)
            l_c = tl.load(ml_ptr + slot * 2 + 1)
            m_new = tl.maximum(m_run, m_c)  # finite from chunk 0 on: every row sees its slot 0
            a = tl.exp2(m_run - m_new)
            w = tl.exp2(m_c - m_new)
            l_run = l_run * a + l_c * w
            acc = acc * a[:, None] + tl.load(acc_ptr + slot[:, None] * HD + d[None, :]) * w[:, None]
            m_run = m_new
        out = (acc / l_run[:, None]).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + ((tok0 + m) * H + head)[:, None] * HD + d[None, :], out, mask=valid[:, None])


@dataclass(frozen=True)
class AttentionRows:
    """Where a pass's rows attend (device tensors): blocks [NB, 5] int32 (tok0, ntok, r0, base,
    span; a block with ntok 0 is padding), chunks: the most CHUNK-slot chunks any sequence may span.
    span: the block's sequence's last position + 1 for causal rows; minus that for a tree's rows
    (its largest position + 1), whose row 0 (pass token tok0) is the root and which read their
    keys past the root's position along their paths (parents). work: None (grid over every block
    and chunk) or (pairs [W, 2] int32 (block, chunk), count [1] int32: the pairs in use). one: the
    table is blocks_of(M, G), one causal sequence from slot 0, which the kernels then work out for
    themselves. parents: [T] int32, each tree row's parent row inside its own sequence (-1: the
    root; read by a tree's blocks only), None when no block is a tree's."""

    blocks: torch.Tensor
    chunks: int
    work: tuple[torch.Tensor, torch.Tensor] | None = None
    one: bool = False
    parents: torch.Tensor | None = None


def blocks_of(ntok: int, group: int, tok0: int = 0, base: int = 0, span: int | None = None) -> list[list[int]]:
    """The block table rows of one sequence of ntok tokens (its rows m * G + g in blocks of ROWS);
    span as AttentionRows says (None: ntok, causal rows from position 0)."""
    return [[tok0, ntok, r0, base, ntok if span is None else span] for r0 in range(0, ntok * group, ROWS)]


@functools.cache
def one_sequence(ntok: int, group: int, slots: int, device: torch.device) -> AttentionRows:
    """NativeLlama's pass: one sequence of ntok tokens from cache slot 0 (made once per shape, outside
    any graph capture: its warm-up runs come first)."""
    table = torch.tensor(blocks_of(ntok, group), dtype=torch.int32, device=device)
    return AttentionRows(table, triton.cdiv(slots, CHUNK), one=True)


def work_list(blocks: list[list[int]]) -> list[list[int]]:
    """The (block, chunk) pairs of a ragged pass: each block with the chunks its sequence reaches
    (up to its span's end; none for a padding block)."""
    return [[b, c] for b, block in enumerate(blocks) if block[1] for c in range(triton.cdiv(abs(block[4]), CHUNK))]


@functools.cache
def _programs(device: torch.device, n_kv_heads: int) -> int:
    """Programs per KV head that run a work list: two per SM in all."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return max(1, 2 * sms // n_kv_heads)


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, rope: torch.Tensor,
              rows: AttentionRows, n_heads: int, n_kv_heads: int) -> torch.Tensor:
    """q [T, H * hd] (rotated, at positions rope [T] inside their sequences) -> [T, H * hd] over the
    cached k, v [Hkv, S, hd], as rows says. Rows of no block (padding) come out 0."""
    hd, slots = k_cache.shape[-1], k_cache.shape[1]
    group = n_heads // n_kv_heads
    nb = rows.blocks.shape[0]
    partial = torch.empty(n_kv_heads * nb * rows.chunks * ROWS, hd, dtype=torch.float32, device=q.device)
    max_sum = torch.empty(n_kv_heads * nb * rows.chunks * ROWS, 2, dtype=torch.float32, device=q.device)
    if rows.work is None:
        grid, (pairs, count) = (n_kv_heads, rows.chunks, nb), (rows.blocks, rows.blocks)  # unused pointers
    else:
        pairs, count = rows.work
        grid = (n_kv_heads, min(_programs(q.device, n_kv_heads), max(1, pairs.shape[0])))
    parents = rows.blocks if rows.parents is None else rows.parents  # read by a tree's blocks only
    _attention_chunk_kernel[grid](
        q, k_cache, v_cache, rope, parents, rows.blocks, pairs, count, partial, max_sum, slots, nb, rows.chunks,
        q.shape[0], math.log2(math.e) / math.sqrt(hd), H=n_heads, G=group, HD=hd, PRECISION=_precision(q), BLOCK_R=ROWS,
        BLOCK_S=64, CHUNK_S=CHUNK, WORKLIST=rows.work is not None, ONE=rows.one, num_warps=4,
        **_launch_options(q.device))
    out = torch.empty_like(q) if rows.work is None else torch.zeros_like(q)
    _attention_combine_kernel[(n_kv_heads, nb)](
        partial, max_sum, rope, rows.blocks, out, nb, rows.chunks, q.shape[0], H=n_heads, G=group, HD=hd,
        BLOCK_R=ROWS, CHUNK_S=CHUNK, ONE=rows.one, num_warps=4, **_launch_options(q.device))
    return out
