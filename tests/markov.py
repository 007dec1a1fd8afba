"""A tiny order-2 Markov "language model" behind the CausalLM interface.

Its next-token logits depend on the last two tokens through a random table, so it runs in
microseconds: the distribution tests can draw thousands of generations. Exactness is a property
of the engine and the rule, not of the network, and the cache is real (a token list) so that
rollback bugs change the output.
"""

import itertools

import torch

from specdec.drafters.base import Draft, Drafter
from specdec.models.base import CausalLM
from specdec.models.slots import RaggedOutput, SlotModel
from specdec.sampling import sample_distinct, warp_logits
from specdec.models.tree_rows import refuse_trees


class MarkovLM(CausalLM):
    def __init__(self, vocab: int, seed: int, sharpness: float = 2.0, name: str = "markov"):
        g = torch.Generator().manual_seed(seed)
        self.table = torch.randn(vocab, vocab, vocab, generator=g) * sharpness  # [prev2, prev1, next]
        self.vocab_size = vocab
        self.max_length = 10_000
        self.device = torch.device("cpu")
        self.name = name
        self.tokens: list[int] = []

    @property
    def cache_len(self) -> int:
        return len(self.tokens)

    def rollback(self, length: int) -> None:
        assert length <= len(self.tokens), "rollback past the end"
        del self.tokens[length:]

    def forward(self, tokens: torch.Tensor, tree=None) -> torch.Tensor:
        refuse_trees(self.name, tree, tokens.shape[0], "its cache is a token list")
        rows = []
        for t in tokens.tolist():
            self.tokens.append(t)
            prev2 = self.tokens[-2] if len(self.tokens) > 1 else 0
            rows.append(self.table[prev2, t])
        return torch.stack(rows)

    def forward_with_hidden(self, tokens, layers=(), tree=None):
        logits = self.forward(tokens, tree)
        return logits, logits

    def next_logits(self, context: list[int]) -> torch.Tensor:
        """Logits after a whole context, without touching the cache (for exact probabilities)."""
        prev2 = context[-2] if len(context) > 1 else 0
        return self.table[prev2, context[-1]]


class MarkovSlots(SlotModel):
    """MarkovLM's table for many sequences, with tree passes (specdec.trees): a row's logits depend on
    its token and its parent row's (the cache's last token for the root), so a tree row's logits are
    exactly its path's, and keep_rows really moves the kept rows."""

    def __init__(self, lm: MarkovLM, max_slots: int):
        self.table, self.vocab_size, self.max_length = lm.table, lm.vocab_size, lm.max_length
        self.device, self.name, self.max_slots = lm.device, lm.name, max_slots
        self.slots: list[list[int]] = [[] for _ in range(max_slots)]

    def cache_len(self, slot: int) -> int:
        return len(self.slots[slot])

    def rollback(self, slot: int, length: int) -> None:
        assert length <= len(self.slots[slot]), "rollback past the end"
        del self.slots[slot][length:]

    def keep_rows(self, slot: int, start: int, rows) -> None:
        cache = self.slots[slot]
        assert list(rows) == sorted(set(rows)) and start + max(rows) < len(cache)
        self.slots[slot] = cache[:start] + [cache[start + r] for r in rows]

    def forward_ragged(self, slots, tokens, *, logits=None, features=None, trees=None) -> RaggedOutput:
        out, counts = [], []
        for i, (slot, new) in enumerate(zip(slots, tokens)):
            cache, ids = self.slots[slot], new.tolist()
            tree = trees[i] if trees is not None and trees[i] is not None else tuple(range(-1, len(ids) - 1))
            before = cache[-1] if cache else 0
            rows = [self.table[before if parent < 0 else ids[parent], t] for t, parent in zip(ids, tree)]
            cache += ids
            wanted = logits is None or logits[i]
            out += rows if wanted else []
            counts.append(len(ids) if wanted else 0)
        offsets = tuple(itertools.accumulate(counts, initial=0))
        flat = torch.stack(out) if out else torch.empty(0, self.vocab_size)
        return RaggedOutput(flat, offsets, (None,) * len(slots))


class MarkovTreeDrafter(Drafter):
    """Drafts a tree from another order-2 table: `width` children a node, `depth` levels, at most k
    nodes (breadth first). sampled: children drawn i.i.d. from the warped q (with replacement, q rows
    given), or with distinct=True without replacement as the head draws them (sampling.sample_distinct,
    each child's q the row less its earlier siblings); else the top-`width` tokens of q, most
    probable first (q None)."""

    def __init__(self, lm: MarkovLM, width: int = 2, depth: int = 3, sampled: bool = False, distinct: bool = False):
        self.lm, self.width, self.depth, self.sampled, self.distinct = lm, width, depth, sampled or distinct, distinct
        self.name = "markov-tree"

    def fork(self) -> "MarkovTreeDrafter":
        return MarkovTreeDrafter(self.lm, self.width, self.depth, self.sampled, self.distinct)

    def propose(self, context, k, params, generator) -> Draft:
        tokens, parents, rows = [], [], []
        frontier = [(-1, context[-2] if len(context) > 1 else 0, context[-1])]
        for _ in range(self.depth):
            nxt = []
            for node, prev2, last in frontier:
                q = warp_logits(self.lm.table[prev2, last], params)
                if self.distinct:
                    picks, live, conditionals = sample_distinct(q[None], self.width, generator)
                    kids, qs = picks[live].tolist(), list(conditionals[live])
                else:
                    kids = (torch.multinomial(q, self.width, replacement=True, generator=generator) if self.sampled
                            else q.topk(self.width).indices).tolist()
                    qs = [q] * len(kids)
                for t, q_t in zip(kids, qs):
                    if len(tokens) == k:
                        break
                    tokens.append(t)
                    parents.append(node)
                    rows.append(q_t)
                    nxt.append((len(tokens) - 1, last, t))
            frontier = nxt
        q_rows = torch.stack(rows) if self.sampled and rows else None
        return Draft(torch.tensor(tokens, dtype=torch.long), q_rows, tuple(parents))
