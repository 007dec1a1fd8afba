"""Draft trees: their shape, as the models and the rule read it.

A verify pass over a tree has one row per node and a root row first: row 0 is the text's newest
token (the root), row r > 0 is draft node r - 1. row_parents[r] is row r's parent row (-1 for the
root), always an earlier row, so a parent's row comes before its children's. Row r sits at
position cache_len + depth(r) of its sequence and attends to the cached text and to the rows on
its own path (its ancestors and itself), nothing else: its logits are those of decoding its path
one token at a time (rule 7 of the design). A chain is the tree whose row r has parent r - 1.
"""

from __future__ import annotations

from typing import Sequence


def check_parents(parents: Sequence[int], n: int) -> None:
    """A ValueError unless parents make a tree of n nodes in topological order (parents[j] in -1..j-1)."""
    if len(parents) != n or any(not -1 <= p < j for j, p in enumerate(parents)):
        raise ValueError(f"a draft tree of {n} nodes needs one parent per node, each -1 (the root) or an "
                         f"earlier node; got {list(parents)}")


def depths(row_parents: Sequence[int]) -> list[int]:
    """Each row's depth below the root row 0 (row_parents[0] == -1): its position past the cache's end."""
    out: list[int] = []
    for parent in row_parents:
        out.append(0 if parent < 0 else out[parent] + 1)
    return out


def path_rows(row_parents: Sequence[int], row: int) -> list[int]:
    """The rows from the root to `row`, both included, in order."""
    path = []
    while row >= 0:
        path.append(row)
        row = row_parents[row]
    return path[::-1]


def is_chain(row_parents: Sequence[int] | None) -> bool:
    return row_parents is None or all(p == r - 1 for r, p in enumerate(row_parents))


def rows_of(parents: Sequence[int]) -> tuple[int, ...]:
    """A draft's node parents (Draft.parents: -1 the root) as its verify pass's row parents (row 0 the
    root, row j + 1 node j)."""
    return (-1,) + tuple(p + 1 for p in parents)


def node_depths(parents: Sequence[int]) -> list[int]:
    """Each draft node's depth (Draft.parents: -1 the root), the root's children at 1."""
    return depths(rows_of(parents))[1:]


def children_of(parents: Sequence[int]) -> list[list[int]]:
    """Per row (row 0 the root, row j + 1 node j), its child nodes in node order. parents: Draft.parents."""
    kids: list[list[int]] = [[] for _ in range(len(parents) + 1)]
    for node, parent in enumerate(parents):
        kids[parent + 1].append(node)
    return kids


def check_row_parents(row_parents: Sequence[int], n: int) -> None:
    """A ValueError unless row_parents make the rows of a tree pass over n tokens: n entries, row 0
    the root (-1), every other row's parent an earlier row (0..r-1)."""
    rows = list(row_parents)
    if len(rows) != n or not rows or rows[0] != -1 or any(not 0 <= p < r for r, p in enumerate(rows) if r):
        raise ValueError(f"a tree pass over {n} tokens needs {n} row parents: -1 for row 0 (the root), then "
                         f"for each row r > 0 an earlier row in 0..r-1; got {rows}")


def check_kept_rows(rows: Sequence[int], start: int, cache_len: int) -> None:
    """A ValueError unless `rows` (increasing, relative to `start`) are rows a cache of cache_len
    tokens holds after a pass that began at start (what keep_rows takes)."""
    rows = list(rows)
    if not 0 <= start <= cache_len or any(b <= a for a, b in zip(rows, rows[1:])) or \
            (rows and (rows[0] < 0 or start + rows[-1] >= cache_len)):
        raise ValueError(f"keep_rows needs increasing rows of the pass that began at {start}, all below "
                         f"{cache_len - start} (the cache holds {cache_len} tokens); got {rows}")
