"""A tiny order-2 Markov "language model" behind the CausalLM interface.

Its next-token logits depend on the last two tokens through a random table, so it runs in
microseconds: the distribution tests can draw thousands of generations. Exactness is a property
of the engine and the rule, not of the network, and the cache is real (a token list) so that
rollback bugs change the output.
"""

import torch

from specdec.models.base import CausalLM
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
