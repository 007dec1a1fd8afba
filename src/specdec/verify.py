"""The rejection rule of speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

Notation, stated once: p is the target's probability vector at a position, q the draft's, d the
drafted token. The draft token is kept with probability min(1, p[d] / q[d]); at the first
rejection a replacement is drawn from the residual max(0, p - q) / sum(max(0, p - q)). If all K
drafts are kept, a bonus token is drawn from the target's p at the position after them. Each
emitted token is then distributed exactly as if it had been sampled from p.

Three variants, one per kind of draft:
- q given (a sampled draft): the rule above.
- q one-hot (a draft that chose d deterministically: argmax, lookup): keep with probability p[d],
  residual is p with d removed. Pass q=None.
- greedy (temperature 0, p one-hot too): keep while the target's argmax equals the draft.

All functions are pure tensor code; randomness comes only from the explicit generator.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.transfers import pick
from specdec.sampling import sample


@dataclass(frozen=True)
class Verdict:
    """How one round ended: the first `num_accepted` drafts are kept, then `next_token` follows.

    next_token is the recovered token (drawn from the residual, or the target's argmax when
    greedy) if num_accepted < K, else the bonus token drawn from p after the last draft.
    """

    num_accepted: int
    next_token: int
    num_drafted: int

    @property
    def all_accepted(self) -> bool:
        return self.num_accepted == self.num_drafted


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """max(0, p - q), normalised. p, q: [..., V].

    A row whose residual is all zero (only when p == q, where rejection has probability 0 and
    float rounding is the only way here) falls back to p so that sampling stays defined.
    """
    r = torch.clamp(p - q, min=0.0)
    mass = r.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, r / mass.clamp_min(1e-30), p)


def accept_or_fix(
    p: torch.Tensor, q: torch.Tensor, d: int, generator: torch.Generator | None = None
) -> tuple[int, bool]:
    """Settle one drafted token d. p, q: [V] fp32 probability vectors. Returns (token, kept)."""
    u = torch.rand((), generator=generator, device=p.device)
    if u * q[d] < p[d]:  # u < p[d] / q[d], without dividing by a zero q[d]
        return int(d), True
    return int(sample(residual(p, q), generator)), False


def verify_sampled(
    p: torch.Tensor,
    draft_tokens: torch.Tensor,
    q: torch.Tensor | None,
    generator: torch.Generator | None = None,
) -> Verdict:
    """Settle all K positions of a round at once (see sampled_outcome); one read of the result."""
    return read_round(*sampled_outcome(p, draft_tokens, q, generator), draft_tokens)[0]


def sampled_outcome(
    p: torch.Tensor,
    draft_tokens: torch.Tensor,
    q: torch.Tensor | None,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rejection rule over a round, left on the device: (num_accepted, next_token), 0-d long.

    p: [K+1, V] target probabilities (row i predicts the token after draft i-1; row K is for the bonus).
    draft_tokens: [K] long. q: [K, V] draft probabilities, or None for a one-hot (deterministic) draft.
    Nothing is read back, so the caller decides when (or whether) to wait for it.
    """
    k = draft_tokens.shape[0]
    rows = torch.arange(k, device=p.device)
    p_d = p[rows, draft_tokens]  # [K]
    if q is None:
        q = torch.zeros_like(p[:k]).scatter_(1, draft_tokens[:, None], 1.0)
    q_d = q[rows, draft_tokens]  # [K]
    u = torch.rand(k, generator=generator, device=p.device)
    kept = u * q_d < p_d  # [K]
    num_accepted = kept.long().cumprod(0).sum()
    # Row n of the fix-up table: the residual at a rejection, or p itself for the bonus (q = 0 there).
    q_padded = torch.cat([q, torch.zeros_like(p[:1])])  # [K+1, V]
    fixup = residual(p, q_padded)
    return num_accepted, sample(pick(fixup, num_accepted), generator)


def verify_greedy(target_tokens: torch.Tensor, draft_tokens: torch.Tensor) -> Verdict:
    """Greedy rule: keep drafts while they equal the target's argmax (see greedy_outcome)."""
    return read_round(*greedy_outcome(target_tokens, draft_tokens), draft_tokens)[0]


def greedy_outcome(target_tokens: torch.Tensor, draft_tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy rule left on the device: (num_accepted, next_token), 0-d long.

    target_tokens: [K+1] the target's argmax at each position. draft_tokens: [K].
    """
    k = draft_tokens.shape[0]
    agree = (target_tokens[:k] == draft_tokens).long()
    num_accepted = agree.cumprod(0).sum()
    return num_accepted, pick(target_tokens, num_accepted)


def read_round(num_accepted: torch.Tensor, next_token: torch.Tensor,
               draft_tokens: torch.Tensor) -> tuple[Verdict, list[int]]:
    """The host's one read of a round: the verdict and the kept drafts [n] (on a GPU, each read waits
    for the queue)."""
    n, tok, *drafts = torch.cat([torch.stack([num_accepted, next_token]), draft_tokens]).tolist()
    return Verdict(num_accepted=n, next_token=tok, num_drafted=len(drafts)), drafts[:n]
