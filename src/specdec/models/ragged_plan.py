"""Where the rows of one ragged pass go, built on the host and sent to the GPU in one copy.

A NativeSlots pass on the fused kernels needs, per row, the cache slot its k and v go to and its
position inside its own sequence, the attention block table and work list
(triton_attention), and which rows feed the LM head's outputs the caller wants. The host knows
every sequence's cache length, so it builds all of them as one int32 array; a CUDA graph of a
fixed row capacity keeps one such array (MetaLayout) and each step copies into it once. A draft
tree only changes what the array says (its rows' positions start + depth, their parents, a
negative span in its blocks), so one graph runs causal passes and trees alike. Rows past
the pass's real ones (padding up to the graph's capacity) write their k and v to a scratch region
no sequence owns and belong to no attention block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import triton

from specdec.models.triton_attention import BLOCK_FIELDS, CHUNK, ROWS, AttentionRows, blocks_of, work_list
from specdec.models.triton_forward import PassRows, forward_rows
from specdec.trees import depths


@dataclass(frozen=True)
class MetaLayout:
    """Capacities of one pass's int32 array: rows (slots, rope, head rows, tree parents), attention
    blocks, work pairs."""

    rows: int
    blocks: int
    pairs: int

    @classmethod
    def for_rows(cls, rows: int, max_seqs: int, group: int, stride: int) -> "MetaLayout":
        """Room for any pass of `rows` rows over at most max_seqs sequences of a cache stride:
        each sequence adds at most one part-filled block, and reaches at most stride / CHUNK chunks."""
        blocks = triton.cdiv(rows * group, ROWS) + min(rows, max_seqs)
        return cls(rows, blocks, blocks * triton.cdiv(stride, CHUNK))

    @property
    def size(self) -> int:
        return 4 * self.rows + BLOCK_FIELDS * self.blocks + 2 * self.pairs + 1

    def views(self, meta: torch.Tensor, chunks: int) -> tuple[PassRows, torch.Tensor]:
        """(PassRows over `meta` [size] int32, the head rows [rows]) as views: no copies."""
        r, b, w = self.rows, self.blocks, self.pairs
        slots, rope, head, parents = meta[:r], meta[r:2 * r], meta[2 * r:3 * r], meta[3 * r:4 * r]
        at = 4 * r + BLOCK_FIELDS * b
        blocks = meta[4 * r:at].view(b, BLOCK_FIELDS)
        pairs = meta[at:at + 2 * w].view(w, 2)
        count = meta[self.size - 1:]
        return PassRows(slots, rope, AttentionRows(blocks, chunks, (pairs, count), parents=parents)), head


@dataclass(frozen=True)
class RaggedPlan:
    """One pass over sequences i with counts[i] new tokens after starts[i] cached ones, their cache
    at bases[i]; want[i]: whether sequence i's rows feed the returned logits; trees[i]: its rows'
    parents (specdec.trees; row r at position starts[i] + depth(r), cached at starts[i] + r) or
    None for causal rows (trees None: all causal)."""

    counts: tuple[int, ...]
    starts: tuple[int, ...]
    bases: tuple[int, ...]
    want: tuple[bool, ...]
    trees: tuple[tuple[int, ...] | None, ...] | None = None

    def tree(self, i: int) -> tuple[int, ...] | None:
        return None if self.trees is None else self.trees[i]

    def positions(self, i: int) -> np.ndarray:
        """Sequence i's rows' positions inside their sequence [counts[i]]."""
        tree, start = self.tree(i), self.starts[i]
        return np.arange(start, start + self.counts[i]) if tree is None else start + np.asarray(depths(tree))

    @property
    def rows(self) -> int:
        return sum(self.counts)

    def head_rows(self) -> np.ndarray:
        first = np.cumsum((0,) + self.counts[:-1])
        return np.concatenate([np.arange(f, f + n) for f, n, w in zip(first, self.counts, self.want) if w]
                              or [np.zeros(0, dtype=np.int64)])

    def pack(self, layout: MetaLayout, group: int, scratch: int, scratch_len: int) -> np.ndarray:
        """The int32 array of `layout` for this pass (padding rows to `scratch` .. + scratch_len)."""
        meta = np.zeros(layout.size, dtype=np.int32)
        r = layout.rows
        pad = np.arange(r - self.rows)
        meta[:r] = np.concatenate([np.arange(b + s, b + s + n) for b, s, n in zip(self.bases, self.starts, self.counts)]
                                  + [scratch + pad % scratch_len])
        meta[r:2 * r - len(pad)] = np.concatenate([self.positions(i) for i in range(len(self.counts))]
                                                  + [np.zeros(0, dtype=np.int64)])
        head = self.head_rows()
        meta[2 * r:2 * r + len(head)] = head
        if self.trees is not None:  # a causal pass leaves them 0: no block reads them
            meta[3 * r:4 * r - len(pad)] = np.concatenate([np.asarray(t if t is not None else [-1] * n)
                                                           for t, n in zip(self.trees, self.counts)])
        blocks, pairs = self.attention_tables(group)
        if len(blocks) > layout.blocks:
            raise ValueError(f"{len(blocks)} attention blocks exceed the layout's {layout.blocks}")
        at = 4 * r
        if blocks:
            meta[at:at + BLOCK_FIELDS * len(blocks)] = np.asarray(blocks, dtype=np.int32).ravel()
        at += BLOCK_FIELDS * layout.blocks
        if len(pairs) > layout.pairs:
            raise ValueError(f"{len(pairs)} attention work pairs exceed the layout's {layout.pairs}")
        if pairs:
            meta[at:at + 2 * len(pairs)] = np.asarray(pairs, dtype=np.int32).ravel()
        meta[-1] = len(pairs)
        return meta

    def attention_tables(self, group: int) -> tuple[list[list[int]], list[list[int]]]:
        """The block table (tok0, ntok, r0, base, span) of every sequence in order, and the work list
        of the (block, chunk) pairs they reach (triton_attention.AttentionRows, blocks_of, work_list)."""
        blocks, tok0 = [], 0
        for i, (n, start, base) in enumerate(zip(self.counts, self.starts, self.bases)):
            tree = self.tree(i)
            span = start + n if tree is None else -(start + max(depths(tree)) + 1)
            blocks += blocks_of(n, group, tok0, base, span)
            tok0 += n
        return blocks, work_list(blocks)


def exact_layout(plan: RaggedPlan, group: int) -> MetaLayout:
    """The smallest layout that holds this pass (an eager pass: no padding)."""
    blocks, pairs = plan.attention_tables(group)
    return MetaLayout(plan.rows, max(1, len(blocks)), max(1, len(pairs)))


class RaggedGraph:
    """The CUDA graph of a fused pass of layout.rows rows, with its static inputs: the tokens and
    the pass's int32 array (ragged_plan.MetaLayout), which each run copies in."""

    def __init__(self, model, layout: MetaLayout, capture: tuple[int, ...]):
        """model: the NativeSlots whose net the graph runs."""
        self.model, self.layout = model, layout
        device = model.device
        self.tokens = torch.zeros(layout.rows, dtype=torch.long, device=device)
        self.meta = torch.zeros(layout.size, dtype=torch.int32, device=device)
        self._staging = [torch.zeros(layout.size, dtype=torch.int32, pin_memory=True) for _ in range(2)]
        self._copied = [torch.cuda.Event(), torch.cuda.Event()]  # each staging array's last copy (none yet)
        self._turn = 0
        rows, self.head = layout.views(self.meta, model.attention_chunks)
        self._copy_in(RaggedPlan((), (), (), ()), model.scratch)  # warm-up runs execute: every row is padding
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # Triton's tile tuning and compiles outside the capture
            for _ in range(2):
                forward_rows(model.net, self.tokens, rows, capture)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits, self.features = forward_rows(model.net, self.tokens, rows, capture)

    def run(self, plan: "RaggedPlan", tokens: torch.Tensor, scratch: tuple[int, int]) -> None:
        self._copy_in(plan, scratch)
        self.tokens[:plan.rows].copy_(tokens)
        self.graph.replay()

    def _copy_in(self, plan: "RaggedPlan", scratch: tuple[int, int]) -> None:
        # From pinned memory without waiting: a blocking copy waits for the pass queued before it,
        # so the GPU would idle while the host launches this one. Two staging arrays take turns; an
        # array is refilled only once its last copy has run (its event), which by then it has.
        turn = self._turn = 1 - self._turn
        self._copied[turn].synchronize()  # an event never recorded returns at once
        staging = self._staging[turn]
        staging.numpy()[:] = plan.pack(self.layout, self.model.arch.group, *scratch)
        self.meta.copy_(staging, non_blocking=True)
        self._copied[turn].record(torch.cuda.current_stream(self.meta.device))
