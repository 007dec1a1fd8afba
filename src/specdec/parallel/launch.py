"""Start the ranks of a tensor-parallel target, watch them, stop them.

open_tensor_parallel runs in the caller's process, which becomes rank 0; ranks 1..N-1 are spawned
(torch.multiprocessing, start method spawn, so CUDA works in them) and meet rank 0 at a free local
port. Shutdown: close() on a normal end; when any rank dies, a watchdog on rank 0 terminates the
others (whose collectives then fail at once) and rank 0's next call raises TensorParallelError
naming the dead rank; each spawned rank exits when rank 0's process is gone; every collective has
the group's timeout besides, so no failure waits without end.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from specdec.parallel.group import GroupOptions, TensorParallelError, device_for, join_group, leave_group
from specdec.parallel.shard import check_divisible
from specdec.parallel.target import TargetRecipe, TensorParallelLM, build_shard, run_commands

log = logging.getLogger(__name__)
POLL_S = 0.2  # how often the watchdogs look at the other processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def open_tensor_parallel(recipe: TargetRecipe, world: int, device_type: str = "cpu", timeout_s: float = 120.0,
                         built: tuple | None = None) -> TensorParallelLM:
    """The target of `recipe` sharded over `world` ranks (this process is rank 0); close() it.
    built: what recipe() returns, when this process has it already (else it calls recipe too)."""
    if device_type == "cuda" and torch.cuda.device_count() < world:
        raise TensorParallelError(f"tensor parallel size {world} needs {world} GPUs; "
                                  f"{torch.cuda.device_count()} are visible")
    if dist.is_initialized():  # torch.distributed has one default group a process
        raise TensorParallelError("one tensor-parallel target per process at a time: close() the open one first")
    built = built or recipe()
    check_divisible(built[0].arch, world)  # before any rank starts: a one-line error, no processes
    options = GroupOptions(world, "127.0.0.1", free_port(), timeout_s)
    context = mp.start_processes(_worker, args=(options, recipe, device_type, os.getpid()), nprocs=world - 1,
                                 join=False, start_method="spawn")
    ranks = Ranks(context.processes)
    device = device_for(0, device_type)
    try:
        join_group(0, options, device)
        shard = build_shard(built, 0, world, device)
    except BaseException as exc:
        ranks.stop(healthy=False)
        raise TensorParallelError(ranks.failure(exc)) from None
    ranks.watch()
    target = TensorParallelLM(shard, world, ranks.failure, ranks.stop)
    target.worker_pids = tuple(p.pid for p in context.processes)  # ranks 1.. (what a test kills)
    return target


class Ranks:
    """The spawned processes of ranks 1..N-1 (processes[i] is rank i + 1), seen from rank 0."""

    def __init__(self, processes):
        self.processes = processes
        self._stopping = threading.Event()

    def dead(self) -> list[tuple[int, int]]:
        """(rank, exit code) of every spawned rank that has exited."""
        return [(i + 1, p.exitcode) for i, p in enumerate(self.processes) if p.exitcode is not None]

    def failure(self, exc: BaseException) -> str:
        """What to tell the user when a collective (or the start) raised `exc`."""
        deadline = time.monotonic() + 2.0  # a rank that just crashed may take a moment to be reaped
        while not self.dead() and time.monotonic() < deadline:
            time.sleep(POLL_S / 4)
        dead = self.dead()
        if dead:
            gone = ", ".join(f"rank {r} (exit code {code})" for r, code in dead)
            return f"tensor parallelism failed: {gone} stopped; all ranks are shut down"
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return f"tensor parallelism failed on rank 0: {first}"

    def watch(self) -> None:
        threading.Thread(target=self._watchdog, name="tp-watchdog", daemon=True).start()

    def stop(self, healthy: bool = True) -> None:
        """Join the ranks (after a STOP when healthy), terminating those that do not leave in time."""
        self._stopping.set()
        for p in self.processes:
            p.join(timeout=10.0 if healthy else 0.5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5.0)
        leave_group()

    def _watchdog(self) -> None:
        while not self._stopping.wait(POLL_S):
            dead = [(r, code) for r, code in self.dead() if code != 0]
            if dead:
                log.error("tensor-parallel rank %d exited with code %s; stopping the others", *dead[0])
                for p in self.processes:
                    if p.is_alive():
                        p.terminate()
                return


def _worker(index: int, options: GroupOptions, recipe: TargetRecipe, device_type: str, parent: int) -> None:
    """Rank index + 1: join, build the shard, run rank 0's commands, leave."""
    rank = index + 1
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    device = device_for(rank, device_type)
    join_group(rank, options, device)
    try:
        run_commands(build_shard(recipe(), rank, options.world, device), device)
    finally:
        leave_group()


def _exit_with_parent(parent: int) -> None:
    """A spawned rank whose rank 0 is gone (killed, SIGKILL) exits instead of waiting on it."""
    while os.getppid() == parent:
        time.sleep(POLL_S)
    os._exit(3)


__all__ = ["TensorParallelError", "open_tensor_parallel"]
