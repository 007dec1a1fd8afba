"""How many CPU threads torch uses: resolved once, when a model loads, and shown to the user.

torch's default is one thread per physical core. When other processes keep some of those cores
busy, its parallel loops wait at every barrier for a thread that is not running: on a 2-core AMD
EPYC with two other jobs running, decoding fell to 0.9-1.8 tokens/s with 2 threads against 22.5
with 1, and loading the default model took 29-34 s against 2.8. So the default leaves out the cores
that the load average says are busy (at least one thread stays), and `--threads N` overrides it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class CpuThreads:
    """count: the threads torch runs with; why: how that was decided, in words for the user."""

    count: int
    why: str

    def describe(self) -> str:
        return f"{self.count} CPU thread{'s' if self.count != 1 else ''} ({self.why})"


def pick_threads(requested: int | None, cores: int, load: float, omp_env: str = "") -> CpuThreads:
    """requested (--threads) if given; else OMP_NUM_THREADS if set (the user's own setting for
    OpenMP, which torch honours too); else the `cores` this process may run on less the busy ones,
    round(load) of the 1-minute load average, at least 1."""
    if requested:
        return CpuThreads(requested, "--threads")
    if omp_env.strip().isdigit() and int(omp_env) > 0:
        return CpuThreads(int(omp_env), "OMP_NUM_THREADS")
    count = max(1, min(cores, cores - round(load)))
    return CpuThreads(count, f"{cores} cores, load average {load:.1f}; --threads N to change")


def use_threads(requested: int | None = None) -> CpuThreads:
    """Pick the thread count for this machine now (pick_threads) and set torch to it."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    threads = pick_threads(requested, cores, load, os.environ.get("OMP_NUM_THREADS", ""))
    torch.set_num_threads(threads.count)
    return threads
