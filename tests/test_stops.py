"""Stop strings (specdec.stops): the automaton finds what a brute-force search finds, the text held
back is exactly what could still become a stop string, the engine finishes at a stop string of any
length, and the work a character does not grow with the number of stop strings."""

import random

import pytest

from specdec.engine.batched import BatchConfig, BatchedEngine
from specdec.drafters import NoDrafter
from specdec.engine import GenerationConfig
from specdec.models.slots import LoopSlots
from specdec.stops import MAX_STOP_CHARS, MAX_STOPS, StopMatcher, StopScan, stop_list_problem

CPU = "cpu"
DECODE = lambda ids: " ".join(f"t{i}" for i in ids)  # noqa: E731


def first_start(text: str, stops) -> int | None:
    starts = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(starts) if starts else None


def partial_len(text: str, stops) -> int:
    """The longest tail of text that is a proper prefix of a stop string (brute force)."""
    return max((n for s in stops for n in range(1, min(len(s) - 1, len(text)) + 1) if text.endswith(s[:n])),
               default=0)


def random_case(rng: random.Random):
    stops = tuple("".join(rng.choice("abc") for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 6)))
    text = "".join(rng.choice("abcd") for _ in range(rng.randint(0, 30)))
    return stops, text


@pytest.mark.parametrize("seed", range(300))
def test_the_automaton_finds_the_earliest_stop_as_a_search_does(seed):
    stops, text = random_case(random.Random(seed))
    state, first = StopMatcher(stops).scan(text)
    assert first == first_start(text, stops)


@pytest.mark.parametrize("seed", range(300))
def test_scanning_in_pieces_holds_back_exactly_a_possible_stop_start(seed):
    rng = random.Random(seed)
    stops, text = random_case(rng)
    scan, n = StopScan(stops), 0
    while n < len(text):
        n = min(len(text), n + rng.randint(1, 4))
        scan.feed(text[:n])
    cut = first_start(text, stops)
    head = text if cut is None else text[:cut]
    assert scan.visible(final=True) == head
    assert scan.visible(final=False) == head[: len(head) - partial_len(head, stops)]


def test_a_rewritten_past_is_rescanned():
    scan = StopScan(("ab",))
    scan.feed("xa")
    scan.feed("xab")
    assert scan.cut == 1
    scan.feed("yy")  # not an extension of "xab": scanned afresh
    assert scan.cut is None and scan.visible(final=True) == "yy"


def test_the_work_a_character_is_the_same_for_one_stop_string_or_many():
    """Transitions are counted, not timed: a dict lookup per character and failure link, whatever the list."""
    class Counting(dict):
        looked = 0

        def get(self, key, default=None):
            Counting.looked += 1
            return super().get(key, default)

    text = "".join(random.Random(1).choice("abcdefgh") for _ in range(2000))

    def lookups(stops) -> int:
        matcher = StopMatcher(stops)
        matcher.children = [Counting(c) for c in matcher.children]
        Counting.looked = 0
        matcher.scan(text)
        return Counting.looked

    few = lookups(("zzzz",))
    many = lookups(tuple(f"{w}zz" for w in ("ab", "bc", "cd", "de", "ef", "fg", "gh", "ha", "aa", "hh", "ch", "ea")))
    assert few == many == len(text)


def test_stop_lists_past_the_bounds_are_named():
    assert stop_list_problem(("x",) * MAX_STOPS) is None
    assert str(MAX_STOPS) in stop_list_problem(("x",) * (MAX_STOPS + 1))
    assert stop_list_problem(("y" * MAX_STOP_CHARS,)) is None
    assert str(MAX_STOP_CHARS) in stop_list_problem(("y" * (MAX_STOP_CHARS + 1),))


def free_run(tiny_target):
    """An engine with a decode function, a prompt, and its 20 tokens without stop strings."""
    engine = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 1), lambda: NoDrafter(CPU), decode=DECODE,
                           config=BatchConfig(prefill_chunk=8))
    prompt = [7, 11, 13, 17, 19]
    free = engine.submit(prompt, GenerationConfig(max_new_tokens=20))
    engine.run()
    return engine, prompt, free


def test_the_engine_finishes_at_a_stop_string_longer_than_a_few_tokens(tiny_target):
    """A stop string spanning 12 tokens: it used to be looked for in a window of the newest 9."""
    engine, prompt, free = free_run(tiny_target)
    stop = DECODE(free.token_ids[3:15])
    handle = engine.submit(prompt, GenerationConfig(max_new_tokens=20, stop=(stop,)))
    engine.run()
    assert handle.finish_reason == "stop"
    assert handle.token_ids == free.token_ids[:15]


def test_the_text_a_listener_reads_is_the_one_the_engine_checked(tiny_target):
    """One TextStream a sequence, the handle's: the engine finds the stop string in it and a listener
    reads what it shows after each step; it ends cut before the stop string. Without a decode
    function, or with no stop strings and no listener, the engine keeps no text."""
    engine, prompt, free = free_run(tiny_target)
    stop = DECODE(free.token_ids[6:9])
    seen = []
    handle = engine.submit(prompt, GenerationConfig(max_new_tokens=20, stop=(stop,)),
                           listener=lambda h, tokens: seen.append(h.text.shown))
    engine.run()
    text = DECODE(free.token_ids)
    assert handle.finish_reason == "stop" and seen[-1] == handle.text.shown == text[: text.index(stop)]
    assert all(later.startswith(earlier) for earlier, later in zip(seen, seen[1:]))
    assert engine.submit(prompt, GenerationConfig(max_new_tokens=4)).text is None  # no stops, no listener: no reader
    bare = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 1), lambda: NoDrafter(CPU))
    assert bare.submit(prompt, GenerationConfig(max_new_tokens=4)).text is None
