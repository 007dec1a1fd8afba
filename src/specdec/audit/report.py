"""What an audit shows: terminal tables, a JSON report, a PNG per failing prompt, the exit status."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.table import Table

from specdec.audit.greedy import DIFFERENT, IDENTICAL
from specdec.audit.run import AuditResult, CONSISTENT, EXIT_STATUS
from specdec.audit.sampled import SampledResult

TOP_OUTCOMES = 12  # bars a plot shows; the rest are summed into "other"


def per_category(result: AuditResult) -> dict[str, dict]:
    """Greedy identity per category: {category: {prompts, identical, different, rate}}."""
    rows: dict[str, dict] = defaultdict(lambda: {"prompts": 0, "identical": 0, "different": 0, "other": 0})
    for g in result.greedy:
        row = rows[g.category]
        row["prompts"] += 1
        row[g.status if g.status in (IDENTICAL, DIFFERENT) else "other"] += 1
    for row in rows.values():
        compared = row["identical"] + row["different"]
        row["rate"] = row["identical"] / compared if compared else None
    return dict(rows)


def to_json(result: AuditResult, plots: dict[str, str]) -> dict:
    return {"command": "audit", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "verdict": result.verdict, "exit_status": EXIT_STATUS[result.verdict],
            "stopped": result.stopped, "unfinished": result.unfinished, "sides": result.sides,
            "options": asdict(result.options),
            "greedy": {"per_category": per_category(result), "prompts": [asdict(g) for g in result.greedy]},
            "sampled": {"min_detectable_tv": result.min_detectable_tv,
                        "prompts": [{**asdict(s), "fails": result.sampled_fails(s), "plot": plots.get(s.prompt_id)}
                                    for s in result.sampled]}}


def print_report(result: AuditResult, console: Console) -> None:
    for name, side in result.sides.items():
        tokens = "tokens from logprobs" if side["returned_logprobs"] else "no logprobs: text compared"
        console.print(f"{name}: {side['url']} model {side['model']!r} ({tokens})")
    if result.greedy:
        _greedy_tables(result, console)
    if result.sampled:
        _sampled_table(result, console)
    if result.stopped:
        console.print(f"[bold red]stopped early:[/] {result.stopped}; the report is partial "
                      f"({len(result.unfinished)} prompt(s) unfinished)")
    verdict = result.verdict
    style = "bold green" if verdict == CONSISTENT else "bold red"
    console.print(f"[{style}]verdict: {verdict.upper()}[/] ({_verdict_line(result)})")


def _greedy_tables(result: AuditResult, console: Console) -> None:
    table = Table(title="greedy (temperature 0): candidate answer identical to the reference's")
    for col in ("category", "prompts", "identical", "different", "other", "identity rate"):
        table.add_column(col, justify="left" if col == "category" else "right")
    for cat, row in per_category(result).items():
        rate = "-" if row["rate"] is None else f"{row['rate']:.0%}"
        table.add_row(cat, str(row["prompts"]), str(row["identical"]), str(row["different"]), str(row["other"]), rate)
    console.print(table)
    varies = [g.prompt_id for g in result.greedy if not g.reference_deterministic]
    console.print(f"reference deterministic (asked twice) on {len(result.greedy) - len(varies)} of "
                  f"{len(result.greedy)} prompts" + (f"; it varies on {', '.join(varies)}" if varies else ""))
    for g in result.greedy:
        if g.status == DIFFERENT:
            tv = "" if g.max_logprob_tv is None else f"; next-token distributions up to TV {g.max_logprob_tv:.3f} apart"
            if g.error:
                console.print(f"  [red]{g.prompt_id}[/]: the candidate failed: {g.error}", highlight=False)
            elif g.first_difference is None:
                console.print(f"  [red]{g.prompt_id}[/]: the same {g.unit}s{tv}", highlight=False)
            else:
                console.print(f"  [red]{g.prompt_id}[/]: first difference at {g.unit} {g.first_difference}{tv}",
                              highlight=False)
                console.print(f"    reference: {g.reference_around!r}\n    candidate: {g.candidate_around!r}",
                              highlight=False, markup=False)


def _sampled_table(result: AuditResult, console: Console) -> None:
    o = result.options
    table = Table(title=f"sampled (temperature {o.temperature:g}): {o.samples} completions a side, first "
                        f"{o.tokens} tokens; p-values after {o.correction.upper()} correction")
    for col in ("prompt", "unit", "first token p", "first m p", "logprob TV", "result"):
        table.add_column(col, justify="left" if col in ("prompt", "unit") else "right")
    for s in result.sampled:
        tv = "-" if s.logprob_tv is None else f"{s.logprob_tv:.3f}"
        verdict = "[red]DIFFERS[/]" if result.sampled_fails(s) else "same"
        table.add_row(s.prompt_id, s.unit, f"{s.first_p_adjusted:.3g}", f"{s.prefix_p_adjusted:.3g}", tv, verdict)
    console.print(table)
    if result.min_detectable_tv is not None:
        console.print(f"power: with {o.samples} completions a side at significance {o.alpha:g} over "
                      f"{2 * len(result.sampled)} tests, a difference of total-variation distance "
                      f"{result.min_detectable_tv:.2f} or more in the first {o.tokens} tokens of one prompt "
                      "would be found with 80% probability; smaller ones may go unseen")


def _verdict_line(result: AuditResult) -> str:
    misses = sum(g.counts_as_difference for g in result.greedy)
    fails = sum(result.sampled_fails(s) for s in result.sampled)
    return (f"greedy: {misses} of {len(result.greedy)} prompts differ; "
            f"sampled: {fails} of {len(result.sampled)} prompts differ")


def save_plots(result: AuditResult, out_dir: Path) -> dict[str, str]:
    """A PNG per failing sampled prompt: the two empirical distributions side by side. {prompt id: path}."""
    failing = [s for s in result.sampled if result.sampled_fails(s)]
    if not failing:
        return {}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for s in failing:
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
        _bars(axes[0], s.reference_first, s.candidate_first, s, "first token")
        _bars(axes[1], s.reference_prefix, s.candidate_prefix, s, f"first {result.options.tokens} tokens")
        fig.suptitle(f"{s.prompt_id}: reference vs candidate (adjusted p {s.first_p_adjusted:.2g} / "
                     f"{s.prefix_p_adjusted:.2g})")
        fig.tight_layout()
        path = out_dir / f"audit-{re.sub(r'[^A-Za-z0-9_.-]', '_', s.prompt_id)}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths[s.prompt_id] = str(path)
    return paths


def _bars(ax, ref: dict[str, int], cand: dict[str, int], s: SampledResult, title: str) -> None:
    ranked = sorted(set(ref) | set(cand), key=lambda o: -(ref.get(o, 0) + cand.get(o, 0)))
    shown, rest = ranked[:TOP_OUTCOMES], ranked[TOP_OUTCOMES:]
    labels = [o[:24] or "''" for o in shown] + (["other"] if rest else [])
    share_r = [ref.get(o, 0) / max(1, s.n_reference) for o in shown]
    share_c = [cand.get(o, 0) / max(1, s.n_candidate) for o in shown]
    if rest:
        share_r.append(sum(ref.get(o, 0) for o in rest) / max(1, s.n_reference))
        share_c.append(sum(cand.get(o, 0) for o in rest) / max(1, s.n_candidate))
    x = range(len(labels))
    ax.bar([i - 0.2 for i in x], share_r, width=0.4, label=f"reference (n={s.n_reference})")
    ax.bar([i + 0.2 for i in x], share_c, width=0.4, label=f"candidate (n={s.n_candidate})")
    ax.set_xticks(list(x), labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("share of completions")
    ax.set_title(title)
    ax.legend()


def write_json(result: AuditResult, path: Path, plots: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_json(result, plots), indent=2, ensure_ascii=False) + "\n")
