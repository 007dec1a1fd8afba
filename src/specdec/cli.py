"""`specdec` command line: one subcommand a module, each with `register(subparsers)`.

Errors a user can fix (SpecdecError and its subclasses) print one line and exit 2: no traceback.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from specdec.errors import SpecdecError

# Modules that add subcommands; each register() must stay cheap (heavy imports go inside run()).
COMMAND_MODULES = [
    "specdec.commands.generate",
    "specdec.commands.calc",
    "specdec.commands.serve",
    "specdec.commands.train_draft",
    "specdec.bench.cli",
    "specdec.commands.audit",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="Exact speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except SpecdecError as exc:
        print(f"specdec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
