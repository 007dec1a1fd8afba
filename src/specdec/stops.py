"""Stop strings: the bounds on a request's list, a matcher whose cost does not grow with the list,
and the incremental text of a growing answer with its stop strings cut.

The one place where stop strings are looked for. The engine (`BatchedEngine._finish_reason`) asks
a TextStream whether the answer so far holds a stop string (to finish the sequence at that token);
the server's per-choice listener asks its own TextStream for the text to show. Each costs a few
tokens' decoding and a constant amount of matching per new character, whatever the number of stop
strings (an Aho-Corasick automaton: `StopMatcher`), where testing `s in text` for each stop cost
stops x characters per token.
"""

from __future__ import annotations

from collections import deque
from functools import lru_cache
from typing import Callable

MAX_STOPS = 16  # stop strings in one request (OpenAI allows 4)
MAX_STOP_CHARS = 256  # characters in one stop string


def stop_list_problem(stops: tuple[str, ...]) -> str | None:
    """Why this list of stop strings is refused (a sentence), or None when it is within the bounds."""
    if len(stops) > MAX_STOPS:
        return f"at most {MAX_STOPS} stop strings, got {len(stops)}"
    longest = max(map(len, stops), default=0)
    if longest > MAX_STOP_CHARS:
        return f"a stop string may have at most {MAX_STOP_CHARS} characters, got one of {longest}"
    return None


class StopMatcher:
    """An Aho-Corasick automaton over a tuple of non-empty stop strings.

    A state is a node of the strings' trie: the longest tail of the text scanned so far that is a
    prefix of some stop string. `scan` advances it over more text in time linear in the text (plus
    the trie's depth), independent of how many stop strings there are.
    """

    def __init__(self, stops: tuple[str, ...]):
        self.children: list[dict[str, int]] = [{}]
        self.depth = [0]  # characters of the prefix each node spells
        self.longest = [0]  # the longest stop string that is a suffix of the node's prefix (0: none)
        for stop in stops:
            self._insert(stop)
        self.fail = [0] * len(self.children)
        self._link()

    def _insert(self, stop: str) -> None:
        node = 0
        for char in stop:
            child = self.children[node].get(char)
            if child is None:
                child = len(self.children)
                self.children[node][char] = child
                self.children.append({})
                self.depth.append(self.depth[node] + 1)
                self.longest.append(0)
            node = child
        self.longest[node] = len(stop)

    def _link(self) -> None:
        """Failure links, breadth first: a node's link is the longest proper suffix that is also a prefix."""
        queue = deque(self.children[0].values())
        while queue:
            node = queue.popleft()
            for char, child in self.children[node].items():
                link = self.fail[node]
                while link and char not in self.children[link]:
                    link = self.fail[link]
                target = self.children[link].get(char, 0)
                self.fail[child] = target if target != child else 0
                self.longest[child] = self.longest[child] or self.longest[self.fail[child]]
                queue.append(child)

    def scan(self, text: str, state: int = 0, offset: int = 0) -> tuple[int, int | None]:
        """(the state after `text`, the earliest start of a stop string that ends in `text` or None).

        `state` is the state after the text before `text`, which starts at character `offset` of
        the whole; the start returned counts from the whole's beginning."""
        children, fail, longest = self.children, self.fail, self.longest
        first = None
        for i, char in enumerate(text):
            while state and char not in children[state]:
                state = fail[state]
            state = children[state].get(char, 0)
            if longest[state]:
                start = offset + i + 1 - longest[state]
                first = start if first is None else min(first, start)
        return state, first


@lru_cache(maxsize=64)
def matcher_for(stops: tuple[str, ...]) -> StopMatcher:
    """One automaton per distinct stop list (the n choices of a request, its engine and its stream share it)."""
    return StopMatcher(tuple(s for s in stops if s))


class StopScan:
    """The stop-string state of a text that grows at its end (a rewrite of the past is rescanned).

    `cut`: where the first stop string starts (None: none so far); `partial`: characters at the end
    that could begin a stop string (to hold back while the text may still grow)."""

    def __init__(self, stops: tuple[str, ...]):
        self.matcher = matcher_for(stops)
        self.text, self.state, self.cut = "", 0, None

    def feed(self, text: str) -> None:
        """Advance to `text`, which normally extends the text fed before."""
        if not text.startswith(self.text):
            self.text, self.state, self.cut = "", 0, None
        self.state, first = self.matcher.scan(text[len(self.text):], self.state, len(self.text))
        if first is not None:
            self.cut = first if self.cut is None else min(self.cut, first)
        self.text = text

    def visible(self, final: bool) -> str:
        """The text to show: cut before the first stop string; unless final, less a tail that could begin one."""
        if self.cut is not None:
            head = self.text[: self.cut]
            return head if final else head[: len(head) - self.matcher.depth[self.matcher.scan(head)[0]]]
        if final:
            return self.text
        return self.text[: len(self.text) - self.matcher.depth[self.state]]


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
    stop string. Everything shown concatenates to the final text. `stopped`: a stop string has
    appeared (the text shown ends before it).
    """

    MAX_CHAR_TOKENS = 4

    def __init__(self, decode: Callable[[list[int]], str], stop: tuple[str, ...]):
        self.decode, self.shown = decode, ""
        self._stops = StopScan(stop) if any(stop) else None
        self._text = ""  # the text of token_ids[:self._read]
        self._start = 0  # the latest window's first token
        self._read = 0  # tokens whose text is in _text

    @property
    def stopped(self) -> bool:
        return self._stops is not None and self._stops.cut is not None

    def update(self, token_ids: list[int], final: bool) -> str:
        """The new text to show, given all of the answer's tokens so far (`final`: there are no more)."""
        self._read_new(token_ids, final)
        if self._stops is None:
            text = self._text
        else:
            self._stops.feed(self._text)
            text = self._stops.visible(final)
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
