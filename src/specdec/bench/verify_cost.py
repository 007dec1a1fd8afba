"""`specdec bench verify-cost`: what one target forward over n new tokens costs, on top of a cached prompt.

Speculation pays off because checking K+1 tokens in one pass costs little more than one token when
decoding is memory-bound. This measures that curve: the median of N trials for each n, and its ratio
to n = 1 (the `verify_cost` the speedup formula assumes to be 1).
"""

from __future__ import annotations

import argparse

from specdec.bench.common import add_bench_flags, parse_ints
from specdec.errors import InvalidRequestError

FILLER = ("Speculative decoding lets a small draft model propose several tokens that a large target model "
          "checks in a single forward pass, keeping the output exactly as the target would produce it. ")


def register(sub) -> None:
    p = sub.add_parser("verify-cost", help="time one target forward over n new tokens (n = 1..64)",
                       description="Median time of one target forward over n new tokens on a cached prompt.")
    add_bench_flags(p, draft_default=None)
    p.add_argument("--prompt-tokens", type=int, default=512, help="cached prompt length (default: %(default)s)")
    p.add_argument("--n", type=parse_ints, default=parse_ints("1,2,4,8,16,32,64"),
                   help="new-token counts, e.g. 1,2,4,8 or 1-8 (default: 1,2,4,8,16,32,64)")
    p.add_argument("--trials", type=int, default=7, help="trials per n; the median is reported (default: %(default)s)")
    p.set_defaults(func=run)


def prompt_tokens(tokenizer, length: int) -> list[int]:
    """About `length` tokens of plain text (repeated filler), cut to exactly `length`."""
    ids: list[int] = []
    while len(ids) < length:
        ids += tokenizer(FILLER, add_special_tokens=False)["input_ids"]
    return ids[:length]


def time_alternating(models: dict, prompt: list[int], ns: list[int], trials: int) -> dict[str, dict[int, list[float]]]:
    """time_forwards for several models {name: CausalLM}, alternating trial by trial so that the
    machine's drift hits all of them alike: {name: {n: seconds}}."""
    times: dict[str, dict[int, list[float]]] = {name: {n: [] for n in ns} for name in models}
    for _ in range(trials):
        for name, model in models.items():
            for n, ts in time_forwards(model, prompt, ns, 1, show_progress=False).items():
                times[name][n] += ts
            model.reset()
    return times


def median_cells(times: dict[str, dict[int, list[float]]], n: int, base: int) -> list[str]:
    """'median ms (ratio to the model's own median at `base` rows)' for each model, at n rows."""
    import statistics

    cells = []
    for by_n in times.values():
        ms, one = statistics.median(by_n[n]) * 1e3, statistics.median(by_n[base]) * 1e3
        cells.append(f"{ms:8.1f} ms ({ms / one:5.2f}x)")
    return cells


def time_forwards(model, prompt: list[int], ns: list[int], trials: int, show_progress: bool = True) -> dict[int, list[float]]:
    """Seconds of one forward over n new tokens after the cached prompt, `trials` times each n.

    The n values are interleaved within each trial, so machine noise hits every n alike.
    """
    import time

    import torch

    from specdec.bench.common import progress

    device = model.device
    ids = torch.tensor(prompt, dtype=torch.long, device=device)  # [P]
    new = torch.tensor((prompt * (max(ns) // len(prompt) + 1))[: max(ns)], dtype=torch.long, device=device)
    model.prefill(ids)
    for n in ns:  # warm-up: first calls at a new shape pay one-off costs
        model.forward(new[:n])
        model.rollback(len(prompt))
    times: dict[int, list[float]] = {n: [] for n in ns}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    steps = [(t, n) for t in range(trials) for n in (ns if t % 2 == 0 else ns[::-1])]
    for _, n in progress(steps, desc="verify-cost") if show_progress else steps:
        sync()
        start = time.perf_counter()
        model.forward(new[:n])
        sync()
        times[n].append(time.perf_counter() - start)
        model.rollback(len(prompt))
    return times


def run(args: argparse.Namespace) -> int:
    from specdec.bench.common import finish, load_target, median, new_figure, precision_of, print_table, save_plot
    from specdec.bench.scoreboard import ScoreRow

    if args.prompt_tokens < 1 or args.trials < 1:
        raise InvalidRequestError("--prompt-tokens and --trials must be >= 1")
    target = load_target(args)
    prompt = prompt_tokens(target.tokenizer, args.prompt_tokens)
    ns = sorted(set(args.n))
    times = time_forwards(target.model, prompt, ns, args.trials)
    base = median(times[ns[0]])
    rows = [{"n": n, "median_s": median(times[n]), "ratio": median(times[n]) / base if base else 0.0,
             "per_token_s": median(times[n]) / n, "trials_s": times[n]} for n in ns]
    print_table(f"verify cost: {target.name}, prompt {len(prompt)} tokens, median of {args.trials}",
                ["n new tokens", "time (ms)", f"ratio to n={ns[0]}", "ms per token"],
                [[r["n"], r["median_s"] * 1e3, r["ratio"], r["per_token_s"] * 1e3] for r in rows])

    fig, ax = new_figure()
    ax.plot(ns, [r["median_s"] * 1e3 for r in rows], marker="o")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("n new tokens in one forward")
    ax.set_ylabel("median time (ms)")
    ax.set_title(f"verify cost on {target.name} (prompt {len(prompt)} tokens)")
    ax.grid(True, alpha=0.3)
    plot = save_plot(fig, args.out_dir, "verify-cost")
    data = {"command": "verify-cost", "target": target.name, "precision": precision_of(target),
            "device": str(target.model.device), "prompt_tokens": len(prompt), "trials": args.trials,
            "rows": rows, "plot": str(plot)}
    finish(args, "verify-cost", data, ScoreRow(
        target=target.name, draft="-", k=f"n={ns[0]}-{ns[-1]}", precision=data["precision"],
        tokens_per_second=1.0 / base if base else None))
    return 0
