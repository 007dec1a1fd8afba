"""How long the host spends putting a few token ids on the GPU while the GPU is busy, three ways.

    python benchmarks/gpu_h2d.py

The GPU is kept busy (torch.cuda._sleep, ~20 ms queued) and the host times each way of sending 3
ids. A way that waits for the queue takes about as long as the queued work; one that does not takes
microseconds. Ways: torch.tensor(ids, device=cuda) (waits), pinned memory + non_blocking (what
specdec did before), pageable memory + non_blocking (specdec.transfers.token_tensor itself).
"""

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from specdec.transfers import token_tensor  # noqa: E402

WAYS = {
    "torch.tensor(device=cuda)": lambda ids: torch.tensor(ids, dtype=torch.long, device="cuda"),
    "pinned + non_blocking": lambda ids: torch.tensor(ids, dtype=torch.long).pin_memory().to("cuda", non_blocking=True),
    "pageable + non_blocking": lambda ids: token_tensor(ids, torch.device("cuda")),  # specdec's way
}


def host_us(way, ids, busy: bool, reps: int = 20) -> float:
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        if busy:
            torch.cuda._sleep(20_000_000)  # cycles: ~10-20 ms at H200 clocks
        t0 = time.perf_counter()
        out = way(ids)
        times.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        assert out.tolist() == ids
    return statistics.median(times)


def main():
    ids = [3, 1, 4]
    for name, way in WAYS.items():
        way(ids)
        print(f"{name:<28} host time {host_us(way, ids, False):9.1f} us idle GPU, "
              f"{host_us(way, ids, True):9.1f} us with ~20 ms queued")


if __name__ == "__main__":
    main()
