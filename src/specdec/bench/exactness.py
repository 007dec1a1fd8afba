"""`specdec bench exactness`: is speculative sampling really sampling from the target? A test on real models.

Many completions are sampled from the same prompt with and without speculation (plain decoding is
drafter `none` through the same engine). At each of the first few positions the two samples of
tokens are compared with a chi-square test of homogeneity, rare tokens pooled into one column; this
is done at temperature 1 and with top-k/top-p. Two deterministic checks join them: greedy output
must equal plain greedy output token for token, and a draft with a different vocabulary must be
told apart (so that its ids are mapped, never fed to the target as they are). The verdict fails when any check does (p-values against a Bonferroni-corrected level).

`--inject-fault NAME` (a developer option) runs everything with one of specdec.faults' classic bugs
in place, to show that the verdict catches it.
"""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import dataclass

from specdec.commands import add_k_flag, positive_int
from specdec.errors import InvalidRequestError

DEFAULT_PROMPT = "Tell me a short story about a dragon and a knight."


@dataclass(frozen=True)
class PositionTest:
    position: int
    p_value: float
    columns: int  # token columns after pooling
    distinct_plain: int
    distinct_spec: int


def register(sub) -> None:
    from specdec.bench.common import add_bench_flags

    p = sub.add_parser("exactness", help="chi-square test: speculative sampling vs plain sampling",
                       description="Sample with and without speculation; compare position by position.")
    # The default draft is cheap on a CPU and often rejected: rejections are where the rule can go wrong.
    # (On a GPU, where the dynamic int8 kernel does not exist, pass --draft self-int4.)
    add_bench_flags(p, draft_default="self-int8-dynamic")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="prompt (chat template applied)")
    p.add_argument("--samples", type=positive_int, default=100, help="completions per method and setting")
    p.add_argument("--positions", type=positive_int, default=4, help="positions compared (default: %(default)s)")
    add_k_flag(p)
    p.add_argument("--top-k", type=int, default=20, help="top-k of the second setting (default: %(default)s)")
    p.add_argument("--top-p", type=float, default=0.9, help="top-p of the second setting (default: %(default)s)")
    p.add_argument("--significance", type=float, default=0.01, help="family-wise level (default: %(default)s)")
    p.add_argument("--min-expected", type=float, default=5.0, help="pool tokens expected fewer times than this")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--inject-fault", default=None, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def homogeneity_test(a: list[int], b: list[int], min_expected: float) -> tuple[float, int]:
    """Chi-square test that samples a and b of tokens come from one distribution: (p-value, columns).

    Tokens whose expected count in a cell is below min_expected are pooled into one column; a pool
    still too small joins the smallest remaining column.
    """
    from scipy.stats import chi2_contingency

    ca, cb = Counter(a), Counter(b)
    share_a = len(a) / (len(a) + len(b))
    columns, pool = [], [0, 0]
    for token in set(ca) | set(cb):
        total = ca[token] + cb[token]
        if min(share_a, 1 - share_a) * total < min_expected:
            pool[0] += ca[token]
            pool[1] += cb[token]
        else:
            columns.append([ca[token], cb[token]])
    if sum(pool):
        if columns and min(share_a, 1 - share_a) * sum(pool) < min_expected:
            smallest = min(columns, key=sum)
            smallest[0] += pool[0]
            smallest[1] += pool[1]
        else:
            columns.append(pool)
    if len(columns) < 2:
        return 1.0, len(columns)  # one column: both samples put all their mass on it
    table = [[c[0] for c in columns], [c[1] for c in columns]]  # [2, columns]
    return float(chi2_contingency(table).pvalue), len(columns)


def sample_positions(runtime, ids: list[int], sampling, args, seeds: range, bar) -> list[list[int]]:
    """Token ids at each of the first `positions` places, one list per position, over the seeds."""
    from dataclasses import replace

    from specdec.generation import GenerationConfig

    per_position: list[list[int]] = [[] for _ in range(args.positions)]
    for seed in seeds:
        # One token more than compared, so that the first round drafts every compared position.
        config = GenerationConfig(max_new_tokens=args.positions + 1, k=args.k, ignore_eos=True,
                                  sampling=replace(sampling, seed=seed))
        tokens = runtime.engine.generate(ids, config).token_ids
        for j, token in enumerate(tokens[: args.positions]):
            per_position[j].append(token)
        bar.update(1)
    return per_position


def sampled_checks(plain, spec, ids: list[int], args) -> dict[str, list[PositionTest]]:
    from specdec.bench.common import progress
    from specdec.sampling import SamplingParams

    settings = {"temperature 1": SamplingParams(temperature=1.0),
                f"T=1, top-k {args.top_k}, top-p {args.top_p:g}":
                    SamplingParams(temperature=1.0, top_k=args.top_k, top_p=args.top_p)}
    n = args.samples
    results = {}
    with progress(range(2 * n * len(settings)), total=2 * n * len(settings), desc="exactness") as bar:
        for s, (name, sampling) in enumerate(settings.items()):
            base = args.seed + 4 * s * n  # disjoint seeds: plain and speculative samples are independent
            plain_tokens = sample_positions(plain, ids, sampling, args, range(base, base + n), bar)
            spec_tokens = sample_positions(spec, ids, sampling, args, range(base + n, base + 2 * n), bar)
            results[name] = [
                PositionTest(j, *homogeneity_test(pa, sa, args.min_expected), len(set(pa)), len(set(sa)))
                for j, (pa, sa) in enumerate(zip(plain_tokens, spec_tokens))
            ]
    return results


def greedy_identity(plain, spec, ids: list[int], args) -> dict:
    """Greedy speculation must reproduce plain greedy decoding token for token."""
    from specdec.generation import GenerationConfig

    config = GenerationConfig(max_new_tokens=max(24, args.positions), k=args.k, ignore_eos=True)
    a = plain.engine.generate(ids, config).token_ids
    b = spec.engine.generate(ids, config).token_ids
    same = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return {"tokens": len(a), "identical": a == b, "first_difference": None if a == b else same}


class _ShuffledVocabulary:
    """A tokenizer stand-in whose vocabulary swaps two ids of the target's: a draft whose ids must be mapped."""

    def __init__(self, tokenizer):
        vocab = dict(tokenizer.get_vocab())
        (t1, i1), (t2, i2) = list(vocab.items())[:2]
        vocab[t1], vocab[t2] = i2, i1
        self._vocab = vocab

    def get_vocab(self) -> dict:
        return self._vocab

    def __len__(self) -> int:
        return len(self._vocab)


def vocabulary_guard(target) -> bool:
    """True when a draft with a different vocabulary is told apart from one of the target's, so that
    its ids are mapped (drafters.cross_tokenizer), never fed to the target as they are."""
    from specdec.models import loader

    impostor = loader.LoadedModel(target.model, _ShuffledVocabulary(target.tokenizer), "shuffled-vocabulary")
    return not loader.same_vocabulary(target, impostor)  # through the module, as the drafters call it


def run(args: argparse.Namespace) -> int:
    from specdec import faults
    from specdec.bench.common import load_target, runtime_pair

    if args.inject_fault is not None and args.inject_fault not in faults.FAULTS:
        raise InvalidRequestError(f"unknown fault {args.inject_fault!r}; known: {', '.join(faults.FAULTS)}")
    with faults.inject(args.inject_fault):
        target = load_target(args)
        plain, spec = runtime_pair(target, args.draft)
        ids = plain.encode(args.prompt)
        try:
            greedy = greedy_identity(plain, spec, ids, args)
            sampled = sampled_checks(plain, spec, ids, args)
        except (RuntimeError, IndexError, ValueError) as exc:  # e.g. caches out of step: a broken engine fails loudly
            greedy = {"tokens": 0, "identical": False, "first_difference": None, "error": str(exc)}
            sampled = {}
        guard = vocabulary_guard(target)
    return report(args, target, spec, greedy, sampled, guard)


def report(args, target, spec, greedy: dict, sampled: dict, guard: bool) -> int:
    from rich.console import Console

    from specdec.bench.common import finish, precision_of, print_table
    from specdec.bench.scoreboard import ScoreRow

    tests = [t for ts in sampled.values() for t in ts]
    level = args.significance / max(1, len(tests))  # Bonferroni: every position of every setting is a test
    min_p = min((t.p_value for t in tests), default=1.0)
    passed = greedy["identical"] and guard and bool(tests) and min_p >= level
    print_table(f"exactness: {target.name} + {spec.drafter.name}, K={args.k}, {args.samples} samples a method",
                ["setting", "position", "p-value", "columns", "distinct plain", "distinct spec"],
                [[name, t.position, t.p_value, t.columns, t.distinct_plain, t.distinct_spec]
                 for name, ts in sampled.items() for t in ts])
    console = Console(highlight=False)
    if greedy.get("error"):
        console.print(f"[bold red]the engine failed while decoding:[/] {greedy['error']}")
    console.print(f"greedy identity over {greedy['tokens']} tokens: {'yes' if greedy['identical'] else 'NO'}; "
                  f"different-vocabulary draft mapped: {'yes' if guard else 'NO'}; "
                  f"smallest p-value {min_p:.3g} (level {level:.2g} after Bonferroni)")
    fault = f" with fault {args.inject_fault!r} injected" if args.inject_fault else ""
    if passed:
        console.print(f"[bold green]PASS[/]: speculative output follows the target's distribution{fault}")
    else:
        console.print(f"[bold red]FAIL: speculative output does NOT follow the target's distribution{fault}[/]")
    data = {"command": "exactness", "target": target.name, "draft": spec.drafter.name, "k": args.k,
            "precision": precision_of(target), "samples": args.samples, "positions": args.positions,
            "fault": args.inject_fault, "verdict": "PASS" if passed else "FAIL", "level": level,
            "min_p_value": min_p, "greedy": greedy, "vocabulary_guard": guard,
            "settings": {name: [vars(t) for t in ts] for name, ts in sampled.items()}}
    finish(args, "exactness", data, ScoreRow(target=target.name, draft=spec.drafter.name, k=str(args.k),
                                             precision=data["precision"] + f" exactness {data['verdict']}"))
    return 0 if passed else 1
