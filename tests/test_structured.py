"""Structured output under speculation is exact (rule 8): greedy tokens equal plain constrained
decoding, sampled outputs follow the masked p (chi-square), and the faults that break it are caught.

A toy byte-level tokenizer of 17 tokens (tests/grammar_toy.py) and order-2 Markov models make every
generation cheap and every finite grammar's outputs enumerable.
"""

import math
import re

import pytest
import torch

from specdec import faults
from specdec.constraints import ConstraintSpec, masking
from specdec.constraints.grammar import GrammarCompiler
from specdec.drafters import LookupDrafter, ModelDrafter, NoDrafter
from specdec.engine import Engine, GenerationConfig
from specdec.constraints.sequence import ConstraintBroken
from specdec.errors import InvalidRequestError
from specdec.sampling import SamplingParams
from tests.grammar_toy import EOS, VOCAB, exact_outputs, only_token, plain_constrained_greedy, toy_tokenizer
from tests.markov import MarkovLM
from tests.test_exactness import goodness_of_fit

SPECS = [ConstraintSpec.regex("[ab]{1,3}c"), ConstraintSpec.regex("(ab|ba|c)+0"),
         ConstraintSpec.json_schema({"type": "object", "properties": {"a": {"enum": ["ab", "b", "cab"]},
                                                                       "b": {"type": "integer", "maximum": 1}},
                                     "required": ["a", "b"], "additionalProperties": False})]
PROMPTS = [[3, 4], [13, 5, 6], [1]]


@pytest.fixture(scope="module")
def grammars() -> GrammarCompiler:
    return GrammarCompiler(toy_tokenizer(), VOCAB)


def make_engine(kind: str, grammars, sharpness: float = 2.0) -> Engine:
    target = MarkovLM(VOCAB, seed=0, sharpness=sharpness, name="target")
    drafter = {"model": lambda: ModelDrafter(MarkovLM(VOCAB, seed=1, name="draft"), VOCAB),
               "lookup": lambda: LookupDrafter(torch.device("cpu"), max_ngram=1),
               "none": lambda: NoDrafter(torch.device("cpu"))}[kind]()
    return Engine(target, drafter, eos_token_ids=[EOS], grammars=grammars)


def greedy_identical(engine: Engine, grammars, k: int = 3, max_new: int = 14) -> bool:
    """Every spec and prompt: the engine's greedy tokens equal plain constrained decoding's; a broken
    matcher (ConstraintBroken) counts as a mismatch."""
    for spec in SPECS:
        for prompt in PROMPTS:
            config = GenerationConfig(max_new_tokens=max_new, k=k, constraint=spec)
            try:
                got = engine.generate(prompt, config).token_ids
            except ConstraintBroken:
                return False
            want = plain_constrained_greedy(engine.target.next_logits, grammars.matcher(spec), prompt, max_new)
            if got != want:
                return False
    return True


@pytest.mark.parametrize("kind", ["model", "lookup", "none"])
def test_greedy_equals_plain_constrained_decoding(kind, grammars):
    assert greedy_identical(make_engine(kind, grammars), grammars)


def test_greedy_identity_catches_a_matcher_not_rolled_back(grammars):
    with faults.inject("skip-matcher-rollback"):
        assert not greedy_identical(make_engine("model", grammars), grammars)


HOT = SamplingParams(temperature=1.0)
WARPED = SamplingParams(temperature=0.8, top_k=3, top_p=0.9)


def sampled_outputs(engine: Engine, spec: ConstraintSpec, samples: int, k: int = 2, max_new: int = 4,
                    params: SamplingParams = HOT) -> dict:
    counts: dict[tuple, int] = {}
    for i in range(samples):
        config = GenerationConfig(max_new_tokens=max_new, k=k, constraint=spec, sampling=SamplingParams(
            temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=i))
        out = tuple(engine.generate([3, 4], config).token_ids)
        counts[out] = counts.get(out, 0) + 1
    return counts


FINITE = ConstraintSpec.regex("[ab]{1,3}")


@pytest.mark.parametrize("kind, params", [("model", HOT), ("lookup", HOT), ("model", WARPED)],
                         ids=["model-t1", "lookup-t1", "model-topk-topp"])
def test_sampled_outputs_follow_the_masked_target(kind, params, grammars):
    """Temperature, top-k and top-p act on the allowed tokens: the reference masks the logits, then warps."""
    engine = make_engine(kind, grammars, sharpness=1.0)
    exact = exact_outputs(engine.target.next_logits, grammars.matcher(FINITE), [3, 4], 4, params)
    assert goodness_of_fit(sampled_outputs(engine, FINITE, 2500, params=params), exact) > 1e-3


def test_chi_square_catches_q_left_unmasked(grammars):
    engine = make_engine("model", grammars, sharpness=1.0)
    exact = exact_outputs(engine.target.next_logits, grammars.matcher(FINITE), [3, 4], 4, HOT)
    with faults.inject("constraint-unmasked-q"):
        counts = sampled_outputs(engine, FINITE, 2500)
    assert goodness_of_fit(counts, exact) < 1e-4


def test_the_grammar_drafts_without_a_drafter(grammars):
    """With no drafter at all, the tokens a JSON schema dictates come as drafts and are kept: fewer
    rounds than tokens."""
    engine = make_engine("none", grammars)
    gen = engine.generate([3, 4], GenerationConfig(max_new_tokens=30, k=4, constraint=SPECS[2]))
    assert gen.finish_reason == "stop"
    assert gen.stats.grammar_drafted > 0 and gen.stats.grammar_accepted > 0
    assert gen.stats.rounds < len(gen.token_ids)


def test_output_ends_where_the_grammar_ends(grammars):
    """A regex matched in full stops the sequence (finish 'stop'), even with ignore_eos."""
    engine = make_engine("model", grammars)
    gen = engine.generate([3], GenerationConfig(max_new_tokens=20, k=3, ignore_eos=True,
                                                constraint=ConstraintSpec.regex("ab0")))
    assert gen.finish_reason == "stop"
    assert toy_tokenizer().decode(gen.token_ids) == "ab0"


@pytest.mark.parametrize("spec, words", [
    (ConstraintSpec.regex("[ab"), "regex"),
    (ConstraintSpec.grammar("start: nothing_defined"), "grammar"),
    (ConstraintSpec.json_schema({"type": "objekt"}), "type"),
])
def test_a_bad_constraint_says_what_is_wrong(spec, words, grammars):
    with pytest.raises(InvalidRequestError, match=words):
        grammars.compile(spec)


def test_a_schema_that_is_not_json_is_refused():
    with pytest.raises(InvalidRequestError, match="not valid JSON"):
        ConstraintSpec.json_schema("{'type': 'object'}")


def test_an_engine_without_grammars_refuses_a_constraint():
    engine = Engine(MarkovLM(VOCAB, seed=0), NoDrafter(torch.device("cpu")))
    with pytest.raises(InvalidRequestError, match="grammars"):
        engine.generate([3], GenerationConfig(max_new_tokens=4, constraint=FINITE))


def test_unpacked_bitmask_agrees_with_the_bit_reads():
    bits = torch.randint(-2**31, 2**31 - 1, (3, 2), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    allowed = masking.unpack_bitmask(bits, 60)
    assert allowed.shape == (3, 60)
    for r in range(3):
        assert [masking.token_allowed(bits[r], t) for t in range(60)] == allowed[r].tolist()


def test_the_device_unpacking_equals_the_host_one():
    bits = torch.randint(-2**31, 2**31 - 1, (4, 3), dtype=torch.int32, generator=torch.Generator().manual_seed(1))
    bits[2] = 0  # a row after the end: everything allowed
    for vocab in (70, 96, 130):
        assert torch.equal(masking.unpack_on_device(bits, vocab), masking.unpack_bitmask(bits, vocab))
    assert masking.unpack_bitmask(bits, 130)[:, 96:].sum() == 130 - 96  # past the bitmask only the empty row


def test_only_token_finds_a_single_allowed_token():
    bits = torch.zeros(3, dtype=torch.int32)
    assert only_token(bits) is None
    bits[2] = 1 << 5
    assert only_token(bits) == 69
    bits[0] = 1
    assert only_token(bits) is None
    bits[:] = 0
    bits[1] = -2**31  # bit 31
    assert only_token(bits) == 63


def test_an_empty_mask_row_allows_everything():
    """A row after the grammar's end allows nothing; unpacked it allows all (its draw is never emitted)."""
    assert masking.unpack_bitmask(torch.zeros(1, 2, dtype=torch.int32), 40).all()


def test_mask_logits_touches_only_constrained_rows():
    logits = torch.randn(5, 8)
    mask = torch.zeros(3, 8, dtype=torch.bool)
    mask[:, 2] = True
    out = masking.mask_logits(logits, [0, 2, 5], [None, mask])
    assert torch.equal(out[:2], logits[:2])
    assert torch.isinf(out[2:]).sum() == 3 * 7 and torch.equal(out[2:, 2], logits[2:, 2])


def test_a_sampled_draft_row_follows_the_masked_q():
    """Drawing from q, then settle_draft_row, gives tokens distributed as q restricted to the mask."""
    q = torch.tensor([0.4, 0.1, 0.2, 0.3])
    allowed = torch.tensor([False, True, True, False])
    gen = torch.Generator().manual_seed(0)
    counts = [0] * 4
    for _ in range(4000):
        token = int(torch.multinomial(q, 1, generator=gen))
        kept, q_row, _ = masking.settle_draft_row(token, bool(allowed[token]), q, allowed, gen)
        counts[kept] += 1
        assert torch.allclose(q_row, torch.tensor([0.0, 1 / 3, 2 / 3, 0.0]))
    assert counts[0] == counts[3] == 0
    exact = {(1,): 1 / 3, (2,): 2 / 3}
    assert goodness_of_fit({(1,): counts[1], (2,): counts[2]}, exact) > 1e-3


def test_a_gbnf_grammar_is_read_as_lark_is(grammars):
    engine = make_engine("model", grammars)
    for text in ('root ::= "{" item ("," item)* "}"\nitem ::= "a" | "b"', 'start: "{" item ("," item)* "}"\nitem: "a" | "b"'):
        gen = engine.generate([3], GenerationConfig(max_new_tokens=12, k=3, constraint=ConstraintSpec.grammar(text)))
        out = toy_tokenizer().decode(gen.token_ids)
        assert re.fullmatch(r"\{[ab](,[ab])*\}", out) or gen.finish_reason == "length", out


def test_logprobs_under_a_constraint_are_of_the_masked_p(grammars):
    """Every reported alternative is a token the grammar allowed, and the probabilities sum to 1 over them."""
    engine = make_engine("none", grammars)
    tokens = list(engine.stream([3, 4], GenerationConfig(max_new_tokens=3, k=2, logprobs=VOCAB, constraint=FINITE)))
    assert tokens and all(t.top_logprobs for t in tokens)
    first = tokens[0]
    allowed = {3, 4, 13, 14}  # a, b, ab, ba: what [ab]{1,3} allows first
    assert {i for i, _ in first.top_logprobs} <= allowed
    assert sum(math.exp(lp) for _, lp in first.top_logprobs) == pytest.approx(1.0, abs=1e-5)
