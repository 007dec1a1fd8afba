"""`specdec generate`: one prompt through speculative decoding, streamed, then the statistics."""

from __future__ import annotations

import argparse
import json
import signal
import sys

from specdec.commands import add_model_flags, add_sampling_flags, add_tensor_parallel_flag, positive_int, sampling_params
from specdec.commands.structured import add_constraint_flags, constraint_spec, validity

ORIGIN_STYLE = {"accepted": "green", "recovered": "yellow", "bonus": "cyan"}


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate text with speculative decoding",
                       description="Generate from PROMPT (or stdin) with a draft and the target, exactly.")
    p.add_argument("prompt", nargs="?", help="the prompt text; read from stdin when omitted")
    add_model_flags(p)
    add_tensor_parallel_flag(p)
    add_sampling_flags(p)
    p.add_argument("--max-new-tokens", type=positive_int, default=128)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep going past the end-of-sequence token")
    p.add_argument("--raw", action="store_true", help="no chat template: continue the prompt text as is")
    add_constraint_flags(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming")
    p.add_argument("--compare", action="store_true",
                   help="also decode plainly (draft none) and print speedup and whether the tokens match")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specdec.generation import GenerationConfig
    from specdec.runtime import build_runtime, require_prompt

    prompt = args.prompt if args.prompt is not None else sys.stdin.read()
    require_prompt(prompt)  # before the model loads: a bad request should cost nothing
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, k=args.k, sampling=sampling_params(args),
                              stop=tuple(args.stop), ignore_eos=args.ignore_eos, constraint=constraint_spec(args))
    runtime = build_runtime(args.target, args.draft, device=args.device, dtype=args.dtype, backend=args.backend,
                            threads=args.threads, tensor_parallel=args.tensor_parallel_size)
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)  # so that `finally` stops every rank
    try:
        return _generate(args, runtime, prompt, config)
    finally:
        runtime.close()
        signal.signal(signal.SIGTERM, previous)


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def _generate(args: argparse.Namespace, runtime, prompt: str, config) -> int:
    from specdec.drafters import NoDrafter
    from specdec.runtime import cut_at_stop

    prompt_ids = runtime.encode(prompt, chat=not args.raw)
    console = _console(args.json)

    generation = runtime.engine.stream(prompt_ids, config)
    if args.json:
        generation.run()
    else:
        _stream_to_terminal(console, runtime, generation)
    text = cut_at_stop(runtime.decode(generation.token_ids), config.stop)
    baseline = None
    if args.compare:
        plain = runtime.with_drafter(NoDrafter(runtime.target.model.device))
        baseline = plain.engine.generate(prompt_ids, config)

    report = _report(args, runtime, text, generation, baseline)
    if config.constraint is not None:
        report["constraint"] = {"kind": config.constraint.kind,
                                **(validity(config.constraint, text) if config.constraint.schema else {})}
    if args.json:
        print(json.dumps(report))
    else:
        _print_stats(console, report)
    return 0


def _console(quiet: bool):
    from rich.console import Console

    return Console(highlight=False, stderr=quiet)


def _stream_to_terminal(console, runtime, generation) -> None:
    shown = ""
    for emitted in generation:
        text = runtime.decode(generation.token_ids)
        piece, shown = text[len(shown):], text
        console.print(piece, style=ORIGIN_STYLE[emitted.origin.value], end="", markup=False, soft_wrap=True)
    console.print()


def _report(args, runtime, text: str, generation, baseline) -> dict:
    stats = generation.stats
    report = {
        "text": text,
        "token_ids": generation.token_ids,
        "finish_reason": generation.finish_reason,
        "target": runtime.target.name,
        "draft": runtime.drafter.name,
        "k": args.k,
        "tensor_parallel_size": args.tensor_parallel_size,
        "threads": runtime.threads.count,
        "threads_why": runtime.threads.why,
        "stats": stats.to_dict(),
    }
    if baseline is not None:
        plain_tps = baseline.stats.tokens_per_second
        report["compare"] = {
            "plain_tokens_per_second": plain_tps,
            "plain_token_ids": baseline.token_ids,
            "speedup": stats.tokens_per_second / plain_tps if plain_tps else 0.0,
            "identical": baseline.token_ids == generation.token_ids,
            "greedy": args.temperature == 0.0,
        }
    return report


def _print_stats(console, report: dict) -> None:
    from rich.table import Table

    from specdec.models.cpu_threads import CpuThreads

    s = report["stats"]
    threads = CpuThreads(report["threads"], report["threads_why"]).describe()
    table = Table(title=f"target {report['target']}  draft {report['draft']}  K={report['k']}  {threads}",
                  show_header=False, title_justify="left")
    table.add_row("generated tokens", str(s["generated"]))
    table.add_row("rounds", str(s["rounds"]))
    table.add_row("drafted / accepted", f"{s['drafted']} / {s['accepted']}")
    table.add_row("acceptance rate (alpha)", f"{s['acceptance_rate']:.3f}")
    table.add_row("tokens per round (tau)", f"{s['tokens_per_round']:.2f}")
    table.add_row("tokens/s (decode)", f"{s['tokens_per_second']:.1f}")
    if "constraint" in report:
        valid = report["constraint"].get("valid")
        table.add_row("constraint", report["constraint"]["kind"] + ("" if valid is None else
                                                                    " (valid)" if valid else " (INVALID)"))
        table.add_row("grammar drafts / kept / forced", f"{s['grammar_drafted']} / {s['grammar_accepted']} / "
                                                        f"{s['forced']}")
    table.add_row("time draft / verify / other", f"{s['draft_time']:.2f}s / {s['verify_time']:.2f}s / "
                                                  f"{s['other_time']:.2f}s  (prefill {s['prefill_time']:.2f}s)")
    cmp = report.get("compare")
    if cmp:
        table.add_row("plain decoding tokens/s", f"{cmp['plain_tokens_per_second']:.1f}")
        table.add_row("speedup", f"{cmp['speedup']:.2f}x")
        note = "" if cmp["greedy"] else " (sampling: same distribution, not the same draw)"
        table.add_row("identical to plain decoding", ("yes" if cmp["identical"] else "no") + note)
    console.print(table)
    console.print("[green]accepted[/]  [yellow]recovered[/]  [cyan]bonus[/]")
