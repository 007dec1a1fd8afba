"""The server's incremental detokenization (specdec.stops.TextStream): what it shows concatenates to
the whole answer's text, holds back half characters and possible stop strings, and decodes each
token a bounded number of times however long the answer."""

import random

import pytest

from specdec.runtime import cut_at_stop
from specdec.stops import TextStream
from tests.helpers_tiny import tiny_tokenizer

TEXT = "naïve café: 日本語 and 🙂🙂, déjà vu. Ω≈ç√∫ end"
BYTES = list(TEXT.encode())


def byte_decode(ids: list[int]) -> str:
    """A byte-level tokenizer: id = one byte (multi-byte characters span several tokens)."""
    return bytes(ids).decode("utf-8", errors="replace")


def streamed(decode, ids: list[int], stop: tuple[str, ...] = (), seed: int = 0) -> tuple[list[str], str]:
    """The deltas of one answer fed in steps of 1-5 tokens (as verify rounds emit them), and the last
    update's final text."""
    rng, stream, deltas, n = random.Random(seed), TextStream(decode, stop), [], 0
    while n < len(ids):
        n = min(len(ids), n + rng.randint(1, 5))
        deltas.append(stream.update(ids[:n], final=n == len(ids)))
    return deltas, stream.shown


@pytest.mark.parametrize("seed", range(5))
def test_bytes_of_multibyte_characters_concatenate_to_the_text_and_never_show_half_a_character(seed):
    deltas, final = streamed(byte_decode, BYTES, seed=seed)
    assert "".join(deltas) == final == TEXT
    assert not any("\ufffd" in d for d in deltas)


@pytest.mark.parametrize("seed", range(5))
def test_a_word_level_decoder_gets_its_spaces_at_the_seams(seed):
    tok = tiny_tokenizer()
    ids = [i for i in tok.encode("the cat sat on the mat and the dog ran", add_special_tokens=False)] * 3
    decode = lambda part: tok.decode(part, skip_special_tokens=True)  # noqa: E731
    deltas, final = streamed(decode, ids, seed=seed)
    assert "".join(deltas) == final == decode(ids)


def test_a_stop_string_is_never_shown_and_cuts_the_text():
    ids = list("say hello STOP and more".encode())
    deltas, final = streamed(byte_decode, ids, stop=("STOP",))
    assert "".join(deltas) == final == cut_at_stop("say hello STOP and more", ("STOP",)) == "say hello "
    shown = ""
    for d in deltas:
        shown += d
        assert "ST" not in shown  # the possible start of the stop string was held back too


def test_bytes_that_never_complete_a_character_are_shown_after_four_tokens():
    ids = [0xE6, 0x97] + list(b"abcdef")  # a 3-byte character cut after 2 bytes, then ASCII
    stream = TextStream(byte_decode, ())
    assert stream.update(ids[:2], final=False) == ""
    out = "".join(stream.update(ids[:n], final=n == len(ids)) for n in range(3, len(ids) + 1))
    assert out == byte_decode(ids)


def test_each_token_is_decoded_a_bounded_number_of_times():
    """Decoding the whole answer at every step costs n^2 / 2 token decodes; windows cost a few per token."""
    decoded = []

    def counting(ids: list[int]) -> str:
        decoded.append(len(ids))
        return byte_decode(ids)

    ids = list(("word " * 400).encode())  # 2000 tokens
    stream = TextStream(counting, ())
    for n in range(1, len(ids) + 1):
        stream.update(ids[:n], final=n == len(ids))
    assert stream.shown == byte_decode(ids)
    assert sum(decoded) <= 4 * len(ids)
