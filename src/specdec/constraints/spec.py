"""What a request constrains its output to: a JSON schema, any JSON object, a regex, or a Lark grammar.

A ConstraintSpec is plain data (frozen, hashable: the grammar cache's key) and imports nothing heavy,
so that GenerationConfig, the CLI and the server can carry one; constraints.grammar compiles it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from specdec.errors import InvalidRequestError

KINDS = ("json_schema", "json_object", "regex", "grammar")


@dataclass(frozen=True)
class ConstraintSpec:
    """kind: one of KINDS. text: the JSON schema as JSON text (json_schema), the regex (regex), the
    grammar in Lark syntax (grammar), or "" (json_object: any JSON object)."""

    kind: str
    text: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InvalidRequestError(f"constraint kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.kind != "json_object" and not self.text:
            raise InvalidRequestError(f"a {self.kind} constraint needs its text (it is empty)")

    @classmethod
    def json_schema(cls, schema: dict | str) -> "ConstraintSpec":
        """From a schema given as a dict or as JSON text (kept compact; key order kept: the output
        follows the order of `properties`)."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise InvalidRequestError(f"the JSON schema is not valid JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise InvalidRequestError(f"a JSON schema must be a JSON object, got {type(schema).__name__}")
        return cls("json_schema", json.dumps(schema, separators=(",", ":")))

    @classmethod
    def regex(cls, pattern: str) -> "ConstraintSpec":
        return cls("regex", pattern)

    @classmethod
    def grammar(cls, lark: str) -> "ConstraintSpec":
        return cls("grammar", lark)

    @classmethod
    def json_object(cls) -> "ConstraintSpec":
        return cls("json_object")

    @property
    def schema(self) -> dict | None:
        """The JSON schema the output must validate against (json_object: any object), else None."""
        if self.kind == "json_schema":
            return json.loads(self.text)
        return {"type": "object"} if self.kind == "json_object" else None
