"""What one choice of a request sends back: text as it becomes final, its tokens, then its end.

A ChoiceStream is the batched engine's listener for one sequence: the engine thread calls it with
each step's tokens; it detokenizes incrementally (TextStream), times the tokens for the metrics and
hands events to the asyncio loop (`emit`, a call_soon_threadsafe). Event `index` is the choice's
index in the request (n > 1 runs n sequences).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from specdec.generation import EmittedToken, SpecStats
from specdec.runtime import cut_at_stop
from specdec.server.metrics import ServerMetrics
from specdec.server.protocol import APIError


@dataclass(frozen=True)
class TokenEvent:
    index: int  # the choice
    text: str  # new text (may hold several tokens' worth when a piece was held back)
    tokens: list[dict]  # [{"id", "origin", "round"} (+ "logprob", "top_logprobs")] for the tokens this text came from
    stats: dict  # running counts: rounds, drafted, accepted, generated


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


class TextStream:
    """Incremental detokenization that never shows text it may have to take back.

    Each update decodes a window, not the whole answer: the tokens since the previous window's
    start. Starting one window back gives the tokenizer its context at the seam (a word-level or
    SentencePiece decoder puts a space between two tokens, or drops one at the start of a decode),
    and a token costs a few tokens' decoding: decoding the whole answer at every step cost 59 us a
    token of a 256-token answer and 224 us at 1024 (SmolLM2's tokenizer, dev CPU), on the engine
    thread, for every sequence in flight.

    Held back: an incomplete UTF-8 character (decoded as U+FFFD: a character is at most 4 bytes, so
    a tail of up to MAX_CHAR_TOKENS - 1 tokens waits) and any tail that could be the start of a
    stop string. Everything shown concatenates to the final text.
    """

    MAX_CHAR_TOKENS = 4

    def __init__(self, decode: Callable[[list[int]], str], stop: tuple[str, ...]):
        self.decode, self.stop, self.shown = decode, stop, ""
        self._text = ""  # the text of token_ids[:self._read]
        self._start = 0  # the latest window's first token
        self._read = 0  # tokens whose text is in _text

    def update(self, token_ids: list[int], final: bool) -> str:
        self._read_new(token_ids, final)
        text = cut_at_stop(self._text, self.stop) if self.stop else self._text
        if not final:
            text = text[: len(text) - _stop_prefix_len(text, self.stop)]
        if len(text) <= len(self.shown):
            return ""
        delta, self.shown = text[len(self.shown):], text
        return delta

    def _read_new(self, token_ids: list[int], final: bool) -> None:
        """Add the text of the tokens past _read, up to the last one that ends a character (all at the end)."""
        if len(token_ids) == self._read:
            return
        seen = self.decode(token_ids[self._start:self._read])
        whole = self.decode(token_ids[self._start:])
        end, window = len(token_ids), whole
        if not final:  # back off past a character the newest tokens have not finished
            floor = max(self._read, end - (self.MAX_CHAR_TOKENS - 1))
            while window.endswith("\ufffd") and end > floor:
                end -= 1
                window = self.decode(token_ids[self._start:end])
            if window.endswith("\ufffd"):  # no character ends in reach: bytes that are none
                end, window = len(token_ids), whole
        if end == self._read:
            return
        if not window.startswith(seen):  # a decoder that rewrites text across the seam: read it whole
            self._text, self._start, self._read = self.decode(token_ids[:end]), self._read, end
            return
        new = window[len(seen):]
        self._text += new
        if new:  # the next window starts at a token with text (the context its seam needs)
            self._start = self._read
        self._read = end


def _stop_prefix_len(text: str, stop: tuple[str, ...]) -> int:
    """Length of the longest tail of text that is a proper prefix of a stop string."""
    best = 0
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best


def token_record(token: EmittedToken) -> dict:
    record = {"id": token.token_id, "origin": token.origin.value, "round": token.round_index}
    if token.logprob is not None:
        record["logprob"] = token.logprob
        record["top_logprobs"] = [list(pair) for pair in token.top_logprobs or ()]
    return record


class ChoiceStream:
    """One sequence's listener (called on the engine thread). on_done(self) runs once it has finished."""

    def __init__(self, index: int, arrived: float, prompt_tokens: int, decode, stop: tuple[str, ...],
                 keep_tokens: bool, emit: Callable[[object], None], metrics: ServerMetrics,
                 on_done: Callable[["ChoiceStream"], None]):
        self.index, self.prompt_tokens = index, prompt_tokens
        self.text = TextStream(decode, stop)
        self.keep_tokens = keep_tokens  # logprobs asked for: the final answer lists every token
        self.emit, self.metrics, self.on_done = emit, metrics, on_done
        self.last = arrived
        self.arrived = arrived
        self.pending: list[dict] = []
        self.every: list[dict] = []
        self.count = 0

    def __call__(self, handle, tokens: list[EmittedToken]) -> None:
        now = time.perf_counter()
        for token in tokens:
            self.metrics.token_latency(first=self.count == 0, seconds=now - self.last)
            self.last, self.count = now, self.count + 1
            record = token_record(token)
            self.pending.append(record)
            if self.keep_tokens:
                self.every.append(record)
        delta = self.text.update(handle.token_ids, final=handle.done)
        if delta:
            s = handle.stats
            self.emit(TokenEvent(self.index, delta, self.pending, {"rounds": s.rounds, "drafted": s.drafted,
                                                                     "accepted": s.accepted, "generated": s.generated}))
            self.pending = []
        if handle.done:
            self.finish(handle)

    def finish(self, handle) -> None:
        reason = "abort" if handle.cancelled else (handle.finish_reason or "length")
        self.metrics.finish(reason, self.prompt_tokens, handle.stats, time.perf_counter() - self.arrived)
        self.emit(DoneEvent(self.index, reason, self.text.shown, self.pending, handle.stats, tuple(self.every)))
        self.on_done(self)
