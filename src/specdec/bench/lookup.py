"""`specdec bench lookup`: prompt lookup on open chat against prompts whose answer copies their input.

Prompt lookup drafts by copying what followed an earlier occurrence of the text's tail, so it should
shine when the answer repeats the prompt (renaming a variable, editing a document, answering from a
given text) and do little on open chat. Per category: tokens per round, acceptance, speedup over
plain decoding through the same engine (plain and lookup alternate prompt by prompt).
"""

from __future__ import annotations

import argparse

from specdec.commands import positive_int

CODE = '''def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax
'''
CODE2 = '''class Counter:
    def __init__(self):
        self.count = 0

    def increment(self, step=1):
        self.count += step
        return self.count

    def reset(self):
        self.count = 0
'''
DOC = ("The city council met on Tuesday to discuss the new park. Members agreed that the park should "
       "have a playground, a small lake and walking paths. The budget for the project is two million "
       "dollars, and work will begin in the spring. Residents can send comments to the council by email.")
DOC2 = ("Our team will release version 2.0 of the app next month. The update adds dark mode, faster "
        "search and offline support. Users on version 1.x will get the update automatically. Please "
        "report any problems to the support team so that we can fix them quickly.")

CATEGORIES: dict[str, list[str]] = {
    "open chat": [
        "Write a short poem about the sea at night.",
        "What should I pack for a weekend hiking trip?",
    ],
    "code rename": [
        f"Rename the variable `subtotal` to `net_total` in this code and show the whole code:\n\n{CODE}",
        f"Rename the attribute `count` to `value` in this class and show the whole class:\n\n{CODE2}",
    ],
    "document edit": [
        f"Rewrite this text, changing 'Tuesday' to 'Wednesday' and 'two million' to 'three million'. "
        f"Keep everything else the same:\n\n{DOC}",
        f"Fix nothing, just repeat this text exactly, but replace 'next month' with 'in June':\n\n{DOC2}",
    ],
    "answer from text": [
        f"{DOC}\n\nQuote the sentence that says when work will begin, and the sentence about the budget.",
        f"{DOC2}\n\nWhich features does the update add? Answer with the sentence from the text.",
    ],
}


def register(sub) -> None:
    p = sub.add_parser("lookup", help="prompt lookup by category: open chat vs copying prompts",
                       description="Prompt lookup on open chat against prompts whose answer copies the input.")
    from specdec.bench.common import add_answer_flags, add_bench_flags

    add_bench_flags(p, draft_default="lookup")
    add_answer_flags(p, k=5, max_new_tokens=96)
    p.add_argument("--per-category", type=positive_int, default=2, help="prompts per category (default: all 2)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specdec.bench.common import RunTotals, load_target, progress, runtime_pair
    from specdec.generation import GenerationConfig

    target = load_target(args)
    plain, spec = runtime_pair(target, args.draft)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, k=args.k)
    jobs = [(cat, p) for cat, prompts in CATEGORIES.items() for p in prompts[: args.per_category]]
    totals = {cat: (RunTotals(), RunTotals()) for cat in CATEGORIES}  # (plain, lookup)
    for i, (cat, prompt) in enumerate(progress(jobs, desc=f"lookup ({args.draft})")):
        ids = plain.encode(prompt)
        pair = [(plain, totals[cat][0]), (spec, totals[cat][1])]
        for runtime, bucket in pair if i % 2 == 0 else pair[::-1]:  # A/B, alternating which goes first
            bucket.add(runtime.engine.generate(ids, config).stats)
    report(args, target, spec, totals)
    return 0


def report(args, target, spec, totals: dict) -> None:
    from specdec.bench.common import (RunTotals, finish, new_figure, precision_of, print_table, save_plot,
                                      speedup)
    from specdec.bench.scoreboard import ScoreRow

    rows = []
    all_plain, all_spec = RunTotals(), RunTotals()
    for cat, (p, s) in totals.items():
        rows.append({"category": cat, "tau": s.tau, "alpha": s.alpha, "plain_tokens_per_second": p.tokens_per_second,
                     "tokens_per_second": s.tokens_per_second, "speedup": speedup(s, p),
                     "plain": p.to_dict(), "spec": s.to_dict()})
        all_plain.merge(p)
        all_spec.merge(s)
    overall = {"category": "overall", "tau": all_spec.tau, "alpha": all_spec.alpha,
               "plain_tokens_per_second": all_plain.tokens_per_second,
               "tokens_per_second": all_spec.tokens_per_second, "speedup": speedup(all_spec, all_plain)}
    print_table(f"prompt lookup: {target.name} + {spec.drafter.name}, K={args.k}, {args.max_new_tokens} new tokens",
                ["category", "tau", "alpha", "plain tok/s", "lookup tok/s", "speedup"],
                [[r["category"], r["tau"], r["alpha"], r["plain_tokens_per_second"], r["tokens_per_second"],
                  r["speedup"]] for r in rows + [overall]])
    fig, ax = new_figure()
    ax.bar([r["category"] for r in rows], [r["speedup"] for r in rows], color="tab:blue")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title(f"prompt lookup (K={args.k}) on {target.name}")
    plot = save_plot(fig, args.out_dir, "lookup")
    data = {"command": "lookup", "target": target.name, "draft": spec.drafter.name, "k": args.k,
            "precision": precision_of(target), "max_new_tokens": args.max_new_tokens,
            "categories": rows, "overall": overall, "plot": str(plot)}
    finish(args, "lookup", data, ScoreRow(
        target=target.name, draft=spec.drafter.name, k=str(args.k), precision=data["precision"],
        tokens_per_second=overall["tokens_per_second"], speedup=overall["speedup"], tau=overall["tau"],
        alpha=overall["alpha"]))
