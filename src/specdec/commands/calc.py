"""`specdec calc`: expected tokens per round and speedup from alpha, K and c."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser("calc", help="expected tau and speedup from alpha, K and c (Leviathan et al.)",
                       description="Expected tokens per round tau = (1 - alpha^(K+1)) / (1 - alpha) and "
                                   "speedup tau / (K*c + 1), with a table over K.")
    p.add_argument("--alpha", type=float, required=True, help="acceptance rate, 0..1")
    p.add_argument("--k", "-k", type=int, default=4, help="draft tokens per round")
    p.add_argument("--c", type=float, required=True, help="draft step cost / target step cost")
    p.add_argument("--k-max", type=int, default=12, help="table rows K = 1..k_max")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from specdec.speedup import best_k, expected_speedup, expected_tokens_per_round, speedup_table

    tau = expected_tokens_per_round(args.alpha, args.k)
    speed = expected_speedup(args.alpha, args.k, args.c)
    best = best_k(args.alpha, args.c, max(args.k_max, 1))
    console = Console()
    console.print(f"alpha={args.alpha:g}  K={args.k}  c={args.c:g}")
    console.print(f"expected tokens per round (tau): {tau:.3f}")
    console.print(f"expected speedup: {speed:.3f}x")
    table = Table("K", "tau", "speedup", "")
    for row in speedup_table(args.alpha, args.c, max(args.k_max, 1)):
        table.add_row(str(row.k), f"{row.tokens_per_round:.3f}", f"{row.speedup:.3f}x",
                      "<- best" if row.k == best.k else "")
    console.print(table)
    return 0
