"""`random:SIZE`: random weights at a named size with a stand-in tokenizer, loadable as a target or a
draft by name (for engine and server benchmarks where no weights exist)."""

from __future__ import annotations

import pytest

from specdec.drafters.registry import find_kind
from specdec.errors import ModelLoadError, UnsupportedHereError
from specdec.models.loader import load_model
from specdec.models.native_llama import NativeLlama
from specdec.models.random_weights import standin_tokenizer


def test_a_random_target_loads_by_name_labelled_as_random():
    loaded = load_model("random:llama-tiny", device="cpu")
    assert isinstance(loaded.model, NativeLlama)
    assert loaded.name == loaded.model.name == "llama-tiny (random weights)"
    assert len(loaded.tokenizer) == loaded.model.vocab_size == 384


def test_the_same_name_gives_the_same_weights():
    a, b = (load_model("random:llama-tiny", device="cpu").model for _ in range(2))
    assert all((x == y).all() for x, y in zip(a.net.parameters(), b.net.parameters()))


@pytest.mark.parametrize("name, error, words", [
    ("random:llama-9000", ModelLoadError, "known: random:llama-3.1-8b"),
    ("random:", ModelLoadError, "unknown random-weight size"),
])
def test_unknown_sizes_are_refused_with_the_known_ones(name, error, words):
    with pytest.raises(error, match=words):
        load_model(name, device="cpu")


def test_random_weights_run_on_the_native_backend_only():
    with pytest.raises(UnsupportedHereError, match="native backend only"):
        load_model("random:llama-tiny", device="cpu", backend="hf")


def test_the_standin_tokenizer_decodes_every_id_and_reads_any_text():
    tok = standin_tokenizer(384)
    text = "Héllo, wörld! 日本"
    ids = tok(text)["input_ids"]
    assert len(ids) == len(text.encode()) and tok.decode(ids) == text  # one token a byte, lossless
    assert tok.decode([383, 300]) == " w383 w300"  # filler ids decode to text too
    assert tok.eos_token_id == 2
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_a_vocabulary_too_small_for_the_standin_is_refused():
    with pytest.raises(ModelLoadError, match="cannot hold"):
        standin_tokenizer(100)


def test_the_oracle_takes_a_random_draft_model_by_name():
    kind, arg = find_kind("oracle:0.8:random:llama-3.2-1b")
    assert (kind.syntax, arg) == ("oracle:ALPHA[:DRAFT]", "0.8:random:llama-3.2-1b")
    assert find_kind("random:llama-3.2-1b")[0].syntax == "MODEL"  # a random draft model on its own


def test_an_oracle_for_a_batch_drafts_all_sequences_in_one_draft_slot_model():
    from specdec.drafters import make_drafter

    target = load_model("random:llama-tiny", device="cpu")
    prototype = make_drafter("oracle:0.8:random:llama-tiny", target, max_slots=3)
    twins = [prototype.fork() for _ in range(2)]
    assert {id(t.lease.pool) for t in twins} == {id(prototype.lease.pool)}  # one set of draft weights
    assert "random weights" in prototype.name
