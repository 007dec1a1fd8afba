"""`specdec audit`: does an OpenAI-compatible server's speculative decoding change its answers?

Exit status: 0 consistent, 1 a difference found, 2 bad input or an audit that could not finish
(a server stopped before any difference was found). See docs/audit.md.
"""

from __future__ import annotations

import argparse
import os

from specdec.commands import json_object, positive_int


def register(sub) -> None:
    p = sub.add_parser("audit", help="check that a server's speculative decoding does not change its answers",
                       description="Ask a reference server (the model without speculation) and a candidate "
                                   "(with it) the same prompts: greedy answers must be identical, sampled ones "
                                   "must follow the same distribution. Exit 0 consistent, 1 different, 2 bad input.")
    p.add_argument("--reference", required=True, metavar="URL", help="server without speculation, e.g. http://host:8000")
    p.add_argument("--candidate", required=True, metavar="URL", help="the same model with speculation on")
    key = os.environ.get("OPENAI_API_KEY")
    p.add_argument("--reference-api-key", default=key, help="bearer token for the reference (default: $OPENAI_API_KEY)")
    p.add_argument("--candidate-api-key", default=key, help="bearer token for the candidate (default: $OPENAI_API_KEY)")
    p.add_argument("--model", default=None, help="model id sent to both (default: each server's first listed model)")
    p.add_argument("--reference-body", type=json_object, default={}, metavar="JSON",
                   help="fields merged into every reference request, e.g. '{\"draft\": \"none\"}'")
    p.add_argument("--candidate-body", type=json_object, default={}, metavar="JSON",
                   help="fields merged into every candidate request")
    p.add_argument("--prompts", default=None, metavar="FILE",
                   help="JSONL, one {\"prompt\": ...} or {\"messages\": [...]} a line, optional \"category\" and "
                        "\"id\" (default: the built-in set of chat, code, math, summarization, rewriting, extraction)")
    p.add_argument("--limit", type=positive_int, default=None, help="use only the first N prompts")
    p.add_argument("--mode", choices=("both", "greedy", "sampled"), default="both", help="(default: %(default)s)")
    p.add_argument("--max-tokens", type=positive_int, default=48, help="greedy answer length (default: %(default)s)")
    p.add_argument("-n", "--samples", type=positive_int, default=100,
                   help="sampled completions a prompt and side (default: %(default)s)")
    p.add_argument("-m", "--tokens", type=positive_int, default=4,
                   help="leading tokens of each sample that are compared (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=1.0, help="of the sampled stage (default: %(default)s)")
    p.add_argument("--top-p", type=float, default=None, help="sent when given")
    p.add_argument("--top-k", type=int, default=None, help="sent when given (vLLM, llama.cpp, specdec honour it)")
    p.add_argument("--alpha", type=float, default=0.05, help="significance across all prompts (default: %(default)s)")
    p.add_argument("--correction", choices=("holm", "bh"), default="holm",
                   help="across prompts: holm (family-wise) or bh (Benjamini-Hochberg) (default: %(default)s)")
    p.add_argument("--test", choices=("chi2", "permutation"), default="chi2",
                   help="first-token test (the first m tokens always use the permutation test) (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="first seed; samples use seed+0, seed+1, ... (default: 0)")
    p.add_argument("--top-logprobs", type=int, default=5,
                   help="top logprobs asked of both servers, 0 for none (default: %(default)s)")
    p.add_argument("--logprob-tolerance", type=float, default=0.05,
                   help="TV between two sides' logprob distributions that counts as a difference (default: %(default)s)")
    p.add_argument("--concurrency", type=positive_int, default=4, help="requests in flight a side (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request (default: %(default)s)")
    p.add_argument("--json", default="audit/audit.json", metavar="PATH", help="report file (default: %(default)s)")
    p.add_argument("--plots", default=None, metavar="DIR", help="PNGs of failing prompts (default: beside the JSON)")
    p.set_defaults(func=run)


def options_from(args: argparse.Namespace):
    from specdec.audit.prompts import AuditInputError
    from specdec.audit.run import AuditOptions

    checks = [(0 < args.alpha < 1, "--alpha must be between 0 and 1"),
              (0 <= args.temperature <= 2, "--temperature must be in [0, 2]"),
              (args.mode == "greedy" or args.temperature > 0, "the sampled stage needs --temperature > 0"),
              (args.timeout > 0, "--timeout must be > 0"), (args.top_logprobs >= 0, "--top-logprobs must be >= 0")]
    for ok, message in checks:
        if not ok:
            raise AuditInputError(message)
    return AuditOptions(greedy=args.mode != "sampled", sampled=args.mode != "greedy", max_tokens=args.max_tokens,
                        samples=args.samples, tokens=args.tokens, temperature=args.temperature, top_p=args.top_p,
                        top_k=args.top_k, alpha=args.alpha, correction=args.correction, test=args.test,
                        seed=args.seed, logprob_tolerance=args.logprob_tolerance, concurrency=args.concurrency,
                        timeout=args.timeout, top_logprobs=args.top_logprobs)


def run(args: argparse.Namespace) -> int:
    import asyncio
    from pathlib import Path

    from rich.console import Console

    from specdec.audit.client import SideConfig
    from specdec.audit.prompts import load_prompts
    from specdec.audit.report import print_report, save_plots, write_json
    from specdec.audit.run import EXIT_STATUS, run_audit

    options = options_from(args)
    prompts = load_prompts(args.prompts, args.limit)
    configs = [SideConfig("reference", args.reference, args.reference_api_key or None, args.model, args.reference_body),
               SideConfig("candidate", args.candidate, args.candidate_api_key or None, args.model, args.candidate_body)]
    console = Console(highlight=False)
    with ProgressBars(console, options, len(prompts)) as progress:
        result = asyncio.run(run_audit(options, prompts, configs, progress))
    print_report(result, console)
    report = Path(args.json)
    plots = save_plots(result, Path(args.plots) if args.plots else report.parent)
    write_json(result, report, plots)
    console.print(f"report: {report}" + (f"; plots: {', '.join(plots.values())}" if plots else ""))
    return EXIT_STATUS[result.verdict]


class ProgressBars:
    """Two rich progress bars (greedy, sampled), advanced by run_audit's progress callback."""

    def __init__(self, console, options, n_prompts: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bars = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), console=console, transient=False)
        self.tasks = {}
        if options.greedy:
            self.tasks["greedy"] = self.bars.add_task("greedy ", total=4 * n_prompts)
        if options.sampled:
            self.tasks["sampled"] = self.bars.add_task("sampled", total=2 * options.samples * n_prompts)

    def __enter__(self):
        self.bars.start()
        return lambda stage, done: self.bars.update(self.tasks[stage], completed=done)

    def __exit__(self, *exc):
        self.bars.stop()
