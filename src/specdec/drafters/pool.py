"""Drafters of one kind kept for reuse: a batch needs one per running sequence, never one shared.

A sequence takes a drafter when it starts and gives it back when it is done; the next sequence's
begin() resets it (as engine.Engine reuses its one drafter across requests). The pool builds a new
one only when every drafter it holds is in use, so it never holds more than the most sequences that
ran at once. Not thread-safe: take and give back from the thread that steps the engine.
"""

from __future__ import annotations

from typing import Callable

from specdec.drafters.base import Drafter


class DrafterPool:
    def __init__(self, build: Callable[[], Drafter], first: Drafter | None = None):
        """build: () -> a fresh drafter (its own caches); first: one already built, used first."""
        self._build = build
        self._free: list[Drafter] = [first] if first is not None else []
        self.built = len(self._free)

    def take(self) -> Drafter:
        if self._free:
            return self._free.pop()
        self.built += 1
        return self._build()

    def give_back(self, drafter: Drafter) -> None:
        self._free.append(drafter)
