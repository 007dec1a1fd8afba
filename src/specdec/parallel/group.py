"""The process group of a tensor-parallel target, and the commands rank 0 broadcasts to the others.

The backend follows the device: NCCL for CUDA ranks, gloo for CPU ranks. Every collective has the
group's timeout, so a rank that stops answering turns into an error, never a wait without end.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from enum import IntEnum

import torch
import torch.distributed as dist

from specdec.errors import SpecdecError

MAX_FEATURE_LAYERS = 8  # the most layers a forward_with_hidden command can name


class TensorParallelError(SpecdecError):
    """A rank of a tensor-parallel target failed, died or stopped answering."""


class Op(IntEnum):
    FORWARD = 1  # n tokens follow; logits wanted
    FORWARD_HIDDEN = 2  # n tokens follow; logits and the features of the named layers
    EXTEND = 3  # n tokens follow; no logits (a prefill)
    ROLLBACK = 4  # cut the cache to n tokens
    STOP = 5  # leave the loop and the group


@dataclass(frozen=True)
class Command:
    op: Op
    n: int = 0
    layers: tuple[int, ...] = ()


@dataclass(frozen=True)
class GroupOptions:
    """Where the ranks meet and how long a collective may wait for the slowest rank."""

    world: int
    addr: str
    port: int
    timeout_s: float = 120.0


def device_for(rank: int, device_type: str) -> torch.device:
    return torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")


def join_group(rank: int, options: GroupOptions, device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank, world_size=options.world,
                            init_method=f"tcp://{options.addr}:{options.port}",
                            timeout=datetime.timedelta(seconds=options.timeout_s))


def leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(partial: torch.Tensor) -> torch.Tensor:
    """The sum over ranks of a row-split matrix's partial output, in place (LlamaNet.reduce_partial)."""
    dist.all_reduce(partial)
    return partial


def send_command(command: Command, tokens: torch.Tensor | None, device: torch.device) -> None:
    """Rank 0: broadcast a command, then its tokens [n] when it carries some."""
    header = torch.zeros(3 + MAX_FEATURE_LAYERS, dtype=torch.long)
    header[:3] = torch.tensor([int(command.op), command.n, len(command.layers)])
    header[3:3 + len(command.layers)] = torch.tensor(command.layers, dtype=torch.long)
    dist.broadcast(header.to(device), src=0)
    if tokens is not None:
        dist.broadcast(tokens.to(device, torch.long), src=0)


def receive_command(device: torch.device) -> tuple[Command, torch.Tensor | None]:
    """Other ranks: the next command and its tokens (as send_command sent them)."""
    header = torch.empty(3 + MAX_FEATURE_LAYERS, dtype=torch.long, device=device)
    dist.broadcast(header, src=0)
    op, n, count = (int(v) for v in header[:3].tolist())
    command = Command(Op(op), n, tuple(int(v) for v in header[3:3 + count].tolist()))
    if command.op in (Op.ROLLBACK, Op.STOP):
        return command, None
    tokens = torch.empty(n, dtype=torch.long, device=device)
    dist.broadcast(tokens, src=0)
    return command, tokens
