"""Many sequences in one model: a slot per sequence, each with its own KV cache length.

A slot model holds up to `max_slots` sequences. One `forward_ragged` call runs a ragged batch: each
sequence brings its own number of new tokens (1 for a plain step, K_i + 1 for a verify, a chunk of
its prompt for prefill) at its own positions, after the tokens its slot already holds. Rollback of
one slot sets its length; the others are untouched. A sequence's rows must not depend on what
shares the batch (rule 6 of the design): attention runs per sequence over its own cache.

`LoopSlots` runs the batch as a loop over one CausalLM per slot: the generic backend's way, exact by
construction. A native slot cache (one preallocated [max_slots, max_length] cache, one pass over all
rows) offers the same interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from itertools import accumulate
from typing import Callable, Sequence

import torch

from specdec.models.base import CausalLM
from specdec.trees import check_kept_rows, check_row_parents


@dataclass(frozen=True)
class RaggedOutput:
    """What forward_ragged returns for a batch of B sequences.

    logits: [R, V] fp32, the rows of the sequences that asked for logits, in batch order (sequence i
        brought n_i tokens; R = sum of n_i over those sequences).
    offsets: [B + 1] host ints, cumulative: sequence i's logits are logits[offsets[i]:offsets[i + 1]],
        an empty range when it asked for none (a prefill chunk).
    features: [B] one entry per sequence: its features [n_i, (len(layers) + 1) * D] (as
        CausalLM.forward_with_hidden gives them) when it asked for them, else None.
    """

    logits: torch.Tensor
    offsets: tuple[int, ...]
    features: tuple[torch.Tensor | None, ...]

    def logits_of(self, i: int) -> torch.Tensor:
        """Sequence i's logits [n_i, V] (or [0, V])."""
        return self.logits[self.offsets[i]:self.offsets[i + 1]]


class SlotModel(ABC):
    """A target (or draft) holding up to max_slots sequences. Token tensors are 1-D long on `device`.

    A slot starts empty (cache length 0); `release` empties it again for the next sequence. Which
    slot a sequence uses is the caller's choice (the engine keeps the free list).
    """

    name: str
    vocab_size: int  # size of the logits' last dimension
    max_length: int  # longest sequence (prompt + generated) one slot accepts
    max_slots: int
    device: torch.device

    @abstractmethod
    def forward_ragged(self, slots: Sequence[int], tokens: Sequence[torch.Tensor], *,
                       logits: Sequence[bool] | None = None,
                       features: Sequence[tuple[int, ...] | None] | None = None,
                       trees: Sequence[tuple[int, ...] | None] | None = None) -> RaggedOutput:
        """Run sequence slots[i]'s new tokens[i] [n_i] (n_i >= 1) on top of its cache, at positions
        cache_len(slots[i]) .. + n_i - 1, and append them to it. slots: [B] distinct slot indices.
        logits: [B], whether sequence i wants its logits (None: all do). features: [B], the layers
        whose outputs sequence i wants with the last layer's features (CausalLM.forward_with_hidden),
        or None for no features (None: nobody wants any). trees: [B], sequence i's rows as a tree
        (specdec.trees: row_parents, n_i entries; row r at position cache_len + depth(r), seeing the
        cache and its own path), or None for causal rows (None: every sequence's rows are causal);
        every row is appended to the cache all the same, at cache_len + r, until keep_rows."""

    @abstractmethod
    def cache_len(self, slot: int) -> int:
        """Number of tokens slot `slot` holds."""

    @abstractmethod
    def rollback(self, slot: int, length: int) -> None:
        """Slot `slot` keeps its first `length` tokens and forgets the rest."""

    def keep_rows(self, slot: int, start: int, rows: Sequence[int]) -> None:
        """After a tree pass that began at cache length `start`: the slot keeps its first `start`
        tokens, then the entries of the pass's rows `rows` (increasing, relative to start: a path from
        the root row 0) moved to start, start + 1, ..., and forgets the rest. Causal rows 0..m - 1
        are a rollback to start + m."""
        check_kept_rows(rows, start, self.cache_len(slot))
        if list(rows) != list(range(len(rows))):
            raise NotImplementedError(f"{self.name} cannot keep a tree's path: it verifies chains only")
        self.rollback(slot, start + len(rows))

    def release(self, slot: int) -> None:
        """The slot's sequence is done: empty it for the next one."""
        self.rollback(slot, 0)

    @property
    def cheap_verify_rows(self) -> bool:
        """As CausalLM.cheap_verify_rows: whether a few more rows in a pass cost about nothing here."""
        return self.device.type != "cpu"

    def warm_up(self) -> None:
        """Prepare now what the first passes of each size would otherwise prepare in the middle of a
        run (CUDA graphs), so that a server's first requests are timed like the rest; nothing here."""


class LoopSlots(SlotModel):
    """A slot model made of one CausalLM per slot, run one sequence after another.

    factory: () -> CausalLM, a fresh model with an empty cache each call (over the same weights:
    HFCausalLM.with_own_cache). Every slot's rows are exactly what its model gives alone.
    """

    def __init__(self, factory: Callable[[], CausalLM], max_slots: int):
        if max_slots < 1:
            raise ValueError(f"max_slots must be >= 1, got {max_slots}")
        self._models = [factory() for _ in range(max_slots)]
        if len({id(m) for m in self._models}) < max_slots:
            raise ValueError("the factory returned the same model twice: each slot needs a cache of its own")
        first = self._models[0]
        self.name, self.vocab_size, self.max_length = first.name, first.vocab_size, first.max_length
        self.device, self.max_slots = first.device, max_slots

    @property
    def cheap_verify_rows(self) -> bool:
        return self._models[0].cheap_verify_rows

    def cache_len(self, slot: int) -> int:
        return self._models[slot].cache_len

    def rollback(self, slot: int, length: int) -> None:
        self._models[slot].rollback(length)

    def forward_ragged(self, slots: Sequence[int], tokens: Sequence[torch.Tensor], *,
                       logits: Sequence[bool] | None = None,
                       features: Sequence[tuple[int, ...] | None] | None = None,
                       trees: Sequence[tuple[int, ...] | None] | None = None) -> RaggedOutput:
        check_ragged(self, slots, tokens, trees)
        want_logits = list(logits) if logits is not None else [True] * len(slots)
        layers = list(features) if features is not None else [None] * len(slots)
        shapes = list(trees) if trees is not None else [None] * len(slots)
        rows, feats = [], []
        for slot, new, want, wanted_layers, tree in zip(slots, tokens, want_logits, layers, shapes):
            out, feat = self._run(self._models[slot], new, want, wanted_layers, tree)
            rows.append(out)
            feats.append(feat)
        kept = [r for r in rows if r is not None]
        if len(kept) == 1:  # one sequence's logits as they are: no copy of [n, V] (a batch of one)
            flat = kept[0]
        else:
            flat = torch.cat(kept) if kept else torch.empty(0, self.vocab_size, device=self.device)
        offsets = tuple(accumulate((0 if r is None else r.shape[0] for r in rows), initial=0))
        return RaggedOutput(flat, offsets, tuple(feats))

    def keep_rows(self, slot: int, start: int, rows: Sequence[int]) -> None:
        self._models[slot].keep_rows(start, rows)

    @staticmethod
    def _run(model: CausalLM, tokens: torch.Tensor, want_logits: bool, layers: tuple[int, ...] | None,
             tree: tuple[int, ...] | None):
        """One slot's share: (logits [n, V] or None, features [n, F] or None)."""
        shape = {} if tree is None else {"tree": tree}  # causal rows: the very call as before trees
        if layers is not None:
            out, feat = model.forward_with_hidden(tokens, layers, **shape)
            return (out if want_logits else None), feat
        if want_logits or tree is not None:  # extend has no tree rows
            out = model.forward(tokens, **shape)
            return (out if want_logits else None), None
        model.extend(tokens)
        return None, None


def check_ragged(model: SlotModel, slots: Sequence[int], tokens: Sequence[torch.Tensor],
                 trees: Sequence[tuple[int, ...] | None] | None = None) -> None:
    """A ValueError unless slots, tokens (and trees: one entry a sequence, each None or the row
    parents of its n_i tokens) make a valid ragged batch for this model."""
    if len(slots) != len(tokens) or not slots:
        raise ValueError(f"a ragged batch needs one token tensor per slot, got {len(slots)} slots and "
                         f"{len(tokens)} tensors")
    if trees is not None and len(trees) != len(slots):
        raise ValueError(f"trees needs one entry per sequence (None for causal rows), got {len(trees)} for "
                         f"{len(slots)} sequences")
    if len(set(slots)) != len(slots) or not all(0 <= s < model.max_slots for s in slots):
        raise ValueError(f"slots must be distinct indices in 0..{model.max_slots - 1}, got {list(slots)}")
    for slot, new in zip(slots, tokens):
        if new.dim() != 1 or new.shape[0] < 1:
            raise ValueError(f"slot {slot}: tokens must be a non-empty 1-D tensor, got shape {list(new.shape)}")
        if model.cache_len(slot) + new.shape[0] > model.max_length:
            raise ValueError(f"slot {slot}: {model.cache_len(slot)} cached + {new.shape[0]} new tokens exceed "
                             f"the model's {model.max_length} positions")
    for new, tree in zip(tokens, trees or ()):
        if tree is not None:
            check_row_parents(tree, int(new.shape[0]))


def slot_model_for(model: CausalLM, max_slots: int, max_length: int | None = None) -> SlotModel:
    """A slot model over a loaded CausalLM's weights: a NativeSlots sharing the native backend's
    tensors (NativeSlots.sharing), a LoopSlots of caches of their own for transformers.
    max_length: per slot (None: the model's)."""
    from specdec.errors import UnsupportedHereError
    from specdec.models.native_llama import NativeLlama
    from specdec.models.native_slots import NativeSlots

    length = min(max_length or model.max_length, model.max_length)
    if isinstance(model, NativeLlama):
        return NativeSlots.sharing(model, max_slots, length)
    if hasattr(model, "with_own_cache"):
        return LoopSlots(model.with_own_cache, max_slots)
    raise UnsupportedHereError(f"{model.name} cannot hold several sequences here: use --backend hf or native")


def own_cache_slot(model: CausalLM) -> SlotModel:
    """The model as a slot model of one slot, its own cache the slot: what one sequence needs
    (engine.single.Engine). It runs the model's own single-sequence path (on CUDA its captured graphs),
    holds no second cache, and takes any CausalLM, a tensor-parallel target's included."""
    return LoopSlots(lambda: model, 1)
