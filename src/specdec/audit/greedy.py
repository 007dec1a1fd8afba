"""The greedy comparison: at temperature 0 the candidate must answer exactly as the reference does.

Each side answers each prompt twice, so that a reference which varies by itself (batching, numerics)
is told apart from a candidate that changed the answer. Answers are compared token by token where
both servers returned tokens (logprobs), else character by character; a miss reports its first
diverging position with the text around it. Where both returned top logprobs, the next-token
distributions along the common prefix are compared as well (their largest TV distance).
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.audit.client import Completion
from specdec.audit.prompts import Prompt
from specdec.audit.stats import logprob_tv

CONTEXT_CHARS = 30  # text shown on each side of a first difference

IDENTICAL, DIFFERENT, REFERENCE_VARIES, REFERENCE_ERROR = "identical", "different", "reference varies", "reference error"


@dataclass(frozen=True)
class GreedyResult:
    prompt_id: str
    category: str
    status: str  # one of IDENTICAL, DIFFERENT, REFERENCE_VARIES, REFERENCE_ERROR
    unit: str  # "token" or "char": what first_difference counts
    first_difference: int | None  # position of the first differing unit (None: identical)
    reference_around: str  # the reference's text around the first difference
    candidate_around: str
    reference_deterministic: bool
    candidate_deterministic: bool
    max_logprob_tv: float | None  # along the common prefix, where both sides returned top logprobs
    reference_text: str
    candidate_text: str
    error: str | None = None  # the side's error message, when one refused a request

    @property
    def counts_as_difference(self) -> bool:
        return self.status == DIFFERENT


def greedy_params(max_tokens: int, seed: int) -> dict:
    return {"temperature": 0.0, "max_tokens": max_tokens, "seed": seed}


def compare_greedy(prompt: Prompt, ref: list[Completion], cand: list[Completion],
                   logprob_tolerance: float) -> GreedyResult:
    """Compare two reference answers and two candidate answers to one prompt."""
    r1, c1 = ref[0], cand[0]
    ref_same = all(_same(r1, r) for r in ref[1:])
    cand_same = all(_same(c1, c) for c in cand[1:])
    unit, first = _first_difference(r1, next((c for c in cand if not _same(r1, c)), c1))
    tv = _max_logprob_tv(r1, c1, first if unit == "token" else None)
    if tv is not None and len(ref) > 1:  # drift counts beyond the reference's own, asked twice
        own = _max_logprob_tv(r1, ref[1], None)
        tv = max(0.0, tv - own) if own is not None else tv
    if any(r.error for r in ref):
        status, error = REFERENCE_ERROR, next(r.error for r in ref if r.error)
    elif not ref_same:
        status, error = REFERENCE_VARIES, None
    else:
        error = next((c.error for c in cand if c.error), None)
        drifted = tv is not None and tv > logprob_tolerance
        status = DIFFERENT if error or first is not None or drifted else IDENTICAL
    c_text = c1.error or c1.text
    around_r, around_c = _around(r1, r1.text, c_text, unit, first)
    return GreedyResult(prompt.id, prompt.category, status, unit, first, around_r, around_c, ref_same, cand_same,
                        tv, r1.text, c_text, error)


def _same(a: Completion, b: Completion) -> bool:
    return a.error is None and b.error is None and _units(a, b)[0] == _units(a, b)[1]


def _units(a: Completion, b: Completion) -> tuple:
    if a.tokens is not None and b.tokens is not None:
        return a.tokens, b.tokens
    return a.text, b.text


def _first_difference(a: Completion, b: Completion) -> tuple[str, int | None]:
    unit = "token" if a.tokens is not None and b.tokens is not None else "char"
    if a.error or b.error:
        return unit, 0
    x, y = _units(a, b)
    if x == y:
        return unit, None
    return unit, next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))


def _max_logprob_tv(a: Completion, b: Completion, first: int | None) -> float | None:
    """Largest TV between the two sides' next-token distributions on the positions both share."""
    if a.top_logprobs is None or b.top_logprobs is None:
        return None
    shared = min(len(a.top_logprobs), len(b.top_logprobs))
    if first is not None:
        shared = min(shared, first + 1)  # at the first difference the context is still the same
    tvs = [logprob_tv(x, y) for x, y in zip(a.top_logprobs[:shared], b.top_logprobs[:shared]) if x and y]
    return max(tvs) if tvs else None


def _around(r: Completion, r_text: str, c_text: str, unit: str, first: int | None) -> tuple[str, str]:
    """Both texts around the first difference (a token position is turned into a character one)."""
    if first is None:
        return "", ""
    at = len("".join(r.tokens[:first])) if unit == "token" and r.tokens else first
    lo = max(0, at - CONTEXT_CHARS)
    return r_text[lo:at + CONTEXT_CHARS], c_text[lo:at + CONTEXT_CHARS]
