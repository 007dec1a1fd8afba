"""Fast backend for the Llama family: a preallocated KV cache and, on CUDA, captured CUDA graphs.

Rolling back only moves `cache_len`: the slots after it are overwritten by the next tokens.

On CUDA every forward of n <= max_graph_rows tokens replays a CUDA graph captured for exactly that
many rows (the single-token draft step, the K+1-token verify step): one launch for the whole
model, the positions living on the device, so a draft loop runs with no host synchronisation.
The layer function is compiled with torch.compile before capture (fused norms, RoPE and SwiGLU).

`pad_rows` > 0 runs every forward of up to that many tokens with exactly that many rows (extra
rows are scratch writes past the cache length). The matmul kernels then see one shape whatever
the number of real tokens, so a verify pass gives each row bit-for-bit the logits that a
single-token step gives: greedy speculative output equals plain greedy output even in bf16.
Without padding the default attention (SDPA) already computes each row independently of the row
count, and an H200 run gave 100% identity (docs/gpu.md); `net.math_attention = True` is ~10%
faster per step but row-count dependent, so use it together with pad_rows.

`kernels="triton"` runs the graphed steps through the fused Triton kernels of `triton_ops` instead
(six kernels per layer, no torch.compile; exact by construction, each row computed the same way
whatever the row count). `"auto"` takes them on CUDA when Triton and the shape allow.

`megakernel=True` (Hopper GPUs, bf16) runs single-token steps as one persistent CUDA kernel
(`megakernel.py`) and the rest as before. Its logits differ from a verify pass's in the last bits,
so it is for draft models only: the engine refuses it as a target.
"""

from __future__ import annotations

import functools
import logging
import os

import torch

from specdec.models.base import CausalLM, check_feature_layers
from specdec.models.llama_config import LlamaArch, arch_from_hf, named_arch
from specdec.models.llama_net import (
    LlamaNet,
    build_net,
    init_random,
    layer_step,
    load_hf_state,
)

log = logging.getLogger(__name__)


class _StepGraph:
    """One CUDA graph of LlamaNet.forward_static over `rows` tokens, with its static buffers.

    Off CUDA there is nothing to capture: replay() runs the same static-shape forward eagerly,
    which lets the CPU tests check the padded-row and device-mask logic the graphs rely on.
    """

    def __init__(self, net: LlamaNet, rows: int, step_fn=None):
        self.step_fn = step_fn or net.forward_static
        device = net.slot_ids.device
        self.tokens = torch.zeros(rows, dtype=torch.long, device=device)
        # Warm-up runs really execute: point them at the last slots, which no real token uses.
        self.pos = net.slot_ids[net.slots - rows:].clone()
        self.graph = None
        if device.type != "cuda":
            return
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # compile and autotune outside the capture
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
                 compile: bool | str = True, max_graph_rows: int = 17, pad_rows: int = 0,
                 kernels: str = "auto", megakernel: bool = False):
        self.net = net.eval()
        self.model = None  # the transformers model it was built from, kept on a CPU (see from_hf)
        self.arch = net.arch
        self.name = name
        self.vocab_size = net.arch.vocab_size
        self.max_length = max_length
        self.device = net.slot_ids.device
        if net.slots < max_length + max(max_graph_rows, pad_rows):
            raise ValueError("the cache needs max_graph_rows spare slots past max_length for padded rows")
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else cuda_graphs
        self.max_graph_rows = max(max_graph_rows, pad_rows)
        self.pad_rows = pad_rows
        self._compile = compile  # True/"layer": compile the layer function; "step": the whole step
        self._step_fn = None
        self._graphs: dict[tuple[int, tuple[int, ...]], _StepGraph] = {}  # by (rows, feature layers)
        self._len = 0
        if kernels == "triton" and not self.cuda_graphs:
            raise ValueError("kernels='triton' runs the graphed steps: it needs cuda_graphs (on CUDA, the default)")
        self.fused_kernels = _use_fused_kernels(kernels, net.arch, self.device) and self.cuda_graphs
        self.megakernel = megakernel
        if megakernel:
            from specdec.models import megakernel as mk

            reason = mk.unavailable(net.arch, self.device) or (None if self.cuda_graphs else "it needs cuda_graphs")
            if reason:
                raise ValueError(f"megakernel=True: {reason}")

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
        arch = arch_from_hf(hf_model.config)
        weight = hf_model.get_input_embeddings().weight
        max_length = min(max_length or 4096, arch.max_position)
        net = build_net(arch, _slots(max_length, options), weight.device, weight.dtype)
        load_hf_state(net, hf_model.state_dict())
        model = cls(net, name, max_length, **options)
        if model.device.type == "cpu":
            net.embed.weight = weight  # the kept model's own table: no second copy
            if pack is not False and not model.fused_kernels:
                net.pack_for_cpu()  # the layout cpu_matrix.choose_layout picks for this CPU (or none)
            model.model = hf_model
        return model

    @classmethod
    def random(cls, size: str, device="cuda", dtype=torch.bfloat16, max_length: int = 2048, seed: int = 0,
               arch_overrides: dict | None = None, **options) -> "NativeLlama":
        """Random weights at a named real size (`llama-3.1-8b`, `llama-3.2-1b`, ...), for timing.
        arch_overrides changes fields of that shape (e.g. n_layers=2 for a quick smoke run)."""
        arch = named_arch(size, **(arch_overrides or {}))
        net = build_net(arch, _slots(max_length, options), torch.device(device), dtype)
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

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._forward(tokens, (), want_hidden=False)[0]

    def forward_with_hidden(self, tokens: torch.Tensor, layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [n] -> logits [n, V] fp32 and features [n, (len(layers) + 1) * D] (the outputs of
        `layers`, then the final-norm features), appended to the cache."""
        return self._forward(tokens, layers, want_hidden=True)

    @torch.inference_mode()
    def _forward(self, tokens: torch.Tensor, layers: tuple[int, ...], want_hidden: bool):
        # forward() skips copying the features out of the graph: one copy less a step (a few us on a GPU)
        n, start = tokens.shape[0], self._len
        if start + n > self.max_length:
            raise ValueError(f"{start} cached + {n} new tokens exceed the cache of {self.max_length}")
        layers = check_feature_layers(layers, self.arch.n_layers) if layers else ()
        rows = self._graph_rows(n)
        if rows is None:
            logits, hidden = self.net.forward_eager(tokens.to(self.device), start, layers)
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

    # -- CUDA graphs -------------------------------------------------------------------------
    def capture(self, *row_counts: int) -> None:
        """Capture graphs ahead of time (else the first forward of each size captures its own)."""
        with torch.inference_mode():
            for n in row_counts:
                rows = self._graph_rows(n)
                if rows is not None:
                    self._graph(rows)

    def _graph_rows(self, n: int) -> int | None:
        if not self.cuda_graphs or n > self.max_graph_rows:
            return None
        return self.pad_rows if n <= self.pad_rows else n

    def _graph(self, rows: int, layers: tuple[int, ...] = ()) -> _StepGraph:
        """The graph of `rows` tokens that also returns the outputs of `layers` (one per choice)."""
        if (rows, layers) not in self._graphs:
            compiled = self._step_fn is not None if self._compile == "step" else self.net.layer_fn is not layer_step
            if self._compile and self.device.type == "cuda" and not compiled and not self.fused_kernels:
                self._try_compile(rows)
            if self.megakernel and rows == 1 and not layers:
                from specdec.models.megakernel import MegakernelStep

                step_fn = MegakernelStep(self.net)
            else:  # the choice is bound into this model's step, so models sharing one net keep their own
                step_fn = functools.partial(self._step_fn or self.net.forward_static, fused=self.fused_kernels,
                                            capture=layers)
            self._graphs[rows, layers] = _StepGraph(self.net, rows, step_fn)
        return self._graphs[rows, layers]

    def _try_compile(self, rows: int) -> None:
        """Compile the layer function once; if this PyTorch cannot, keep the eager one (still graphed)."""
        import torch._dynamo.config as dynamo_config

        # One compiled layer serves every layer, the target and the draft; shapes that differ
        # (rows, widths) become dynamic after a recompile or two, so a small limit is plenty.
        for knob in ("recompile_limit", "cache_size_limit"):
            if hasattr(dynamo_config, knob):
                setattr(dynamo_config, knob, max(getattr(dynamo_config, knob), 32))
        if self._compile == "step":  # one graph for all layers: fuses across layer boundaries too
            self._step_fn = torch.compile(self.net.forward_static, fullgraph=True)
        else:
            self.net.layer_fn = torch.compile(layer_step, fullgraph=True)
        try:
            tokens = torch.zeros(rows, dtype=torch.long, device=self.device)
            (self._step_fn or self.net.forward_static)(tokens, self.net.slot_ids[self.net.slots - rows:])
        except Exception as exc:  # noqa: BLE001 - any compiler failure means: run uncompiled
            log.warning("torch.compile failed (%s); CUDA graphs run the eager layers", str(exc).splitlines()[0])
            self.net.layer_fn = layer_step
            self._step_fn = None
            self._compile = False


def _use_fused_kernels(kernels: str, arch: LlamaArch, device: torch.device) -> bool:
    """Whether graphed steps take the Triton kernels: "torch" never, "triton" always (or a clear
    error saying why it cannot), "auto" on CUDA when it can. Off CUDA only Triton's interpreter
    runs them (TRITON_INTERPRET=1: the CPU tests)."""
    if kernels not in ("auto", "triton", "torch"):
        raise ValueError(f"kernels must be auto, triton or torch, not {kernels!r}")
    if kernels == "torch":
        return False
    reason = None
    if device.type != "cuda" and (kernels == "auto" or os.environ.get("TRITON_INTERPRET") != "1"):
        reason = f"the fused kernels run on CUDA (this model is on {device.type})"
    else:
        try:
            from specdec.models import triton_ops
        except ImportError as exc:
            reason = f"Triton is not importable ({exc}); install it or use kernels='torch'"
        else:
            reason = triton_ops.supports(arch)
    if reason and kernels == "triton":
        raise ValueError(f"kernels='triton': {reason}")
    return reason is None


def _slots(max_length: int, options: dict) -> int:
    """Cache slots: max_length plus room for padded rows, rounded up to 64 (aligned attention masks)."""
    extra = max(options.get("max_graph_rows", 17), options.get("pad_rows", 0))
    return -(-(max_length + extra) // 64) * 64


__all__ = ["LlamaArch", "NativeLlama"]
