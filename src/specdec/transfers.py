"""Moving tokens between host and device without waiting for the device's queue.

On a GPU a blocking copy (torch.tensor(ids, device="cuda"), int(tensor), indexing with a 0-d tensor)
waits for every kernel queued before it, so the GPU idles while Python queues the next ones. These
helpers send ids, read tokens back and index by a device tensor without that wait (the PhaseClock
in clock.py times the phases in the same spirit).
"""

from __future__ import annotations

import torch


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
    time than the copy (on an H200, 3 ids behind 20 ms of queued work: 178 us of host time against 261
    pinned, and 10 ms for torch.tensor(device=cuda), which waits; docs/history.md)."""
    host = torch.tensor(ids, dtype=torch.long)
    return host.to(device, non_blocking=device.type == "cuda")


def pick(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """table[index] for a 0-d index tensor, without reading the index on the host (indexing with a
    0-d tensor reads it, which on a GPU waits for the queue)."""
    return table.index_select(0, index.reshape(1))[0]
