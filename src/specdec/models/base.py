"""The one interface every model backend offers the engine and the drafters.

A model owns a KV cache for a single sequence (batch 1). `forward` runs new tokens on top of the
cache and appends them; `rollback(n)` cuts the cache back to its first n tokens, so that after a
round the cache holds exactly the true text (rule 2 of the design). A tree pass (`tree=`: the rows'
parents, specdec.trees) appends every row too; `keep_rows` then keeps the accepted path's rows.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

import torch

from specdec.trees import check_kept_rows


class CausalLM(ABC):
    """A causal LM with a KV cache. Token tensors are 1-D long tensors on `self.device`."""

    name: str
    vocab_size: int  # size of the logits' last dimension
    max_length: int  # longest sequence (prompt + generated) the model accepts
    device: torch.device

    @abstractmethod
    def forward(self, tokens: torch.Tensor, tree: tuple[int, ...] | None = None) -> torch.Tensor:
        """Run tokens [n] on top of the cache, append them to it, return logits [n, V] (fp32).

        tree: the rows' parents (specdec.trees: n entries, row 0 the root with -1, row r an earlier
        parent) or None for causal rows. Row r then sits at position start + depth(r) (start: the
        cache length before the pass) and sees the cache and its own path only; its k, v still go
        to cache index start + r, and the cache holds start + n tokens until keep_rows. Backends
        without tree passes raise NotImplementedError for a tree that is not a chain; a malformed
        tree is a ValueError."""

    @abstractmethod
    def forward_with_hidden(self, tokens: torch.Tensor, layers: tuple[int, ...] = (),
                            tree: tuple[int, ...] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Like forward, also returning the target's features [n, (len(layers) + 1) * D]: the
        residual stream after each decoder layer in `layers` (0-based, increasing, never the last
        layer), then the last layer's features (the input of the LM head)."""

    @property
    @abstractmethod
    def cache_len(self) -> int:
        """Number of tokens the cache holds."""

    @abstractmethod
    def rollback(self, length: int) -> None:
        """Forget every cached token after the first `length`."""

    def keep_rows(self, start: int, rows: Sequence[int]) -> None:
        """After a tree pass that began at cache length `start`: keep the first `start` tokens, then
        the entries of the pass's rows `rows` (increasing, relative to start: a root-to-node path)
        moved to start, start + 1, ...; forget the rest. Here only the causal case (rows 0..m - 1,
        a rollback to start + m); backends with tree passes move the entries."""
        check_kept_rows(rows, start, self.cache_len)
        if list(rows) != list(range(len(rows))):
            raise NotImplementedError(f"{self.name} cannot keep a tree's path: its cache verifies chains only")
        self.rollback(start + len(rows))

    def extend(self, tokens: torch.Tensor) -> None:
        """Append tokens [n] to the cache when their logits are not needed (a prompt's prefill).

        Backends override this to skip the LM head over all n positions: for a 500-token prompt
        and a 49k vocabulary that is most of the prefill's arithmetic.
        """
        self.forward(tokens)

    @property
    def cheap_verify_rows(self) -> bool:
        """Whether a verify pass of a few rows costs about one single-token step here (a GPU, or
        bf16 matrices on a CPU with bf16 units); on other CPUs every drafted row costs more, and
        drafters draft fewer tokens a round there."""
        return self.device.type != "cpu"

    @property
    def verify_rows_match_steps(self) -> bool:
        """Whether a verify pass over n tokens gives each row the logits that n single-token steps
        would, to the last bit. The engine needs this of a target: its plain decoding and its verify
        passes must agree, or greedy output drifts on near-ties. A draft need not have it."""
        return True

    def reset(self) -> None:
        self.rollback(0)

    def prefill(self, tokens: torch.Tensor) -> torch.Tensor:
        """Start a new sequence: empty the cache, run tokens [n], return logits [n, V]."""
        self.reset()
        return self.forward(tokens)


def check_feature_layers(layers: tuple[int, ...], n_layers: int) -> tuple[int, ...]:
    """`layers` as forward_with_hidden takes them, or a ValueError saying what is wrong."""
    layers = tuple(int(i) for i in layers)
    if list(layers) != sorted(set(layers)) or any(not 0 <= i < n_layers - 1 for i in layers):
        raise ValueError(f"feature layers must be increasing indices in 0..{n_layers - 2} (the last layer's "
                         f"features always come last), not {list(layers)}")
    return layers
