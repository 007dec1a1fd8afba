"""Measure drafters side by side on Spec-Bench questions (greedy or sampled): tau, alpha, speedup.

    python -m specdec.train.measure --drafts lookup,head:PATH,lookup+head:PATH --per-category 1 -k 5 --temperature 1 [--dtype bf16]
    python -m specdec.train.measure --drafts head:PATH@1,head:PATH@3 ...   # one drafter at two K

Every drafter and plain decoding (draft `none`) run the same prompts through the same engine and
target, in rotating order per prompt, so that load changes on a shared machine hit all alike.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import torch

from specdec.bench.common import RunTotals, speedup
from specdec.bench.specbench import QUESTIONS, load_questions
from specdec.drafters import make_drafter
from specdec.generation import GenerationConfig
from specdec.errors import DraftSpecError
from specdec.runtime import encode_prompt, engine_for
from specdec.sampling import SamplingParams


def split_k(name: str, config: GenerationConfig) -> tuple[str, GenerationConfig]:
    """`DRAFT@K` -> (DRAFT, config with that K); a plain `DRAFT` keeps the config's K."""
    spec, at, k = name.rpartition("@")
    if not at:
        return name, config
    if not k.isdigit() or int(k) < 1:
        raise DraftSpecError(f"the K after @ in {name!r} must be a whole number >= 1")
    return spec, replace(config, k=int(k))


def measure(target, drafts: list[str], questions: list[dict], config: GenerationConfig) -> dict[str, dict[str, RunTotals]]:
    """{draft: {category: RunTotals}}; plain decoding is the draft `none`; `DRAFT@K` runs DRAFT at K."""
    runs = {name: split_k(name, config) for name in ["none"] + drafts}
    engines = {name: engine_for(target, make_drafter(spec, target)) for name, (spec, _) in runs.items()}
    names = list(engines)
    totals: dict[str, dict[str, RunTotals]] = {name: {} for name in names}
    for i, row in enumerate(questions):
        ids = encode_prompt(target.tokenizer, row["turns"][0])
        for j in range(len(names)):
            name = names[(i + j) % len(names)]
            stats = engines[name].generate(ids, runs[name][1]).stats
            totals[name].setdefault(row["category"], RunTotals()).add(stats)
        print(f"{i + 1}/{len(questions)} {row['category']}", flush=True)
    return totals


def with_overall(cats: dict[str, RunTotals]) -> dict[str, RunTotals]:
    """The categories and an 'all' row summing them."""
    overall = RunTotals()
    for totals in cats.values():
        overall.merge(totals)
    return {**cats, "all": overall}


def summarise(totals: dict[str, dict[str, RunTotals]]) -> dict:
    """Per draft and category (and 'all'): tau, alpha, tokens/s, speedup over `none`."""
    plain = with_overall(totals["none"])
    return {name: {cat: {"tau": t.tau, "alpha": t.alpha, "tokens_per_second": t.tokens_per_second,
                         "speedup": speedup(t, plain[cat])}
                   for cat, t in with_overall(cats).items()}
            for name, cats in totals.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="default")
    p.add_argument("--drafts", required=True, help="comma-separated draft specs; DRAFT@K runs that one at K")
    p.add_argument("-k", type=int, default=5)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--per-category", type=int, default=1)
    p.add_argument("--categories", default=None)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--dtype", default=None, help="fp32, bf16 or fp16 (default: fp32 on a CPU)")
    p.add_argument("--out", default=None, help="JSON file for the results")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from specdec.models.loader import load_model

    target = load_model(args.target, dtype=args.dtype)
    questions = load_questions(str(QUESTIONS), args.per_category, args.categories)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, k=args.k,
                              sampling=SamplingParams(temperature=args.temperature, seed=0))
    totals = measure(target, args.drafts.split(","), questions, config)
    summary = summarise(totals)
    for name, cats in summary.items():
        print(name)
        for cat, s in cats.items():
            print(f"  {cat:15s} tau {s['tau']:.2f}  alpha {s['alpha']:.2f}  {s['tokens_per_second']:.1f} tok/s  "
                  f"speedup {s['speedup']:.2f}x")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "summary": summary,
                                              "totals": {n: {c: t.to_dict() for c, t in cats.items()}
                                                         for n, cats in totals.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
