"""The tensor-parallel target: on rank 0 a CausalLM that the engine drives like any other, which
broadcasts each call to the other ranks; on them a loop that runs what rank 0 sent.

Rank 0 decides everything (the drafter runs there, and so does the rejection rule); the other ranks
only ever see forward / extend / rollback commands, in the order rank 0 issued them, so all the
ranks' caches hold the same tokens. The LM head is replicated and the residual stream is summed
over all ranks, so every rank computes the same logits; rank 0 returns its own.
"""

from __future__ import annotations

import logging
from typing import Callable

import torch

from specdec.models.base import CausalLM, check_feature_layers
from specdec.models.tree_rows import refuse_trees
from specdec.models.llama_net import LlamaNet
from specdec.models.native_llama import NativeLlama, NativeOptions
from specdec.parallel.group import (MAX_FEATURE_LAYERS, Command, Op, TensorParallelError, all_reduce_sum,
                                    receive_command, send_command)
from specdec.parallel.shard import shard_net

log = logging.getLogger(__name__)

# What a rank builds its share from: () -> (the whole net, plain matrices, on the CPU or this rank's
# device; the model's name; its max_length). Picklable, since spawned ranks call it too.
TargetRecipe = Callable[[], tuple[LlamaNet, str, int]]


def build_shard(built: tuple[LlamaNet, str, int], rank: int, world: int, device: torch.device) -> NativeLlama:
    """This rank's NativeLlama over its share of a recipe's result. CUDA graphs on CUDA (they hold
    the all-reduces); never the fused Triton kernels, which have no reduce hook."""
    full, name, max_length = built
    net = shard_net(full, rank, world, device, all_reduce_sum)
    options = NativeOptions(graphs=device.type == "cuda")
    return NativeLlama(net, f"{name} (tensor parallel {world})", max_length, options=options)


def run_commands(shard: NativeLlama, device: torch.device) -> None:
    """A rank other than 0: run rank 0's commands on the shard until STOP."""
    while True:
        command, tokens = receive_command(device)
        if command.op == Op.STOP:
            return
        execute(shard, command, tokens)


def execute(shard: NativeLlama, command: Command, tokens: torch.Tensor | None):
    if command.op == Op.ROLLBACK:
        return shard.rollback(command.n)
    if command.op == Op.EXTEND:
        return shard.extend(tokens)
    if command.op == Op.FORWARD_HIDDEN:
        return shard.forward_with_hidden(tokens, command.layers)
    return shard.forward(tokens)


class TensorParallelLM(CausalLM):
    """Rank 0's face of a target sharded over `world` ranks. `failure(exc)` says which rank failed
    when a collective raises (launch.Ranks); `close()` stops every rank."""

    def __init__(self, shard: NativeLlama, world: int, failure: Callable[[BaseException], str],
                 on_close: Callable[[bool], None]):
        self.shard = shard
        self.net = shard.net  # embedding, final norm, LM head: replicated, what a draft head reads
        self.model = None
        self.arch = shard.net.arch
        self.name, self.vocab_size = shard.name, shard.vocab_size
        self.max_length, self.device = shard.max_length, shard.device
        self.world = world
        self._failure, self._on_close = failure, on_close
        self._closed = False

    @property
    def cache_len(self) -> int:
        return self.shard.cache_len

    @property
    def cheap_verify_rows(self) -> bool:
        return self.shard.cheap_verify_rows

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.shard.cache_len:  # refused before any rank hears of it
            raise ValueError(f"cannot roll back to {length}: the cache holds {self.shard.cache_len} tokens")
        self._everywhere(Command(Op.ROLLBACK, length), None)

    def forward(self, tokens: torch.Tensor, tree: tuple[int, ...] | None = None) -> torch.Tensor:
        refuse_trees(self.name, tree, tokens.shape[0], "its ranks run causal passes only")
        return self._everywhere(Command(Op.FORWARD, self._checked(tokens)), tokens)

    def extend(self, tokens: torch.Tensor) -> None:
        self._everywhere(Command(Op.EXTEND, self._checked(tokens)), tokens)

    def forward_with_hidden(self, tokens: torch.Tensor, layers: tuple[int, ...] = (),
                            tree: tuple[int, ...] | None = None):
        refuse_trees(self.name, tree, tokens.shape[0], "its ranks run causal passes only")
        layers = check_feature_layers(layers, self.arch.n_layers) if layers else ()
        if len(layers) > MAX_FEATURE_LAYERS:
            raise ValueError(f"at most {MAX_FEATURE_LAYERS} feature layers under tensor parallelism")
        return self._everywhere(Command(Op.FORWARD_HIDDEN, self._checked(tokens), layers), tokens)

    def close(self) -> None:
        """Stop the other ranks (STOP when they are well, else terminate them) and leave the group."""
        if self._closed:
            return
        self._closed = True
        healthy = True
        try:
            send_command(Command(Op.STOP), None, self.device)
        except Exception:  # noqa: BLE001  (a dead rank: on_close terminates the rest)
            healthy = False
        self._on_close(healthy)

    def _checked(self, tokens: torch.Tensor) -> int:
        n = tokens.shape[0]
        if self.shard.cache_len + n > self.max_length:
            raise ValueError(f"{self.shard.cache_len} cached + {n} new tokens exceed the cache of {self.max_length}")
        return n

    def _everywhere(self, command: Command, tokens: torch.Tensor | None):
        if self._closed:
            raise TensorParallelError("the tensor-parallel target is closed")
        try:
            send_command(command, tokens, self.device)
            return execute(self.shard, command, tokens)
        except TensorParallelError:
            raise
        except (RuntimeError, ValueError) as exc:  # a collective failed: some rank died or hung
            raise TensorParallelError(self._failure(exc)) from exc
