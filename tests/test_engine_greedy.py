"""Greedy identity: speculative output equals plain greedy output, token for token."""

import pytest
import torch

from specdec.drafters import LookupDrafter, ModelDrafter, NoDrafter
from specdec.engine import Engine, GenerationConfig, Origin
from tests.conftest import VOCAB

PROMPTS = [
    [1, 2, 3, 4, 5, 1, 2, 3],  # repeats: lookup finds matches
    [7, 11, 13, 17, 19, 23, 29, 31, 37],  # no repeats at first
    [5],  # a single token
]


def plain_greedy(model, prompt, n):
    """Reference: one token at a time, straight from the model."""
    logits = model.prefill(torch.tensor(prompt))
    out = []
    for _ in range(n):
        token = int(logits[-1].argmax())
        out.append(token)
        logits = model.forward(torch.tensor([token]))
    return out


def drafters(tiny_target, tiny_draft):
    return {
        "none": NoDrafter(torch.device("cpu")),
        "lookup": LookupDrafter(torch.device("cpu")),
        "model": ModelDrafter(tiny_draft, VOCAB),
    }


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("kind", ["none", "lookup", "model"])
def test_greedy_identity_with_every_drafter(tiny_target, tiny_draft, kind, k):
    engine = Engine(tiny_target, drafters(tiny_target, tiny_draft)[kind])
    config = GenerationConfig(max_new_tokens=40, k=k)
    for prompt in PROMPTS:
        expected = plain_greedy(tiny_target, prompt, 40)
        assert engine.generate(prompt, config).token_ids == expected


def test_speculation_really_happens(tiny_target):
    """Tiny random models repeat themselves, so lookup drafts get kept: all origins occur."""
    engine = Engine(tiny_target, LookupDrafter(torch.device("cpu")))
    gen = engine.stream(PROMPTS[0], GenerationConfig(max_new_tokens=60, k=4))
    origins = {t.origin for t in gen}
    assert gen.stats.accepted > 0 and gen.stats.drafted > gen.stats.accepted
    assert origins == {Origin.ACCEPTED, Origin.RECOVERED, Origin.BONUS}


def test_stats_add_up(tiny_target, tiny_draft):
    engine = Engine(tiny_target, ModelDrafter(tiny_draft, VOCAB))
    gen = engine.generate(PROMPTS[1], GenerationConfig(max_new_tokens=30, k=3))
    s = gen.stats
    assert s.generated == len(gen.token_ids) == 30
    assert sum(s.accepted_per_position) == s.accepted
    assert sum(s.drafted_per_position) == s.drafted
    assert s.tokens_per_round == pytest.approx(30 / s.rounds)
    assert gen.finish_reason == "length"


def test_cache_invariant_after_generation(tiny_target, tiny_draft):
    """After a round the target's cache holds the emitted text minus its last token."""
    drafter = ModelDrafter(tiny_draft, VOCAB)
    engine = Engine(tiny_target, drafter)
    prompt = PROMPTS[1]
    gen = engine.generate(prompt, GenerationConfig(max_new_tokens=17, k=4))
    total = len(prompt) + len(gen.token_ids)
    assert tiny_target.cache_len == total - 1 or gen.finish_reason == "length"
    assert tiny_draft.cache_len <= total - 1


def test_eos_stops_generation(tiny_target):
    expected = plain_greedy(tiny_target, PROMPTS[1], 20)
    eos = expected[5]
    engine = Engine(tiny_target, LookupDrafter(torch.device("cpu")), eos_token_ids=[eos])
    gen = engine.generate(PROMPTS[1], GenerationConfig(max_new_tokens=20, k=4))
    assert gen.token_ids == expected[: expected.index(eos) + 1]
    assert gen.finish_reason == "stop"
    ignored = engine.generate(PROMPTS[1], GenerationConfig(max_new_tokens=20, k=4, ignore_eos=True))
    assert ignored.token_ids == expected


def test_stop_string_stops_generation(tiny_target):
    expected = plain_greedy(tiny_target, PROMPTS[1], 20)
    decode = lambda ids: " ".join(f"t{i}" for i in ids)  # noqa: E731
    engine = Engine(tiny_target, LookupDrafter(torch.device("cpu")), decode=decode)
    gen = engine.generate(PROMPTS[1], GenerationConfig(max_new_tokens=20, k=4, stop=(f"t{expected[6]}",)))
    assert gen.token_ids == expected[: expected.index(expected[6]) + 1]
    assert gen.finish_reason == "stop"


def test_breaking_the_stream_stops_early(tiny_target):
    engine = Engine(tiny_target, LookupDrafter(torch.device("cpu")))
    gen = engine.stream(PROMPTS[0], GenerationConfig(max_new_tokens=50, k=4))
    for i, _ in enumerate(gen):
        if i == 3:
            break
    gen.close()
    assert len(gen.token_ids) == 4 and gen.finish_reason is None


def test_a_target_whose_verify_rows_differ_from_its_steps_is_refused(tiny_target, monkeypatch):
    """The engine asks the CausalLM interface, not the backend's internals, and says why in one line."""
    from specdec.errors import SpecdecError

    assert tiny_target.verify_rows_match_steps  # the interface's default
    monkeypatch.setattr(type(tiny_target), "verify_rows_match_steps", property(lambda self: False))
    with pytest.raises(SpecdecError, match="cannot be a target"):
        Engine(tiny_target, NoDrafter(torch.device("cpu")))
