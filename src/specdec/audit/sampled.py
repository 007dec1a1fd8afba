"""The sampled comparison: N completions a prompt from each side, distinct seeds, tested per prompt.

Each completion is cut to its first m tokens (max_tokens = m). Its outcome is the sequence of those
tokens as the server names them (logprobs) where every completion of the prompt has them, else the
pieces of its text (words and punctuation marks): any function of the first m tokens is a fair
outcome, since both distributions must agree on all of them. Two tests a prompt: the first token
(chi-square of homogeneity, or the permutation test) and the first m tokens (the permutation test).
Where both sides returned top logprobs, the first token's distributions are compared directly too:
both servers saw the same prompt, so the target's distribution there must be the same.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from specdec.audit.client import Completion
from specdec.audit.prompts import Prompt
from specdec.audit.stats import chi2_homogeneity, logprob_tv, permutation_test

END = "<end>"  # the completion stopped before m tokens
PIECES = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True)
class SampledResult:
    prompt_id: str
    category: str
    unit: str  # "token" (from logprobs) or "piece" (of text)
    n_reference: int
    n_candidate: int
    first_p: float  # first token, before the correction across prompts
    first_columns: int  # columns of the chi-square table after pooling (0 for the permutation test)
    prefix_p: float  # first m tokens, permutation test
    logprob_tv: float | None  # TV of the first token's distributions from logprobs (None: not returned)
    reference_first: dict[str, int]  # empirical counts of the first outcome
    candidate_first: dict[str, int]
    reference_prefix: dict[str, int]  # empirical counts of the m-token outcome
    candidate_prefix: dict[str, int]
    reference_errors: int  # requests that a side refused (not counted as outcomes)
    candidate_errors: int
    first_p_adjusted: float = 1.0
    prefix_p_adjusted: float = 1.0


def sample_params(temperature: float, top_p: float | None, top_k: int | None, m: int, seed: int) -> dict:
    params = {"temperature": temperature, "max_tokens": m, "seed": seed}
    if top_p is not None:
        params["top_p"] = top_p
    if top_k is not None:
        params["top_k"] = top_k
    return params


def outcomes(completions: list[Completion], m: int, use_tokens: bool) -> list[tuple[str, ...]]:
    """Each completion's first m units, END appended where it stopped before m."""
    out = []
    for c in completions:
        units = list(c.tokens) if use_tokens else PIECES.findall(c.text)
        seq = tuple(units[:m])
        out.append(seq if len(seq) == m else seq + (END,))
    return out


def compare_sampled(prompt: Prompt, ref: list[Completion], cand: list[Completion], m: int, test: str,
                    min_expected: float, permutations: int, seed: int) -> SampledResult:
    good_r, good_c = [c for c in ref if not c.error], [c for c in cand if not c.error]
    use_tokens = bool(good_r) and all(c.tokens is not None for c in good_r + good_c)
    a, b = outcomes(good_r, m, use_tokens), outcomes(good_c, m, use_tokens)
    first_a, first_b = [s[:1] for s in a], [s[:1] for s in b]
    if test == "chi2":
        first_p, columns = chi2_homogeneity(first_a, first_b, min_expected)
    else:
        first_p, columns = permutation_test(first_a, first_b, 1, permutations, seed), 0
    return SampledResult(prompt.id, prompt.category, "token" if use_tokens else "piece", len(a), len(b),
                         first_p, columns, permutation_test(a, b, m, permutations, seed),
                         _first_logprob_tv(good_r, good_c), _counts(first_a), _counts(first_b), _counts(a),
                         _counts(b), len(ref) - len(good_r), len(cand) - len(good_c))


def _counts(samples: list[tuple[str, ...]]) -> dict[str, int]:
    return dict(Counter(" ".join(s) for s in samples).most_common())


def _first_logprob_tv(ref: list[Completion], cand: list[Completion]) -> float | None:
    """How far the candidate's first-token distributions lie from the reference's, beyond the spread
    of the reference's own (every completion of a prompt has the same first context, so a
    deterministic server reports one distribution; a server whose own numerics vary from request to
    request must not make the other side look different)."""
    tops_r = [c.top_logprobs[0] for c in ref if c.top_logprobs]
    tops_c = [c.top_logprobs[0] for c in cand if c.top_logprobs]
    if not tops_r or not tops_c:
        return None
    own_spread = max(logprob_tv(tops_r[0], t) for t in tops_r)
    return max(0.0, max(logprob_tv(tops_r[0], t) for t in tops_c) - own_spread)
