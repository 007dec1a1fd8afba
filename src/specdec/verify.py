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

ragged_outcome settles a batch of rounds at once (sequence i with its own K_i, sampling and
generator), each exactly as the one-sequence rule would.

All functions are pure tensor code; randomness comes only from the explicit generator.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.sampling import SamplingParams, sample
from specdec.transfers import pick


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

    @property
    def positions(self) -> int:
        """The draft positions (depths) the round offered: K for a chain."""
        return self.num_drafted

    @property
    def num_judged(self) -> int:
        """Drafts the rule decided on: the accepted ones and the first rejected one (those after it
        never were)."""
        return self.num_accepted + (0 if self.all_accepted else 1)


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
    # The fix-up row: the residual at the first rejection, or p itself for the bonus (q = 0 there).
    # Only that row is reduced, one [V] row whatever K, as ragged_outcome does for each sequence.
    q_padded = torch.cat([q, torch.zeros_like(p[:1])])  # [K+1, V]
    fixup = residual(pick(p, num_accepted), pick(q_padded, num_accepted))  # [V]
    return num_accepted, sample(fixup, generator)


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


def ragged_outcome(
    p: torch.Tensor,
    offsets: Sequence[int],
    draft_tokens: torch.Tensor,
    q: torch.Tensor | None,
    q_offsets: Sequence[int] | None,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rule over a ragged batch of B rounds in one call, left on the device: (num_accepted [B],
    next_token [B]), long; next_token is sequence i's recovered or bonus token.

    The flattened layout. Sequence i drafted K_i >= 0 tokens; T = sum(K_i + 1), D = sum(K_i).
      p: [T, V] the target's warped probabilities (sampling.warp_ragged); rows offsets[i]:offsets[i+1]
         are sequence i's K_i + 1 rows, its p of sampled_outcome (a greedy sequence's are one-hot on
         the target's argmax, which is what the rule reads of them).
      offsets: [B + 1] host ints, cumulative like cu_seqlens: offsets[0] = 0, offsets[B] = T.
      draft_tokens: [D] long; sequence i's K_i drafts start at offsets[i] - i.
      q: [D_q, V] draft probabilities; rows q_offsets[i]:q_offsets[i+1] are sequence i's q: K_i rows
         for a sampled draft, none for a one-hot draft (q=None in sampled_outcome). None if no
         sequence brings q; q_offsets: [B + 1] host ints, cumulative, None with it.
      params, generators: [B]; a greedy params[i] takes greedy_outcome, which draws nothing.
    Batch invariance (rule 6): sequence i's outcome is exactly what greedy_outcome(p_i.argmax(-1), d_i)
    or sampled_outcome(p_i, d_i, q_i, generators[i]) gives on its own rows, with the same draws from
    generators[i] in the same order, whatever shares the batch. So each sampled sequence needs a
    generator of its own. A batch of one goes through that rule itself. No host reads: the caller
    reads ragged_round_values once.
    """
    if _one_sequence(p, offsets, draft_tokens, q, q_offsets):
        return _one_outcome(p, draft_tokens, q, params[0], generators[0])
    index = _ragged_index(p, offsets, draft_tokens, q, q_offsets, params, generators)
    target_tokens = p.argmax(-1)  # [T]
    kept = _ragged_kept(p, target_tokens, draft_tokens, q, index, generators)  # [D]
    # The first rejection of each sequence: the smallest position not kept, or K_i if all were.
    first_rejection = torch.where(kept, index.draft_k, index.draft_pos)  # [D]
    num_accepted = index.seq_k.scatter_reduce(0, index.draft_seq, first_rejection, reduce="amin")  # [B]
    next_token = target_tokens.index_select(0, index.seq_start + num_accepted)  # [B], right for greedy
    if index.sampled_list:
        drawn = _ragged_fixups(p, draft_tokens, q, num_accepted, index, generators)
        next_token = next_token.index_copy(0, index.sampled, drawn)
    return num_accepted, next_token


def _one_sequence(p, offsets, draft_tokens, q, q_offsets) -> bool:
    """Whether the call is one sequence's round in a valid layout (else the general path checks it)."""
    if isinstance(offsets, torch.Tensor) or len(offsets) != 2 or int(offsets[1]) != p.shape[0]:
        return False
    k = p.shape[0] - 1
    return draft_tokens.shape == (k,) and (q is None or (q.shape[0] == k and [int(x) for x in q_offsets] == [0, k]))


def _one_outcome(p: torch.Tensor, draft_tokens: torch.Tensor, q: torch.Tensor | None, params: SamplingParams,
                 generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of one through the single-sequence rule, which is what ragged_outcome must equal
    (same draws, same generator state), without building the ragged index: at batch 1 that index
    was most of a plain step's host time. p [K+1, V]; returns (num_accepted [1], next_token [1])."""
    if params.greedy:
        outcome = greedy_outcome(p.argmax(-1), draft_tokens)
    else:
        outcome = sampled_outcome(p, draft_tokens, q, generator)
    return outcome[0].reshape(1), outcome[1].reshape(1)


def ragged_round_values(num_accepted: torch.Tensor, next_token: torch.Tensor,
                        draft_tokens: torch.Tensor) -> torch.Tensor:
    """What the host reads of a ragged round (ragged_outcome's layout), as one tensor [2B + D] for
    one copy: num_accepted [B], next_token [B], draft_tokens [D]."""
    return torch.cat([num_accepted, next_token, draft_tokens])


def parse_ragged_round(values: list[int], offsets: Sequence[int]) -> list[tuple[Verdict, list[int]]]:
    """ragged_round_values read on the host: per sequence, its verdict and its kept drafts.
    offsets: [B + 1] host ints, ragged_outcome's."""
    b = len(offsets) - 1
    drafts = values[2 * b:]
    rounds = []
    for i, (n, token) in enumerate(zip(values[:b], values[b:2 * b])):
        start, k = offsets[i] - i, offsets[i + 1] - offsets[i] - 1
        rounds.append((Verdict(num_accepted=n, next_token=token, num_drafted=k), drafts[start:start + n]))
    return rounds


@dataclass(frozen=True)
class _RaggedIndex:
    """Where each draft and each sequence sits in ragged_outcome's layout, as device tensors built
    on the host from the offsets (the caller chose each K_i, so nothing is read back for them)."""

    draft_row: torch.Tensor  # [D] the row of p that judges draft j
    draft_seq: torch.Tensor  # [D] the sequence of draft j
    draft_pos: torch.Tensor  # [D] draft j's position among its sequence's drafts
    draft_k: torch.Tensor  # [D] K of draft j's sequence
    draft_q_row: torch.Tensor  # [D] draft j's row of q, -1 for a one-hot draft
    draft_greedy: torch.Tensor  # [D] bool: draft j's sequence is greedy
    seq_start: torch.Tensor  # [B] offsets[i], sequence i's first row of p
    seq_k: torch.Tensor  # [B] K_i
    seq_draft_start: torch.Tensor  # [B] sequence i's first draft, offsets[i] - i
    seq_q_start: torch.Tensor  # [B] q_offsets[i]
    seq_q_given: torch.Tensor  # [B] bool: sequence i brought rows of q
    sampled: torch.Tensor  # [B_s] the sampled sequences, in batch order
    sampled_list: list[int]  # the same, on the host
    k_list: list[int]  # K_i, on the host


def _ragged_index(p, offsets, draft_tokens, q, q_offsets, params, generators) -> _RaggedIndex:
    """Checks ragged_outcome's layout (shapes there) and builds its index."""
    if isinstance(offsets, torch.Tensor) and offsets.device.type != "cpu":
        raise ValueError("offsets must be host ints (the engine chose each K_i); got a tensor on the device")
    offsets = [int(x) for x in offsets]
    b = len(offsets) - 1
    k = [hi - lo - 1 for lo, hi in zip(offsets, offsets[1:])]
    if b < 1 or offsets[0] != 0 or min(k) < 0 or offsets[-1] != p.shape[0]:
        raise ValueError(f"offsets must run from 0 to p's {p.shape[0]} rows, K_i + 1 >= 1 per sequence; got {offsets}")
    if draft_tokens.shape != (p.shape[0] - b,):
        raise ValueError(f"draft_tokens must be [sum(K_i)] = [{p.shape[0] - b}], got {list(draft_tokens.shape)}")
    if len(params) != b or len(generators) != b:
        raise ValueError(f"{b} sequences in offsets but {len(params)} params and {len(generators)} generators")
    q_offsets = [0] * (b + 1) if q is None else [int(x) for x in q_offsets]
    q_counts = [hi - lo for lo, hi in zip(q_offsets, q_offsets[1:])]
    if len(q_offsets) != b + 1 or q_offsets[-1] != (0 if q is None else q.shape[0]) or \
            any(n not in (0, ki) for n, ki in zip(q_counts, k)):
        raise ValueError(f"q_offsets must give each sequence K_i rows of q, or none (one-hot); got {q_offsets}")
    greedy = [int(sp.greedy) for sp in params]
    sampled = [i for i in range(b) if not greedy[i]]
    if len({id(generators[i]) for i in sampled}) < len(sampled):
        raise ValueError("each sampled sequence needs a torch.Generator of its own (a seed belongs to a sequence)")
    drafts = [(offsets[i] + j, i, j, k[i], q_offsets[i] + j if q_counts[i] else -1, greedy[i])
              for i in range(b) for j in range(k[i])]
    draft_cols = _on_device([list(col) for col in zip(*drafts)] or [[]] * 6, p.device)
    seq_cols = _on_device([offsets[:-1], k, [offsets[i] - i for i in range(b)], q_offsets[:-1],
                           [int(n > 0) for n in q_counts]], p.device)
    return _RaggedIndex(*draft_cols[:5], draft_cols[5].bool(), *seq_cols[:4], seq_cols[4].bool(),
                        _on_device([sampled], p.device)[0], sampled, k)


def _on_device(columns: list[list[int]], device: torch.device) -> list[torch.Tensor]:
    """Equal-length int columns as long tensors on device, in one copy that does not wait for the
    stream (from pageable memory, CUDA stages it before returning; a blocking copy would wait)."""
    host = torch.tensor(columns, dtype=torch.long)  # [len(columns), n]
    return list(host.to(device, non_blocking=device.type == "cuda"))


def _ragged_kept(p, target_tokens, draft_tokens, q, index: _RaggedIndex, generators) -> torch.Tensor:
    """Which drafts the rule keeps, all D positions at once: [D] bool (layout in ragged_outcome)."""
    p_d = p[index.draft_row, draft_tokens]  # [D]
    q_d = torch.ones_like(p_d)  # a one-hot q is 1 at its draft
    if q is not None and q.shape[0] > 0:
        q_d = torch.where(index.draft_q_row >= 0, q[index.draft_q_row.clamp(min=0), draft_tokens], q_d)
    # Each sampled sequence draws its K_i uniforms from its own generator, as sampled_outcome does
    # (K_i = 0 included); greedy ones draw nothing.
    sampled = set(index.sampled_list)
    u = torch.cat([torch.rand(k, generator=generators[i], device=p.device) if i in sampled
                   else torch.zeros(k, device=p.device) for i, k in enumerate(index.k_list)])  # [D]
    greedy_kept = target_tokens.index_select(0, index.draft_row) == draft_tokens
    return torch.where(index.draft_greedy, greedy_kept, u * q_d < p_d)


def _ragged_fixups(p, draft_tokens, q, num_accepted, index: _RaggedIndex, generators) -> torch.Tensor:
    """The sampled sequences' next tokens, [B_s]: each drawn from its fix-up row (the residual at
    its first rejection, or p for the bonus) with its own generator, as sampled_outcome draws it."""
    def of_sampled(column: torch.Tensor) -> torch.Tensor:
        return column.index_select(0, index.sampled)  # [B] -> [B_s]

    n, k = of_sampled(num_accepted), of_sampled(index.seq_k)
    rejected = (n < k)[:, None]  # [B_s, 1]
    at = torch.minimum(n, (k - 1).clamp(min=0))  # the rejected draft's position (any, for a bonus)
    p_rows = p.index_select(0, of_sampled(index.seq_start) + n)  # [B_s, V]
    q_rows = torch.zeros_like(p_rows)  # q = 0 at the bonus position
    if draft_tokens.shape[0] > 0:  # a one-hot q at the rejected draft
        d = draft_tokens.index_select(0, (of_sampled(index.seq_draft_start) + at).clamp(max=draft_tokens.shape[0] - 1))
        q_rows = torch.where(rejected, q_rows.scatter(1, d[:, None], 1.0), q_rows)
    if q is not None and q.shape[0] > 0:  # a sampled draft's own q row
        q_at = q.index_select(0, (of_sampled(index.seq_q_start) + at).clamp(max=q.shape[0] - 1))
        q_rows = torch.where(rejected & of_sampled(index.seq_q_given)[:, None], q_at, q_rows)
    # One [V] row at a time, as in sampled_outcome: residual's sum must not see B rows, since on a
    # GPU a reduction's order can change with how many rows it covers.
    drawn = [sample(residual(p_rows[j], q_rows[j]), generators[i]) for j, i in enumerate(index.sampled_list)]
    return torch.stack(drawn)
