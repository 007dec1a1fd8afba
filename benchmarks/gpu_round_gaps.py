"""Where a speculative round's time goes beyond the GPU's work: the GPU's idle gaps inside rounds.

    python benchmarks/gpu_round_gaps.py [--alpha 0.6] [--k 2] [--src DIR] [--out-dir DIR]

Runs the oracle drafter (random-weight Llama-3.1-8B-shape target, Llama-3.2-1B-shape draft, bf16)
under torch.profiler, then prints the wall time per round, the GPU's busy time (union of kernel
intervals) and its idle time, and the largest idle gaps with the host calls that ran during them
(a gap is host latency the GPU waits through), and tokens/s without the profiler. `--src`: run
another checkout's src/ (e.g. `git archive REV src | tar -x -C DIR`), for a before/after in one
session. `--out-dir` also saves the Chrome trace.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

SRC = sys.argv[sys.argv.index("--src") + 1] + "/src" if "--src" in sys.argv else None
sys.path.insert(0, SRC or str(Path(__file__).resolve().parent.parent / "src"))

from specdec.drafters.none import NoDrafter  # noqa: E402
from specdec.drafters.oracle import OracleDrafter  # noqa: E402
from specdec.engine import Engine, GenerationConfig  # noqa: E402
from specdec.models.native_llama import NativeLlama  # noqa: E402


def idle_gaps(kernels: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(start, end) of each stretch between kernel intervals (us) with no kernel running."""
    gaps, busy_until = [], None
    for start, end in sorted(kernels):
        if busy_until is not None and start > busy_until:
            gaps.append((busy_until, start))
        busy_until = end if busy_until is None else max(busy_until, end)
    return gaps


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--alpha", type=float, default=0.6)
    p.add_argument("--k", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--src", default=None, help="a checkout whose src/ to run (read before parsing)")
    p.add_argument("--out-dir", default=None)
    args = p.parse_args()

    target = NativeLlama.random("llama-3.1-8b", device="cuda", max_length=1024)
    draft = NativeLlama.random("llama-3.2-1b", device="cuda", max_length=1024, seed=1)
    prompt = torch.randint(0, target.vocab_size, (512,), generator=torch.Generator().manual_seed(5)).tolist()
    target.capture(*range(1, args.k + 2))
    draft.capture(1, 2)
    config = GenerationConfig(max_new_tokens=args.new_tokens, k=args.k, ignore_eos=True)
    truth = Engine(target, NoDrafter(target.device)).generate(prompt, config).token_ids
    oracle = OracleDrafter(target, args.alpha, draft, horizon=args.new_tokens, seed=7)
    oracle.remember(prompt, truth)
    engine = Engine(target, oracle)
    engine.generate(prompt, config)  # warm
    rates = []
    for _ in range(3):
        g = engine.generate(prompt, config)
        rates.append(g.stats.generated / g.stats.decode_time)
    print(f"src {SRC or 'this checkout'}: decode {statistics.median(rates):.1f} tok/s without the profiler "
          f"(median of 3: {', '.join(f'{r:.1f}' for r in rates)})")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        gen = engine.generate(prompt, config)
        torch.cuda.synchronize()
    events = list(prof.events())
    cpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    # Rounds replay CUDA graphs; the prefill before them runs eagerly: measure from the first replay.
    decode_start = min(e.time_range.start for e in cpu if e.name == "cudaGraphLaunch")
    kernels = [(e.time_range.start, e.time_range.end) for e in events
               if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.start >= decode_start]
    first, last = min(s for s, _ in kernels), max(e for _, e in kernels)
    gaps = idle_gaps(kernels)
    idle = sum(b - a for a, b in gaps)
    rounds = gen.stats.rounds
    print(f"oracle alpha {args.alpha} K={args.k}: {rounds} rounds, tau {gen.stats.generated / rounds:.2f}; "
          f"decode: GPU span {(last - first) / 1000:.1f} ms ({(last - first) / rounds:.0f} us a round), "
          f"idle {idle / 1000:.2f} ms ({idle / rounds:.0f} us a round, {len(gaps) / rounds:.1f} gaps a round)")
    during = Counter()
    for a, b in gaps:
        for e in cpu:
            overlap = min(b, e.time_range.end) - max(a, e.time_range.start)
            if overlap > 0:
                during[e.name] += overlap
    print("host calls running while the GPU was idle (us a round; nested calls counted in each):")
    for name, us in during.most_common(25):
        print(f"  {us / rounds:8.1f}  {name}")
    sizes = sorted((b - a for a, b in gaps), reverse=True)
    print("largest gaps (us):", " ".join(f"{g:.0f}" for g in sizes[:20]))
    print("gap histogram: " + ", ".join(f"<{lim} us: {sum(1 for g in sizes if lo <= g < lim)}"
                                        for lo, lim in ((0, 5), (5, 20), (20, 100), (100, 1000), (1000, 10**9))))
    print("a stretch of the timeline (gaps of 20 us or more, and the host calls that ran in them):")
    mid = sorted(gaps)[len(gaps) // 2][0]
    for a, b in [g for g in sorted(gaps) if g[0] >= mid and g[1] - g[0] >= 20][:10]:
        inside = sorted((e for e in cpu if e.time_range.end > a and e.time_range.start < b),
                        key=lambda e: e.time_range.start)
        print(f"  gap {b - a:6.0f} us at {(a - mid) / 1000:7.3f} ms: " + ", ".join(
            f"{e.name[:28]} {e.time_range.end - e.time_range.start:.0f}" for e in inside[:14]))
    if args.out_dir:
        prof.export_chrome_trace(str(Path(args.out_dir) / f"round-trace-a{args.alpha}-k{args.k}.json"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
