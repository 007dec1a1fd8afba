"""Oracle drafter, for measuring the engine rather than a model pair.

It proposes the target's own greedy continuation of the prompt (recorded once per prompt), each
token replaced by a wrong one with probability 1 - alpha, so that greedy acceptance is alpha by
construction. To pay what a real draft pays, it runs a real draft model's forward pass for every
token it proposes (and throws the logits away). Every number it produces is an *oracle*
measurement: it shows what the engine delivers at a given alpha and c, not what any draft achieves.

Its choice is random, so for sampled decoding it reports the distribution it drew from:
q = alpha on the recorded token and (1 - alpha) / (V - 1) on each other one (rule 1 of the design).
The choices for every position are drawn once, when a generation begins (a round then only slices
them, adding no work on the host between the GPU's rounds). A position proposed again, after a
rejection earlier in its round, gets the same token: its first draw was never judged, so each judged
position still has its own independent draw, accepted with probability alpha.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from specdec.transfers import token_tensor
from specdec.drafters.base import Draft, Drafter, empty_draft
from specdec.drafters.model import DraftLease, DraftSlots, by_pool, catch_up, step_together
from specdec.models.base import CausalLM
from specdec.sampling import SamplingParams


def record_greedy(target: CausalLM, prompt: list[int], length: int) -> list[int]:
    """The target's plain greedy continuation of prompt (length tokens). Leaves the cache empty."""
    device = target.device
    logits = target.prefill(torch.tensor(prompt, dtype=torch.long, device=device))
    token = logits[-1].argmax()
    out = [token]
    for _ in range(length - 1):
        token = target.forward(token.reshape(1))[-1].argmax()
        out.append(token)
    target.reset()
    return torch.stack(out).tolist()


class OracleDrafter(Drafter):
    """Proposes a corrupted copy of the recorded continuation; see the module docstring."""

    def __init__(self, target: CausalLM, alpha: float, draft_model: CausalLM | None = None,
                 horizon: int = 256, seed: int = 0, draft_slots: DraftSlots | None = None):
        """draft_model: the model whose steps it pays for, alone; draft_slots: the same, as a slot of a
        shared draft slot model (a batch pays every sequence's step in one forward_ragged)."""
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"oracle alpha must be in [0, 1], got {alpha}")
        self.target = target
        self.alpha = alpha
        self.draft_model = draft_model
        self.horizon = horizon
        self.device = target.device
        self.vocab_size = target.vocab_size
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.seed = seed
        self._forks = itertools.count(1)  # how many forks so far: each fork's seed
        cost = draft_model.name if draft_model else draft_slots.model.name if draft_slots else None
        self.name = f"oracle(alpha={alpha:g}" + (f", cost of {cost})" if cost else ")")
        self.lease = DraftLease(draft_slots) if draft_slots is not None else None
        self._recorded: dict[tuple[int, ...], torch.Tensor] = {}
        self._truth_all = torch.empty(0, dtype=torch.long, device=self.device)  # recorded, then random
        self._proposals = self._truth_all  # one per position of the generation, drawn in begin()
        self._recorded_len = 0
        self._prompt_len = 0

    def remember(self, prompt: list[int], continuation: list[int]) -> None:
        """Give the greedy continuation of a prompt (saves recording it again)."""
        self._recorded[tuple(prompt)] = torch.tensor(continuation, dtype=torch.long, device=self.device)

    def begin(self, prompt: list[int]) -> None:
        key = tuple(prompt)
        if key not in self._recorded:
            # The engine has prefilled the target; recording reuses its cache, then restores it.
            kept = self.target.cache_len
            self.remember(prompt, record_greedy(self.target, prompt, self.horizon))
            if kept:
                self.target.forward(self._tensor(prompt[:kept]))
        self._truth_all = self._recorded[key]
        self._recorded_len = self._truth_all.shape[0]
        self._proposals = self._choose(self._truth_all)
        self._prompt_len = len(prompt)
        if self.draft_model is not None:
            self.draft_model.reset()
            if len(prompt) > 1:
                self.draft_model.extend(self._tensor(prompt[:-1]))
        if self.lease is not None:
            self.lease.begin(prompt)

    def fork(self) -> "OracleDrafter":
        """Another sequence's oracle: the same target, alpha, draft cost and recordings, and draws of its
        own (the n-th fork's seed derived from this seed and n: reproducible for the same order of forks).
        With one seed for all, every sequence would find the same positions wrong, and what the auto
        policy learns from one sequence's drafts would be every other's luck too."""
        if self.draft_model is not None:
            return super().fork()  # its draft model holds one sequence's cache
        seed = int(np.random.SeedSequence([self.seed, next(self._forks)]).generate_state(1)[0])
        twin = OracleDrafter(self.target, self.alpha, None, self.horizon, seed, self.lease.pool if self.lease else None)
        twin._recorded = self._recorded  # the target's continuations are no one sequence's state
        return twin

    def for_batch(self, max_slots: int, max_length: int | None = None) -> "OracleDrafter":
        """The same oracle paying its draft model's steps in a slot model of its weights."""
        if self.draft_model is None:
            return self
        from specdec.models.slots import slot_model_for

        pool = DraftSlots(slot_model_for(self.draft_model, max_slots, max_length))
        return OracleDrafter(self.target, self.alpha, None, self.horizon, self.seed, pool)

    def end(self) -> None:
        if self.lease is not None:
            self.lease.end()

    def warm_up(self) -> None:
        if self.lease is not None:
            self.lease.pool.warm_up()

    def propose(self, context: list[int], k: int, params: SamplingParams, generator) -> Draft:
        return self.propose_batch([self], [context], [k], [params], [generator])[0]

    @classmethod
    def propose_batch(cls, drafters, contexts, ks, params, generators) -> list[Draft]:
        """Each sequence's slice of its proposals; the draft cost of all leased ones in one
        forward_ragged a step."""
        drafts = [d._draft(c, k, p) for d, c, k, p in zip(drafters, contexts, ks, params)]
        leased = [i for i, d in enumerate(drafters) if d.lease is not None and ks[i] > 0]
        for group in by_pool([drafters[i].lease for i in leased]):
            members = [leased[j] for j in group]
            step_together([drafters[i].lease for i in members], [contexts[i] for i in members],
                          [len(drafts[i]) for i in members],
                          lambda j, step, logits, m=members: drafts[m[j]].tokens[step])
        return drafts

    def _draft(self, context: list[int], k: int, params: SamplingParams) -> Draft:
        """Its proposals for the next k positions (paying a lone draft model's steps, if it has one)."""
        if k < 1:
            return empty_draft(self.device)
        offset = len(context) - self._prompt_len
        while offset + k > self._proposals.shape[0]:  # past the recording: random truths, drawn as needed
            extra = torch.randint(0, self.vocab_size, (max(k, self._proposals.shape[0]),), device=self.device,
                                  generator=self.generator)
            self._truth_all = torch.cat([self._truth_all, extra])
            self._proposals = torch.cat([self._proposals, self._choose(extra)])
        tokens = self._proposals[offset:offset + k]
        if self.draft_model is not None:
            self._pay_draft_cost(context, tokens)
        known = max(0, min(k, self._recorded_len - offset))
        q = None if params.greedy else self._distribution(self._truth_all[offset:offset + k], known)
        return Draft(tokens, q)

    def _choose(self, truth: torch.Tensor) -> torch.Tensor:
        """Each position's proposal: its truth with probability alpha, else one of the other tokens at random."""
        keep = torch.rand(truth.shape[0], device=self.device, generator=self.generator) < self.alpha
        shift = torch.randint(1, self.vocab_size, truth.shape, device=self.device, generator=self.generator)
        return torch.where(keep, truth, (truth + shift) % self.vocab_size)  # shift != 0: surely wrong

    def commit(self, num_valid: int) -> None:
        if self.draft_model is not None and self.draft_model.cache_len > num_valid:
            self.draft_model.rollback(num_valid)
        if self.lease is not None:
            self.lease.commit(num_valid)

    def _pay_draft_cost(self, context: list[int], tokens: torch.Tensor) -> None:
        """k draft steps, as ModelDrafter runs them: the unseen context first, then each proposal but the last."""
        fresh = catch_up(self.draft_model, self._tensor(context[self.draft_model.cache_len:]))
        for i in range(tokens.shape[0]):
            self.draft_model.forward(fresh)
            fresh = tokens[i:i + 1]

    def _distribution(self, truth: torch.Tensor, known: int) -> torch.Tensor:
        """q [k, V]: alpha on the recorded token, the rest spread evenly; uniform past the recording."""
        k, vocab = truth.shape[0], self.vocab_size
        q = torch.full((k, vocab), (1.0 - self.alpha) / (vocab - 1), device=self.device)
        q[:known].scatter_(1, truth[:known, None], self.alpha)
        q[known:] = 1.0 / vocab
        return q

    def _tensor(self, ids: list[int]) -> torch.Tensor:
        return token_tensor(ids, self.device)


def oracle_drafter(target, arg: str, dtype=None) -> Drafter:
    """`oracle:ALPHA` or `oracle:ALPHA:DRAFT_MODEL` (the model whose cost each step pays)."""
    from specdec.errors import DraftSpecError
    from specdec.models.loader import load_model

    alpha_text, _, model_name = arg.partition(":")
    try:
        alpha = float(alpha_text)
    except ValueError:
        raise DraftSpecError(f"oracle needs an acceptance rate: oracle:ALPHA[:DRAFT], got oracle:{arg}") from None
    if not 0.0 <= alpha <= 1.0:
        raise DraftSpecError(f"oracle alpha must be in [0, 1], got {alpha}")
    draft = load_model(model_name, device=str(target.model.device), dtype=dtype).model if model_name else None
    return OracleDrafter(target.model, alpha, draft)

