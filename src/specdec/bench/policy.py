"""`specdec bench policy`: plain, fixed K and auto speculation side by side on the batched engine.

For each batch size, the same greedy prompts run three ways (each twice, in order and reversed; the
faster counts) through BatchedEngine: every sequence
plain (K = 0), every sequence at a fixed K, and the auto controller (specdec.engine.auto), which may pick
K = 0. Reports output tokens per second of each and checks that all three emit the same tokens.
"""

from __future__ import annotations

import argparse

from specdec.bench.common import add_bench_flags, parse_ints
from specdec.engine.controller import Auto, FixedK
from specdec.errors import InvalidRequestError


def register(sub) -> None:
    p = sub.add_parser("policy", help="plain vs fixed K vs auto speculation on the batched engine",
                       description="Tokens/s of plain, fixed-K and auto speculation at each batch size.")
    add_bench_flags(p, draft_default="lookup")
    p.add_argument("--batch", type=parse_ints, default=parse_ints("1,4"), help="batch sizes (default: 1,4)")
    p.add_argument("--k", type=int, default=4, help="the fixed K, and auto's largest (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=48, help="new tokens per sequence (default: %(default)s)")
    p.add_argument("--prompts", default=None, help="prompts file (default: the built-in prompts)")
    p.set_defaults(func=run)


def run_engine(target, slots, policy, prompts: list[list[int]], draft: str, max_tokens: int) -> dict:
    """One batch of greedy prompts through a fresh BatchedEngine: tokens, seconds, acceptance."""
    import time

    from specdec.engine.batched import BatchConfig, BatchedEngine
    from specdec.drafters import NoDrafter, make_drafter
    from specdec.generation import GenerationConfig

    plain = policy == FixedK(0)
    factory = (lambda: NoDrafter(target.model.device)) if plain else (lambda: make_drafter(draft, target))
    engine = BatchedEngine(slots, factory, config=BatchConfig(speculation=policy))
    config = GenerationConfig(max_new_tokens=max_tokens, ignore_eos=True)
    start = time.perf_counter()
    results = engine.generate(prompts, config)
    seconds = time.perf_counter() - start
    tokens = sum(len(r.token_ids) for r in results)
    drafted = sum(r.stats.drafted for r in results)
    alpha = sum(r.stats.accepted for r in results) / drafted if drafted else 0.0
    return {"outputs": [list(r.token_ids) for r in results], "tokens": tokens, "seconds": seconds,
            "tokens_per_second": tokens / seconds, "alpha": alpha,
            "last_ks": list(engine.last_step.plan.budgets) if engine.last_step else []}


def best_of_two(run_one, names: list[str]) -> dict:
    """Each run twice, in order then in reverse (so drift on a shared machine hits all alike); the
    faster of each name's two."""
    runs: dict = {}
    for name in names + names[::-1]:
        r = run_one(name)
        if name not in runs or r["tokens_per_second"] > runs[name]["tokens_per_second"]:
            runs[name] = r
    return runs


def run(args: argparse.Namespace) -> int:
    from specdec.bench.common import load_target, print_table, read_prompts, save_json
    from specdec.models.slots import slot_model_for
    from specdec.runtime import encode_prompt

    if args.k < 1 or args.max_tokens < 1 or min(args.batch) < 1:
        raise InvalidRequestError("--k, --max-tokens and --batch must be >= 1")
    target = load_target(args)
    texts = read_prompts(args.prompts)
    policies = {"plain": FixedK(0), f"K={args.k}": FixedK(args.k), "auto": Auto(args.k)}
    rows, table = [], []
    for batch in args.batch:
        prompts = [encode_prompt(target.tokenizer, texts[i % len(texts)]) for i in range(batch)]
        slots = slot_model_for(target.model, batch, max(map(len, prompts)) + args.max_tokens + 8)
        runs = best_of_two(lambda name: run_engine(target, slots, policies[name], prompts, args.draft,
                                                   args.max_tokens), list(policies))
        same = all(r["outputs"] == runs["plain"]["outputs"] for r in runs.values())
        rows.append({"batch": batch, "same_outputs": same,
                     **{name: {k: v for k, v in r.items() if k != "outputs"} for name, r in runs.items()}})
        table.append([batch, *(runs[n]["tokens_per_second"] for n in policies), runs["auto"]["alpha"],
                      "yes" if same else "NO"])
    print_table(f"speculation policy: {target.name}, draft {args.draft}, {args.max_tokens} tokens a sequence",
                ["batch", *(f"{n} tok/s" for n in policies), "auto alpha", "same tokens"], table)
    data = {"command": "policy", "target": target.name, "draft": args.draft, "k": args.k,
            "device": str(target.model.device), "rows": rows}
    print(f"results: {save_json(data, args.out_dir, 'policy')}")  # no scoreboard row: a check, not a score
    return 0 if all(r["same_outputs"] for r in rows) else 1
