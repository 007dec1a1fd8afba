"""Fast backend for the Llama family: a preallocated KV cache and, on CUDA, captured CUDA graphs.

Rolling back only moves `cache_len`: the slots after it are overwritten by the next tokens.

Three step paths, chosen once at construction (NativeOptions):
- On CUDA every forward of n <= max_graph_rows tokens (the single-token draft step, the K+1-token
  verify step) replays a CUDA graph captured for exactly that many rows: one launch for the whole
  model, the positions living on the device, so a draft loop runs with no host synchronisation.
  Where triton_ops takes the shape, the graph holds its fused kernels (six a layer); else the torch
  layers over all cache slots with a device-built mask. Both compute each row the same way whatever
  the row count, so a verify pass gives each row bit for bit the logits of a single-token step and
  greedy speculative output equals plain greedy output in bf16 too (checked by `specdec bench gpu`).
- With megakernel=True (Hopper GPUs, bf16) single-token steps replay the persistent kernel of
  `megakernel.py` instead. Its logits differ from a verify pass's in the last bits, so it is for
  draft models only: the engine refuses it as a target.
- Everything else (a CPU, long prefills) runs the eager torch layers of LlamaNet.forward_eager.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from specdec.models.base import CausalLM, check_feature_layers
from specdec.models.llama_config import LlamaArch, arch_from_hf, named_arch
from specdec.models.llama_net import LlamaNet, build_net, init_random, load_hf_state
from specdec.models.tree_rows import causal_or_tree
from specdec.trees import check_kept_rows


@dataclass(frozen=True)
class NativeOptions:
    """How a NativeLlama runs its steps, settled once at construction (`resolve` is the product's
    choice; the CPU tests pass their own, which `check` validates).

    graphs: forwards of up to max_graph_rows tokens run the fixed-shape step as CUDA graphs (off
    CUDA the same fixed-shape step runs eagerly: what the CPU tests use to check it).
    fused: that step runs triton_ops' kernels. megakernel: its single-token steps run megakernel.py.
    """

    graphs: bool
    fused: bool = False
    megakernel: bool = False
    max_graph_rows: int = 17

    @classmethod
    def resolve(cls, arch: LlamaArch, device: torch.device, graphs: bool | None = None,
                max_graph_rows: int = 17, megakernel: bool = False) -> "NativeOptions":
        """graphs None: on CUDA. The fused kernels on CUDA for every shape triton_ops supports."""
        graphs = device.type == "cuda" if graphs is None else graphs
        fused = graphs and device.type == "cuda" and _triton_refuses(arch, device) is None
        return cls(graphs, fused, megakernel, max_graph_rows).check(arch, device)

    def check(self, arch: LlamaArch, device: torch.device) -> "NativeOptions":
        """self, or a ValueError saying why these options cannot run this arch on this device."""
        if self.fused:
            reason = "it runs the graphed steps (graphs=True)" if not self.graphs else _triton_refuses(arch, device)
            if reason:
                raise ValueError(f"the fused Triton kernels cannot run here: {reason}")
        if self.megakernel:
            from specdec.models import megakernel as mk

            reason = mk.unavailable(arch, device) or (None if self.graphs else "it needs CUDA graphs")
            if reason:
                raise ValueError(f"megakernel=True: {reason}")
        return self


def _triton_refuses(arch: LlamaArch, device: torch.device) -> str | None:
    """Why triton_ops cannot run this arch on this device, or None. Off CUDA only Triton's
    interpreter runs it (TRITON_INTERPRET=1: the CPU tests)."""
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return f"they run on CUDA (this model is on {device.type})"
    try:
        from specdec.models import triton_ops
    except ImportError as exc:
        return f"Triton is not importable ({exc})"
    return triton_ops.supports(arch)


class _StepGraph:
    """One CUDA graph of a fixed-shape step over `rows` tokens, with its static buffers.

    Off CUDA there is nothing to capture: replay() runs the same static-shape forward eagerly,
    which lets the CPU tests check the device-mask logic the graphs rely on.
    """

    def __init__(self, net: LlamaNet, rows: int, step_fn):
        self.step_fn = step_fn
        device = net.slot_ids.device
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)
        # Warm-up runs really execute: point them at the last slots, which no real token uses.
        self.pos = net.slot_ids[net.slots - rows:].clone()
        self.graph = None
        if device.type != "cuda":
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # Triton's tile tuning and compiles outside the capture
            for _ in range(2):
                self.step_fn(self.tokens, self.pos)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits, self.hidden = self.step_fn(self.tokens, self.pos)  # [rows, V], [rows, D]

    def replay(self) -> None:
        if self.graph is None:
            self.logits, self.hidden = self.step_fn(self.tokens, self.pos)
        else:
            self.graph.replay()


class NativeLlama(CausalLM):
    """A Llama-family model with a static KV cache of `max_length` tokens (batch 1)."""

    def __init__(self, net: LlamaNet, name: str, max_length: int, cuda_graphs: bool | None = None,
                 max_graph_rows: int = 17, megakernel: bool = False, options: NativeOptions | None = None):
        """options: the choices made already (then cuda_graphs, max_graph_rows and megakernel are
        not looked at); else resolved from those (NativeOptions.resolve)."""
        self.net = net.eval()
        self.model = None  # the transformers model it was built from, kept on a CPU (see from_hf)
        self.arch = net.arch
        self.name = name
        self.vocab_size = net.arch.vocab_size
        self.max_length = max_length
        self.device = net.slot_ids.device
        self.options = options.check(net.arch, self.device) if options else \
            NativeOptions.resolve(net.arch, self.device, cuda_graphs, max_graph_rows, megakernel)
        if net.slots < max_length + self.options.max_graph_rows:
            raise ValueError("the cache needs max_graph_rows spare slots past max_length (graph warm-up writes)")
        self._graphs: dict[tuple[int, tuple[int, ...]], _StepGraph] = {}  # by (rows, feature layers)
        self._len = 0

    @property
    def megakernel(self) -> bool:
        """Whether single-token steps run the megakernel (a draft model only)."""
        return self.options.megakernel

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_hf(cls, hf_model, name: str, max_length: int | None = None, pack: bool | None = None,
                **options) -> "NativeLlama":
        """Take the weights of a loaded transformers model.

        On a CPU the matrices are prepacked for oneDNN (fp32, and bf16 on a CPU with bf16 units;
        `pack=False` keeps them plain), and the
        transformers model is kept as `.model` (sharing its embedding table) for what only it does:
        generate() baselines, training data, the self-quantized drafters, as the hf backend exposes
        it. On a GPU it can be dropped (no second copy there).
        """
        max_length = min(max_length or 4096, arch_from_hf(hf_model.config).max_position)
        net = net_from_hf(hf_model, cache_slots(max_length, options))
        model = cls(net, name, max_length, **options)
        model.model = adopt_on_cpu(net, hf_model, pack is not False and not model.options.fused)
        return model

    @classmethod
    def random(cls, size: str, device="cuda", dtype=torch.bfloat16, max_length: int = 2048, seed: int = 0,
               arch_overrides: dict | None = None, **options) -> "NativeLlama":
        """Random weights at a named real size (`llama-3.1-8b`, `llama-3.2-1b`, ...), for timing.
        arch_overrides changes fields of that shape (e.g. n_layers=2 for a quick smoke run)."""
        arch = named_arch(size, **(arch_overrides or {}))
        net = build_net(arch, cache_slots(max_length, options), torch.device(device), dtype)
        init_random(net, seed)
        return cls(net, f"random {size}", max_length, **options)

    # -- CausalLM ----------------------------------------------------------------------------
    @property
    def cache_len(self) -> int:
        return self._len

    @property
    def cheap_verify_rows(self) -> bool:
        """On a CPU: with bf16 matrices prepacked (pack_for_cpu, row_count_invariant), 1-16 rows cost about the same."""
        return self.device.type != "cpu" or self.net.row_count_invariant

    @property
    def verify_rows_match_steps(self) -> bool:
        """False with the megakernel: its single-token logits differ from a verify pass's in the last bits."""
        return not self.megakernel

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self._len:
            raise ValueError(f"cannot roll back to {length}: the cache holds {self._len} tokens")
        self._len = length

    def forward(self, tokens: torch.Tensor, tree: tuple[int, ...] | None = None) -> torch.Tensor:
        return self._forward(tokens, (), want_hidden=False, tree=tree)[0]

    def forward_with_hidden(self, tokens: torch.Tensor, layers: tuple[int, ...] = (),
                            tree: tuple[int, ...] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [n] -> logits [n, V] fp32 and features [n, (len(layers) + 1) * D] (the outputs of
        `layers`, then the final-norm features), appended to the cache. tree: CausalLM.forward's."""
        return self._forward(tokens, layers, want_hidden=True, tree=tree)

    @torch.inference_mode()
    def keep_rows(self, start: int, rows) -> None:
        """CausalLM.keep_rows: every layer's k, v entries of the kept rows moved to start.."""
        check_kept_rows(rows, start, self._len)
        if self.options.fused:  # one kernel for every layer
            from specdec.models.triton_cache import move_rows, path_moves

            move_rows(self.net, 0, path_moves(start, rows, self._len))
        else:
            self.net.keep_rows(start, rows)
        self._len = start + len(rows)

    @torch.inference_mode()
    def _forward(self, tokens: torch.Tensor, layers: tuple[int, ...], want_hidden: bool,
                 tree: tuple[int, ...] | None = None):
        # forward() skips copying the features out of the graph: one copy less a step (a few us on a GPU)
        n, start = tokens.shape[0], self._len
        if start + n > self.max_length:
            raise ValueError(f"{start} cached + {n} new tokens exceed the cache of {self.max_length}")
        layers = check_feature_layers(layers, self.arch.n_layers) if layers else ()
        tree = causal_or_tree(tree, n)
        rows = None if tree is not None else self._graph_rows(n)
        if tree is not None and self.options.graphs and not self.options.fused:
            raise NotImplementedError(f"{self.name}: its graphed torch steps take no draft tree (only the fused "
                                      "kernels read a tree, bit for bit as the graphed steps): build it with the "
                                      "fused kernels or cuda_graphs=False for trees")
        if tree is not None and self.options.fused:  # the graphs' kernels, unrecorded
            from specdec.models.triton_forward import forward_tree

            logits, hidden = forward_tree(self.net, tokens.to(self.device), start, tree, layers)
            logits = logits.float()
        elif rows is None:  # the fused kernels unrecorded where the graphs run them: prefill writes the same k, v
            run = self._fused_pass if self.options.fused else functools.partial(self.net.forward_eager, tree=tree)
            logits, hidden = run(tokens.to(self.device), start, layers)
            logits = logits.float()
        else:
            step = self._graph(rows, layers)
            step.tokens[:n].copy_(tokens)
            step.pos.copy_(self.net.slot_ids[start:start + rows])
            step.replay()
            logits = step.logits[:n].to(torch.float32, copy=True)  # the next replay overwrites them
            hidden = step.hidden[:n].clone() if want_hidden else None
        self._len = start + n
        return logits, hidden

    def _fused_pass(self, tokens: torch.Tensor, start: int, layers: tuple[int, ...]):
        """A pass too long for a graph through the graphs' own kernels, so that its k and v (and
        logits) have the bits a batched NativeSlots pass gives the same tokens (rule 6)."""
        from specdec.models.triton_forward import forward

        return forward(self.net, tokens, self.net.slot_ids[start:start + tokens.shape[0]], layers)

    # -- CUDA graphs -------------------------------------------------------------------------
    def capture(self, *row_counts: int) -> None:
        """Capture graphs ahead of time (else the first forward of each size captures its own)."""
        with torch.inference_mode():
            for n in row_counts:
                rows = self._graph_rows(n)
                if rows is not None:
                    self._graph(rows)

    def _graph_rows(self, n: int) -> int | None:
        return n if self.options.graphs and n <= self.options.max_graph_rows else None

    def _graph(self, rows: int, layers: tuple[int, ...] = ()) -> _StepGraph:
        """The graph of `rows` tokens that also returns the outputs of `layers` (one per choice)."""
        if (rows, layers) not in self._graphs:
            if self.options.megakernel and rows == 1 and not layers:
                from specdec.models.megakernel import MegakernelStep

                step_fn = MegakernelStep(self.net)
            else:  # the choice is bound into this model's step, so models sharing one net keep their own
                step_fn = functools.partial(self.net.forward_static, fused=self.options.fused, capture=layers)
            self._graphs[rows, layers] = _StepGraph(self.net, rows, step_fn)
        return self._graphs[rows, layers]


def net_from_hf(hf_model, slots: int) -> LlamaNet:
    """A net of `slots` cache slots holding the weights of a loaded transformers model, where they live."""
    weight = hf_model.get_input_embeddings().weight
    net = build_net(arch_from_hf(hf_model.config), slots, weight.device, weight.dtype)
    load_hf_state(net, hf_model.state_dict())
    return net


def adopt_on_cpu(net: LlamaNet, hf_model, pack: bool):
    """On a CPU: the net shares hf_model's embedding table (no second copy) and, with `pack`, holds
    its matrices as cpu_matrix.choose_layout picks for this CPU (or plain); hf_model is returned to
    be kept as the model's `.model`. Elsewhere nothing happens and None is returned."""
    if net.slot_ids.device.type != "cpu":
        return None
    net.embed.weight = hf_model.get_input_embeddings().weight
    if pack:
        net.pack_for_cpu()
    return hf_model


def cache_slots(max_length: int, choices: dict) -> int:
    """Cache slots: max_length plus room for the graphs' warm-up rows, rounded up to 64 (aligned attention masks)."""
    rows = choices["options"].max_graph_rows if choices.get("options") else choices.get("max_graph_rows", 17)
    return -(-(max_length + rows) // 64) * 64




__all__ = ["LlamaArch", "NativeLlama", "NativeOptions"]
