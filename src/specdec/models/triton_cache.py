"""Keeping a tree's accepted path in a KV cache on the fused path: one Triton kernel for all layers.

After a tree pass that began at cache length `start`, the cache holds the pass's row r at
start + r (SlotModel.forward_ragged). The rows of the accepted path (0 = the root, then
increasing) move to start, start + 1, ... in every layer's k and v: one launch over a table of
the caches' addresses, rather than a gather and a scatter per cache (two launches each, 128 for
an 8B model's 64 caches), since this runs between every tree round.
"""

from __future__ import annotations

import functools
from typing import Sequence

import torch
import triton
import triton.language as tl


@triton.jit
def _move_rows_kernel(table_ptr, like_ptr, moves_ptr, n_moves, S, HD: tl.constexpr, BLOCK_M: tl.constexpr):
    """Program (cache, KV head): cache table_ptr[cache] [Hkv, S, HD] (like like_ptr's dtype) gets
    slot moves_ptr[n_moves + i] <- slot moves_ptr[i] for i < n_moves, BLOCK_M moves at a time.
    Destinations come before their sources (rows move down), so only a block's own sources can be
    overwritten: each block reads all of them before it writes."""
    cache = tl.load(table_ptr + tl.program_id(0)).to(tl.pointer_type(like_ptr.dtype.element_ty))
    head = tl.program_id(1)
    d = tl.arange(0, HD)
    for first in range(0, n_moves, BLOCK_M):
        i = first + tl.arange(0, BLOCK_M)
        live = i < n_moves
        src = tl.load(moves_ptr + i, mask=live, other=0)
        dst = tl.load(moves_ptr + n_moves + i, mask=live, other=0)
        entries = tl.load(cache + (head * S + src)[:, None] * HD + d[None, :], mask=live[:, None])
        tl.debug_barrier()
        tl.store(cache + (head * S + dst)[:, None] * HD + d[None, :], entries, mask=live[:, None])


@functools.cache
def _table(addresses: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """[C] int64 on device: the caches' addresses (a net allocates its caches once, fills them in place)."""
    return torch.tensor(addresses, dtype=torch.int64, device=device)


def path_moves(start: int, rows: Sequence[int], length: int) -> list[tuple[int, int]]:
    """(source, destination) slot offsets past a sequence's base for keeping `rows` of a tree pass
    that began at `start` in a cache of `length` entries: the rows that are not in place already.
    A ValueError unless rows are increasing rows of that pass (a path: the root row 0 first)."""
    rows = list(rows)
    if any(b <= a for a, b in zip(rows, rows[1:])) or (rows and (rows[0] < 0 or start + rows[-1] >= length)):
        raise ValueError(f"keep_rows needs increasing rows of the pass that began at {start}, all below "
                         f"{length - start}; got {rows}")
    return [(start + r, start + i) for i, r in enumerate(rows) if r != i]


def move_rows(net, base: int, moves: list[tuple[int, int]]) -> None:
    """Every layer's k and v cache of `net` [Hkv, S, hd]: slot base + destination gets the entry at
    base + source, for each (source, destination) of path_moves."""
    if not moves:
        return
    caches = tuple(t for layer in net.layers for t in (layer.k_cache, layer.v_cache))
    first = caches[0]
    flat = [base + s for s, _ in moves] + [base + d for _, d in moves]
    table = torch.tensor(flat, dtype=torch.int32).to(first.device, non_blocking=True)
    n_kv, slots, hd = first.shape
    addresses = _table(tuple(c.data_ptr() for c in caches), first.device)
    _move_rows_kernel[(len(caches), n_kv)](addresses, first, table, len(moves), slots, HD=hd, BLOCK_M=16)
