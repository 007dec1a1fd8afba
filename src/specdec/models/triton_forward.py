"""A whole forward pass of the native Llama net through the fused Triton kernels: six a layer
(triton_ops' GEMVs with their folded norms and epilogues, triton_attention's two attention
kernels), for one sequence (NativeLlama's graphed steps) or a ragged batch of a slot cache
(NativeSlots), with one code path: a pass is told where its rows go (PassRows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from specdec.models.triton_attention import CHUNK, AttentionRows, attention, one_sequence
from specdec.models.triton_ops import NormInput, embed, gemv, gemv_then_norm, qkv_rope, rms_norm


@dataclass(frozen=True)
class PassRows:
    """Where the T rows of a pass go (device tensors): slots [T] the cache slots their k and v are
    written to, rope [T] their positions inside their own sequences, attention their blocks."""

    slots: torch.Tensor
    rope: torch.Tensor
    attention: AttentionRows


def fused_layer_step(x: torch.Tensor, inp: NormInput, block, rows: PassRows, cos: torch.Tensor,
                     sin: torch.Tensor, arch, next_norm: torch.Tensor | None) -> tuple[torch.Tensor, NormInput | None]:
    """One decoder layer in six kernels: x [n, D] (and its NormInput) -> the layer's output and the
    next layer's NormInput (next_norm: that layer's attn_norm; None after the last layer)."""
    eps = arch.norm_eps
    q = qkv_rope(inp, block.wqkv.weight, block.wqkv.bias, cos, sin, rows.rope, rows.slots, block.k_cache,
                 block.v_cache, arch.n_heads, arch.n_kv_heads)
    out = attention(q, block.k_cache, block.v_cache, rows.rope, rows.attention, arch.n_heads, arch.n_kv_heads)
    h, h_in = gemv_then_norm(out, block.wo.weight, block.ffn_norm, eps, bias=block.wo.bias, residual=x)
    act = gemv(h_in, block.w13.weight, swiglu=True)
    if next_norm is None:
        return gemv(act, block.w2.weight, residual=h), None
    return gemv_then_norm(act, block.w2.weight, next_norm, eps, residual=h)


def forward_rows(net, tokens: torch.Tensor, rows: PassRows, capture: tuple[int, ...] = (),
                 head: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [T] placed as rows says -> logits [R, V] of the rows `head` [R] (None: all T),
    features [T, (len(capture) + 1) * D] (the outputs of the layers in `capture`, then the
    final-norm features). A prefill pass skips the head: 64 prompts of 384 tokens are 6 GB of logits."""
    a = net.arch
    layers = net.layers
    x, inp = embed(tokens, net.embed.weight, layers[0].attn_norm, a.norm_eps)
    captured = []
    for i, block in enumerate(layers):
        next_norm = layers[i + 1].attn_norm if i + 1 < len(layers) else None
        x, inp = fused_layer_step(x, inp, block, rows, net.cos, net.sin, a, next_norm)
        if i in capture:
            captured.append(x)  # a new tensor per layer: nothing overwrites it
    hidden = rms_norm(x, net.norm, a.norm_eps)  # [T, D]
    features = torch.cat(captured + [hidden], dim=-1) if captured else hidden
    head_in = hidden if head is None else hidden.index_select(0, head)
    if head_in.shape[0] == 0:
        return head_in.new_empty(0, a.vocab_size), features
    return gemv(head_in, net.lm_weight()), features


def forward_tree(net, tokens: torch.Tensor, start: int, parents: tuple[int, ...],
                 capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """A tree pass of one sequence from slot 0 (NativeLlama's cache): tokens [n] after `start` cached
    ones, row r at position start + depth(r) with parents (specdec.trees), its k and v at slot
    start + r -> as forward_rows. The graphed steps' kernels, unrecorded (their one-sequence table
    knows no tree): each row's logits are those of its path's graphed single steps."""
    from specdec.models.ragged_plan import RaggedPlan, exact_layout

    plan = RaggedPlan((int(tokens.shape[0]),), (start,), (0,), (True,), trees=(tuple(parents),))
    layout = exact_layout(plan, net.arch.group)
    meta = torch.from_numpy(plan.pack(layout, net.arch.group, 0, 1)).to(tokens.device)
    rows, _ = layout.views(meta, triton.cdiv(net.slots, CHUNK))
    return forward_rows(net, tokens, rows, capture)


def forward(net, tokens: torch.Tensor, pos: torch.Tensor,
            capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """LlamaNet.forward_static through these kernels: one sequence from slot 0, tokens at
    positions (= cache slots) pos [n]."""
    blocks = one_sequence(int(tokens.shape[0]), net.arch.group, net.slots, pos.device)
    return forward_rows(net, tokens, PassRows(pos, pos, blocks), capture)
