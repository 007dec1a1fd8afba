"""What the bench commands share: loading, prompts, A/B timing through the engine, tables, plots, output."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

from specdec.bench.cli import add_output_flags
from specdec.bench.scoreboard import ScoreRow, append_row, save_json
from specdec.commands import add_model_flags
from specdec.errors import InvalidRequestError

# Small built-in prompt set (open chat, so that acceptance reflects ordinary text, not copying).
DEFAULT_PROMPTS = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator keeps food cold, in simple terms.",
    "Give me five tips for learning a new language quickly.",
    "What are the main differences between a comet and an asteroid?",
]


def add_bench_flags(parser: argparse.ArgumentParser, draft_default: str | None = "lookup") -> None:
    """--target/--draft/--device/--dtype/--threads (add_model_flags), and the output flags."""
    add_model_flags(parser, draft_default=draft_default or "none")
    add_output_flags(parser)


def add_answer_flags(parser: argparse.ArgumentParser, k: int, max_new_tokens: int) -> None:
    """-k (drafts per round) and --max-new-tokens (tokens per answer), with these defaults."""
    from specdec.commands import add_k_flag, positive_int

    add_k_flag(parser, default=k)
    parser.add_argument("--max-new-tokens", type=positive_int, default=max_new_tokens,
                        help="tokens per answer (default: %(default)s)")


def setup(args: argparse.Namespace) -> None:
    from specdec.models.cpu_threads import use_threads

    use_threads(getattr(args, "threads", None))


def load_target(args: argparse.Namespace):
    from specdec.models.loader import load_model

    setup(args)
    return load_model(args.target, device=args.device, dtype=args.dtype, backend=getattr(args, "backend", "auto"))


def runtime_pair(target, draft: str, draft_dtype: str | None = None):
    """(plain, speculative) runtimes over one loaded target: plain decoding is drafter `none`, same engine."""
    from specdec.drafters import NoDrafter, make_drafter
    from specdec.runtime import Runtime, engine_for

    drafter = make_drafter(draft, target, dtype=draft_dtype)
    plain = NoDrafter(target.model.device)
    return Runtime(target, plain, engine_for(target, plain)), Runtime(target, drafter, engine_for(target, drafter))


def precision_of(target) -> str:
    model = getattr(target.model, "model", None)
    try:
        dtype = next(model.parameters()).dtype
    except (AttributeError, StopIteration, TypeError):
        return "-"
    return {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}.get(str(dtype), str(dtype))


def read_prompts(path: str | None) -> list[str]:
    """Prompts from a file: JSONL with `prompt`/`text`/`turns` (first turn), or one prompt a line."""
    if not path:
        return list(DEFAULT_PROMPTS)
    file = Path(path)
    if not file.is_file():
        raise InvalidRequestError(f"prompts file not found: {path}")
    prompts = []
    for line in file.read_text().splitlines():
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            row = json.loads(line)
            text = row.get("prompt") or row.get("text") or (row.get("turns") or [None])[0]
            if not text:
                raise InvalidRequestError(f"{path}: a JSON line has no prompt, text or turns field")
            prompts.append(text)
        else:
            prompts.append(line)
    if not prompts:
        raise InvalidRequestError(f"{path} holds no prompts")
    return prompts


def parse_ints(text: str) -> list[int]:
    """'1-8' or '1,2,4' -> list of positive ints."""
    values: list[int] = []
    try:
        for part in text.split(","):
            lo, sep, hi = part.partition("-")
            values += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1-8 or 1,2,4, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"numbers must be >= 1, got {text!r}")
    return values


@dataclass
class RunTotals:
    """Sums over several generations of one configuration."""

    generated: int = 0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    decode_time: float = 0.0
    prefill_time: float = 0.0
    draft_time: float = 0.0
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)

    def add(self, stats) -> None:
        self.generated += stats.generated
        self.rounds += stats.rounds
        self.drafted += stats.drafted
        self.accepted += stats.accepted
        self.decode_time += stats.decode_time
        self.prefill_time += stats.prefill_time
        self.draft_time += stats.draft_time
        self.accepted_per_position = _add_lists(self.accepted_per_position, stats.accepted_per_position)
        self.drafted_per_position = _add_lists(self.drafted_per_position, stats.drafted_per_position)

    def merge(self, other: "RunTotals") -> None:
        """Add another configuration's sums to these (e.g. categories into an overall row)."""
        self.add(other)

    def reached_per_position(self) -> list[int]:
        """How often draft position i was actually judged: every earlier draft of its round was kept."""
        reached = []
        for i, drafted in enumerate(self.drafted_per_position):
            reached.append(drafted if i == 0 else min(drafted, self.accepted_per_position[i - 1]))
        return reached

    @property
    def alpha_by_position(self) -> list[float]:
        """P(draft i kept | drafts before it kept), position by position."""
        return [a / r if r else 0.0 for a, r in zip(self.accepted_per_position, self.reached_per_position())]

    @property
    def alpha_judged(self) -> float:
        """alpha as the speedup formula means it: kept / judged (drafts after a rejection are not judged).

        (accepted / drafted, `alpha`, undercounts it at large K: it counts unjudged drafts as failures.)
        """
        judged = sum(self.reached_per_position())
        return sum(self.accepted_per_position) / judged if judged else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.generated / self.decode_time if self.decode_time else 0.0

    @property
    def tau(self) -> float:
        return self.generated / self.rounds if self.rounds else 0.0

    @property
    def alpha(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def to_dict(self) -> dict:
        return dict(vars(self), tokens_per_second=self.tokens_per_second, tau=self.tau, alpha=self.alpha,
                    alpha_judged=self.alpha_judged, alpha_by_position=self.alpha_by_position)


def _add_lists(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


def speedup(spec: RunTotals, plain: RunTotals) -> float:
    """Time per generated token of plain decoding over that of speculation (decode only, prefill excluded)."""
    if not spec.generated or not plain.generated or not spec.decode_time:
        return 0.0
    return (plain.decode_time / plain.generated) / (spec.decode_time / spec.generated)


def median(values) -> float:
    return statistics.median(values) if values else 0.0


def progress(iterable, total: int | None = None, desc: str = ""):
    """A progress bar on stderr (quiet when output is not a terminal, e.g. in tests)."""
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, leave=False, dynamic_ncols=True)


def print_table(title: str, columns: list[str], rows: list[list], note: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for i, name in enumerate(columns):
        table.add_column(name, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(_fmt(v) for v in row))
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)  # no wrapping in logs
    console.print(table)
    if note:
        console.print(note)


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def new_figure(width: float = 6.0, height: float = 4.0):
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height), dpi=100)


def save_plot(fig, out_dir: str, name: str) -> Path:
    import matplotlib.pyplot as plt

    path = Path(out_dir) / f"bench-{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def finish(args: argparse.Namespace, name: str, data: dict, row: ScoreRow) -> Path:
    """Save the JSON, add the scoreboard row (unless --no-scoreboard), say where things went."""
    path = save_json(data, args.out_dir, name)
    if not args.no_scoreboard:
        append_row(row, args.scoreboard)
    print(f"results: {path}" + (f"; plot: {data['plot']}" if data.get("plot") else ""))
    return path
