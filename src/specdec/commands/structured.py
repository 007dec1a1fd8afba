"""Structured-output flags shared by commands: --json-schema FILE, --json-object, --regex REGEX, --grammar FILE."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdec.errors import InvalidRequestError


def add_constraint_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--json-schema", metavar="FILE",
                       help="constrain the output to JSON valid under the JSON schema in FILE (exactly: docs/structured.md)")
    group.add_argument("--json-object", action="store_true", help="constrain the output to a JSON object")
    group.add_argument("--regex", metavar="REGEX", help="constrain the output to match REGEX in full")
    group.add_argument("--grammar", metavar="FILE", help="constrain the output to the Lark grammar in FILE")


def constraint_spec(args: argparse.Namespace):
    """The ConstraintSpec the flags ask for, or None; InvalidRequestError naming an unreadable file."""
    from specdec.constraints import ConstraintSpec

    if args.json_schema:
        return ConstraintSpec.json_schema(_read(args.json_schema, "--json-schema"))
    if args.json_object:
        return ConstraintSpec.json_object()
    if args.regex is not None:
        return ConstraintSpec.regex(args.regex)
    if args.grammar:
        return ConstraintSpec.grammar(_read(args.grammar, "--grammar"))
    return None


def _read(path: str, flag: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise InvalidRequestError(f"{flag}: cannot read {path}: {exc.strerror}") from None


def validity(spec, text: str) -> dict:
    """How the output meets a JSON constraint: {"valid": bool, "error": str | None} (only for JSON kinds)."""
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), spec.schema)
    except (json.JSONDecodeError, jsonschema.ValidationError) as exc:
        return {"valid": False, "error": str(exc).splitlines()[0]}
    return {"valid": True, "error": None}
