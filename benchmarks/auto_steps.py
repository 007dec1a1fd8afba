"""Where an auto drafting step spends the time a fixed-K step does not: the server's engine, stepped in
this process one request at a time (1 in flight), beside an engine on the same target with K = 4 fixed.

    PYTHONPATH=src python benchmarks/auto_steps.py [--requests 4] [--tokens 256] [--rounds 2] [--json F] -- \
        --target random:llama-3.1-8b --device cuda --max-model-len 1024 --max-num-seqs 32 \
        --draft oracle:0.8:random:llama-3.2-1b -k 4 --speculation auto

Everything after `--` is `specdec serve`'s arguments (the auto engine is the server's). The two engines
take turns on the same requests, after one unreported run of each (an oracle drafter first records the
target's continuation). Printed per engine and round, by the drafts a step ran (0, 3, 4): the steps,
their median milliseconds, and the median milliseconds of each engine phase inside them (_plan holds
_decide and the drafting; _settle the wait for the device). Auto's K = 4 step against fixed K's is
the policy's own price; on the H100 on 2026-12-06 it was 0.6 ms (results/auto-steps-h100-20261206-1050.json, from this script's first version).
"""

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict

from serve_steps import prompts
from specdec.batching import BatchConfig, BatchedEngine
from specdec.cli import build_parser
from specdec.commands.serve import build_state
from specdec.generation import GenerationConfig
from specdec.speculation import SpeculationPolicy

PHASES = ("_decide", "_plan", "_launch", "_settle", "_calibrate", "_guard_record", "_record_drafting", "_leave")


def timed(engine: BatchedEngine) -> dict:
    """Wrap the engine's phases so that each adds its seconds to the dict returned (cleared per step)."""
    spent = defaultdict(float)
    for name in PHASES:
        def wrapped(*args, _fn=getattr(engine, name), _name=name, **kwargs):
            start = time.perf_counter()
            try:
                return _fn(*args, **kwargs)
            finally:
                spent[_name] += time.perf_counter() - start
        setattr(engine, name, wrapped)
    return spent


def run(engine: BatchedEngine, spent: dict, requests: list[list[int]], tokens: int) -> list[dict]:
    """Each request alone, to its end; every step's seconds, drafts and phase seconds."""
    config = GenerationConfig(max_new_tokens=tokens, ignore_eos=True)
    steps = []
    for prompt in requests:
        engine.submit(prompt, config)
        while engine.busy:
            spent.clear()
            start = time.perf_counter()
            engine.step()
            seconds = time.perf_counter() - start
            decision = engine.last_decision
            steps.append({"seconds": seconds, "drafts": sum(decision.ks) if decision else 0, **spent})
    return steps


def by_drafts(steps: list[dict]) -> dict:
    out = {}
    for drafts in sorted({s["drafts"] for s in steps}):
        chosen = [s for s in steps if s["drafts"] == drafts]
        out[drafts] = {"steps": len(chosen), "ms": 1e3 * statistics.median(s["seconds"] for s in chosen),
                       **{p: 1e3 * statistics.median(s.get(p, 0.0) for s in chosen) for p in PHASES}}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="auto_steps.py")
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", default=None, help="write the tables here")
    parser.add_argument("serve", nargs=argparse.REMAINDER, help="after --: specdec serve's arguments")
    args = parser.parse_args()
    state = build_state(build_parser().parse_args(["serve", *(a for a in args.serve if a != "--")]))
    auto = state.engine
    fixed = BatchedEngine(auto.target, auto.drafter_factory, auto.eos_token_ids, auto.decode,
                          BatchConfig(auto.config.prefill_chunk, SpeculationPolicy.fixed(4)))
    engines = {"auto": (auto, timed(auto)), "k4": (fixed, timed(fixed))}
    requests = prompts(args.requests, auto.target.vocab_size, 0)
    for engine, spent in engines.values():
        run(engine, spent, requests, args.tokens)
    tables = []
    for r in range(args.rounds):
        for label, (engine, spent) in engines.items():
            steps = run(engine, spent, requests, args.tokens)
            table = by_drafts(steps)
            tables.append({"round": r + 1, "engine": label, "seconds": sum(s["seconds"] for s in steps), "by_drafts": table})
            print(f"round {r + 1} {label:4s} {tables[-1]['seconds']:.3f} s, {len(steps)} steps")
            for drafts, row in table.items():
                phases = " ".join(f"{p.strip('_')} {row[p]:.3f}" for p in PHASES)
                print(f"    {drafts} drafts: {row['steps']:4d} steps, {row['ms']:.3f} ms; {phases}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(tables, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
