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

On CUDA (where triton_ops takes the shape) the pass runs the fused Triton kernels instead, with
attention per sequence inside one kernel (triton_attention's block tables): every kernel computes
a row with the same arithmetic whatever the batch, so a sequence's logits are bit for bit the
ones it gets alone, and the ones NativeLlama's graphed steps give it. Passes of up to the largest
of SlotOptions.graph_rows rows replay a CUDA graph captured for the next row count up (padding
rows go to a scratch region past the last slot); longer ones (a batch of prefill chunks, a draft
catching up) run as several passes of at most that many rows (SlotOptions.pass_rows), one after
another, so that no kernel ever runs outside a graph captured at start: an unrecorded launch of a
new shape can make Triton compile a kernel variant for seconds in the middle of serving.

Draft trees (forward_ragged's trees=) run on both passes, RoPE at start + depth. The eager pass
attends as LlamaNet.eager_span lays a tree out. On the fused pass the pass's int32 array carries each
tree row's parent and position, and the attention kernel reads a row's keys along its path
(triton_attention), so the graphs of causal passes run trees as they are. A tree is never split
between passes. keep_rows moves the kept path in every layer's cache (on the fused path with one
kernel, triton_cache).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Sequence

import torch

from specdec.models.base import check_feature_layers
from specdec.models.llama_config import LlamaArch, arch_from_hf, named_arch
from specdec.models.llama_net import LlamaNet, build_net, init_random
from specdec.models.native_llama import _triton_refuses, adopt_on_cpu, net_from_hf
from specdec.models.native_llama import cache_slots as one_sequence_slots
from specdec.models.slots import RaggedOutput, SlotModel, check_ragged
from specdec.models.tree_rows import causal_or_tree, row_positions
from specdec.trees import check_kept_rows

# Row counts with a CUDA graph: decode steps of up to 64 sequences, verifies of up to 64 x (K + 1).
GRAPH_ROWS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256, 320, 384, 512)


@dataclass(frozen=True)
class SlotOptions:
    """fused: the Triton kernels (triton_forward.forward_rows); graphs: passes of up to
    max(graph_rows) rows replay CUDA graphs (fused on CUDA only); pass_rows: the most rows one pass
    runs, a longer one running as several (None: any; with graphs, the largest graph's rows)."""

    fused: bool
    graphs: bool
    graph_rows: tuple[int, ...] = GRAPH_ROWS
    pass_rows: int | None = None

    def __post_init__(self):
        if self.pass_rows is not None and self.pass_rows < 1:
            raise ValueError(f"pass_rows must be >= 1, got {self.pass_rows}")

    @classmethod
    def resolve(cls, arch: LlamaArch, device: torch.device, fused: bool | None = None) -> "SlotOptions":
        """fused None: on CUDA wherever triton_ops takes the shape; graphs wherever fused on CUDA."""
        refused = _triton_refuses(arch, device)
        if fused and refused:
            raise ValueError(f"the fused kernels cannot run here: {refused}")
        fused = (device.type == "cuda" and refused is None) if fused is None else fused
        graphs = fused and device.type == "cuda"
        return cls(fused, graphs, pass_rows=max(GRAPH_ROWS) if graphs else None)

    def bucket(self, rows: int) -> int | None:
        """The graph's row count for a pass of `rows` rows, or None (no graph)."""
        return next((r for r in self.graph_rows if r >= rows), None) if self.graphs else None


def split_passes(counts: Sequence[int], pass_rows: int,
                 whole: Sequence[bool] = ()) -> list[list[tuple[int, int, int]]]:
    """A pass of sequences i with counts[i] new tokens as consecutive passes of at most pass_rows
    rows: each a list of (i, first, stop), sequence i's tokens first..stop - 1. Sequences keep
    their order and fill each pass in turn; one that does not fit goes on in the next pass, so its
    pieces run in order (its cache grows between them). Example, counts (3, 5, 1), pass_rows 4:
    [[(0, 0, 3), (1, 0, 1)], [(1, 1, 5)], [(2, 0, 1)]]. whole[i] (a tree: its rows see each other
    in one pass) keeps sequence i in one pass, starting the next one if it does not fit."""
    passes, current, room = [], [], pass_rows
    for i, n in enumerate(counts):
        if i < len(whole) and whole[i] and n > room:
            if n > pass_rows:
                raise ValueError(f"a tree of {n} rows cannot run in passes of {pass_rows} rows")
            passes.append(current)
            current, room = [], pass_rows
        first = 0
        while first < n:
            take = min(room, n - first)
            current.append((i, first, first + take))
            first, room = first + take, room - take
            if room == 0:
                passes.append(current)
                current, room = [], pass_rows
    return passes + ([current] if current else [])


def slot_stride(max_length: int) -> int:
    """Cache slots one sequence owns: as many as a NativeLlama of this max_length holds, so that
    its whole-block attention spans (row_count_invariant) are clamped alike."""
    return one_sequence_slots(max_length, {})


def cache_slots(max_slots: int, max_length: int) -> int:
    """The net's cache for max_slots sequences, and one region more: the scratch of padding rows."""
    return (max_slots + 1) * slot_stride(max_length)


class NativeSlots(SlotModel):
    """A Llama-family model holding up to max_slots sequences in one preallocated KV cache."""

    def __init__(self, net: LlamaNet, name: str, max_length: int, max_slots: int, fused: bool | None = None,
                 options: SlotOptions | None = None):
        """fused: the Triton kernels (None: SlotOptions.resolve's choice); options: all of them
        instead, as given."""
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
        self.stride = slot_stride(max_length)
        if net.slots < cache_slots(max_slots, max_length):
            raise ValueError(f"a cache of {net.slots} slots cannot hold {max_slots} sequences of {max_length} tokens "
                             f"and a scratch region ({cache_slots(max_slots, max_length)} slots)")
        self.options = options or SlotOptions.resolve(net.arch, self.device, fused)
        self._lens = [0] * max_slots
        self._graphs: dict = {}  # (rows, feature layers) -> ragged_plan.RaggedGraph

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, hf_model, name: str, max_slots: int, max_length: int | None = None,
                pack: bool | None = None, fused: bool | None = None) -> "NativeSlots":
        """Take the weights of a loaded transformers model, as NativeLlama.from_hf does."""
        max_length = min(max_length or 4096, arch_from_hf(hf_model.config).max_position)
        net = net_from_hf(hf_model, cache_slots(max_slots, max_length))
        model = cls(net, name, max_length, max_slots, fused)
        model.model = adopt_on_cpu(net, hf_model, pack is not False and not model.options.fused)
        return model

    @classmethod
    def random(cls, size: str, max_slots: int, device="cuda", dtype=torch.bfloat16, max_length: int = 2048,
               seed: int = 0, arch_overrides: dict | None = None, fused: bool | None = None) -> "NativeSlots":
        """Random weights at a named real size, as NativeLlama.random (the same seed, the same weights)."""
        arch = named_arch(size, **(arch_overrides or {}))
        net = build_net(arch, cache_slots(max_slots, max_length), torch.device(device), dtype)
        init_random(net, seed)
        return cls(net, f"random {size}", max_length, max_slots, fused)

    @classmethod
    def sharing(cls, llama, max_slots: int, max_length: int | None = None,
                options: SlotOptions | None = None) -> "NativeSlots":
        """Over a NativeLlama's own weights, no copy (on a GPU it keeps no transformers model to
        build from): a net whose parameters (and CPU matrices) are the llama's tensors, with a slot
        cache of its own. options: as the constructor's (None: the llama's fused choice)."""
        src = llama.net
        max_length = min(max_length or llama.max_length, llama.max_length)
        with torch.device("meta"):
            net = LlamaNet(src.arch, cache_slots(max_slots, max_length))
        for name, param in src.named_parameters():
            owner, _, leaf = name.rpartition(".")
            net.get_submodule(owner).register_parameter(leaf, param)
        like = dict(src.named_buffers())
        for name, buf in list(net.named_buffers()):
            owner, _, leaf = name.rpartition(".")
            real = torch.empty(buf.shape, dtype=like[name].dtype, device=src.slot_ids.device)
            net.get_submodule(owner).register_buffer(leaf, real, persistent=False)
        for mine, theirs in zip(net.layers, src.layers):
            mine.packed = theirs.packed
        net._packed_lm, net.cpu_layout, net.row_count_invariant = src._packed_lm, src.cpu_layout, src.row_count_invariant
        net.reset_buffers()
        model = cls(net, llama.name, max_length, max_slots, llama.options.fused, options)
        model.model = llama.model
        return model

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
    def keep_rows(self, slot: int, start: int, rows: Sequence[int]) -> None:
        """SlotModel.keep_rows: the kept rows' k, v entries moved to start.. in every layer's cache
        (on the fused path by one kernel for all layers)."""
        check_kept_rows(rows, start, self._lens[slot])
        if self.options.fused:
            from specdec.models.triton_cache import move_rows, path_moves

            move_rows(self.net, slot * self.stride, path_moves(start, rows, self._lens[slot]))
        else:
            self.net.keep_rows(slot * self.stride + start, rows)
        self._lens[slot] = start + len(rows)

    @torch.inference_mode()
    def forward_ragged(self, slots: Sequence[int], tokens: Sequence[torch.Tensor], *,
                       logits: Sequence[bool] | None = None,
                       features: Sequence[tuple[int, ...] | None] | None = None,
                       trees: Sequence[tuple[int, ...] | None] | None = None) -> RaggedOutput:
        check_ragged(self, slots, tokens, trees)
        want = list(logits) if logits is not None else [True] * len(slots)
        layers = [None if f is None else check_feature_layers(f, self.arch.n_layers)
                  for f in (features if features is not None else [None] * len(slots))]
        counts = [int(t.shape[0]) for t in tokens]
        shapes = [causal_or_tree(t, n) for t, n in zip(trees or [None] * len(slots), counts)]
        trees = shapes if any(shapes) else None  # a chain-shaped tree runs as causal rows
        if self.options.pass_rows is not None and sum(counts) > self.options.pass_rows:
            return self._in_passes(slots, tokens, want, layers, trees)
        capture = tuple(sorted(set().union(*(f for f in layers if f))))
        if self.options.fused:
            out, feats = self._run_fused(slots, torch.cat(tokens).to(self.device), counts, want, capture, trees)
        else:
            out, feats = self._run_eager(slots, torch.cat(tokens).to(self.device), counts, want, capture, shapes)
        for slot, n in zip(slots, counts):
            self._lens[slot] += n
        offsets = tuple(accumulate((n if w else 0 for n, w in zip(counts, want)), initial=0))
        rows = list(accumulate(counts, initial=0))
        picked = tuple(None if f is None else self._features(feats, capture, f, row, n)
                       for f, row, n in zip(layers, rows, counts))
        return RaggedOutput(out.float(), offsets, picked)

    def _in_passes(self, slots, tokens, want, layers, trees=None) -> RaggedOutput:
        """One pass over more than options.pass_rows rows, run as split_passes' consecutive passes;
        each sequence's logits and features put back together, in batch order. Exact: a row's
        arithmetic does not depend on what shares its pass (rule 6 of the design). A tree stays whole."""
        logits = [[] for _ in slots]
        feats = [[] for _ in slots]
        trees = trees or [None] * len(slots)
        whole = [t is not None for t in trees]
        for part in split_passes([int(t.shape[0]) for t in tokens], self.options.pass_rows, whole):
            out = self.forward_ragged([slots[i] for i, _, _ in part], [tokens[i][a:b] for i, a, b in part],
                                      logits=[want[i] for i, _, _ in part],
                                      features=[layers[i] for i, _, _ in part],
                                      trees=[trees[i] for i, _, _ in part])
            for j, (i, _, _) in enumerate(part):
                logits[i].append(out.logits_of(j))
                feats[i].append(out.features[j])
        rows = [torch.cat(pieces) for pieces, w in zip(logits, want) if w]
        flat = torch.cat(rows) if rows else torch.empty(0, self.vocab_size, device=self.device)
        offsets = tuple(accumulate((int(t.shape[0]) if w else 0 for t, w in zip(tokens, want)), initial=0))
        picked = tuple(None if f is None else torch.cat(pieces) for f, pieces in zip(layers, feats))
        return RaggedOutput(flat, offsets, picked)

    def _run_eager(self, slots, tokens, counts, want, capture, trees) -> tuple[torch.Tensor, torch.Tensor]:
        """The portable pass: every matrix once over all rows, attention per sequence (SeqSpan).
        trees: [B] each sequence's row parents (causal_or_tree's) or None for causal rows."""
        ids = self.net.slot_ids
        spans, pos, rope, head = [], [], [], []
        for slot, row, n, w, tree in zip(slots, accumulate(counts, initial=0), counts, want, trees):
            base, start = slot * self.stride, self._lens[slot]
            spans.append(self.net.eager_span(row, base, start, n, self.stride, tree))
            pos.append(ids[base + start:base + start + n])  # the cache slots the tokens go to
            # their positions inside their own sequence (a tree's rows: start + depth)
            rope.append(ids[start:start + n] if tree is None else row_positions(start, n, tree).to(self.device))
            if w:
                head.append(torch.arange(row, row + n))
        head_rows = None if all(want) else torch.cat(head).to(self.device) if head else ids[:0]
        return self.net.run_rows(tokens, torch.cat(pos), spans, capture, torch.cat(rope), head_rows)

    def _run_fused(self, slots, tokens, counts, want, capture, trees=None) -> tuple[torch.Tensor, torch.Tensor]:
        """The Triton pass: one CUDA graph of the next row count up, or the same kernels unrecorded.
        Trees change only the pass's int32 array (ragged_plan), so a graph runs them too."""
        from specdec.models.ragged_plan import RaggedPlan, exact_layout
        from specdec.models.triton_forward import forward_rows

        plan = RaggedPlan(tuple(counts), tuple(self._lens[s] for s in slots), tuple(s * self.stride for s in slots),
                          tuple(want), None if trees is None else tuple(trees))
        wanted = sum(n for n, w in zip(counts, want) if w)
        rows = self.options.bucket(plan.rows)
        if rows is None:
            layout = exact_layout(plan, self.arch.group)
            meta = torch.from_numpy(plan.pack(layout, self.arch.group, *self.scratch)).to(self.device)
            pass_rows, head = layout.views(meta, self.attention_chunks)
            return forward_rows(self.net, tokens, pass_rows, capture, head[:wanted])
        graph = self._graph(rows, capture)
        graph.run(plan, tokens, self.scratch)
        return graph.logits.index_select(0, graph.head[:wanted]), graph.features[:plan.rows]

    @property
    def scratch(self) -> tuple[int, int]:
        """Where padding rows write: the region past the last slot's."""
        return self.max_slots * self.stride, self.stride

    @property
    def attention_chunks(self) -> int:
        """Attention chunks one sequence's cache may span."""
        from specdec.models.triton_attention import CHUNK

        return -(-self.stride // CHUNK)

    def capture(self, *row_counts: int, layers: tuple[int, ...] = ()) -> None:
        """Capture the graphs of passes of these row counts ahead of time (else the first pass of
        each captures its own)."""
        with torch.inference_mode():
            for n in row_counts:
                rows = self.options.bucket(n)
                if rows is not None:
                    self._graph(rows, layers)

    def warm_up(self) -> None:
        """Every graph a pass can replay (SlotModel.warm_up): a capture costs about a second at 8B."""
        self.capture(*self.options.graph_rows)

    def _graph(self, rows: int, capture: tuple[int, ...]):
        from specdec.models.ragged_plan import MetaLayout, RaggedGraph

        if (rows, capture) not in self._graphs:
            layout = MetaLayout.for_rows(rows, self.max_slots, self.arch.group, self.stride)
            self._graphs[rows, capture] = RaggedGraph(self, layout, capture)
        return self._graphs[rows, capture]

    def _features(self, feats: torch.Tensor, capture: tuple[int, ...], layers: tuple[int, ...],
                  row: int, n: int) -> torch.Tensor:
        """One sequence's features [n, (len(layers) + 1) * D] out of the pass's feats
        [T, (len(capture) + 1) * D] (the layers in `capture`, then the final-norm features)."""
        mine = feats[row:row + n].view(n, len(capture) + 1, self.arch.dim)
        return mine[:, [capture.index(i) for i in layers] + [len(capture)]].reshape(n, -1)

