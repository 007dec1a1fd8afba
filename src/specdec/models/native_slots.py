"""The native Llama backend for many sequences: one preallocated slot KV cache, one pass over a ragged batch.

Each layer's cache is k, v [Hkv, max_slots * stride, hd]: slot s owns the cache slots
s * stride .. (s + 1) * stride - 1, and its token at position p (inside its own sequence) lives at
s * stride + p. A slot's length is a host int: rollback sets it, release sets it to 0, and the
stale cache slots past it are overwritten by the next tokens.

forward_ragged runs every matrix (q/k/v, o, gate/up, down; the LM head over the rows that want
logits) once over the concatenated rows of all sequences, and attention once per sequence over its
own cache range with the very call a NativeLlama makes for those tokens alone (LlamaNet.eager_span),
RoPE at each token's position inside its sequence. So attention gives a row the same bits whatever
shares the batch; the matrices give it the same bits only where they compute a row alike at every
row count (bf16 prepacked with row_count_invariant). On a CPU in fp32 a single-token step reads
another layout than a pass of several rows (cpu_matrix.CpuMatrix), so logits may differ from a
sequence's own in the last bits (tests/test_native_slots.py measures by how much).
"""

from __future__ import annotations

from itertools import accumulate
from typing import Sequence

import torch

from specdec.models.base import check_feature_layers
from specdec.models.llama_config import arch_from_hf, named_arch
from specdec.models.llama_net import LlamaNet, build_net, init_random
from specdec.models.native_llama import _slots, adopt_on_cpu, net_from_hf
from specdec.models.slots import RaggedOutput, SlotModel, check_ragged


def slot_stride(max_length: int) -> int:
    """Cache slots one sequence owns: as many as a NativeLlama of this max_length holds, so that
    its whole-block attention spans (row_count_invariant) are clamped alike."""
    return _slots(max_length, {})


class NativeSlots(SlotModel):
    """A Llama-family model holding up to max_slots sequences in one preallocated KV cache."""

    def __init__(self, net: LlamaNet, name: str, max_length: int, max_slots: int):
        if max_slots < 1:
            raise ValueError(f"max_slots must be >= 1, got {max_slots}")
        self.net = net.eval()
        self.model = None  # the transformers model it was built from, kept on a CPU (as NativeLlama)
        self.arch = net.arch
        self.name = name
        self.vocab_size = net.arch.vocab_size
        self.max_length = max_length
        self.max_slots = max_slots
        self.device = net.slot_ids.device
        self.stride = net.slots // max_slots
        if self.stride < max_length:
            raise ValueError(f"a cache of {net.slots} slots cannot hold {max_slots} sequences of {max_length} tokens")
        self._lens = [0] * max_slots

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, hf_model, name: str, max_slots: int, max_length: int | None = None,
                pack: bool | None = None) -> "NativeSlots":
        """Take the weights of a loaded transformers model, as NativeLlama.from_hf does."""
        max_length = min(max_length or 4096, arch_from_hf(hf_model.config).max_position)
        net = net_from_hf(hf_model, max_slots * slot_stride(max_length))
        model = cls(net, name, max_length, max_slots)
        model.model = adopt_on_cpu(net, hf_model, pack is not False)
        return model

    @classmethod
    def random(cls, size: str, max_slots: int, device="cuda", dtype=torch.bfloat16, max_length: int = 2048,
               seed: int = 0, arch_overrides: dict | None = None) -> "NativeSlots":
        """Random weights at a named real size, as NativeLlama.random (the same seed, the same weights)."""
        arch = named_arch(size, **(arch_overrides or {}))
        net = build_net(arch, max_slots * slot_stride(max_length), torch.device(device), dtype)
        init_random(net, seed)
        return cls(net, f"random {size}", max_length, max_slots)

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes of the whole preallocated KV cache (every layer's k and v, every slot)."""
        return sum(t.numel() * t.element_size() for layer in self.net.layers for t in (layer.k_cache, layer.v_cache))

    @property
    def cheap_verify_rows(self) -> bool:
        """As NativeLlama.cheap_verify_rows."""
        return self.device.type != "cpu" or self.net.row_count_invariant

    # -- SlotModel ---------------------------------------------------------------------------
    def cache_len(self, slot: int) -> int:
        return self._lens[slot]

    def rollback(self, slot: int, length: int) -> None:
        if not 0 <= length <= self._lens[slot]:
            raise ValueError(f"cannot roll slot {slot} back to {length}: it holds {self._lens[slot]} tokens")
        self._lens[slot] = length

    @torch.inference_mode()
    def forward_ragged(self, slots: Sequence[int], tokens: Sequence[torch.Tensor], *,
                       logits: Sequence[bool] | None = None,
                       features: Sequence[tuple[int, ...] | None] | None = None) -> RaggedOutput:
        check_ragged(self, slots, tokens)
        want = list(logits) if logits is not None else [True] * len(slots)
        layers = [None if f is None else check_feature_layers(f, self.arch.n_layers)
                  for f in (features if features is not None else [None] * len(slots))]
        counts = [int(t.shape[0]) for t in tokens]
        rows = list(accumulate(counts, initial=0))
        ids = self.net.slot_ids
        spans, pos, rope = [], [], []
        for slot, row, n in zip(slots, rows, counts):
            base, start = slot * self.stride, self._lens[slot]
            spans.append(self.net.eager_span(row, base, start, n, self.stride))
            pos.append(ids[base + start:base + start + n])  # the cache slots the tokens go to
            rope.append(ids[start:start + n])  # their positions inside their own sequence
        capture = tuple(sorted(set().union(*(f for f in layers if f))))
        head = [torch.arange(row, row + n) for row, n, w in zip(rows, counts, want) if w]
        head_rows = None if all(want) else torch.cat(head).to(self.device) if head else ids[:0]
        out, feats = self.net.run_rows(torch.cat(tokens).to(self.device), torch.cat(pos), spans, capture,
                                       torch.cat(rope), head_rows)
        for slot, n in zip(slots, counts):
            self._lens[slot] += n
        offsets = tuple(accumulate((n if w else 0 for n, w in zip(counts, want)), initial=0))
        picked = tuple(None if f is None else self._features(feats, capture, f, row, n)
                       for f, row, n in zip(layers, rows, counts))
        return RaggedOutput(out.float(), offsets, picked)

    def _features(self, feats: torch.Tensor, capture: tuple[int, ...], layers: tuple[int, ...],
                  row: int, n: int) -> torch.Tensor:
        """One sequence's features [n, (len(layers) + 1) * D] out of the pass's feats
        [T, (len(capture) + 1) * D] (the layers in `capture`, then the final-norm features)."""
        mine = feats[row:row + n].view(n, len(capture) + 1, self.arch.dim)
        return mine[:, [capture.index(i) for i in layers] + [len(capture)]].reshape(n, -1)


__all__ = ["NativeSlots", "slot_stride"]
