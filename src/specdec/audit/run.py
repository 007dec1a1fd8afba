"""The whole audit: prepare both sides, run the greedy and the sampled comparisons, decide.

Requests of a stage run concurrently (each side bounds its own concurrency). When a side stops
answering, the requests still in flight are cancelled and the audit ends with what it has: the
prompts whose every answer arrived are compared, the others are listed as unfinished.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Awaitable, Callable

from specdec.audit.client import Completion, ServerStopped, Side, SideConfig
from specdec.audit.greedy import IDENTICAL, GreedyResult, compare_greedy, greedy_params
from specdec.audit.prompts import Prompt
from specdec.audit.sampled import SampledResult, compare_sampled, sample_params
from specdec.audit.stats import adjust, min_detectable_tv

CONSISTENT, DIFFERENT, INCOMPLETE = "consistent", "different", "incomplete"
EXIT_STATUS = {CONSISTENT: 0, DIFFERENT: 1, INCOMPLETE: 2}


@dataclass(frozen=True)
class AuditOptions:
    greedy: bool = True
    sampled: bool = True
    max_tokens: int = 48  # greedy answers' length
    samples: int = 100  # N, completions a prompt and side
    tokens: int = 4  # m, tokens of each sampled completion that are compared
    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    alpha: float = 0.05  # significance across all prompts (after the correction)
    correction: str = "holm"  # or "bh"
    test: str = "chi2"  # first-token test: "chi2" or "permutation"
    min_expected: float = 5.0
    permutations: int = 2000
    seed: int = 0
    logprob_tolerance: float = 0.05  # TV between logprob distributions above which they differ
    concurrency: int = 4
    timeout: float = 120.0
    top_logprobs: int = 5  # asked of both servers (0: do not ask)


@dataclass
class AuditResult:
    options: AuditOptions
    sides: dict[str, dict] = field(default_factory=dict)  # name -> {url, model, returned_logprobs}
    greedy: list[GreedyResult] = field(default_factory=list)
    sampled: list[SampledResult] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)  # prompt ids a stopped server left unanswered
    stopped: str | None = None  # why the audit ended early
    min_detectable_tv: float | None = None

    def sampled_fails(self, r: SampledResult) -> bool:
        o = self.options
        refused = r.candidate_errors > 0 and r.reference_errors == 0
        drift = r.logprob_tv is not None and r.logprob_tv > o.logprob_tolerance
        return refused or drift or min(r.first_p_adjusted, r.prefix_p_adjusted) < o.alpha

    @property
    def verdict(self) -> str:
        if any(g.counts_as_difference for g in self.greedy) or any(self.sampled_fails(s) for s in self.sampled):
            return DIFFERENT
        compared = [g for g in self.greedy if g.status == IDENTICAL] + [s for s in self.sampled if s.n_reference]
        if self.stopped or not compared:  # e.g. the reference refused every request
            return INCOMPLETE
        return CONSISTENT


Progress = Callable[[str, int], None]  # (stage, requests done) after each answer


async def run_audit(options: AuditOptions, prompts: list[Prompt], configs: list[SideConfig],
                    progress: Progress = lambda stage, n: None) -> AuditResult:
    """Audit `configs` = [reference, candidate] on `prompts`; bad URLs or keys raise AuditInputError."""
    sides = [Side(c, options.concurrency, options.timeout, options.top_logprobs) for c in configs]
    result = AuditResult(options)
    try:
        for side in sides:
            await side.prepare()
        if options.greedy:
            await _greedy_stage(options, prompts, sides, result, progress)
        if options.sampled and not result.stopped:
            await _sampled_stage(options, prompts, sides, result, progress)
    finally:
        for side in sides:
            result.sides[side.config.name] = {"url": side.root, "model": side.model,
                                              "returned_logprobs": side.returned_tokens}
            await side.close()
    return result


async def _greedy_stage(options: AuditOptions, prompts: list[Prompt], sides: list[Side], result: AuditResult,
                        progress: Progress) -> None:
    params = greedy_params(options.max_tokens, options.seed)
    jobs = [((p.id, s, rep), side.complete(p, params)) for p in prompts for rep in range(2)
            for s, side in enumerate(sides)]
    answers = await _gather(jobs, result, lambda n: progress("greedy", n))
    for p in prompts:
        got = [[answers.get((p.id, s, rep)) for rep in range(2)] for s in range(2)]
        if any(a is None for pair in got for a in pair):
            result.unfinished.append(p.id)
            continue
        result.greedy.append(compare_greedy(p, got[0], got[1], options.logprob_tolerance))


async def _sampled_stage(options: AuditOptions, prompts: list[Prompt], sides: list[Side], result: AuditResult,
                         progress: Progress) -> None:
    o, n = options, options.samples

    def params(s: int, i: int) -> dict:  # distinct seeds: the two sides' samples are independent
        return sample_params(o.temperature, o.top_p, o.top_k, o.tokens, o.seed + s * n + i)

    jobs = [((p.id, s, i), side.complete(p, params(s, i))) for p in prompts for i in range(n)
            for s, side in enumerate(sides)]
    answers = await _gather(jobs, result, lambda k: progress("sampled", k))
    done = []
    for p in prompts:
        got = [[answers.get((p.id, s, i)) for i in range(n)] for s in range(2)]
        if any(a is None for side in got for a in side):
            if p.id not in result.unfinished:
                result.unfinished.append(p.id)
            continue
        done.append(compare_sampled(p, got[0], got[1], o.tokens, o.test, o.min_expected, o.permutations, o.seed))
    raw = [r.first_p for r in done] + [r.prefix_p for r in done]
    adjusted = adjust(raw, o.correction) if raw else []
    result.sampled = [replace(r, first_p_adjusted=adjusted[i], prefix_p_adjusted=adjusted[len(done) + i])
                      for i, r in enumerate(done)]
    if done:  # the smallest level a single test must reach: alpha over every test (Holm's first step)
        per_side = min(min(r.n_reference, r.n_candidate) for r in done)
        result.min_detectable_tv = min_detectable_tv(per_side, per_side, o.alpha / len(raw))


async def _gather(jobs: list[tuple[tuple, Awaitable[Completion]]], result: AuditResult,
                  progress: Callable[[int], None]) -> dict[tuple, Completion]:
    """Run every job; on ServerStopped cancel the rest, note why, and return the answers that came."""
    async def keyed(key, job):
        return key, await job

    tasks = [asyncio.ensure_future(keyed(key, job)) for key, job in jobs]
    answers: dict[tuple, Completion] = {}
    try:
        for next_done in asyncio.as_completed(tasks):
            key, answer = await next_done
            answers[key] = answer
            progress(len(answers))
    except ServerStopped as exc:
        result.stopped = str(exc)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return answers
