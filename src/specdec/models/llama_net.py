"""The Llama-family network, written out (gpt-fast style): RMSNorm, RoPE, grouped-query attention
over a preallocated KV cache, SwiGLU.

Shapes: n new tokens of one sequence (batch 1), D = dim, H query heads, Hkv KV heads, G = H // Hkv,
hd = head dim, S = cache slots. The cache of a layer is k, v: [Hkv, S, hd]; a token at position p
lives in slot p, so rolling back is only a shorter length (the caller keeps it) and the stale slots
are overwritten later.

q, k and v are one fused matmul, and gate and up another: fewer, larger kernels (one launch
instead of three on a GPU; one pass over x on a CPU).

On a CPU each matrix is held as a CpuMatrix (cpu_matrix.py: one layout policy, chosen once from
the CPU's capabilities) and the layers just call `linear(x, w)`.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import nn

from specdec.models.cpu_matrix import CpuCaps, CpuLayout, CpuMatrix, choose_layout, linear, row_exact_slices
from specdec.models.llama_config import LlamaArch

log = logging.getLogger(__name__)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise in fp32 and cast back before the weight, exactly as transformers does."""
    if x.dtype == torch.float32:  # the same arithmetic in one fused op (fewer small ops on a CPU)
        return F.rms_norm(x, weight.shape, weight, eps)
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


ATTN_SPAN = 128  # eager steps attend over whole blocks of this many cache slots (forward_eager)
EXACT_PASS_ROWS = 64  # row-count invariant passes up to this many tokens attend token by token (verify passes)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in the half-split layout of HF checkpoints: x [..., hd]; cos, sin [..., hd] broadcast
    against x (e.g. x [n, heads, hd] with cos [n, 1, hd]). The reference every copy follows."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def layer_step(
    x: torch.Tensor, attn_norm: torch.Tensor, wqkv: torch.Tensor, bqkv: torch.Tensor | None,
    wo: torch.Tensor, bo: torch.Tensor | None, ffn_norm: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None,
    cos: torch.Tensor, sin: torch.Tensor, kv_len: int, n_heads: int, n_kv_heads: int, eps: float,
    token_spans: tuple[int, ...] = (),
) -> torch.Tensor:
    """One decoder layer on x [n, D]; writes this step's k, v into the cache at `pos` [n].

    mask: [G*n, kv_len] additive (0 where the row may attend, -inf elsewhere; built once per step,
    not per layer), or None when every cached slot up to kv_len may be seen (a single token).
    cos, sin: [n, hd], the RoPE tables at the tokens' positions. token_spans: one SDPA call per
    token over its own span of slots (its G query rows, the call its single-token step makes), so
    that a verify pass attends exactly as n single steps would.
    """
    n = x.shape[0]
    hd = k_cache.shape[-1]
    group = n_heads // n_kv_heads
    qkv = linear(rms_norm(x, attn_norm, eps), wqkv, bqkv)  # [n, (H + 2 Hkv) hd]
    q, k, v = qkv.split([n_heads * hd, n_kv_heads * hd, n_kv_heads * hd], dim=-1)
    q = rotate(q.view(n, n_heads, hd), cos[:, None], sin[:, None])
    k = rotate(k.view(n, n_kv_heads, hd), cos[:, None], sin[:, None])
    k_cache[:, pos] = k.transpose(0, 1)
    v_cache[:, pos] = v.view(n, n_kv_heads, hd).transpose(0, 1)
    # GQA without copying the cache: the G query heads of a KV head become G*n query rows.
    q = q.view(n, n_kv_heads, group, hd).permute(1, 2, 0, 3).reshape(1, n_kv_heads, group * n, hd)
    keys, values = k_cache[None, :, :kv_len], v_cache[None, :, :kv_len]  # [1, Hkv, kv_len, hd]
    if token_spans:  # query rows are (g, token): token m's G rows are q[..., g * n + m, :]
        per_token = q.view(1, n_kv_heads, group, n, hd)
        masks = mask.view(group, n, kv_len)
        out = torch.stack([F.scaled_dot_product_attention(per_token[:, :, :, m], keys[:, :, :span], values[:, :, :span],
                                                          attn_mask=masks[:, m, :span])
                           for m, span in enumerate(token_spans)], dim=3)  # [1, Hkv, G, n, hd]
    else:
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
    out = out.reshape(n_kv_heads, group, n, hd).permute(2, 0, 1, 3).reshape(n, n_heads * hd)
    h = x + linear(out, wo, bo)
    gate, up = linear(rms_norm(h, ffn_norm, eps), w13).chunk(2, dim=-1)  # [n, I] each
    return h + linear(F.silu(gate) * up, w2)


class Block(nn.Module):
    """The weights of one decoder layer, and its KV cache: k, v [Hkv, S, hd] (one tensor per layer,
    which the fused kernels and the megakernel address directly)."""

    def __init__(self, arch: LlamaArch, slots: int):
        super().__init__()
        hd, d = arch.head_dim, arch.dim
        self.attn_norm = nn.Parameter(torch.ones(d))
        self.wqkv = nn.Linear(d, (arch.n_heads + 2 * arch.n_kv_heads) * hd, bias=arch.qkv_bias)
        self.wo = nn.Linear(arch.n_heads * hd, d, bias=arch.out_bias)
        self.ffn_norm = nn.Parameter(torch.ones(d))
        self.w13 = nn.Linear(d, 2 * arch.intermediate, bias=False)  # gate rows, then up rows
        self.w2 = nn.Linear(arch.intermediate, d, bias=False)
        self.register_buffer("k_cache", torch.empty(arch.n_kv_heads, slots, hd), persistent=False)
        self.register_buffer("v_cache", torch.empty(arch.n_kv_heads, slots, hd), persistent=False)
        self.packed: dict[str, CpuMatrix] = {}  # CPU only: the matrices by name (see pack_for_cpu)

    def weights(self) -> tuple:
        w = {name: self.packed.get(name, getattr(self, name).weight) for name in ("wqkv", "wo", "w13", "w2")}
        return (self.attn_norm, w["wqkv"], self.wqkv.bias, w["wo"], self.wo.bias,
                self.ffn_norm, w["w13"], w["w2"])


class LlamaNet(nn.Module):
    """Weights, RoPE tables and a KV cache of `slots` positions. Knows nothing of the cache length."""

    def __init__(self, arch: LlamaArch, slots: int):
        super().__init__()
        self.arch = arch
        self.slots = slots
        self.embed = nn.Embedding(arch.vocab_size, arch.dim)
        self.layers = nn.ModuleList(Block(arch, slots) for _ in range(arch.n_layers))
        self.norm = nn.Parameter(torch.ones(arch.dim))
        self.lm_head = None if arch.tie_embeddings else nn.Linear(arch.dim, arch.vocab_size, bias=False)
        self.register_buffer("slot_ids", torch.empty(slots, dtype=torch.long), persistent=False)
        self.register_buffer("cos", torch.empty(slots, arch.head_dim), persistent=False)  # [S, hd]
        self.register_buffer("sin", torch.empty(slots, arch.head_dim), persistent=False)
        self._packed_lm: CpuMatrix | None = None  # the LM head, by pack_for_cpu
        self.cpu_layout: CpuLayout | None = None  # how pack_for_cpu holds the matrices (None: plain)
        # True when every matrix gives a row the same bits at any row count (bf16 prepacked on a
        # CPU): eager attention then keeps that too (forward_eager). Set by pack_for_cpu.
        self.row_count_invariant = False

    @torch.no_grad()
    def reset_buffers(self) -> None:
        """Fill the cache with zeros and the RoPE tables (angles in fp32, then cast, as HF does)."""
        # Zeros, not garbage: masked slots still enter the attention product, and NaN * 0 is NaN.
        for layer in self.layers:
            layer.k_cache.zero_()
            layer.v_cache.zero_()
        self.slot_ids.copy_(torch.arange(self.slots))
        angles = torch.outer(torch.arange(self.slots).float(), self.arch.rope_inv_freq())  # [S, hd/2]
        angles = torch.cat([angles, angles], dim=-1)
        self.cos.copy_(angles.cos())
        self.sin.copy_(angles.sin())

    def lm_weight(self) -> torch.Tensor:
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    @torch.no_grad()
    def pack_for_cpu(self, layout: CpuLayout | None = None) -> CpuLayout | None:
        """Hold every matrix as a CpuMatrix in `layout` (None: cpu_matrix.choose_layout's choice for
        this CPU, dtype and size; where it is None the net stays plain) and return the layout used.
        Once, before the net is used (from_hf). The layer parameters are then emptied (the
        CpuMatrix holds what is needed); the embedding stays plain for lookups and the head drafter.
        bf16 with slice_bf16: each matrix shape prepacked whole or in the input slices under which
        its rows are computed alike at every row count (checked by arithmetic, row_exact_slices)."""
        if self.cpu_layout is not None:
            raise ValueError("pack_for_cpu runs once: this net is already packed")
        matrices = [getattr(block, name).weight for block in self.layers for name in ("wqkv", "wo", "w13", "w2")]
        lm = self.lm_weight()
        if layout is None:
            size = sum(w.numel() * w.element_size() for w in matrices + [lm])
            layout = choose_layout(lm.dtype, size, CpuCaps.here())
            if layout is None:
                return None
        sliced = layout.slice_bf16 and lm.dtype == torch.bfloat16
        slices = {tuple(w.shape): row_exact_slices(w, layout) for w in matrices + [lm]} if sliced else {}
        for block in self.layers:
            for name in ("wqkv", "wo", "w13", "w2"):
                w = getattr(block, name).weight
                block.packed[name] = CpuMatrix(w, layout, k_chunk=slices.get(tuple(w.shape)) or 0)
                getattr(block, name).weight = nn.Parameter(torch.empty(0), requires_grad=False)
        self._packed_lm = CpuMatrix(lm, layout, k_chunk=slices.get(tuple(lm.shape)) or 0)
        self.cpu_layout = layout
        self.row_count_invariant = sliced and None not in slices.values()
        if sliced and not self.row_count_invariant:
            log.warning("bf16 matrices of shapes %s give rows that differ by row count on this CPU, even in "
                        "slices: verify passes may not match single steps bit for bit",
                        [shape for shape, k in slices.items() if k is None])
        return layout

    def _run(self, tokens: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None, kv_len: int,
             token_spans: tuple[int, ...] = (), capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens, pos [n]; mask and kv_len as layer_step takes them -> logits [n, V] and features
        [n, (len(capture) + 1) * D]: the outputs of the layers in `capture` (a draft head's
        multi-layer features), then the final-norm features."""
        a = self.arch
        x = self.embed(tokens)  # [n, D]
        cos, sin = self.cos[pos], self.sin[pos]  # [n, hd]
        captured = []
        for i, layer in enumerate(self.layers):
            x = layer_step(x, *layer.weights(), layer.k_cache, layer.v_cache, pos, mask, cos, sin,
                           kv_len, a.n_heads, a.n_kv_heads, a.norm_eps, token_spans)
            if i in capture:
                captured.append(x)
        hidden = rms_norm(x, self.norm, a.norm_eps)  # [n, D]
        lm = self.lm_weight() if self._packed_lm is None else self._packed_lm
        features = torch.cat(captured + [hidden], dim=-1) if captured else hidden
        return linear(hidden, lm), features  # [n, V], [n, (len(capture) + 1) * D]

    def forward_eager(self, tokens: torch.Tensor, start: int,
                      capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [n] at positions start..start+n-1; each sees the slots up to its own position.
        capture: layers whose outputs come before the final-norm features (see _run).

        With row_count_invariant, attention always runs with a mask over whole blocks of ATTN_SPAN slots, and
        a pass of 2..EXACT_PASS_ROWS tokens (a verify pass) attends token by token, each token's
        query rows over its own span: the very call its single-token step makes, so a token gets
        the same bits alone or inside a verify pass. One SDPA call over several tokens' rows did
        not: over exactly start+n slots without a mask, 1-4 of 16 rows differed in the last bits
        on a Xeon; masked over blocks, one row in 16 at one layer on an AMD EPYC, as a batch too;
        enough to flip bf16 near-ties. Otherwise (fp32, whose layouts differ by row count anyway)
        a single token attends over exactly start+1 slots without a mask, ~3% faster a step on the Xeon."""
        n = tokens.shape[0]
        span = start + n
        if self.row_count_invariant:
            span = self._whole_blocks(span)
        pos = self.slot_ids[start:start + n]
        mask = self._additive_mask(pos, self.slot_ids[:span]) if n > 1 or self.row_count_invariant else None
        spans = ()
        if self.row_count_invariant and 1 < n <= EXACT_PASS_ROWS:
            spans = tuple(self._whole_blocks(start + m + 1) for m in range(n))
        return self._run(tokens, pos, mask, span, spans, capture)

    def forward_static(self, tokens: torch.Tensor, pos: torch.Tensor, fused: bool = False,
                       capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """Fixed shapes for CUDA graphs: tokens, pos [n] (device tensors); attends over all S slots
        with a mask built on the device, so the host never has to say how long the cache is, and
        every row goes through the same SDPA call whatever n is. fused: the Triton kernels of
        triton_ops instead (six per layer, each row computed independently of the row count;
        they mask by position inside the attention kernel)."""
        if fused:
            from specdec.models import triton_ops

            return triton_ops.forward(self, tokens, pos, capture)
        mask = self._additive_mask(pos, self.slot_ids)  # [G*n, S]
        return self._run(tokens, pos, mask, self.slots, capture=capture)

    def _whole_blocks(self, length: int) -> int:
        """The slots a row_count_invariant step attends over for `length` tokens: whole ATTN_SPAN blocks."""
        return min(self.slots, -(-length // ATTN_SPAN) * ATTN_SPAN)

    def _additive_mask(self, pos: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """[G*n, len(slots)]: 0 where the row's position may see the slot (slot <= pos), else -inf."""
        visible = slots[None, :] <= pos[:, None]  # [n, L]
        mask = torch.zeros(visible.shape, dtype=self.cos.dtype, device=pos.device)
        return mask.masked_fill_(~visible, float("-inf")).repeat(self.arch.group, 1)


def build_net(arch: LlamaArch, slots: int, device: torch.device, dtype: torch.dtype) -> LlamaNet:
    """An uninitialised net allocated straight on `device` in `dtype` (no fp32 copy of 8B weights
    on the host first); fill it with load_hf_state or init_random."""
    with torch.device("meta"):
        net = LlamaNet(arch, slots)
    net = net.to(dtype).to_empty(device=device)
    net.reset_buffers()
    return net


def load_hf_state(net: LlamaNet, state: dict[str, torch.Tensor]) -> None:
    """Copy a transformers Llama/Mistral/Qwen2 state_dict into the fused layout."""
    def get(name):
        return state[name]

    with torch.no_grad():
        net.embed.weight.copy_(get("model.embed_tokens.weight"))
        net.norm.copy_(get("model.norm.weight"))
        if net.lm_head is not None:
            net.lm_head.weight.copy_(state.get("lm_head.weight", get("model.embed_tokens.weight")))
        for i, block in enumerate(net.layers):
            p = f"model.layers.{i}."
            attn = [p + f"self_attn.{x}_proj" for x in "qkv"]
            block.wqkv.weight.copy_(torch.cat([get(a + ".weight") for a in attn]))
            if block.wqkv.bias is not None:
                block.wqkv.bias.copy_(torch.cat([get(a + ".bias") for a in attn]))
            block.wo.weight.copy_(get(p + "self_attn.o_proj.weight"))
            if block.wo.bias is not None:
                block.wo.bias.copy_(get(p + "self_attn.o_proj.bias"))
            block.w13.weight.copy_(torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")]))
            block.w2.weight.copy_(get(p + "mlp.down_proj.weight"))
            block.attn_norm.copy_(get(p + "input_layernorm.weight"))
            block.ffn_norm.copy_(get(p + "post_attention_layernorm.weight"))


def init_random(net: LlamaNet, seed: int = 0) -> None:
    """Random weights (normal, std 0.02; norms 1) for timing at a real size. Generated where the
    net lives, so an 8B model is filled on the GPU in a second."""
    gen = torch.Generator(device=net.embed.weight.device).manual_seed(seed)
    with torch.no_grad():
        for name, param in net.named_parameters():
            if name.endswith("norm"):
                param.fill_(1.0)
            elif name.endswith("bias"):
                param.zero_()
            else:
                param.normal_(0.0, 0.02, generator=gen)
