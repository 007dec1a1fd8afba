"""The verify masks computed beside the target's pass (constraints.overlap): the same bits as the
matcher's masks one position at a time, the matchers left where they were, the work done in the
worker thread while the forward runs, and the same tokens as the masks computed in line."""

import threading

import pytest
import torch

from specdec.constraints import masking, overlap
from specdec.constraints.grammar import GrammarCompiler
from specdec.constraints.sequence import SequenceConstraint
from specdec.drafters import Draft
from specdec.engine import GenerationConfig
from tests.grammar_toy import VOCAB, only_token, toy_tokenizer
from tests.test_structured import SPECS, PROMPTS, make_engine

DOC = [15, 3, 16, 10, 5, 13, 10, 12, 10, 4, 16, 6, 9]  # {"a":"cab","b":0} in the toy's tokens


@pytest.fixture(scope="module")
def grammars() -> GrammarCompiler:
    return GrammarCompiler(toy_tokenizer(), VOCAB)


def one_by_one(matcher, tokens: list[int], words: int) -> torch.Tensor:
    """The masks along tokens, int32 [len(tokens) + 1, W], one fill a position; the matcher ends where it began."""
    import llguidance.torch

    rows = torch.zeros(len(tokens) + 1, words, dtype=torch.int32)
    for j in range(len(tokens) + 1):
        llguidance.torch.fill_next_token_bitmask(matcher, rows, j)
        if j < len(tokens):
            assert matcher.consume_token(tokens[j])
    matcher.rollback(len(tokens))
    return rows


def constraint_at(grammars, spec, done: list[int], draft: list[int]) -> SequenceConstraint:
    """A constraint that has emitted `done` and fitted the one-hot draft `draft` (the grammar drafts nothing)."""
    constraint = SequenceConstraint(grammars.matcher(spec), VOCAB, torch.device("cpu"), grammar_drafts=False)
    assert constraint.matcher.consume_tokens(done) or not done
    constraint.grammar_draft(len(draft))
    fitted = constraint.fit_draft(Draft(torch.tensor(draft)), torch.Generator())
    assert fitted.tokens.tolist() == draft
    return constraint


def test_the_batch_masks_equal_the_masks_one_position_at_a_time(grammars):
    spec = SPECS[2]
    cases = [(DOC[:1], DOC[1:5]), (DOC[:7], []), (DOC[:8], DOC[8:])]  # the last draft ends the document
    constraints = [constraint_at(grammars, spec, done, draft) for done, draft in cases]
    rows = overlap.verify_bits(constraints)
    words = constraints[0].mask_words
    for (done, draft), constraint, bits in zip(cases, constraints, rows):
        assert bits.shape == (len(draft) + 1, words)
        reference = grammars.matcher(spec)
        assert reference.consume_tokens(done)
        assert torch.equal(bits, one_by_one(reference, draft, words))
        assert reference.consume_tokens(draft)  # the constraint's matcher is after the draft again, as the reference
        assert torch.equal(one_by_one(constraint.matcher, [], words), one_by_one(reference, [], words))
        assert constraint.single_rows == [only_token(row) is not None for row in bits]
    assert constraints[2].stopped and sum(constraints[0].single_rows) >= 1  # '":' follows the key 'a'


def test_the_masks_are_computed_in_the_worker_while_the_caller_goes_on(grammars, monkeypatch):
    seen, release = {}, threading.Event()

    def slow_bits(constraints):
        seen["thread"] = threading.current_thread().name
        release.wait(timeout=10)  # the caller must reach result() only after setting it
        return real(constraints)

    real = overlap.verify_bits
    monkeypatch.setattr(overlap, "verify_bits", slow_bits)
    constraint = constraint_at(grammars, SPECS[2], DOC[:1], DOC[1:4])
    job = overlap.MaskJob([None, constraint])
    release.set()  # had the job run in this thread, it would have waited its whole timeout before this line
    masks = job.result()
    assert seen["thread"].startswith("specdec-masks")
    assert masks[0] is None and masks[1].shape == (4, VOCAB) and masks[1].dtype == torch.bool  # a host target's
    assert constraint.overlapped_seconds > 0


def test_masks_in_line_give_the_same_tokens_as_overlapped(grammars):
    inline = GrammarCompiler(toy_tokenizer(), VOCAB, overlap_masks=False)
    for spec in SPECS:
        for prompt in PROMPTS:
            config = GenerationConfig(max_new_tokens=14, k=3, constraint=spec)
            a = make_engine("model", grammars).generate(prompt, config)
            b = make_engine("model", inline).generate(prompt, config)
            assert a.token_ids == b.token_ids
            assert a.stats.constraint_overlapped_time > 0 and b.stats.constraint_overlapped_time == 0
