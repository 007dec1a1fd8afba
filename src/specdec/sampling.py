"""Turn logits into the probability vectors that the rejection rule compares.

The same warping (temperature, then top-k, top-p and min-p) is applied to the target's logits to
get p and to the draft's logits to get q (rule 3 of the design). Temperature 0 means greedy: the
distribution is one-hot on the argmax, so the general rule reduces to "keep while they agree".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.errors import InvalidRequestError


GREEDY_BELOW = 1e-5  # temperatures under this mean greedy (as vLLM does)


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are chosen. temperature 0 is greedy; top_k 0 and top_p 1 and min_p 0 are off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not (self.temperature >= 0.0):
            raise InvalidRequestError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise InvalidRequestError(f"top_k must be >= 0 (0 turns it off), got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidRequestError(f"top_p must be in (0, 1], got {self.top_p}")
        if not (0.0 <= self.min_p < 1.0):
            raise InvalidRequestError(f"min_p must be in [0, 1), got {self.min_p}")

    @property
    def greedy(self) -> bool:
        # Below this, logits / temperature overflows to inf and softmax to NaN; the limit is argmax anyway.
        return self.temperature < GREEDY_BELOW

    def make_generator(self, device: torch.device | str = "cpu") -> torch.Generator:
        """A generator seeded from `seed` (or from fresh entropy when seed is None). Every one of the
        seed's 64 bits counts (a negative seed s is 2**64 + s): two seeds give two different streams."""
        gen = torch.Generator(device=device)
        if self.seed is None:
            gen.seed()
        elif gen.device.type == "cpu":
            seed_all_bits(gen, self.seed % 2**64)
        else:
            gen.manual_seed(self.seed % 2**64)  # CUDA's Philox generator takes the 64-bit seed whole
        return gen


# torch's CPU generator state: uint64 seed, int32 left, int32 seeded, uint64 next, then the
# Mersenne Twister's 624 32-bit words, each in a uint64 (int64s 3 to 626 of the state).
_MT_WORD0, _MT_WORDS = 3, 624


def seed_all_bits(gen: torch.Generator, seed: int) -> None:
    """Seed a CPU generator from all 64 bits of `seed` (0 <= seed < 2**64), collision free.

    torch's manual_seed keeps the low 32 bits (s and s + 2**32 draw alike): it fills the Mersenne
    Twister's words with Matsumoto and Nishimura's recurrence w[0] = low, w[i] = g(w[i-1]) + i,
    g(x) = 1812433253 * (x ^ (x >> 30)) mod 2**32 (a bijection). Here the high 32 bits are added
    into w[1] too, so they reach every later word. Two seeds with the same state have the same
    w[0] (low half), so the same g(w[0]), so the same high half: no collisions. A seed below 2**32
    draws exactly as torch.manual_seed(seed) draws."""
    low, high = seed & 0xFFFFFFFF, seed >> 32
    gen.manual_seed(low)
    state = gen.get_state()
    words = state.numpy().view("<i8")  # the CPU state's bytes as int64s, a view: writes go to `state`
    if int(words[_MT_WORD0]) != low:
        raise RuntimeError("torch's CPU generator state has a layout this code does not know; "
                           "see specdec.sampling.seed_all_bits")
    mt = [low]
    for i in range(1, _MT_WORDS):
        prev = mt[-1]
        mt.append((1812433253 * (prev ^ (prev >> 30)) + i + (high if i == 1 else 0)) & 0xFFFFFFFF)
    words[_MT_WORD0:_MT_WORD0 + _MT_WORDS] = mt
    words[0] = seed - 2**64 if seed >= 2**63 else seed  # initial_seed() reports the whole seed
    gen.set_state(state)


def warp_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities after temperature, top-k, top-p and min-p, in fp32.

    logits: [..., V]. Returns [..., V] rows that sum to 1. Greedy gives one-hot rows on the argmax.
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        probs = _top_p_filter(probs, params.top_p)
    if params.min_p > 0.0:
        floor = params.min_p * probs.max(dim=-1, keepdim=True).values
        probs = probs.masked_fill(probs < floor, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def warp_ragged(logits: torch.Tensor, offsets: Sequence[int], params: Sequence[SamplingParams]) -> torch.Tensor:
    """warp_logits over a ragged batch, each sequence under its own params (rule 3).

    logits: [T, V]; sequence i owns rows offsets[i]:offsets[i + 1] (offsets: [B + 1] host ints,
    cumulative, offsets[0] = 0, offsets[B] = T). Returns [T, V] fp32 probabilities.
    Each sequence is warped on its own rows alone, never grouped with others sharing its params:
    a group's row count would then choose the kernels, and its probabilities would depend on B (rule 6).
    """
    if len(params) != len(offsets) - 1:
        raise ValueError(f"offsets describe {len(offsets) - 1} sequences but {len(params)} SamplingParams came")
    return torch.cat([warp_logits(logits[lo:hi], sp) for lo, hi, sp in zip(offsets[:-1], offsets[1:], params)])


def token_logprobs(logits: torch.Tensor, params: SamplingParams, tokens: Sequence[int],
                   top: int) -> list[tuple[float, tuple[tuple[int, float], ...]]]:
    """Log-probabilities of emitted tokens under the target's processed distribution p, and the
    `top` most likely tokens at each position (those p gives no mass are left out).

    logits: [n, V] the target's raw logits at n positions (all of a verify's rows, warped together as
    the rule warped them); tokens: [m <= n] the tokens emitted at the first m positions.
    p is warp_logits' (temperature, top-k, top-p, min-p), the distribution the rejection rule used,
    except when greedy: there p is one-hot (log 0 for the argmax, -inf for every other token), so the
    untruncated softmax of the raw logits (temperature 1) is reported instead. One read to the host.
    """
    if params.greedy:
        logp = torch.log_softmax(logits.float(), dim=-1)
    else:
        logp = warp_logits(logits, params).log()  # the same rows, the same call: the rule's p bit for bit
    index = torch.tensor(list(tokens), dtype=torch.long, device=logits.device)
    logp = logp[: index.shape[0]]  # [m, V]
    chosen = logp.gather(1, index[:, None])[:, 0]  # [m]
    best = torch.topk(logp, min(top, logp.shape[-1]), dim=-1) if top > 0 else None
    values = chosen.tolist()
    alternatives = [()] * len(values) if best is None else [
        tuple((i, v) for i, v in zip(ids, vals) if v != float("-inf"))
        for ids, vals in zip(best.indices.tolist(), best.values.tolist())]
    return list(zip(values, alternatives))


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p. probs: [..., V]."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop = mass_before >= top_p
    drop[..., 0] = False  # the most likely token always stays (a top_p below fp32's range rounds to 0)
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs)


def _inverse_cdf(flat: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of flat [B, V] (weights, not necessarily summing to 1): the first index whose
    cumulative weight, summed in double, exceeds a uniform draw below the row's total, so a token of zero
    weight is never drawn. Why: on a CPU torch.multinomial draws one sample by exponential races over the
    whole row, several times the cost of a cumulative sum and a binary search at a 49K vocabulary."""
    cdf = flat.double().cumsum(-1)
    total = cdf[:, -1:]
    u = torch.rand(flat.shape[0], 1, dtype=torch.float64, generator=generator) * total
    u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))  # u * total may round up to total
    return torch.searchsorted(cdf, u, right=True).squeeze(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token id per row. probs: [..., V] -> [...] (long)."""
    flat = probs.reshape(-1, probs.shape[-1])
    if flat.device.type == "cpu":
        drawn = _inverse_cdf(flat, generator)
    else:
        drawn = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return drawn.reshape(probs.shape[:-1])


def sample_distinct(probs: torch.Tensor, n: int, generator: torch.Generator | None = None):
    """Up to n distinct tokens from each row of probs [F, N] without replacement, by successive sampling
    (Gumbel keys, the largest first: the i-th token is a draw from the row with the earlier ones
    removed). Returns (tokens [F, n], live [F, n] bool: False past a row's nonzero tokens,
    conditionals [F, n, N]: the distribution token i was drawn from)."""
    n = min(n, probs.shape[-1])
    noise = torch.rand(probs.shape, generator=generator, device=probs.device).clamp_(min=1e-20)
    keys = probs.log() - (-noise.log()).log()  # log p + Gumbel; a zero p is -inf, never live
    top = torch.topk(keys, n, dim=-1)
    return top.indices, top.values.isfinite(), sibling_conditionals(probs, top.indices)


def sibling_conditionals(probs: torch.Tensor, picks: torch.Tensor) -> torch.Tensor:
    """probs [F, N], picks [F, n] drawn in order without replacement -> [F, n, N]: row f with
    picks[f, :i] removed and renormalised, the distribution pick i was drawn from (the q that the
    multi-step rule must read for it)."""
    rows = probs.unsqueeze(1).repeat(1, picks.shape[1], 1)  # [F, n, N]
    for i in range(1, picks.shape[1]):
        rows[:, i:].scatter_(2, picks[:, i - 1].view(-1, 1, 1).expand(-1, picks.shape[1] - i, 1), 0.0)
    return rows / rows.sum(-1, keepdim=True).clamp_(min=torch.finfo(rows.dtype).tiny)

