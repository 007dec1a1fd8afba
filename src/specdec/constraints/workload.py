"""The structured-output workload kept in the repo (data/structured/extraction.jsonl, SOURCE.md beside it)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

WORKLOAD = Path(__file__).resolve().parent.parent / "data" / "structured" / "extraction.jsonl"


@dataclass(frozen=True)
class StructuredTask:
    """One extraction: the prompt, the JSON schema its answer must validate against, a valid answer."""

    id: str
    schema_name: str
    prompt: str
    schema: dict
    example: dict


def load_tasks(path: Path = WORKLOAD) -> list[StructuredTask]:
    return [StructuredTask(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
