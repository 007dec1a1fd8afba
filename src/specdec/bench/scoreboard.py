"""SCOREBOARD.md: one row per benchmark run, and the run's JSON saved beside it."""

from __future__ import annotations

import datetime as _dt
import json
import platform
import shlex
import sys
from dataclasses import asdict, dataclass, fields
from pathlib import Path

HEADER_NAMES = ["date", "machine", "target", "draft", "K", "precision", "tokens/s", "speedup", "tau",
                "alpha", "command"]


@dataclass(frozen=True)
class ScoreRow:
    target: str
    draft: str
    k: str  # a number, a range ("1-8"), or "-"
    precision: str
    tokens_per_second: float | None = None
    speedup: float | None = None
    tau: float | None = None
    alpha: float | None = None
    command: str = ""
    machine: str = ""
    date: str = ""


def machine_name() -> str:
    """The CPU model (and the GPU when CUDA is in use): numbers mean little without it."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import os

    desc = f"{cpu} ({os.cpu_count()} cores)"
    try:
        import torch

        if torch.cuda.is_available():
            desc = f"{torch.cuda.get_device_name(0)}; {desc}"
    except ImportError:
        pass
    return desc


def this_command() -> str:
    return "specdec " + shlex.join(sys.argv[1:]) if sys.argv and sys.argv[0].endswith("specdec") \
        else shlex.join(sys.argv)


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.1f}"
    return str(value).replace("|", "\\|")


def append_row(row: ScoreRow, path: str | Path = "SCOREBOARD.md") -> None:
    """Append one row (date, machine and command filled in when left empty), creating the table if needed."""
    path = Path(path)
    row_values = asdict(row)
    row_values["date"] = row.date or _dt.date.today().isoformat()
    row_values["machine"] = row.machine or machine_name()
    row_values["command"] = f"`{row.command or this_command()}`"
    order = ["date", "machine", "target", "draft", "k", "precision", "tokens_per_second", "speedup", "tau",
             "alpha", "command"]
    assert set(order) == {f.name for f in fields(ScoreRow)}
    line = "| " + " | ".join(_cell(row_values[name]) for name in order) + " |\n"
    if not path.exists():
        path.write_text("# Scoreboard\n\nOne row per benchmark run (`specdec bench ...`); the JSON of each run is "
                        "in results/.\n\n| " + " | ".join(HEADER_NAMES) + " |\n|" + "---|" * len(HEADER_NAMES) + "\n")
    with path.open("a") as f:
        f.write(line)


def save_json(data: dict, out_dir: str | Path, name: str) -> Path:
    """Write results to out_dir/name-<timestamp>.json and return the path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = out / f"{name}-{stamp}.json"
    path.write_text(json.dumps(data, indent=2, default=str))
    return path
