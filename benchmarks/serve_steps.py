"""Where the auto server's time goes at one load: the engine of `specdec serve`, stepped by a closed-loop
client in this process (no HTTP), step by step.

    PYTHONPATH=src python benchmarks/serve_steps.py --concurrency 16 --n 32 -- \
        --target random:llama-3.1-8b --device cuda --max-model-len 1024 --max-num-seqs 32 \
        --draft oracle:0.8:random:llama-3.2-1b -k 4 --speculation auto

Everything after `--` is `specdec serve`'s arguments: the engine is the server's (ServerState). Each
round runs one set of requests (the same in every round: rounds sample the timing, not the prompts)
twice in turns: `plain` (each request given a drafter that drafts nothing, so every step is plain
and pipelines, as on a server with `--draft none`) and `auto` (the server's own drafter and policy).
Printed per mode: seconds and tokens/s; for auto, each step that drafted: the load (sequences in
the engine), its decoding sequences, the drafts, the tokens its drafters caught up on, and its
seconds against the median plain step. It answers which steps cost auto its time at a load where
the guard holds it to plain steps (docs/server.md, the H100 run of 2026-12-06).
"""

import argparse
import json
import random
import statistics
import time

from specdec.cli import build_parser
from specdec.commands.serve import build_state
from specdec.drafters.none import NoDrafter
from specdec.generation import GenerationConfig


def prompts(n: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randrange(60, 105))] for _ in range(n)]


def run(engine, requests: list[list[int]], concurrency: int, tokens: int, plain: bool) -> dict:
    """Keep `concurrency` requests in the engine until all have run; every step's record."""
    config = GenerationConfig(max_new_tokens=tokens, ignore_eos=True)
    pending, live, steps = list(requests), [], []
    start = time.perf_counter()
    while pending or engine.busy:
        live = [h for h in live if not h.done]
        while pending and len(live) < concurrency:
            drafter = NoDrafter(engine.target.device) if plain else None
            live.append(engine.submit(pending.pop(0), config, drafter=drafter))
        load = engine.num_running + engine.num_waiting
        t0 = time.perf_counter()
        engine.step()
        d = engine.last_decision
        steps.append({"load": load, "seconds": time.perf_counter() - t0,
                      "ks": list(d.ks) if d else [], "drafting": d.drafting if d else None,
                      "caught_up": getattr(engine, "_caught_up_on", 0)})
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens_per_second": len(requests) * tokens / seconds, "steps": steps}


def report(label: str, result: dict, plain_step: float) -> None:
    drafted = [s for s in result["steps"] if any(s["ks"])]
    extra = sum(s["seconds"] - plain_step for s in drafted)
    print(f"{label:6s} {result['seconds']:7.3f} s  {result['tokens_per_second']:8.1f} tok/s  "
          f"{len(result['steps'])} steps, {len(drafted)} drafted ({extra * 1e3:.1f} ms beyond a plain step)")
    for s in drafted:
        print(f"    load {s['load']:3d}  decoding {len(s['ks']):3d}  drafts {sum(s['ks']):3d}  "
              f"caught up {s['caught_up']:5d}  {s['seconds'] * 1e3:6.2f} ms  guard {s['drafting']}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="serve_steps.py")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--before", default="1:8,4:16",
                        help="concurrency:n levels auto runs first, unreported, as the serving benchmark's "
                             "lower levels teach the guard before 16 in flight (default: %(default)s)")
    parser.add_argument("--json", default=None, help="write every step's record here")
    parser.add_argument("serve", nargs=argparse.REMAINDER, help="after --: specdec serve's arguments")
    args = parser.parse_args()
    state = build_state(build_parser().parse_args(["serve", *(a for a in args.serve if a != "--")]))
    engine = state.engine
    warm = prompts(4, engine.target.vocab_size, 99)
    run(engine, warm, 4, 16, plain=False)  # warm both paths
    run(engine, warm, 4, 16, plain=True)
    # Every level asks from one set of requests, run once first unreported: an oracle drafter records
    # the target's continuation of a prompt it has not seen, at the target's full decoding cost
    # (seconds), as the serving benchmark's warm-up requests make it do before its levels.
    reqs = prompts(args.n, engine.target.vocab_size, 0)
    run(engine, reqs, args.concurrency, args.tokens, plain=False)
    for level in filter(None, args.before.split(",")):
        c, n = map(int, level.split(":"))
        run(engine, [reqs[i % len(reqs)] for i in range(n)], c, args.tokens, plain=False)
    out = []
    for r in range(args.rounds):
        for label in ("plain", "auto"):
            result = run(engine, reqs, args.concurrency, args.tokens, plain=label == "plain")
            result.update(label=label, round=r + 1)
            out.append(result)
        plain, auto = out[-2], out[-1]
        plain_step = statistics.median(s["seconds"] for s in plain["steps"])
        ratio = auto["tokens_per_second"] / plain["tokens_per_second"]
        print(f"round {r + 1}, concurrency {args.concurrency}, n {args.n}: auto / plain {ratio:.3f}; "
              f"median plain step {plain_step * 1e3:.2f} ms")
        report("plain", plain, plain_step)
        report("auto", auto, plain_step)
    print("guard:", json.dumps(engine.guard.summary if engine.guard else None))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
