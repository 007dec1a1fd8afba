"""Structured-output fields of a request, to one ConstraintSpec (or a 400 that says what is wrong).

The fields, as OpenAI and vLLM's server name them:
- `response_format` (OpenAI): {"type": "text"} (none), {"type": "json_object"}, or
  {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}};
- `structured_outputs` (vLLM): {"json": schema (object or JSON text), "regex": str, "choice": [str],
  "grammar": str (Lark), "json_object": true}, exactly one of them;
- `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar` (vLLM before 0.12, the same meanings).
At most one field may ask for a constraint. The spec is compiled here (grammar cache: constraints/grammar.py),
so that a bad schema, regex or grammar is a 400 before the request is queued.
"""

from __future__ import annotations

import json

from specdec.constraints import ConstraintSpec
from specdec.errors import InvalidRequestError
from specdec.server.protocol import APIError

GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
STRUCTURED_KEYS = ("json", "regex", "choice", "grammar", "json_object")


def constraint_of(request, grammars) -> ConstraintSpec | None:
    """The request's constraint, compiled once through grammars (a GrammarCompiler), or None."""
    asked = [(name, spec) for name, spec in _asked(request) if spec is not None]
    if len(asked) > 1:
        raise APIError(400, f"{asked[0][0]} and {asked[1][0]} both constrain the output: send one",
                       asked[1][0], "invalid_value")
    if not asked:
        return None
    name, spec = asked[0]
    try:
        grammars.compile(spec)
    except InvalidRequestError as exc:
        raise APIError(400, f"{name}: {exc}", name, "invalid_value") from None
    return spec


def _asked(request):
    """(field, spec or None) for every structured-output field of the request."""
    yield "response_format", _guarded("response_format", _response_format, request.response_format)
    yield "structured_outputs", _guarded("structured_outputs", _structured_outputs, request.structured_outputs)
    for field, key in GUIDED.items():
        value = getattr(request, field, None)
        yield field, None if value is None else _guarded(field, _one, key, value)


def _guarded(field: str, parse, *args):
    try:
        return parse(*args)
    except InvalidRequestError as exc:
        raise APIError(400, f"{field}: {exc}", field, "invalid_value") from None


def _response_format(value) -> ConstraintSpec | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise InvalidRequestError('must be an object with a "type": "text", "json_object" or "json_schema"')
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return ConstraintSpec.json_object()
    if kind != "json_schema":
        raise InvalidRequestError(f'type must be "text", "json_object" or "json_schema", got {kind!r}')
    inner = value.get("json_schema")
    if not isinstance(inner, dict) or not isinstance(inner.get("schema"), dict):
        raise InvalidRequestError('json_schema must be an object whose "schema" is the JSON schema (an object)')
    return ConstraintSpec.json_schema(inner["schema"])


def _structured_outputs(value) -> ConstraintSpec | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidRequestError(f"must be an object with one of {', '.join(STRUCTURED_KEYS)}")
    keys = [k for k in STRUCTURED_KEYS if value.get(k) not in (None, False)]
    unknown = sorted(set(value) - set(STRUCTURED_KEYS) - {"disable_fallback", "disable_any_whitespace",
                                                          "disable_additional_properties", "whitespace_pattern"})
    if unknown:
        raise InvalidRequestError(f"{unknown[0]!r} is not served here; use one of {', '.join(STRUCTURED_KEYS)}")
    if len(keys) != 1:
        raise InvalidRequestError(f"give exactly one of {', '.join(STRUCTURED_KEYS)}, got {keys or 'none'}")
    return _one(keys[0], value[keys[0]])


def _one(key: str, value) -> ConstraintSpec:
    """One vLLM-style constraint: json (schema object or its JSON text), regex, choice, grammar, json_object."""
    if key == "json_object":
        return ConstraintSpec.json_object()
    if key == "json":
        if not isinstance(value, (dict, str)):
            raise InvalidRequestError("json must be a JSON schema: an object, or its JSON text")
        return ConstraintSpec.json_schema(value)
    if key == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise InvalidRequestError("choice must be a non-empty list of non-empty strings")
        return ConstraintSpec.grammar("start: " + " | ".join(json.dumps(c) for c in value))
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(f"{key} must be a non-empty string")
    return ConstraintSpec.regex(value) if key == "regex" else ConstraintSpec.grammar(value)
