"""Structured output in a batch, on the embedded model's real tokenizer (49152 tokens, a tiny random
Llama over it): every finished output validates against its JSON schema (jsonschema), greedy sequences
equal plain constrained decoding, and a seeded sampled sequence is the same alone and in company (rule 6)."""

import json

import jsonschema
import pytest
import torch

from specdec.engine.batched import BatchConfig, BatchedEngine
from specdec.constraints import ConstraintSpec
from specdec.constraints.grammar import GrammarCompiler
from specdec.drafters import LookupDrafter
from specdec.generation import GenerationConfig
from specdec.models.native_slots import NativeSlots
from specdec.sampling import SamplingParams
from tests.grammar_toy import plain_constrained_greedy
from tests.helpers_tiny import default_tokenizer_random_llama

SCHEMAS = [
    {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
     "required": ["ok", "n"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
     "required": ["color", "tags"], "additionalProperties": False},
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 4}}, "required": ["name"],
     "additionalProperties": False},
]
MAX_NEW = 40


@pytest.fixture(scope="module")
def setup():
    tokenizer, model = default_tokenizer_random_llama()
    grammars = GrammarCompiler(tokenizer, model.config.vocab_size)
    return tokenizer, model, grammars


def make_engine(model, tokenizer, grammars, slots: int) -> BatchedEngine:
    target = NativeSlots.from_hf(model, "tiny", max_slots=slots, max_length=256)
    return BatchedEngine(target, lambda: LookupDrafter(torch.device("cpu")), eos_token_ids=[tokenizer.eos_token_id],
                         decode=tokenizer.decode, config=BatchConfig(prefill_chunk=8), grammars=grammars)


def prompts(tokenizer) -> list[list[int]]:
    texts = ["Give a JSON answer.", "Colour of the sky as JSON, with tags", "A name, in JSON please: Bob"]
    return [tokenizer.encode(t) for t in texts]


def config(i: int, sampled: bool) -> GenerationConfig:
    sampling = SamplingParams(temperature=1.0, seed=100 + i) if sampled else SamplingParams()
    return GenerationConfig(max_new_tokens=MAX_NEW, k=4, sampling=sampling,
                            constraint=ConstraintSpec.json_schema(SCHEMAS[i % len(SCHEMAS)]))


def plain_greedy(model, grammars, cfg: GenerationConfig, prompt: list[int]) -> list[int]:
    """Plain constrained greedy decoding of the transformers model, the whole text afresh each step."""
    def next_logits(ids):
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0, -1]
    return plain_constrained_greedy(next_logits, grammars.matcher(cfg.constraint), prompt, MAX_NEW)


def test_batched_outputs_validate_and_greedy_equals_plain(setup):
    tokenizer, model, grammars = setup
    engine = make_engine(model, tokenizer, grammars, slots=3)
    jobs = [(p, config(i, sampled=i >= 3)) for i, p in enumerate(prompts(tokenizer) * 2)]
    handles = [engine.submit(p, c) for p, c in jobs]
    engine.run()
    finished = 0
    for (prompt, cfg), handle in zip(jobs, handles):
        result = handle.result()
        if result.finish_reason == "stop":
            finished += 1
            jsonschema.validate(json.loads(tokenizer.decode(result.token_ids, skip_special_tokens=True)),
                                cfg.constraint.schema)
        if cfg.sampling.greedy:
            assert list(result.token_ids) == plain_greedy(model, grammars, cfg, prompt)
    assert finished >= 4  # bounded schemas: a random model finishes most documents within MAX_NEW


def test_a_seeded_constrained_sequence_is_the_same_alone_and_in_company(setup):
    tokenizer, model, grammars = setup
    prompt = prompts(tokenizer)[1]
    alone = make_engine(model, tokenizer, grammars, slots=1).generate([prompt], config(1, sampled=True))[0]
    engine = make_engine(model, tokenizer, grammars, slots=3)
    others = [engine.submit(p, config(i, sampled=True)) for i, p in enumerate(prompts(tokenizer))]
    mine = engine.submit(prompt, config(1, sampled=True))
    engine.run()
    assert mine.result().token_ids == alone.token_ids
    assert all(h.done for h in others)


def test_under_the_auto_policy_greedy_still_equals_plain(setup):
    """The server's default policy (K per sequence per step, 0 included) around the grammar's drafts."""
    from specdec.engine.controller import Auto

    tokenizer, model, grammars = setup
    target = NativeSlots.from_hf(model, "tiny", max_slots=3, max_length=256)
    engine = BatchedEngine(target, lambda: LookupDrafter(torch.device("cpu")), eos_token_ids=[tokenizer.eos_token_id],
                           decode=tokenizer.decode, grammars=grammars,
                           config=BatchConfig(prefill_chunk=8, speculation=Auto(4)))
    jobs = [(p, config(i, sampled=False)) for i, p in enumerate(prompts(tokenizer))]
    handles = [engine.submit(p, c) for p, c in jobs]
    engine.run()
    for (prompt, cfg), handle in zip(jobs, handles):
        assert list(handle.result().token_ids) == plain_greedy(model, grammars, cfg, prompt)


def test_the_grammar_drafts_the_forced_text_that_the_fast_forward_tokens_hold_back(setup):
    """Before a string value llguidance's fast-forward tokens stop short of the forced `":"` (a token
    the value's text could merge into); the grammar drafts it too, as the tokenizer writes it."""
    from specdec.constraints.sequence import SequenceConstraint

    tokenizer, model, grammars = setup
    spec = ConstraintSpec.json_schema(SCHEMAS[2])

    def constraint(ll_tokenizer):
        return SequenceConstraint(grammars.matcher(spec), model.config.vocab_size, torch.device("cpu"),
                                  ll_tokenizer=ll_tokenizer)

    fast_forward = grammars.matcher(spec).compute_ff_tokens()
    assert constraint(None).grammar_draft(8) == fast_forward
    drafted = constraint(grammars.ll_tokenizer).grammar_draft(8)
    assert len(drafted) > len(fast_forward) and drafted[:len(fast_forward)] == fast_forward
    assert tokenizer.decode(drafted) == '{"name":"'
    assert constraint(grammars.ll_tokenizer).grammar_draft(len(fast_forward)) == fast_forward  # the limit holds


def test_the_grammars_drafts_leave_the_drafter_its_whole_budget(setup):
    """Forced tokens are free: after them the drafter may still propose its K, within the room."""
    from specdec.constraints.rounds import grammar_drafts
    from specdec.constraints.sequence import SequenceConstraint

    tokenizer, model, grammars = setup
    spec = ConstraintSpec.json_schema(SCHEMAS[2])

    def constraint():
        return SequenceConstraint(grammars.matcher(spec), model.config.vocab_size, torch.device("cpu"),
                                  ll_tokenizer=grammars.ll_tokenizer)

    forced, ks = grammar_drafts([constraint(), None], [4, 4], [4, 4], [50, 50])
    assert tokenizer.decode(forced[0]) == '{"name":"' and forced[1] == [] and ks == [4, 4]
    room = len(forced[0]) + 1
    again, ks = grammar_drafts([constraint()], [4], [4], [room])
    assert again == forced[:1] and ks == [1]
