"""`specdec bench sweep`: K = 1..8, greedy and at temperature 1: measured against predicted speedup.

For every K it reports alpha (overall and per draft position), tau, the measured speedup over plain
decoding through the same engine, and the speedup the formula predicts from the measured alpha and
c (one draft step over one target step, timed in this run). Plain and speculative runs alternate
prompt by prompt, so machine noise hits both alike.
"""

from __future__ import annotations

import argparse

from specdec.bench.common import add_bench_flags, parse_ints
from specdec.errors import InvalidRequestError


def register(sub) -> None:
    p = sub.add_parser("sweep", help="K sweep: measured vs predicted speedup, alpha, tau, c",
                       description="Sweep K for one draft: alpha, tau, c, measured and predicted speedup.")
    add_bench_flags(p, draft_default="self-int8")
    p.add_argument("--prompts", default=None, help="prompts file (JSONL with prompt/turns, or one a line)")
    p.add_argument("--num-prompts", type=int, default=1, help="use the first N prompts (default: %(default)s)")
    p.add_argument("--ks", type=parse_ints, default=parse_ints("1-8"), help="K values (default: 1-8)")
    p.add_argument("--temperatures", default="0,1", help="comma-separated temperatures (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens per generation (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default: %(default)s)")
    p.add_argument("--c-trials", type=int, default=9, help="trials timing one draft and one target step")
    p.set_defaults(func=run)


def measure_c(target_model, draft_model, prompt: list[int], trials: int) -> dict:
    """Median of one draft step and one target step, timed alternately on the same cached prompt."""
    import time

    import torch

    ids = torch.tensor(prompt, dtype=torch.long, device=target_model.device)
    times = {"target": [], "draft": []}
    for model in (target_model, draft_model):
        model.prefill(ids[:-1])
    for i in range(trials + 1):
        for name, model in (("target", target_model), ("draft", draft_model))[:: 1 if i % 2 else -1]:
            start = time.perf_counter()
            model.forward(ids[-1:])
            if i:  # the first pass is a warm-up
                times[name].append(time.perf_counter() - start)
            model.rollback(len(prompt) - 1)
    from specdec.bench.common import median

    target_s, draft_s = median(times["target"]), median(times["draft"])
    return {"target_step_s": target_s, "draft_step_s": draft_s, "c": draft_s / target_s if target_s else 0.0}


def sweep_temperature(plain, spec, prompts: list[list[int]], ks: list[int], temperature: float,
                      args: argparse.Namespace, bar) -> tuple:
    """Plain and every K on every prompt; the run order rotates from prompt to prompt (A/B interleaving)."""
    from specdec.bench.common import RunTotals
    from specdec.generation import GenerationConfig
    from specdec.sampling import SamplingParams

    plain_totals, totals = RunTotals(), {k: RunTotals() for k in ks}
    for i, prompt in enumerate(prompts):
        sampling = SamplingParams(temperature=temperature, seed=args.seed + i)
        order = [None] + list(ks)
        shift = i % len(order)
        for k in order[shift:] + order[:shift]:
            config = GenerationConfig(max_new_tokens=args.max_new_tokens, k=k or 1, sampling=sampling,
                                      ignore_eos=True)
            runtime, bucket = (plain, plain_totals) if k is None else (spec, totals[k])
            bucket.add(runtime.engine.generate(prompt, config).stats)
            bar.update(1)
    return plain_totals, totals


def k_rows(plain_totals, totals: dict, c: float, verify_ratio: dict) -> list[dict]:
    from specdec.bench.common import speedup
    from specdec.speedup import expected_speedup

    rows = []
    for k, t in totals.items():
        alpha = min(t.alpha_judged, 1.0)
        rows.append({
            "k": k, "alpha": alpha, "accept_rate": t.alpha, "alpha_by_position": t.alpha_by_position,
            "tau": t.tau, "tokens_per_second": t.tokens_per_second,
            "speedup": speedup(t, plain_totals),
            "predicted_speedup": expected_speedup(alpha, k, c),
            "predicted_speedup_measured_verify": expected_speedup(alpha, k, c, verify_ratio.get(k + 1, 1.0)),
            "c_engine": (t.draft_time / t.drafted) / (plain_totals.decode_time / plain_totals.generated)
            if t.drafted and plain_totals.generated else None,
            "totals": t.to_dict(),
        })
    return rows


def run(args: argparse.Namespace) -> int:
    from specdec.bench.common import load_target, read_prompts, runtime_pair

    temperatures = [float(t) for t in args.temperatures.split(",") if t.strip()]
    if args.max_new_tokens < 2 or args.num_prompts < 1 or not temperatures:
        raise InvalidRequestError("--max-new-tokens must be >= 2, --num-prompts >= 1, and give at least one temperature")
    target = load_target(args)
    plain, spec = runtime_pair(target, args.draft)
    prompts = [plain.encode(p) for p in read_prompts(args.prompts)[: args.num_prompts]]
    results = measure(target, spec, plain, prompts, args, temperatures)
    report(args, target, spec, results, temperatures)
    return 0


def measure(target, spec, plain, prompts, args, temperatures) -> dict:
    from specdec.bench.common import median, progress
    from specdec.bench.verify_cost import time_forwards

    draft_model = getattr(spec.drafter, "model", None)
    cost = measure_c(target.model, draft_model, prompts[0], args.c_trials) if draft_model is not None else None
    vt = time_forwards(target.model, prompts[0], sorted({1} | {k + 1 for k in args.ks}), 3, show_progress=False)
    verify_ratio = {n: median(v) / median(vt[1]) for n, v in vt.items()}
    total = len(temperatures) * len(prompts) * (len(args.ks) + 1)
    by_temperature = {}
    with progress(range(total), total=total, desc=f"sweep {args.draft}") as bar:
        for temperature in temperatures:
            plain_totals, totals = sweep_temperature(plain, spec, prompts, args.ks, temperature, args, bar)
            c = cost["c"] if cost else _c_from_engine(plain_totals, totals)
            by_temperature[temperature] = {"plain": plain_totals.to_dict(), "c": c,
                                           "rows": k_rows(plain_totals, totals, c, verify_ratio)}
    return {"cost": cost, "verify_ratio": verify_ratio, "by_temperature": by_temperature}


def _c_from_engine(plain_totals, totals) -> float:
    """For drafters without a model step (lookup): draft time per drafted token over a plain step."""
    drafted = sum(t.drafted for t in totals.values())
    draft_time = sum(t.draft_time for t in totals.values())
    step = plain_totals.decode_time / plain_totals.generated if plain_totals.generated else 0.0
    return (draft_time / drafted) / step if drafted and step else 0.0


def report(args, target, spec, results: dict, temperatures: list[float]) -> None:
    from specdec.bench.common import finish, new_figure, precision_of, print_table, save_plot
    from specdec.bench.scoreboard import ScoreRow

    best = {}
    fig, ax = new_figure()
    for temperature in temperatures:
        res = results["by_temperature"][temperature]
        rows = res["rows"]
        best_measured = max(rows, key=lambda r: r["speedup"])
        best_predicted = max(rows, key=lambda r: r["predicted_speedup"])
        best[temperature] = {"measured": best_measured["k"], "predicted": best_predicted["k"]}
        print_table(
            f"sweep: {target.name} + {spec.drafter.name}, temperature {temperature:g}, c = {res['c']:.3f}",
            ["K", "alpha", "alpha by position", "tau", "tokens/s", "speedup", "predicted", "pred. (verify meas.)"],
            [[r["k"], r["alpha"], " ".join(f"{a:.2f}" for a in r["alpha_by_position"]), r["tau"],
              r["tokens_per_second"], r["speedup"], r["predicted_speedup"],
              r["predicted_speedup_measured_verify"]] for r in rows],
            note=f"plain: {res['plain']['tokens_per_second']:.2f} tokens/s; best K measured "
                 f"{best_measured['k']} ({best_measured['speedup']:.2f}x), predicted {best_predicted['k']} "
                 f"({best_predicted['predicted_speedup']:.2f}x)")
        ks = [r["k"] for r in rows]
        line = ax.plot(ks, [r["speedup"] for r in rows], marker="o", label=f"measured, T={temperature:g}")[0]
        ax.plot(ks, [r["predicted_speedup"] for r in rows], linestyle="--", color=line.get_color(),
                label=f"predicted, T={temperature:g}")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xticks(args.ks)
    ax.set_xlabel("K (draft tokens per round)")
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title(f"{target.name} + {spec.drafter.name}")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    plot = save_plot(fig, args.out_dir, "sweep")
    data = {"command": "sweep", "target": target.name, "draft": spec.drafter.name,
            "precision": precision_of(target), "max_new_tokens": args.max_new_tokens, "ks": args.ks,
            "best_k": best, **results, "plot": str(plot)}
    first = results["by_temperature"][temperatures[0]]["rows"]
    top = max(first, key=lambda r: r["speedup"])
    finish(args, "sweep", data, ScoreRow(
        target=target.name, draft=spec.drafter.name, k=f"{min(args.ks)}-{max(args.ks)} (best {top['k']})",
        precision=data["precision"], tokens_per_second=top["tokens_per_second"], speedup=top["speedup"],
        tau=top["tau"], alpha=top["alpha"]))
