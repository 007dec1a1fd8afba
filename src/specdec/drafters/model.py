"""A smaller model of the same tokenizer drafts K tokens, one forward step each (a model of another
tokenizer drafts through cross_tokenizer.py).

ModelDrafter runs a CausalLM of its own (one sequence). For many sequences, SlotDrafter runs on a
slot model of the draft (DraftSlots, e.g. a NativeSlots): each sequence leases a slot, rolls it
back on its own, and a draft step of every sequence of the batch is one forward_ragged call.
"""

from __future__ import annotations

import torch

from typing import Callable, Sequence

from specdec.transfers import token_tensor
from specdec.drafters.base import Draft, Drafter, empty_draft, fit_logits
from specdec.drafters.tree_shape import GrownTree, TreeShape
from specdec.errors import DraftSpecError, InvalidRequestError
from specdec.models.base import CausalLM
from specdec.models.slots import SlotModel
from specdec.sampling import SamplingParams, sample, warp_logits


class ModelDrafter(Drafter):
    """Drafts with its own model and KV cache.

    Greedy: argmax, q one-hot (None). Sampling: draws from the warped q and records exactly that q.
    `vocab_size` is the target's logit width: a draft with fewer logit rows (a smaller padded
    embedding) gets zero probability on the extra ids.
    """

    def __init__(self, model: CausalLM, vocab_size: int, name: str | None = None):
        self.model = model
        self.vocab_size = vocab_size
        self.name = name or model.name

    def begin(self, prompt: list[int]) -> None:
        self.model.reset()
        if len(prompt) > 1:
            self.model.extend(self._tensor(prompt[:-1]))

    def propose(
        self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator
    ) -> Draft:
        if k < 1:
            return empty_draft(self.model.device)
        if self.tree is not None:
            from specdec.drafters.model_tree import grow_model_tree

            return tree_draft(grow_model_tree(self, context, k, params), self.model.device)
        fresh = catch_up(self.model, self._tensor(context[self.model.cache_len:]))
        tokens, qs = [], []
        for _ in range(k):
            logits = self._fit(self.model.forward(fresh)[-1])  # [V]
            if params.greedy:
                token = logits.argmax(-1)
            else:
                q = warp_logits(logits, params)
                token = sample(q, generator)
                qs.append(q)
            tokens.append(token)
            fresh = token.reshape(1)
        # The last token was never fed: the cache covers context + tokens[:-1].
        return Draft(torch.stack(tokens), torch.stack(qs) if qs else None)

    def commit(self, num_valid: int) -> None:
        if self.model.cache_len > num_valid:
            self.model.rollback(num_valid)

    def fork(self) -> "ModelDrafter":
        """The same weights with a cache of its own (a model that can give one: HFCausalLM)."""
        if not hasattr(self.model, "with_own_cache"):
            raise DraftSpecError(f"the draft {self.name} holds one sequence's cache: for several sequences "
                                 "build it over a slot model (SlotDrafter)")
        return ModelDrafter(self.model.with_own_cache(), self.vocab_size, self.name).tree_of(self.tree)

    def with_tree(self, shape: TreeShape) -> "ModelDrafter":
        """EAGLE-2 trees of `shape` from this model (model_tree.py): its top-`branch` tokens per node.
        It drafts over this one's model and cache (one sequence's): use one of the two."""
        return ModelDrafter(self.model, self.vocab_size, f"tree:{shape}:{self.name}").tree_of(shape)

    def tree_of(self, shape: TreeShape | None) -> "ModelDrafter":
        self.tree = shape
        return self

    def for_batch(self, max_slots: int, max_length: int | None = None) -> "SlotDrafter":
        """The same drafts over a slot model of its weights, each sequence in a slot of its own."""
        from specdec.models.slots import slot_model_for

        slots = DraftSlots(slot_model_for(self.model, max_slots, max_length))
        return SlotDrafter(slots, self.vocab_size, self.name, self.tree)

    def _fit(self, logits: torch.Tensor) -> torch.Tensor:
        return fit_logits(logits, self.vocab_size)

    def _tensor(self, ids: list[int]) -> torch.Tensor:
        return token_tensor(ids, self.model.device)


def tree_draft(tree: GrownTree, device: torch.device) -> Draft:
    """A tree whose nodes were chosen by rank (q None: one-hot per node)."""
    return Draft(token_tensor(list(tree.tokens), device), None, tree.parents)


class DraftSlots:
    """A draft's slot model shared by the drafters of a batch: each sequence leases a slot of it."""

    def __init__(self, model: SlotModel):
        self.model = model
        self._free = list(range(model.max_slots - 1, -1, -1))  # popped from the end: slot 0 first

    def lease(self) -> int:
        if not self._free:
            raise InvalidRequestError(f"the draft {self.model.name} holds {self.model.max_slots} sequences and "
                                      "all are drafting: give it as many slots as the engine runs sequences")
        return self._free.pop()

    def give_back(self, slot: int) -> None:
        self.model.release(slot)
        self._free.append(slot)

    def warm_up(self) -> None:
        self.model.warm_up()


class DraftLease:
    """One sequence's slot in DraftSlots: leased at its first begin(), kept across begin()s, given
    back at end(). Its cache holds the text minus what was never fed (as ModelDrafter's)."""

    def __init__(self, pool: DraftSlots):
        self.pool = pool
        self.slot: int | None = None

    def begin(self, prompt: list[int]) -> None:
        """An empty slot: the prompt goes in with its first draft (step_together feeds what the cache
        has not seen), so a sequence that never drafts (K = 0 all along) never pays for it."""
        if self.slot is None:
            self.slot = self.pool.lease()
        self.pool.model.rollback(self.slot, 0)

    def unseen(self, context: list[int]) -> torch.Tensor:
        """The tokens of context its cache has not seen yet [n]."""
        return token_tensor(context[self.pool.model.cache_len(self.slot):], self.pool.model.device)

    def commit(self, num_valid: int) -> None:
        if self.slot is not None and self.pool.model.cache_len(self.slot) > num_valid:
            self.pool.model.rollback(self.slot, num_valid)

    def end(self) -> None:
        if self.slot is not None:
            self.pool.give_back(self.slot)
            self.slot = None


# A drafter more tokens behind its text than this is catching up (a prompt, a stretch of plain
# steps): its text but the last token goes in first, in a pass that asks for no logits. Fewer (a
# round leaves two unseen, a step without drafts one more) go in with the first draft pass: their
# few rows of logits cost less than a pass of their own would.
CATCH_UP_TOKENS = 16


def catch_up(model: CausalLM, unseen: torch.Tensor) -> torch.Tensor:
    """One sequence's drafter `unseen` tokens behind: past CATCH_UP_TOKENS, all but the last go into
    its cache without logits (as step_together does for a batch); what its first draft step feeds."""
    if unseen.shape[0] <= CATCH_UP_TOKENS:
        return unseen
    model.extend(unseen[:-1])
    return unseen[-1:]

# choose(i, step, logits [V_draft]) -> sequence i's token [0-d] at this draft step
Choose = Callable[[int, int, torch.Tensor], torch.Tensor]


def step_together(leases: Sequence[DraftLease], contexts: Sequence[list[int]], ks: Sequence[int],
                  choose: Choose) -> None:
    """ks[i] draft steps for sequence i, as ModelDrafter runs them alone (its unseen text first, then
    each chosen token but the last), one forward_ragged a step over the sequences still drafting
    (all leases of one DraftSlots). A drafter catching up (CATCH_UP_TOKENS) first reads its unseen
    text but the last token in a pass of its own that asks for no logits: a draft reads only its last
    row's, and 32 drafters catching up on a few hundred tokens each would otherwise ask for [rows, V]
    fp32 logits at once (at an 8B model's 128K vocabulary, the 3 GiB an H100 serving three servers
    ran out of)."""
    model = leases[0].pool.model
    fresh = [lease.unseen(context) for lease, context in zip(leases, contexts)]
    behind = [i for i, k in enumerate(ks) if k > 0 and fresh[i].shape[0] > CATCH_UP_TOKENS]
    if behind:
        model.forward_ragged([leases[i].slot for i in behind], [fresh[i][:-1] for i in behind],
                             logits=[False] * len(behind))
        for i in behind:
            fresh[i] = fresh[i][-1:]
    for step in range(max(ks, default=0)):
        active = [i for i, k in enumerate(ks) if step < k]
        out = model.forward_ragged([leases[i].slot for i in active], [fresh[i] for i in active])
        for j, i in enumerate(active):
            fresh[i] = choose(i, step, out.logits[out.offsets[j + 1] - 1]).reshape(1)


def by_pool(leases: Sequence[DraftLease]) -> list[list[int]]:
    """Indices of the leases grouped by the DraftSlots they lease from (one forward_ragged each)."""
    groups: dict[int, list[int]] = {}
    for i, lease in enumerate(leases):
        groups.setdefault(id(lease.pool), []).append(i)
    return list(groups.values())


class SlotDrafter(Drafter):
    """ModelDrafter's drafts over a slot of a shared draft slot model: a batch of sequences drafts
    with one forward_ragged a draft step. fork() gives another sequence a drafter on the same pool."""

    def __init__(self, pool: DraftSlots, vocab_size: int, name: str | None = None, tree: TreeShape | None = None):
        self.pool, self.vocab_size = pool, vocab_size
        self.name = name or pool.model.name
        self.lease = DraftLease(pool)
        self.device = pool.model.device
        self.tree = tree  # None: chains; else trees of this shape, one forward_ragged a depth (model_tree.py)

    def fork(self) -> "SlotDrafter":
        return SlotDrafter(self.pool, self.vocab_size, self.name, self.tree)

    def with_tree(self, shape: TreeShape) -> "SlotDrafter":
        return SlotDrafter(self.pool, self.vocab_size, f"tree:{shape}:{self.name}", shape)

    def warm_up(self) -> None:
        self.pool.warm_up()

    def begin(self, prompt: list[int]) -> None:
        self.lease.begin(prompt)

    def commit(self, num_valid: int) -> None:
        self.lease.commit(num_valid)

    def end(self) -> None:
        self.lease.end()

    def propose(self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator) -> Draft:
        return self.propose_batch([self], [context], [k], [params], [generator])[0]

    @classmethod
    def propose_batch(cls, drafters, contexts, ks, params, generators) -> list[Draft]:
        """Chains through step_together, trees (model_tree.py) together by pool, one pass a depth."""
        from specdec.drafters.model_tree import grow_slot_trees

        out = cls._chains(*(_members(values, lambda d: d.tree is None, drafters)
                            for values in (drafters, contexts, ks, params, generators)))
        out = iter(out)
        drafts = [None if d.tree is not None else next(out) for d in drafters]
        growing = [i for i, d in enumerate(drafters) if d.tree is not None and ks[i] > 0]
        for group in by_pool([drafters[i].lease for i in growing]):
            members = [growing[j] for j in group]
            trees = grow_slot_trees([drafters[i] for i in members], [contexts[i] for i in members],
                                    [ks[i] for i in members], [params[i] for i in members])
            for i, tree in zip(members, trees):
                drafts[i] = tree_draft(tree, drafters[i].device)
        return [draft if draft is not None else empty_draft(d.device) for d, draft in zip(drafters, drafts)]

    @classmethod
    @torch.inference_mode()
    def _chains(cls, drafters, contexts, ks, params, generators) -> list[Draft]:
        tokens: list[list[torch.Tensor]] = [[] for _ in drafters]
        qs: list[list[torch.Tensor]] = [[] for _ in drafters]

        def choose(i: int, step: int, logits: torch.Tensor) -> torch.Tensor:
            logits = fit_logits(logits, drafters[i].vocab_size)
            if params[i].greedy:
                token = logits.argmax(-1)
            else:
                q = warp_logits(logits, params[i])
                token = sample(q, generators[i])
                qs[i].append(q)
            tokens[i].append(token)
            return token

        for group in by_pool([d.lease for d in drafters]):
            step_together([drafters[i].lease for i in group], [contexts[i] for i in group],
                          [ks[i] for i in group], lambda j, step, logits, g=group: choose(g[j], step, logits))
        return [Draft(torch.stack(t), torch.stack(q) if q else None) if t else empty_draft(d.device)
                for d, t, q in zip(drafters, tokens, qs)]


def _members(values: Sequence, keep: Callable, drafters: Sequence) -> list:
    """values[i] for the drafters that `keep` picks."""
    return [v for v, d in zip(values, drafters) if keep(d)]
