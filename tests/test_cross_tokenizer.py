"""Drafts of another tokenizer (docs/drafts.md): re-encoded text and shared-token intersection, exactly.

Tokenizers: two word-level ones (tests/helpers_tiny.py) of the same words in another order, a
byte-level BPE (GPT-2's Ġ spaces, bytes of characters it never merged) and a SentencePiece-style BPE
(Metaspace's ▁), both trained here on a small corpus. The chi-square tests run on word-level pairs,
whose small vocabularies make the target's exact joint distribution enumerable; there the draft is
the target's own weights with its rows moved to the draft's ids (so it predicts the target's text
and many drafts are kept), plus two words of its own that the target cannot write.
"""

from __future__ import annotations

import pytest
import torch

from specdec import faults
from specdec.drafters import make_drafter
from specdec.drafters.cross_tokenizer import (ForeignDraft, IntersectionDrafter, TextDrafter, encode, reencode,
                                              text_after)
from specdec.drafters.model import DraftSlots
from specdec.drafters.none import NoDrafter
from specdec.engine import Engine, GenerationConfig
from specdec.models.loader import load_model
from specdec.models.slots import own_cache_slot
from specdec.sampling import SamplingParams
from tests.helpers_tiny import SPECIAL, tiny_model_dir, tiny_tokenizer
from tests.test_exactness import goodness_of_fit

CPU = torch.device("cpu")
CORPUS = ["the cat sat on the mat", "hello world, hello there", "a dog and a cat", "café au lait — très bon",
          "the sun and the sea", "one two three four five", "hello hello hello world"] * 20
WORDS = ["the", "a", "cat", "dog", "sun", "sea"]
OWN = ["moon", "star"]  # the permuted draft's words the target lacks


def trained_bpe(byte_level: bool, vocab_size: int):
    """A BPE tokenizer trained on CORPUS: byte-level (Ġ, every byte a token) or Metaspace (▁, <unk>)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None if byte_level else "<unk>"))
    if byte_level:
        tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    alphabet = pre_tokenizers.ByteLevel.alphabet() if byte_level else []
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                                        initial_alphabet=alphabet))
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


@pytest.fixture(scope="module")
def bpe():
    return trained_bpe(True, 320)


@pytest.fixture(scope="module")
def spm():
    return trained_bpe(False, 120)


def words_target_dir(path):
    """A word-level target that seldom writes a special token (their LM-head rows zero): drafts,
    which end at a special token, then reach further."""
    from transformers import LlamaForCausalLM

    tiny_model_dir(path, seed=0, layers=1, hidden=16, scale=10.0, words=WORDS)
    model = LlamaForCausalLM.from_pretrained(path)
    with torch.no_grad():
        model.lm_head.weight[:len(SPECIAL)] = 0.0
    model.save_pretrained(path)
    return str(path)


def permuted_draft_dir(target_dir, path, words: list[str]):
    """The target's weights over a word-level tokenizer of `words`: each shared word's embedding and
    LM-head rows moved to its draft id; a word of its own reads as 'cat' and is written as often."""
    from transformers import LlamaForCausalLM

    target = LlamaForCausalLM.from_pretrained(target_dir)
    old, new = tiny_tokenizer(WORDS).get_vocab(), tiny_tokenizer(words)
    config = target.config
    config.vocab_size = len(new)
    draft = LlamaForCausalLM(config)
    draft.load_state_dict({k: v for k, v in target.state_dict().items() if "embed" not in k and "lm_head" not in k},
                          strict=False)
    with torch.no_grad():
        for word, i in new.get_vocab().items():
            j = old.get(word, old["cat"])
            draft.model.embed_tokens.weight[i] = target.model.embed_tokens.weight[j]
            draft.lm_head.weight[i] = target.lm_head.weight[j]
    draft.save_pretrained(path)
    new.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, bpe, spm):
    root = tmp_path_factory.mktemp("xtok")
    words = words_target_dir(root / "words")
    return {"words": words,
            "permuted": permuted_draft_dir(words, root / "permuted", list(reversed(WORDS)) + OWN),
            "bpe": str(tiny_model_dir(root / "bpe", seed=1, layers=1, hidden=16, tokenizer=bpe)),
            "spm": str(tiny_model_dir(root / "spm", seed=2, layers=1, hidden=16, tokenizer=spm))}


# --- the re-encoding, edge case by edge case -------------------------------------------------------

def continues(tokenizer, context: list[int], new: list[int], text: str) -> bool:
    """Whether target ids `new` after `context` write exactly `text` after the context's text."""
    before = tokenizer.decode(context, clean_up_tokenization_spaces=False)
    return tokenizer.decode(context + new, clean_up_tokenization_spaces=False) == before + text


@pytest.mark.parametrize("name", ["bpe", "spm"])
def test_reencode_gives_a_strict_continuation(name, request):
    tok = request.getfixturevalue(name)
    context = encode(tok, "a dog and a cat")
    new = reencode(tok, context, " sat on the mat")
    assert new and continues(tok, context, new, " sat on the mat")
    assert context + new == encode(tok, "a dog and a cat sat on the mat")


def test_reencode_drops_a_text_that_merges_with_the_last_token(bpe):
    context = encode(bpe, "the hel")  # ... 'Ġ', 'he', 'l': with "lo" the text is 'Ġhello', not an extension
    assert encode(bpe, "the hello")[:len(context)] != context
    assert reencode(bpe, context, "lo world") == []


def test_reencode_after_a_context_that_does_not_round_trip(bpe):
    spelled = [i for ch in " hello" for i in encode(bpe, ch)]  # ' hello' byte by byte: not BPE's ids
    context = encode(bpe, "the") + spelled
    assert encode(bpe, bpe.decode(context)) != context
    new = reencode(bpe, context, " world")
    assert new == encode(bpe, " world") and continues(bpe, context, new, " world")


def test_reencode_never_proposes_special_tokens(bpe, spm):
    for tok in (bpe, spm):
        context = encode(tok, "a cat")
        new = reencode(tok, context, " sat</s> on<user> the")
        assert new and tok.eos_token_id not in new and continues(tok, context, new, " sat")


def test_reencode_waits_for_a_context_ending_mid_character(bpe):
    context = encode(bpe, "the 日")
    assert len(encode(bpe, "日")) == 3  # three byte tokens: none of them a character alone
    assert reencode(bpe, context[:-1], " cat") == []


def test_text_after_drops_a_half_character_tail(bpe):
    context = encode(bpe, "a cat")
    new = encode(bpe, "a cat sat 日")[len(context):]
    assert text_after(bpe, context, new) == " sat 日"
    assert text_after(bpe, context, new[:-1]) == " sat "  # the last byte of 日 missing: the tail goes


@pytest.mark.parametrize("name", ["bpe", "spm"])
def test_text_after_keeps_the_draft_tokenizers_spaces(name, request):
    tok = request.getfixturevalue(name)
    context = encode(tok, "the sun")
    new = encode(tok, "the sun and the sea")[len(context):]
    assert text_after(tok, context, new) == " and the sea"  # ▁and and Ġand both start with a space


def test_whitespace_conventions_cross_both_ways(bpe, spm):
    for draft, target in ((spm, bpe), (bpe, spm)):
        d_context, t_context = encode(draft, "hello world,"), encode(target, "hello world,")
        text = text_after(draft, d_context, encode(draft, "hello world, hello there")[len(d_context):])
        new = reencode(target, t_context, text)
        assert t_context + new == encode(target, "hello world, hello there")


def test_the_draft_stops_at_its_eos_and_rolls_back_to_the_common_prefix(dirs, spm, bpe):
    draft = load_model(dirs["spm"])
    foreign = ForeignDraft(DraftSlots(own_cache_slot(draft.model)), spm, bpe)
    foreign.begin()
    choices = iter([encode(spm, " cat")[0], spm.eos_token_id, 7])
    ids, chosen = foreign.run(encode(bpe, "the sun and"), 3, lambda logits: next(choices))
    assert chosen == encode(spm, " cat")[:1]  # EOS ended it: never proposed, never fed
    assert foreign.fed == ids + chosen and draft.model.cache_len == len(foreign.fed)
    ids2, chosen2 = foreign.run(encode(bpe, "the sun and the sea"), 2, lambda logits: 5)
    assert ids2[:len(ids)] == ids and ids2[len(ids)] != chosen[0]  # the draft's ' cat' was not the text
    assert foreign.fed == ids2 + chosen2[:-1] and draft.model.cache_len == len(foreign.fed)


# --- end to end: greedy identity, the distribution, the faults -------------------------------------

def plain_and_spec(target, drafter, prompt: list[int], config: GenerationConfig):
    plain = Engine(target.model, NoDrafter(CPU)).generate(prompt, config)
    spec = Engine(target.model, drafter).generate(prompt, config)
    return plain.token_ids, spec.token_ids, spec.stats


@pytest.mark.parametrize("target_name, draft_spec", [
    ("bpe", "spm"), ("spm", "bpe"), ("words", "permuted"), ("bpe", "intersect:spm"), ("spm", "intersect:bpe"),
    ("words", "intersect:permuted")])
def test_greedy_output_is_the_targets_token_for_token(dirs, target_name, draft_spec):
    target = load_model(dirs[target_name])
    prefix, _, name = draft_spec.rpartition(":")
    drafter = make_drafter(f"{prefix}:{dirs[name]}" if prefix else dirs[name], target)
    assert isinstance(drafter, IntersectionDrafter if prefix else TextDrafter)
    drafted = 0
    for text in ("<s> the cat sat on the", "hello wor", "café au", "日本 the sea"):
        prompt = encode(target.tokenizer, text)
        plain, spec, stats = plain_and_spec(target, drafter, prompt, GenerationConfig(max_new_tokens=24, k=3))
        assert spec == plain
        drafted += stats.drafted
    assert drafted > 0


def test_a_draft_of_the_targets_text_is_kept(dirs):
    """The permuted draft predicts the target's text in its own ids: mapped back, nearly all is kept."""
    target = load_model(dirs["words"])
    prompt = encode(target.tokenizer, "<s> the cat")
    for spec in (dirs["permuted"], f"intersect:{dirs['permuted']}"):
        config = GenerationConfig(max_new_tokens=30, k=3)
        _, _, stats = plain_and_spec(target, make_drafter(spec, target), prompt, config)
        assert stats.drafted > 10 and stats.accepted >= 0.8 * stats.drafted


V = len(SPECIAL) + len(WORDS)
HOT = SamplingParams(temperature=1.0)


def exact_joint(model, prompt: list[int], n_tokens: int) -> dict[tuple, float]:
    """P(the first n_tokens tokens) under the target at temperature 1, by enumeration."""
    out: dict[tuple, float] = {(): 1.0}
    for _ in range(n_tokens):
        out = {seq + (t,): prob * p.item() for seq, prob in out.items()
               for t, p in enumerate(torch.softmax(model.prefill(torch.tensor(prompt + list(seq)))[-1], -1))}
    return out


def sampled_joint(engine: Engine, prompt: list[int], n_tokens: int, samples: int) -> dict[tuple, int]:
    """How often each sequence of n_tokens came, over `samples` seeds (the drafts must be kept at times)."""
    counts: dict[tuple, int] = {}
    accepted = 0
    for i in range(samples):
        config = GenerationConfig(max_new_tokens=n_tokens, k=2, sampling=SamplingParams(temperature=1.0, seed=i))
        generation = engine.generate(prompt, config)
        seq = tuple(generation.token_ids)
        counts[seq] = counts.get(seq, 0) + 1
        accepted += generation.stats.accepted
    assert accepted > samples / 10  # one-hot proposals are kept with probability p(x) only
    return counts


@pytest.fixture(scope="module")
def words_target(dirs):
    target = load_model(dirs["words"])
    prompt = encode(target.tokenizer, "<s> the cat")
    return target, prompt, exact_joint(target.model, prompt, 3)


@pytest.mark.parametrize("prefix", ["", "intersect:"])
def test_sampled_output_follows_the_target(dirs, words_target, prefix):
    target, prompt, exact = words_target
    drafter = make_drafter(prefix + dirs["permuted"], target)
    engine = Engine(target.model, drafter)
    counts = sampled_joint(engine, prompt, 3, 1500)
    assert goodness_of_fit(counts, exact) > 1e-3


def test_the_distribution_test_catches_an_unnormalised_intersection_q(dirs, words_target):
    target, prompt, exact = words_target
    engine = Engine(target.model, make_drafter("intersect:" + dirs["permuted"], target))
    with faults.inject("intersection-unnormalised-q"):
        counts = sampled_joint(engine, prompt, 3, 1500)
    assert goodness_of_fit(counts, exact) < 1e-4


def test_unmapped_draft_ids_are_caught(dirs):
    """A draft of a smaller vocabulary fed the target's ids unmapped: greedy decoding fails loudly."""
    target = load_model(dirs["bpe"])
    prompt = encode(target.tokenizer, "hello world, hello there and the sea")
    with faults.inject("unmapped-draft-ids"):
        drafter = make_drafter(dirs["spm"], target)
    assert not isinstance(drafter, TextDrafter)
    with pytest.raises((IndexError, RuntimeError)):
        plain_and_spec(target, drafter, prompt, GenerationConfig(max_new_tokens=8, k=3))


def test_a_batch_drafts_with_forks_of_one_prototype(dirs):
    """`specdec serve`'s way: a DraftMenu's prototype over a slot model of the draft, one fork a sequence."""
    from specdec.drafters.registry import DraftMenu
    from specdec.engine.batched import BatchedEngine
    from specdec.errors import DraftSpecError
    from specdec.models.slots import slot_model_for

    target = load_model(dirs["bpe"])
    with pytest.raises(DraftSpecError, match="one sequence's cache"):
        make_drafter(dirs["spm"], target).fork()
    config = GenerationConfig(max_new_tokens=16, k=3)
    prompts = [encode(target.tokenizer, text) for text in ("the cat sat", "hello wor", "café au lait")]
    plain = [plain_and_spec(target, NoDrafter(CPU), p, config)[0] for p in prompts]
    menu = DraftMenu(target, max_slots=3)
    for spec in (dirs["spm"], "intersect:" + dirs["spm"]):
        engine = BatchedEngine(slot_model_for(target.model, 3), menu.factory(spec))
        results = engine.generate(prompts, config)
        assert [list(r.token_ids) for r in results] == plain
        assert sum(r.stats.drafted for r in results) > 0
