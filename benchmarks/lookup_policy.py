"""How much should prompt lookup draft? Replay lookup policies offline on the target's own greedy answers.

    python benchmarks/lookup_policy.py [--per-category 1] [--max-new-tokens 128] [--outputs answers.json]

1. The target answers Spec-Bench prompts greedily through the engine (or `--outputs` reloads them).
2. The cost of one target pass over n = 1..9 new tokens is measured on this machine (median, as a
   ratio to n = 1), the same way as `specdec bench verify-cost`.
3. Each policy is replayed on every answer: greedy verification keeps a drafted token exactly when
   it equals the answer's next token, so tau and the cost of each round follow without running the
   model again; speedup = tokens / sum of the rounds' verify costs (lookup itself is ~free).

The replay ranks policies; its speedups are optimistic (no per-round engine overhead, lookup taken as
free): on 2026-11-30 it gave 1.45x / 2.24x for adaptive K=6 where the engine measured 1.35x / 1.81x.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from specdec.drafters.lookup import draft_length, lookup_match

MAX_ROWS = 9


def replay(prompt: list[int], answer: list[int], k: int, adaptive: bool, cost: dict[int, float],
           max_ngram: int = 3) -> tuple[float, float]:
    """(speedup, tau) of lookup with K = k on one answer, from the verify cost by row count."""
    pos, spent, rounds = 0, 0.0, 0
    while pos < len(answer):
        matched, found = lookup_match(prompt + answer[:pos], k, max_ngram)
        if adaptive:
            found = found[:draft_length(matched, k, max_ngram)]
        found = found[:max(0, len(answer) - pos - 1)]
        kept = 0
        while kept < len(found) and found[kept] == answer[pos + kept]:
            kept += 1
        spent += cost[len(found) + 1]
        pos += kept + 1
        rounds += 1
    return len(answer) / spent, len(answer) / rounds


def answers(args) -> list[dict]:
    if args.outputs and Path(args.outputs).exists():
        return json.loads(Path(args.outputs).read_text())
    from specdec.bench.specbench import QUESTIONS, load_questions
    from specdec.drafters import make_drafter
    from specdec.engine import GenerationConfig
    from specdec.runtime import encode_prompt, engine_for

    engine = engine_for(args.target_model, make_drafter("none", args.target_model))
    rows = []
    for q in load_questions(str(QUESTIONS), args.per_category, None):
        ids = encode_prompt(args.target_model.tokenizer, q["turns"][0])
        out = engine.generate(ids, GenerationConfig(max_new_tokens=args.max_new_tokens, k=1)).token_ids
        rows.append({"category": q["category"], "prompt": ids, "output": out})
        print(f"answered {q['category']}", flush=True)
    if args.outputs:
        Path(args.outputs).write_text(json.dumps(rows))
    return rows


def main() -> None:
    from specdec.bench.verify_cost import time_forwards
    from specdec.models.loader import load_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-category", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--outputs", default=None, help="JSON cache of the answers (written, or read if present)")
    args = p.parse_args()
    args.target_model = load_model("default")
    rows = answers(args)
    ns = list(range(1, MAX_ROWS + 1))
    times = time_forwards(args.target_model.model, rows[0]["prompt"], ns, trials=7, show_progress=False)
    base = statistics.median(times[1])
    cost = {n: statistics.median(times[n]) / base for n in ns}
    print("verify cost by rows:", " ".join(f"{n}:{c:.2f}" for n, c in cost.items()))
    groups = {"summarization": ["summarization"], "rag": ["rag"],
              "others": sorted({r["category"] for r in rows} - {"summarization", "rag"})}
    print(f"{'policy':24s}" + "".join(f"{g:>15s}" for g in groups) + "   (mean speedup, tau)")
    for adaptive in (False, True):
        for k in (2, 4, 6, 8):
            cells = []
            for cats in groups.values():
                res = [replay(r["prompt"], r["output"], k, adaptive, cost) for r in rows if r["category"] in cats]
                cells.append(f"{statistics.mean(s for s, _ in res):7.2f}x {statistics.mean(t for _, t in res):5.2f}")
            print(f"{('adaptive' if adaptive else 'fixed') + f' K={k}':24s}" + "".join(f"{c:>15s}" for c in cells))


if __name__ == "__main__":
    main()
