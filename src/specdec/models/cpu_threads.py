"""How many CPU threads torch uses: resolved once, when a model loads, and shown to the user.

torch's default is one thread per physical core. When other processes keep some of those cores
busy, its parallel loops wait at every barrier for a thread that is not running: on a 2-core AMD
EPYC with two other jobs running, decoding fell to 0.9-1.8 tokens/s with 2 threads against 22.5
with 1, and loading the default model took 29-34 s against 2.8. So the default leaves out the cores
that other processes keep busy right now (at least one thread stays), and `--threads N` overrides it.
"Right now" is read from /proc/stat over a fifth of a second, not from the 1-minute load average,
which still counts a job that ended seconds ago (such as `make install` before `make demo`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

SAMPLE_SECONDS = 0.2  # how long busy_cores watches the CPU


@dataclass(frozen=True)
class CpuThreads:
    """count: the threads torch runs with; why: how that was decided, in words for the user."""

    count: int
    why: str

    def describe(self) -> str:
        return f"{self.count} CPU thread{'s' if self.count != 1 else ''} ({self.why})"


def pick_threads(requested: int | None, cores: int, busy: float, omp_env: str = "") -> CpuThreads:
    """requested (--threads) if given; else OMP_NUM_THREADS if set (the user's own setting for
    OpenMP, which torch honours too); else the `cores` this process may run on less round(busy),
    the cores' worth of time other processes are using (busy_cores), at least 1."""
    if requested:
        return CpuThreads(requested, "--threads")
    if omp_env.strip().isdigit() and int(omp_env) > 0:
        return CpuThreads(int(omp_env), "OMP_NUM_THREADS")
    count = max(1, min(cores, cores - round(busy)))
    return CpuThreads(count, f"{cores} cores, {busy:.1f} busy; --threads N to change")


def busy_cores(seconds: float = SAMPLE_SECONDS) -> float:
    """Cores' worth of CPU time that other processes use now: the machine's non-idle share over
    `seconds` (this process sleeps meanwhile) times its core count, from /proc/stat; off Linux the
    1-minute load average."""
    def totals() -> tuple[int, int]:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
        return sum(fields[:8]), fields[3] + fields[4]  # all time (guests are in user), idle + iowait

    try:
        all0, idle0 = totals()
        time.sleep(seconds)
        all1, idle1 = totals()
    except (OSError, ValueError, IndexError):
        return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    elapsed = all1 - all0
    return (os.cpu_count() or 1) * (1 - (idle1 - idle0) / elapsed) if elapsed > 0 else 0.0


def use_threads(requested: int | None = None) -> CpuThreads:
    """Pick the thread count for this machine now (pick_threads) and set torch to it."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    omp_env = os.environ.get("OMP_NUM_THREADS", "")
    busy = 0.0 if requested or omp_env.strip().isdigit() else busy_cores()
    threads = pick_threads(requested, cores, busy, omp_env)
    torch.set_num_threads(threads.count)
    return threads
