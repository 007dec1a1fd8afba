"""What one choice of a request sends back: text as it becomes final, its tokens, then its end.

A ChoiceStream is the batched engine's listener for one sequence: the engine thread calls it with
each step's tokens; it sends the text the engine has made final (the handle's stops.TextStream, where
the engine also finds the stop strings), times the tokens for the metrics and
hands events to the asyncio loop (`emit`, a call_soon_threadsafe). Event `index` is the choice's
index in the request (n > 1 runs n sequences).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from specdec.generation import EmittedToken, RoundTree, SpecStats
from specdec.server.metrics import ServerMetrics
from specdec.server.protocol import APIError


@dataclass(frozen=True)
class TokenEvent:
    index: int  # the choice
    text: str  # new text (may hold several tokens' worth when a piece was held back)
    tokens: list[dict]  # [{"id", "origin", "round"} (+ "logprob", "top_logprobs")] for the tokens this text came from
    stats: dict  # running counts: rounds, drafted, accepted, generated
    tree: "TreeOfRound | None" = None  # the newest tree round whose first token is among `tokens`


@dataclass(frozen=True)
class TreeOfRound:
    """A tree round's draft tree, the round it belongs to, and the token the round emitted after the
    kept path (recovered or bonus; None when the answer ended first). A stream's web view draws it."""

    round_index: int
    tree: RoundTree
    next_token: EmittedToken | None

    def fields(self, piece: Callable[[int], str]) -> dict:
        """The stream's `specdec.tree`: each node's text (`piece(token_id)`, decoded alone), parents
        (-1: the root, the text's newest token), the kept path (node indices, root's child first),
        the round, and `next`: the recovered or bonus token's text and origin (or None)."""
        tree, after = self.tree, self.next_token
        following = None if after is None else {"token": piece(after.token_id), "origin": after.origin.value}
        return {"round": self.round_index, "tokens": [piece(token) for token in tree.tokens],
                "parents": list(tree.parents), "path": list(tree.path), "next": following}


def tree_of_round(tokens: list[EmittedToken], first: int) -> TreeOfRound:
    """The tree that tokens[first] carries (the first token of its round; the round's tokens follow it)."""
    head = tokens[first]
    kept = len(head.tree.path)
    rest = [token for token in tokens[first:] if token.round_index == head.round_index]
    return TreeOfRound(head.round_index, head.tree, rest[kept] if kept < len(rest) else None)


@dataclass(frozen=True)
class DoneEvent:
    index: int
    finish_reason: str  # "stop", "length" or "abort"
    text: str  # the whole answer (stop strings cut)
    tokens: list[dict]  # tokens not yet sent with any text
    stats: SpecStats
    all_tokens: tuple[dict, ...] = ()  # every token of the answer, when logprobs were asked for


@dataclass(frozen=True)
class ErrorEvent:
    error: APIError


def token_record(token: EmittedToken) -> dict:
    record = {"id": token.token_id, "origin": token.origin.value, "round": token.round_index}
    if token.logprob is not None:
        record["logprob"] = token.logprob
        record["top_logprobs"] = [list(pair) for pair in token.top_logprobs or ()]
    return record


class ChoiceStream:
    """One sequence's listener (called on the engine thread). on_done(self) runs once it has finished."""

    def __init__(self, index: int, arrived: float, prompt_tokens: int, keep_tokens: bool,
                 emit: Callable[[object], None], metrics: ServerMetrics, on_done: Callable[["ChoiceStream"], None]):
        self.index, self.prompt_tokens = index, prompt_tokens
        self.sent = 0  # characters of the handle's text sent so far
        self.keep_tokens = keep_tokens  # logprobs asked for: the final answer lists every token
        self.emit, self.metrics, self.on_done = emit, metrics, on_done
        self.last = arrived
        self.arrived = arrived
        self.pending: list[dict] = []
        self.tree: TreeOfRound | None = None  # of the pending tokens (decoded on the loop, not here)
        self.every: list[dict] = []
        self.count = 0

    def __call__(self, handle, tokens: list[EmittedToken]) -> None:
        now = time.perf_counter()
        for i, token in enumerate(tokens):
            self.metrics.token_latency(first=self.count == 0, seconds=now - self.last)
            self.last, self.count = now, self.count + 1
            record = token_record(token)
            if token.tree is not None:  # text held back across rounds: the newest tree wins
                self.tree = tree_of_round(tokens, i)
            self.pending.append(record)
            if self.keep_tokens:
                self.every.append(record)
        shown = handle.text.shown
        delta, self.sent = shown[self.sent:], len(shown)
        if delta:
            s = handle.stats
            self.emit(TokenEvent(self.index, delta, self.pending, {"rounds": s.rounds, "drafted": s.drafted,
                                                                     "accepted": s.accepted, "generated": s.generated},
                                 self.tree))
            self.pending, self.tree = [], None
        if handle.done:
            self.finish(handle)

    def finish(self, handle) -> None:
        reason = "abort" if handle.cancelled else (handle.finish_reason or "length")
        self.metrics.finish(reason, self.prompt_tokens, handle.stats, time.perf_counter() - self.arrived)
        self.emit(DoneEvent(self.index, reason, handle.text.shown, self.pending, handle.stats, tuple(self.every)))
        self.on_done(self)
