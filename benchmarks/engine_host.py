"""The batched engine's own host time a step, with a model that costs nothing: plain against auto.

    PYTHONPATH=src python benchmarks/engine_host.py [--batch 32] [--tokens 256] [--runs 3]

A slot model that returns fixed logits at once (no weights, no device) stands in for the target,
so a step's wall time is the engine's Python alone: planning, the rule, settling, emitting. Plain:
no drafter. Auto: `--speculation auto` with oracle drafters, under a verify-cost table where
drafting never pays, so every step is plain by the policy's choice and the difference is what the
policy itself costs. At high load on a GPU the host's time a step is the server's (docs/server.md),
so this is the number to keep small. Printed: milliseconds a step, each mode run `--runs` times in
turns, the median and the fastest run.
"""

import argparse
import statistics
import time
from itertools import accumulate

import torch

from specdec.batching import BatchConfig, BatchedEngine
from specdec.drafters.none import NoDrafter
from specdec.drafters.oracle import OracleDrafter
from specdec.engine import GenerationConfig
from specdec.models.slots import RaggedOutput, SlotModel
from specdec.speculation import SpeculationPolicy, VerifyCostTable

VOCAB = 1000
ANSWER = 7  # the token every row's logits pick


class InstantSlots(SlotModel):
    """Fixed logits for every row, at once: the engine's host work is all a step costs."""

    def __init__(self, slots: int):
        self.name, self.vocab_size, self.max_length = "instant", VOCAB, 4096
        self.max_slots, self.device = slots, torch.device("cpu")
        self._lens = [0] * slots

    def cache_len(self, slot: int) -> int:
        return self._lens[slot]

    def rollback(self, slot: int, length: int) -> None:
        self._lens[slot] = length

    def forward_ragged(self, slots, tokens, *, logits=None, features=None) -> RaggedOutput:
        want = list(logits) if logits is not None else [True] * len(slots)
        counts = [int(t.shape[0]) for t in tokens]
        for slot, n in zip(slots, counts):
            self._lens[slot] += n
        rows = torch.zeros(sum(n for n, w in zip(counts, want) if w), VOCAB)
        rows[:, ANSWER] = 1.0
        offsets = tuple(accumulate((n if w else 0 for n, w in zip(counts, want)), initial=0))
        return RaggedOutput(rows, offsets, (None,) * len(slots))


def step_ms(mode: str, batch: int, tokens: int) -> float:
    """Milliseconds a step of `batch` sequences decoding `tokens` tokens each."""
    target = InstantSlots(batch)
    batch_sizes = tuple(sorted({1, 2, 4, 8, 16, 32, batch}))
    rows = (1, 2, 3, 5)  # a verify costs its rows: drafting never pays, the policy picks K = 0
    costs = VerifyCostTable(batch_sizes, rows, tuple(tuple(4e-3 * r * (1 + b / 64) for r in rows) for b in batch_sizes))
    policy = SpeculationPolicy.auto(k_max=4, verify_cost=costs) if mode == "auto" else SpeculationPolicy()
    engine = BatchedEngine(target, lambda: NoDrafter(target.device),
                           config=BatchConfig(speculation=policy, pipeline=True))
    config = GenerationConfig(max_new_tokens=tokens, k=4, ignore_eos=True)
    for i in range(batch):
        prompt = [1 + i, 2, 3, 4] * 20
        drafter = NoDrafter(target.device)
        if mode == "auto":
            drafter = OracleDrafter(target, 0.8, horizon=0)
            drafter.remember(prompt, [ANSWER] * (tokens + 8))
        engine.submit(prompt, config, drafter=drafter)
    steps, start = 0, time.perf_counter()
    while engine.step():
        steps += 1
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(prog="engine_host.py")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    times = {"plain": [], "auto": []}
    for _ in range(args.runs):
        for mode in times:
            times[mode].append(step_ms(mode, args.batch, args.tokens))
    for mode, ms in times.items():
        print(f"{mode:5s} {statistics.median(ms):.3f} ms a step at batch {args.batch}, fastest {min(ms):.3f} "
              f"(runs: {', '.join(f'{m:.3f}' for m in ms)})")
    print(f"auto - plain, fastest runs: {min(times['auto']) - min(times['plain']):.3f} ms a step "
          "(on a shared machine the fastest runs are the least disturbed)")


if __name__ == "__main__":
    main()
