"""`specdec bench`: one module a benchmark, each with `register(bench_subparsers)`.

register() must stay cheap: heavy imports belong inside the command's run function.
"""

from __future__ import annotations

import importlib

BENCH_MODULES: list[str] = [
    # e.g. "specdec.bench.verify_cost"; each module adds its own subcommand
    "specdec.bench.verify_cost",
    "specdec.bench.sweep",
    "specdec.bench.policy",
    "specdec.bench.lookup",
    "specdec.bench.exactness",
    "specdec.bench.specbench",
    "specdec.bench.serve",
    "specdec.bench.gpu",
    "specdec.bench.structured",
]


def register(sub) -> None:
    parser = sub.add_parser("bench", help="measure: verify cost, K sweep, lookup, exactness, Spec-Bench, ...")
    bench_sub = parser.add_subparsers(dest="bench_command", required=True, metavar="BENCH")
    for name in BENCH_MODULES:
        importlib.import_module(name).register(bench_sub)


def add_output_flags(parser) -> None:
    """Flags every bench command shares: where results go, and whether a scoreboard row is added."""
    parser.add_argument("--out-dir", default="results", help="folder for the JSON and plots (default: %(default)s)")
    parser.add_argument("--scoreboard", default="SCOREBOARD.md", help="scoreboard file (default: %(default)s)")
    parser.add_argument("--no-scoreboard", action="store_true", help="do not append a scoreboard row")
