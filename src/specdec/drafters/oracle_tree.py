"""Oracle tree drafter, for measuring what trees buy the engine rather than what a draft achieves.

It knows the target's greedy continuation (recorded as OracleDrafter records it). Each round, at every
depth independently, the true next token sits among the draft's children at sibling rank i with
probability profile[i] (EAGLE-2's per-rank acceptance profiles), or at none of them. The tree's shape is
speedup.best_tree(profile, k): the k nodes most likely to be kept, so its expected tau is the shape's
expected_tokens, a prediction a measured run can be held to. A node on the true path whose rank was
drawn gets the true token, every other node a wrong one. q is None: the tree is chosen independently of
the rule's draws, which is all the one-hot rule needs to be exact at any temperature (though the
profile is an acceptance rate only when decoding greedily). To pay what a real draft pays, it runs a
draft model's forward over each depth's nodes (and throws the logits away). Every number it produces
is an oracle measurement: label it so.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from specdec.drafters.base import Draft, Drafter, empty_draft
from specdec.drafters.oracle import record_greedy
from specdec.drafters.tree_shape import TreeShape
from specdec.models.base import CausalLM
from specdec.sampling import SamplingParams
from specdec.speedup import TreePlan, best_tree
from specdec.transfers import token_tensor
from specdec.trees import node_depths


class OracleTreeDrafter(Drafter):
    """Proposes best_tree(profile, k) with the truth placed by the profile; see the module docstring."""

    def __init__(self, target: CausalLM, profile: tuple[float, ...], draft_model: CausalLM | None = None,
                 max_depth: int = 8, horizon: int = 256, seed: int = 0):
        best_tree(profile, 1)  # checks the profile
        self.target, self.profile, self.draft_model = target, tuple(profile), draft_model
        self.tree = TreeShape(max_depth, len(profile), len(profile))  # k is a node budget
        self.max_depth, self.horizon, self.seed = max_depth, horizon, seed
        self.device, self.vocab_size = target.device, target.vocab_size
        self._rng = np.random.default_rng(seed)  # host draws: a round's shape is host work anyway
        self._cumulative = np.cumsum(profile)
        self.name = f"oracle-tree(profile={','.join(f'{p:g}' for p in profile)})"
        self._recorded: dict[tuple[int, ...], list[int]] = {}
        self._shapes: dict[int, TreePlan] = {}
        self._depths: dict[int, list[int]] = {}
        self._forks = itertools.count(1)
        self._truth: list[int] = []
        self._prompt_len = 0

    def remember(self, prompt: list[int], continuation: list[int]) -> None:
        """Give the greedy continuation of a prompt (saves recording it again)."""
        self._recorded[tuple(prompt)] = list(continuation)

    def shape(self, nodes: int) -> TreePlan:
        """The round's tree of `nodes` nodes (chosen once per size)."""
        if nodes not in self._shapes:
            plan = self._shapes[nodes] = best_tree(self.profile, nodes, self.max_depth)
            self._depths[len(plan.parents)] = node_depths(plan.parents)
        return self._shapes[nodes]

    def begin(self, prompt: list[int]) -> None:
        key = tuple(prompt)
        if key not in self._recorded:
            kept = self.target.cache_len  # the engine may have prefilled the target: record, then restore
            self._recorded[key] = record_greedy(self.target, prompt, self.horizon)
            if kept:
                self.target.forward(token_tensor(prompt[:kept], self.device))
        self._truth, self._prompt_len = self._recorded[key], len(prompt)
        if self.draft_model is not None:
            self.draft_model.reset()

    def propose(self, context: list[int], k: int, params: SamplingParams, generator) -> Draft:
        offset = len(context) - self._prompt_len
        if k < 1 or offset >= len(self._truth):
            return empty_draft(self.device)
        plan = self.shape(min(k, len(self._truth) - offset))
        depth_of = self._depths[len(plan.parents)]
        # The round's draws at once (host numpy: the oracle's own work should not weigh on the engine's).
        drawn = np.searchsorted(self._cumulative, self._rng.random(self.max_depth), side="right")
        shifts = self._rng.integers(1, self.vocab_size, size=len(plan.parents))
        truth = [self._truth[min(offset + d - 1, len(self._truth) - 1)] for d in depth_of]
        tokens, on_path = [], []
        for j, (parent, rank, depth) in enumerate(zip(plan.parents, plan.ranks, depth_of)):
            true_here = (parent < 0 or on_path[parent]) and drawn[depth - 1] == rank and offset + depth <= len(self._truth)
            on_path.append(true_here)
            tokens.append(truth[j] if true_here else (truth[j] + int(shifts[j])) % self.vocab_size)
        if self.draft_model is not None:
            self._pay_draft_cost(context, plan.parents, tokens)
        return Draft(token_tensor(tokens, self.device), None, plan.parents)

    def _pay_draft_cost(self, context: list[int], parents: tuple[int, ...], tokens: list[int]) -> None:
        """A draft model's passes as a tree drafter runs them: the unseen text, then one pass a depth
        over that depth's nodes; the model then forgets the round."""
        model = self.draft_model
        start = len(context) - 1
        if model.cache_len < start:
            model.extend(token_tensor(context[model.cache_len:start], self.device))
        model.rollback(start)
        level = node_depths(parents)
        model.forward(token_tensor(context[-1:], self.device))
        for depth in range(1, max(level, default=0)):
            model.forward(token_tensor([t for t, d in zip(tokens, level) if d == depth], self.device))
        model.rollback(start)

    def commit(self, num_valid: int) -> None:
        if self.draft_model is not None and self.draft_model.cache_len > num_valid:
            self.draft_model.rollback(num_valid)

    def fork(self) -> "OracleTreeDrafter":
        if self.draft_model is not None:
            return super().fork()  # its draft model holds one sequence's cache
        # Draws of its own (the n-th fork's seed from this seed and n), as OracleDrafter.fork's.
        seed = int(np.random.SeedSequence([self.seed, next(self._forks)]).generate_state(1)[0])
        twin = OracleTreeDrafter(self.target, self.profile, None, self.max_depth, self.horizon, seed)
        twin._recorded = self._recorded
        return twin


def oracle_tree_drafter(target, arg: str, dtype=None) -> Drafter:
    """`oracle-tree:P0,P1,...[:DRAFT]`: the truth at sibling rank i with probability Pi (DRAFT: the
    model whose passes each depth pays)."""
    from specdec.errors import DraftSpecError, InvalidRequestError
    from specdec.models.loader import load_model

    profile_text, _, model_name = arg.partition(":")
    try:
        profile = tuple(float(x) for x in profile_text.split(","))
        best_tree(profile, 1)
    except (ValueError, InvalidRequestError):
        raise DraftSpecError("oracle-tree needs a rank profile of probabilities summing to at most 1: "
                             f"oracle-tree:P0,P1,...[:DRAFT], got oracle-tree:{arg}") from None
    draft = load_model(model_name, device=str(target.model.device), dtype=dtype).model if model_name else None
    return OracleTreeDrafter(target.model, profile, draft)
