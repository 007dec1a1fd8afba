"""A tree pass's rows as the model backends take them (specdec.trees holds the shape itself).

Every backend reads a tree argument through `causal_or_tree`: None or a chain-shaped tree means
causal rows, which run today's causal pass unchanged (the same ops, the same bits, the same speed);
anything else is checked, and runs the backend's tree pass.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specdec.trees import check_row_parents, depths, is_chain, path_rows


def causal_or_tree(tree: Sequence[int] | None, n: int) -> tuple[int, ...] | None:
    """None for causal rows (no tree, or a chain), else the tree's row parents, checked against n
    tokens (a ValueError saying what is wrong)."""
    if tree is None:
        return None
    check_row_parents(tree, n)
    return None if is_chain(tree) else tuple(int(p) for p in tree)


def refuse_trees(name: str, tree: Sequence[int] | None, n: int, why: str) -> None:
    """A NotImplementedError naming the backend unless the tree is causal rows (None or a chain)."""
    if causal_or_tree(tree, n) is not None:
        raise NotImplementedError(f"{name} cannot verify a draft tree: {why}. Draft chains for it, or use a "
                                  f"backend with tree passes (hf, or native on its eager path)")


def sees(tree: Sequence[int]) -> torch.Tensor:
    """[n, n] bool: row r sees row c where c is on r's path (its ancestors and itself)."""
    n = len(tree)
    out = torch.eye(n, dtype=torch.bool)
    for r, parent in enumerate(tree):
        if parent >= 0:
            out[r] |= out[parent]
    return out


def row_positions(start: int, n: int, tree: Sequence[int] | None) -> torch.Tensor:
    """[n] long: each row's position inside its sequence, start + depth (start + r for causal rows)."""
    return start + torch.tensor(range(n) if tree is None else depths(tree), dtype=torch.long)


def paths(tree: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """Each row's path (root first, itself last)."""
    return tuple(tuple(path_rows(tree, r)) for r in range(len(tree)))
