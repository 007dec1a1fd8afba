"""Timing a generation's phases without adding host synchronisation.

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
