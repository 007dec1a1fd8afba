"""Moving tokens between host and device without waiting for the device's queue.

On a GPU a blocking copy (torch.tensor(ids, device="cuda"), int(tensor), indexing with a 0-d tensor)
waits for every kernel queued before it, so the GPU idles while Python queues the next ones. These
helpers send ids, read tokens back and index by a device tensor without that wait.
"""

from __future__ import annotations

import torch


class HostRead:
    """Values of a 1-D long tensor on their way to the host, read without waiting for work queued
    after them.

    The copy starts at once (on CUDA into pinned memory, with an event marking the stream);
    `values()` waits for that mark only, so a step queued in between keeps the GPU busy while the
    host waits for these values. Elsewhere the work is synchronous and `values()` reads the tensor.
    """

    def __init__(self, values: torch.Tensor) -> None:  # values: [n] long, on any device
        self._done = None
        if values.device.type != "cuda":
            self._host = values
            return
        self._host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
        self._host.copy_(values, non_blocking=True)
        self._done = torch.cuda.Event()
        self._done.record(torch.cuda.current_stream(values.device))  # the stream the copy was queued on

    def values(self) -> list[int]:
        if self._done is not None:
            self._done.synchronize()
        return self._host.tolist()


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
