"""What the host waits for: timing a generation's phases without adding host synchronisation,
reading tokens early, and indexing without reading the index.

A torch.cuda.synchronize() per phase (or a blocking copy such as torch.tensor(ids, device="cuda"),
which waits for the stream too) drains the GPU's queue in the middle of a round: the GPU then idles
while Python queues the next kernels. So on CUDA the phases are timed with CUDA events, read once
they are known to have run; elsewhere the wall clock is exact, since the work is synchronous.
"""

from __future__ import annotations

import time

import torch


class PhaseClock:
    """Charges the time between laps to named float fields of `stats` (e.g. "draft_time").

    On CUDA an interval reaches the stats once its end has run on the GPU, so stats read while a
    generation streams may lag by a round; the generation's end settles them all.
    """

    def __init__(self, device: torch.device, stats) -> None:
        self._cuda = device.type == "cuda"
        self._device = device
        self._stats = stats
        self._unsettled: list[tuple[str, object, object]] = []  # (field, start, end) not yet read
        self._mark = self._now()

    def lap(self, phase: str | None) -> None:
        """Charge the time since the last lap to `phase`, or to nobody (None: e.g. the consumer's time)."""
        now = self._now()
        if phase is not None:
            self._unsettled.append((phase, self._mark, now))
        self._mark = now
        self.settle()

    def settle(self, wait: bool = False) -> None:
        """Add every interval whose end has run to the stats; `wait` first waits for the last one."""
        if wait and self._cuda:
            self._mark.synchronize()
        pending = []
        for phase, start, end in self._unsettled:
            if self._cuda and not end.query():
                pending.append((phase, start, end))
                continue
            seconds = start.elapsed_time(end) / 1000.0 if self._cuda else end - start
            setattr(self._stats, phase, getattr(self._stats, phase) + seconds)
        self._unsettled = pending

    def _now(self):
        if not self._cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self._device))  # the model's stream, whatever device is current
        return event


class TokenReader:
    """Reads a device token on the host without waiting for work queued after it.

    `send(token)` starts the copy of a 0-d long tensor into pinned memory and marks the stream;
    `receive()` waits for that mark only, so a step queued in between keeps the GPU busy meanwhile.
    """

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._inflight: list[tuple[torch.Tensor, object]] = []

    def send(self, token: torch.Tensor) -> None:
        if not self._cuda:
            self._inflight.append((token, None))
            return
        host = torch.empty((), dtype=torch.long, pin_memory=True)
        host.copy_(token, non_blocking=True)
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(token.device))  # the stream the copy was queued on
        self._inflight.append((host, done))

    def receive(self) -> int:
        host, done = self._inflight.pop(0)
        if done is not None:
            done.synchronize()
        return int(host)


def token_tensor(ids: list[int], device: torch.device) -> torch.Tensor:
    """ids as a 1-D long tensor on `device`, without waiting for the stream. A few ids go from
    pageable memory with non_blocking=True: CUDA stages them before the call returns and does not
    wait for queued work (torch.tensor(ids, device=...) would); pinning them first cost more host
    time than the copy (benchmarks/gpu_h2d.py measures the three ways)."""
    host = torch.tensor(ids, dtype=torch.long)
    return host.to(device, non_blocking=device.type == "cuda")


def pick(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """table[index] for a 0-d index tensor, without reading the index on the host (indexing with a
    0-d tensor reads it, which on a GPU waits for the queue)."""
    return table.index_select(0, index.reshape(1))[0]
