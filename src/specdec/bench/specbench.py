"""`specdec bench specbench`: Spec-Bench (Xia et al. 2024) prompts, batch 1, as Spec-Bench reports.

First turn of each question through the chat template; per category and overall: mean tokens per
round (tau, "mean accepted tokens" in Spec-Bench, counting the bonus/recovered token), acceptance
per draft position, and speedup of the draft over plain decoding through the same engine
(alternating which runs first). Greedy by default; `--temperature T` samples (question i with seed
`--seed` + i, the same for the plain and the speculative run).
`--hf-baseline` also times transformers' `model.generate()` (greedy, same prompts, same limits) on
the same target weights, to compare plain decoding through the engine with it.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

from specdec.commands import add_k_flag, positive_int

QUESTIONS = Path(__file__).resolve().parent.parent / "data" / "spec_bench" / "question.jsonl"


def register(sub) -> None:
    from specdec.bench.common import add_bench_flags

    p = sub.add_parser("specbench", help="Spec-Bench: tau and speedup per category (batch 1)",
                       description="Spec-Bench questions (first turn): tau and speedup by category.")
    add_bench_flags(p, draft_default="lookup")
    add_k_flag(p, default=5)
    p.add_argument("--per-category", type=positive_int, default=1,
                   help="first N questions of each category (default: %(default)s; 80 = all of the big ones)")
    p.add_argument("--categories", default=None, help="comma-separated categories (default: all 13)")
    p.add_argument("--questions", default=str(QUESTIONS), help="question.jsonl (default: the shipped copy)")
    p.add_argument("--max-new-tokens", type=positive_int, default=128, help="(default: %(default)s)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed of the first question (default: %(default)s)")
    p.add_argument("--hf-baseline", action="store_true",
                   help="also time transformers model.generate() (greedy) on the same target")
    p.add_argument("--versus", default=None, metavar="DRAFT",
                   help="a second draft run on every question in the same alternation (e.g. chains against "
                        "trees: --draft tree:auto -k 16 --versus auto --versus-k 4)")
    p.add_argument("--versus-k", type=positive_int, default=None, help="the second draft's K (default: -k)")
    p.set_defaults(func=run)


def load_questions(path: str, per_category: int, categories: str | None) -> list[dict]:
    """The first `per_category` questions of each category, in file order."""
    from specdec.errors import InvalidRequestError

    file = Path(path)
    if not file.is_file():
        raise InvalidRequestError(f"Spec-Bench question file not found: {path}")
    rows = [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
    wanted = None if not categories else {c.strip() for c in categories.split(",") if c.strip()}
    known = {r["category"] for r in rows}
    if wanted and wanted - known:
        raise InvalidRequestError(f"unknown categories {sorted(wanted - known)}; known: {sorted(known)}")
    taken: dict[str, int] = {}
    chosen = []
    for row in rows:
        cat = row["category"]
        if (wanted is None or cat in wanted) and taken.get(cat, 0) < per_category:
            taken[cat] = taken.get(cat, 0) + 1
            chosen.append(row)
    return chosen


def category_sizes(path: str) -> dict[str, int]:
    """How many questions each category has in the question file."""
    return dict(Counter(row["category"] for row in load_questions(path, 10**9, None)))


def weighted_to_file(rows: list[dict], sizes: dict[str, int]) -> dict:
    """Each measured category's rates weighted by its size in the whole question file: what the sample
    predicts for the whole benchmark when it takes the same number from a big category and a small one
    (Spec-Bench: 80 questions in each of five categories, 10 in each of MT-bench's eight)."""
    weights = [sizes[r["category"]] for r in rows]
    total = sum(weights)

    def mean(values: list[float]) -> float:
        return sum(w * v for w, v in zip(weights, values)) / total

    positions = max(len(r["alpha_by_position"]) for r in rows)
    by_position = []
    for j in range(positions):  # categories that never reached position j do not count there
        pairs = [(w, r["alpha_by_position"][j]) for w, r in zip(weights, rows) if len(r["alpha_by_position"]) > j]
        by_position.append(sum(w * a for w, a in pairs) / sum(w for w, _ in pairs))
    return {"questions_per_category": {r["category"]: sizes[r["category"]] for r in rows},
            "tau": mean([r["tau"] for r in rows]), "alpha_judged": mean([r["alpha_judged"] for r in rows]),
            "alpha_by_position": by_position}


class HFGenerate:
    """transformers' own greedy generate() on the target's weights: the reference plain decoder."""

    def __init__(self, target, args):
        from transformers import PreTrainedModel

        model = getattr(target.model, "model", None)
        if not isinstance(model, PreTrainedModel):  # another backend: load the same weights through transformers
            from specdec.models.loader import load_model

            model = load_model(args.target, device=args.device, dtype=args.dtype).model.model
        from specdec.runtime import eos_ids

        self.model = model
        self.eos = sorted(eos_ids(target)) or None

    def generate(self, ids: list[int], max_new_tokens: int) -> tuple[int, float]:
        """(tokens generated, seconds from prompt to last token)."""
        import torch

        x = torch.tensor([ids], device=self.model.device)
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                                      do_sample=False, eos_token_id=self.eos,
                                      pad_token_id=self.eos[0] if self.eos else None)
        if x.device.type == "cuda":
            torch.cuda.synchronize()
        return int(out.shape[1] - x.shape[1]), time.perf_counter() - start


def run(args: argparse.Namespace) -> int:
    from specdec.bench.common import RunTotals, load_target, progress, runtime_pair
    from specdec.generation import GenerationConfig
    from specdec.errors import InvalidRequestError
    from specdec.sampling import SamplingParams

    if args.hf_baseline and args.temperature > 0:
        raise InvalidRequestError("--hf-baseline times greedy generate(); drop it or use --temperature 0")
    questions = load_questions(args.questions, args.per_category, args.categories)
    SamplingParams(temperature=args.temperature)  # a bad temperature fails before the model loads
    target = load_target(args)
    plain, spec = runtime_pair(target, args.draft)
    runtimes = {"plain": (plain, args.k), "spec": (spec, args.k)}
    if args.versus:
        runtimes["versus"] = (runtime_pair(target, args.versus)[1], args.versus_k or args.k)
    hf = HFGenerate(target, args) if args.hf_baseline else None
    totals: dict[str, dict] = {}
    for i, q in enumerate(progress(questions, desc=f"specbench ({args.draft})")):
        sampling = SamplingParams(temperature=args.temperature, seed=args.seed + i)
        ids = plain.encode(q["turns"][0])
        bucket = totals.setdefault(q["category"], {"n": 0, "hf": [0, 0.0], **{job: RunTotals() for job in runtimes}})
        bucket["n"] += 1
        jobs = list(runtimes) + (["hf"] if hf else [])
        shift = i % len(jobs)  # rotate which runs first: A/B alternation
        for job in jobs[shift:] + jobs[:shift]:
            if job == "hf":
                n, seconds = hf.generate(ids, args.max_new_tokens)
                bucket["hf"][0] += n
                bucket["hf"][1] += seconds
            else:
                runtime, k = runtimes[job]
                config = GenerationConfig(max_new_tokens=args.max_new_tokens, k=k, sampling=sampling)
                bucket[job].add(runtime.engine.generate(ids, config).stats)
    data = report(args, target, spec, totals, hf is not None)
    if args.versus:
        versus = report(args, target, runtimes["versus"][0], totals, False, job="versus", k=runtimes["versus"][1])
        _compare(data, versus)
    return 0


def _compare(first: dict, second: dict) -> None:
    """One line: the first draft against the second, measured on the same questions in one run."""
    a, b = first["overall"], second["overall"]
    print(f"{first['draft']} (K={first['k']}) against {second['draft']} (K={second['k']}), same questions, "
          f"one run: tau {a['tau']:.2f} / {b['tau']:.2f}, speedup {a['speedup']:.2f}x / {b['speedup']:.2f}x, "
          f"ratio {a['speedup'] / b['speedup']:.3f}" if b["speedup"] else "")


def _row(name: str, n: int, plain, spec, hf: list | None) -> dict:
    from specdec.bench.common import speedup

    plain_e2e = plain.generated / (plain.decode_time + plain.prefill_time) if plain.generated else 0.0
    row = {"category": name, "questions": n, "tau": spec.tau, "alpha": spec.alpha,
           "alpha_judged": spec.alpha_judged, "alpha_by_position": spec.alpha_by_position,
           "plain_tokens_per_second": plain.tokens_per_second, "tokens_per_second": spec.tokens_per_second,
           "speedup": speedup(spec, plain), "plain_end_to_end_tokens_per_second": plain_e2e}
    if hf is not None:
        hf_rate = hf[0] / hf[1] if hf[1] else 0.0
        row.update(hf_tokens_per_second=hf_rate, plain_vs_hf=plain_e2e / hf_rate if hf_rate else None)
    return row


def report(args, target, spec, totals: dict, with_hf: bool, job: str = "spec", k: int | None = None) -> dict:
    """Print, plot and save one draft's results (totals[category][job]) against plain; returns the JSON data."""
    from specdec.bench.common import RunTotals, finish, new_figure, precision_of, print_table, save_plot
    from specdec.bench.scoreboard import ScoreRow

    k = args.k if k is None else k
    rows, all_plain, all_spec, all_hf, count = [], RunTotals(), RunTotals(), [0, 0.0], 0
    for cat, b in totals.items():
        rows.append(_row(cat, b["n"], b["plain"], b[job], b["hf"] if with_hf else None))
        all_plain.merge(b["plain"])
        all_spec.merge(b[job])
        all_hf[0] += b["hf"][0]
        all_hf[1] += b["hf"][1]
        count += rows[-1]["questions"]
    overall = _row("overall", count, all_plain, all_spec, all_hf if with_hf else None)
    weighted = weighted_to_file(rows, category_sizes(args.questions))
    columns = ["category", "n", "tau", "kept/judged", "plain tok/s", f"{spec.drafter.name} tok/s", "speedup"]
    if with_hf:
        columns += ["plain e2e tok/s", "HF generate() tok/s", "plain/HF"]
    mode = "greedy" if args.temperature == 0 else f"T={args.temperature:g}"
    print_table(f"Spec-Bench: {target.name} + {spec.drafter.name}, K={k}, {mode}, "
                f"{args.max_new_tokens} new tokens max", columns,
                [[r["category"], r["questions"], r["tau"], r["alpha_judged"], r["plain_tokens_per_second"],
                  r["tokens_per_second"],
                  r["speedup"]] + ([r["plain_end_to_end_tokens_per_second"], r["hf_tokens_per_second"],
                                    r["plain_vs_hf"]] if with_hf else []) for r in rows + [overall]],
                note="tok/s: decode only (prefill excluded); e2e and HF: prompt to last token; kept/judged: "
                     "drafts kept over drafts the target judged; kept per draft position overall: "
                     + ", ".join(f"{a:.2f}" for a in overall["alpha_by_position"])
                     + "; weighted by each category's size in the question file: tau "
                     + f"{weighted['tau']:.2f}, kept/judged {weighted['alpha_judged']:.2f}, per position "
                     + ", ".join(f"{a:.2f}" for a in weighted["alpha_by_position"]))
    fig, ax = new_figure(7, 4)
    ax.bar([r["category"] for r in rows], [r["speedup"] for r in rows], color="tab:green")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title(f"Spec-Bench, {spec.drafter.name} (K={k}) on {target.name}")
    ax.tick_params(axis="x", labelrotation=45)
    name = "specbench" if job == "spec" else f"specbench-{job}"
    plot = save_plot(fig, args.out_dir, name)
    data = {"command": "specbench", "target": target.name, "draft": spec.drafter.name, "k": k,
            "temperature": args.temperature, "seed": args.seed,
            "precision": precision_of(target), "max_new_tokens": args.max_new_tokens,
            "per_category": args.per_category, "categories": rows, "overall": overall,
            "weighted_to_question_file": weighted, "plot": str(plot)}
    finish(args, name, data, ScoreRow(
        target=target.name, draft=spec.drafter.name, k=str(k), precision=data["precision"],
        tokens_per_second=overall["tokens_per_second"], speedup=overall["speedup"], tau=overall["tau"],
        alpha=overall["alpha"]))
    return data
