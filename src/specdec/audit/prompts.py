"""The prompts an audit sends: a built-in set (chat, code, math, summarization, rewriting, extraction)
or a user's JSONL file, one prompt a line.

A line is `{"messages": [{"role": "user", "content": "..."}]}` (sent to /v1/chat/completions) or
`{"prompt": "..."}` (sent to /v1/completions), with an optional "category" and "id".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import InvalidRequestError

BUILTIN = Path(__file__).resolve().parent.parent / "data" / "audit_prompts.jsonl"
ROLES = ("system", "developer", "user", "assistant")


class AuditInputError(InvalidRequestError):
    """Bad input the user can fix (a prompts file, a flag, a server that cannot be reached): one line
    and exit 2, like every specdec input error (cli.main)."""


@dataclass(frozen=True)
class Prompt:
    id: str
    category: str
    messages: tuple[tuple[str, str], ...] | None  # (role, content) pairs for the chat endpoint
    text: str | None  # a raw prompt for the completions endpoint

    @property
    def chat(self) -> bool:
        return self.messages is not None

    def body(self) -> dict:
        """The request fields that carry the prompt."""
        if self.chat:
            return {"messages": [{"role": r, "content": c} for r, c in self.messages]}
        return {"prompt": self.text}


def load_prompts(path: str | Path | None = None, limit: int | None = None) -> list[Prompt]:
    """The prompts of a JSONL file (the built-in set when path is None), at most `limit` of them."""
    path = Path(path) if path is not None else BUILTIN
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise AuditInputError(f"cannot read the prompts file {str(path)!r}: {exc}") from None
    prompts = [_parse(line, path, n) for n, line in enumerate(lines, 1) if line.strip()]
    if not prompts:
        raise AuditInputError(f"the prompts file {str(path)!r} has no prompts; give one JSON object a line")
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise AuditInputError(f"{path}: the id {dup!r} is used twice; give each prompt its own id")
    return prompts[:limit] if limit else prompts


def _parse(line: str, path: Path, n: int) -> Prompt:
    where = f"{path}:{n}"
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise AuditInputError(f"{where}: not JSON ({exc.msg}); give one object a line, like "
                              '{"prompt": "..."} or {"messages": [...]}') from None
    if not isinstance(row, dict):
        raise AuditInputError(f"{where}: expected a JSON object, got {type(row).__name__}")
    category = str(row.get("category", "user"))
    pid = str(row.get("id", f"{category}-{n}"))
    if isinstance(row.get("prompt"), str) and row["prompt"].strip():
        return Prompt(pid, category, None, row["prompt"])
    if "messages" in row:
        return Prompt(pid, category, _messages(row["messages"], where), None)
    raise AuditInputError(f"{where}: give a non-empty \"prompt\" string or a \"messages\" list")


def _messages(messages, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(messages, list) or not messages:
        raise AuditInputError(f"{where}: \"messages\" must be a non-empty list of {{role, content}} objects")
    pairs = []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise AuditInputError(f"{where}: each message needs a role ({', '.join(ROLES)}) and a content string")
        pairs.append((m["role"], m["content"]))
    return tuple(pairs)
