"""One rank's share of a LlamaNet (Megatron-style): q/k/v and gate/up split by columns, whole KV
heads per rank; o and down split by rows, their partial outputs summed over ranks by the net's
reduce_partial hook; embedding, norms and LM head replicated, so every rank ends a forward with the
same logits. Each rank's KV cache holds only its own heads.

Rank r of W holds query heads r*H/W.., KV heads r*Hkv/W.. (the query heads of a KV head stay
with it, since they are consecutive) and intermediate columns r*I/W...
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from specdec.errors import InvalidRequestError
from specdec.models.llama_config import LlamaArch
from specdec.models.llama_net import LlamaNet, build_net


def check_divisible(arch: LlamaArch, world: int) -> None:
    """An InvalidRequestError unless `world` ranks can each hold whole KV heads and equal FFN shares."""
    if world < 1:
        raise InvalidRequestError(f"--tensor-parallel-size must be >= 1, got {world}")
    for what, count in (("KV heads", arch.n_kv_heads), ("intermediate (FFN) columns", arch.intermediate)):
        if count % world:
            raise InvalidRequestError(f"tensor parallel size {world} does not divide the target's {count} {what}: "
                                      f"choose a size that divides {arch.n_kv_heads} and {arch.intermediate}")


def local_arch(arch: LlamaArch, world: int) -> LlamaArch:
    """The shapes one rank's layers have (head_dim fixed, so RoPE is the whole model's)."""
    check_divisible(arch, world)
    return replace(arch, n_heads=arch.n_heads // world, n_kv_heads=arch.n_kv_heads // world,
                   intermediate=arch.intermediate // world, head_dim=arch.head_dim)


@torch.no_grad()
def shard_net(full: LlamaNet, rank: int, world: int, device: torch.device,
              reduce: Callable[[torch.Tensor], torch.Tensor]) -> LlamaNet:
    """Rank `rank`'s share of `full` (plain, unpacked matrices) on `device`, summing with `reduce`."""
    if full.cpu_layout is not None:
        raise ValueError("shard_net needs the plain matrices, not a net packed for a CPU")
    arch = full.arch
    mine = build_net(local_arch(arch, world), full.slots, device, full.embed.weight.dtype)
    mine.embed.weight.copy_(full.embed.weight)
    mine.norm.copy_(full.norm)
    if mine.lm_head is not None:
        mine.lm_head.weight.copy_(full.lm_head.weight)
    hd = arch.head_dim
    for block, whole in zip(mine.layers, full.layers):
        q, k, v = whole.wqkv.weight.split([arch.n_heads * hd, arch.n_kv_heads * hd, arch.n_kv_heads * hd])
        rows = [w.chunk(world)[rank] for w in (q, k, v)]  # [local heads * hd, D] each
        block.wqkv.weight.copy_(torch.cat(rows))
        if whole.wqkv.bias is not None:
            bq, bk, bv = whole.wqkv.bias.split([arch.n_heads * hd, arch.n_kv_heads * hd, arch.n_kv_heads * hd])
            block.wqkv.bias.copy_(torch.cat([b.chunk(world)[rank] for b in (bq, bk, bv)]))
        block.wo.weight.copy_(whole.wo.weight.chunk(world, dim=1)[rank])  # [D, local H hd]
        if whole.wo.bias is not None:  # added once: by rank 0 before the sum
            block.wo.bias.copy_(whole.wo.bias if rank == 0 else torch.zeros_like(whole.wo.bias))
        gate, up = whole.w13.weight.chunk(2)
        block.w13.weight.copy_(torch.cat([gate.chunk(world)[rank], up.chunk(world)[rank]]))
        block.w2.weight.copy_(whole.w2.weight.chunk(world, dim=1)[rank])  # [D, local I]
        block.attn_norm.copy_(whole.attn_norm)
        block.ffn_norm.copy_(whole.ffn_norm)
    mine.reduce_partial = reduce
    return mine
