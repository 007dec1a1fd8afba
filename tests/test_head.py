"""The draft head drafter (and lookup+head): exact output, save/load, resumable training, registry."""

import pytest
import torch

from specdec.drafters import LookupDrafter, make_drafter
from specdec.drafters.combined import LookupThenHead
from specdec.drafters.head import DraftHead, HeadDrafter, config_for_target, target_parts
from specdec.engine import Engine, GenerationConfig, Origin
from specdec.errors import DraftSpecError, ModelLoadError
from specdec.models.loader import LoadedModel
from specdec.sampling import SamplingParams
from specdec.train.trainer import TrainConfig, collate, fit, sub_vocab_index, unrolled_features
from tests.conftest import tiny_llama
from tests.test_engine_greedy import PROMPTS, plain_greedy
from tests.test_exactness import HOT, WARPED, exact_joint, goodness_of_fit, sampled_joint

CPU = torch.device("cpu")


def examples_from(model, prompts: list[list[int]], new_tokens: int = 16, top_k: int = 4,
                  layers: tuple[int, ...] = ()) -> list[dict]:
    """Training examples (the format of specdec.train.data) from a model's own greedy answers."""
    out = []
    for prompt in prompts:
        ids = list(prompt) + plain_greedy(model, prompt, new_tokens)
        model.reset()
        logits, hidden = model.forward_with_hidden(torch.tensor(ids[:-1]), layers)  # [n-1, V], [n-1, W]
        top = torch.softmax(logits[len(prompt) - 1:], -1).topk(top_k)
        out.append({"ids": torch.tensor(ids, dtype=torch.int32), "features": hidden.to(torch.bfloat16),
                    "start": len(prompt), "top_ids": top.indices.int(), "top_p": top.values.half(),
                    "layers": torch.tensor(layers, dtype=torch.int32)})
    return out


def train_head(model, draft_vocab: int, steps: int, tmp_path, layers: tuple[int, ...] = (), **kw) -> DraftHead:
    prompts = [[(7 * i + j) % model.vocab_size for j in range(3 + i % 4)] for i in range(8)]
    config = TrainConfig(steps=steps, batch_size=4, val_examples=2, eval_every=steps, ckpt_every=2, **kw)
    head, _ = fit(target_parts(model), config_for_target(model, draft_vocab, layers),
                  examples_from(model, prompts, layers=layers), config, tmp_path / "head.ckpt", progress=False,
                  log=lambda *_: None)
    return head


@pytest.fixture(scope="module")
def fused_head_path(tiny_target, tmp_path_factory):
    """A head that also reads the output of the tiny target's first layer (EAGLE-3 fused features)."""
    tmp = tmp_path_factory.mktemp("fused-head")
    head = train_head(tiny_target, draft_vocab=48, steps=6, tmp_path=tmp, layers=(0,))
    head.save(tmp / "head.safetensors")
    return tmp / "head.safetensors"


@pytest.fixture(scope="module")
def head_path(tiny_target, tmp_path_factory):
    """A head for the tiny target, trained for a few steps, drafting from 48 of its 64 ids."""
    tmp = tmp_path_factory.mktemp("head")
    head = train_head(tiny_target, draft_vocab=48, steps=6, tmp_path=tmp)
    head.save(tmp / "head.safetensors")
    return tmp / "head.safetensors"


def head_drafter(model, path, min_confidence: float = 0.0) -> HeadDrafter:
    return HeadDrafter(DraftHead.load(path), target_parts(model), min_confidence=min_confidence)


@pytest.mark.parametrize("k, min_confidence", [(1, 0.0), (3, 0.0), (6, 0.0), (6, 0.003)])
@pytest.mark.parametrize("kind", ["head", "lookup+head"])
def test_greedy_identity_with_head(tiny_target, head_path, kind, k, min_confidence):
    drafter = head_drafter(tiny_target, head_path, min_confidence)
    if kind == "lookup+head":
        drafter = LookupThenHead(LookupDrafter(CPU), drafter)
    engine = Engine(tiny_target, drafter)
    for prompt in PROMPTS:
        expected = plain_greedy(tiny_target, prompt, 30)
        assert engine.generate(prompt, GenerationConfig(max_new_tokens=30, k=k)).token_ids == expected


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("kind", ["head", "lookup+head"])
def test_greedy_identity_with_fused_head(tiny_target, fused_head_path, kind, k):
    drafter = head_drafter(tiny_target, fused_head_path)
    assert drafter.feature_layers == (0,)
    if kind == "lookup+head":
        drafter = LookupThenHead(LookupDrafter(CPU), drafter)
        assert drafter.feature_layers == (0,)
    engine = Engine(tiny_target, drafter)
    for prompt in PROMPTS:
        expected = plain_greedy(tiny_target, prompt, 30)
        assert engine.generate(prompt, GenerationConfig(max_new_tokens=30, k=k)).token_ids == expected


def test_output_follows_target_distribution_with_fused_head(tmp_path):
    target = tiny_llama(21, layers=2, hidden=16, vocab=5, scale=30.0)
    head = train_head(target, draft_vocab=4, steps=2, tmp_path=tmp_path, layers=(0,))
    counts = sampled_joint(Engine(target, HeadDrafter(head, target_parts(target))), HOT, k=2, samples=1000,
                           n_tokens=2)
    assert goodness_of_fit(counts, exact_joint(target, HOT, n_tokens=2)) > 1e-3


def test_fused_head_starts_as_the_final_feature_head(tiny_target):
    """Untrained, fuse passes the final-norm feature through: the lower layers' columns weigh zero,
    so the target's features and the head's own predicted feature enter the same way."""
    plain = DraftHead(config_for_target(tiny_target, 64))
    fused = DraftHead(config_for_target(tiny_target, 64, (0,)))
    fused.fc.load_state_dict(plain.fc.state_dict())
    feats, final, embeds = torch.randn(1, 5, 64), torch.randn(1, 5, 32), torch.randn(1, 5, 32)
    feats[..., 32:] = final
    with torch.no_grad():
        torch.testing.assert_close(fused.layer_inputs(feats, embeds)[0], plain.layer_inputs(final, embeds)[0])
        torch.testing.assert_close(fused.layer_inputs(final, embeds)[0], plain.layer_inputs(final, embeds)[0])
    assert fused.config.feature_width == 64 and config_for_target(tiny_target, 64, "auto").feature_layers == (0,)


def test_head_learns_the_target(tiny_target, tmp_path):
    """Trained a little longer on the target's own answers, the head's drafts get kept."""
    head = train_head(tiny_target, draft_vocab=64, steps=60, tmp_path=tmp_path, lr=3e-3)
    engine = Engine(tiny_target, HeadDrafter(head, target_parts(tiny_target)))
    gen = engine.stream([7, 14, 21, 28], GenerationConfig(max_new_tokens=40, k=3))
    origins = {t.origin for t in gen}
    assert gen.stats.accepted > 0 and Origin.ACCEPTED in origins


class RecordingHeadDrafter(HeadDrafter):
    """Remembers each round's drafts with the context length they were drafted at (the engine drafts
    through propose_batch, which propose calls too)."""

    @classmethod
    def propose_batch(cls, drafters, contexts, ks, params, generators):
        drafts = super().propose_batch(drafters, contexts, ks, params, generators)
        for drafter, context, draft in zip(drafters, contexts, drafts):
            drafter.rounds.append((len(context), draft.tokens.tolist()))
        return drafts


def drafts_checked_against_training(model, head, prompt: list[int], k: int) -> int:
    """Generate with the head, then assert each draft equals the trainer's prediction on the final
    text (see below); returns how many drafts were compared."""
    parts = target_parts(model)
    drafter = RecordingHeadDrafter(head, parts)
    drafter.rounds = []
    answer = Engine(model, drafter).generate(prompt, GenerationConfig(max_new_tokens=24, k=k)).token_ids
    text = prompt + answer
    model.reset()
    _, feats = model.forward_with_hidden(torch.tensor(text[:-1]), head.config.feature_layers)
    example = {"ids": torch.tensor(text), "features": feats, "start": len(prompt),
               "top_ids": torch.tensor(answer)[:, None], "top_p": torch.ones(len(answer), 1),
               "layers": torch.tensor(head.config.feature_layers)}
    batch = collate([example], sub_vocab_index(head.vocab_ids, model.vocab_size, "cpu"), 1 << 10,
                    head.config.feature_layers)
    lm_rows = head.lm_rows(parts).float()
    with torch.no_grad():
        predicted = [head.vocab_ids[(head.readout(h[0]) @ lm_rows.T).argmax(-1)].tolist()
                     for h in unrolled_features(head, parts, batch, k)]  # [step][pair]
    checked = 0
    for length, drafts in drafter.rounds:
        for j, token in enumerate(drafts):
            pair = length - 2 + j
            if pair >= len(predicted[j]):
                break
            assert token == predicted[j][pair], (prompt, length, j)
            checked += 1
            if token != text[length + j]:
                break
    return checked


@pytest.mark.parametrize("layers", [(), (0,)], ids=["eagle1", "fused"])
def test_drafts_are_what_training_predicts(tiny_target, tmp_path, layers):
    """In the engine, the head drafts exactly what the trainer's unrolled pass predicts on the same
    text: draft j of a round at context length L is step j+1's prediction at pair L-2+j (while the
    drafts before it were right). Catches any drift between the features, layers, tokens or
    positions the head was trained on and those the engine hands it."""
    head = train_head(tiny_target, draft_vocab=64, steps=60, tmp_path=tmp_path, layers=layers, lr=3e-3)
    checked = sum(drafts_checked_against_training(tiny_target, head, prompt, k=3)
                  for prompt in PROMPTS + [[7, 11, 13, 17, 19, 23], [3, 9, 27, 17, 51, 25, 11]])
    assert checked >= 40


@pytest.mark.parametrize("kind, params", [("head", HOT), ("lookup+head", WARPED)],
                         ids=["head-t1", "combined-topk-topp"])
def test_output_follows_target_distribution_with_head(tmp_path, kind, params):
    target = tiny_llama(20, layers=1, hidden=16, vocab=5, scale=30.0)
    head = train_head(target, draft_vocab=4, steps=2, tmp_path=tmp_path)  # one id can never be drafted
    drafter = HeadDrafter(head, target_parts(target))
    if kind == "lookup+head":
        drafter = LookupThenHead(LookupDrafter(CPU, max_ngram=1), drafter, min_match=1)  # both draft
    counts = sampled_joint(Engine(target, drafter), params, k=2, samples=1000, n_tokens=2)
    assert goodness_of_fit(counts, exact_joint(target, params, n_tokens=2)) > 1e-3


def test_confidence_stop_drafts_fewer_tokens_and_keeps_the_first(tiny_target, head_path):
    """min_confidence cuts a round once the head's product of probabilities falls below it; the
    first draft of a round is always made."""
    config = GenerationConfig(max_new_tokens=24, k=5)
    drafted, positions = {}, {}
    for min_confidence in (0.0, 0.003, 0.99):  # this head is unsure: 0.003 stops most rounds after two
        stats = Engine(tiny_target, head_drafter(tiny_target, head_path, min_confidence)).generate(
            PROMPTS[0], config).stats
        drafted[min_confidence] = stats.drafted / stats.rounds
        positions[min_confidence] = len([n for n in stats.drafted_per_position if n])
    assert drafted[0.0] > 4.0 and positions[0.0] == 5  # K = 5, less only where max_new_tokens caps a round
    assert positions[0.99] == 1  # a barely trained head is never 99% sure: first drafts only
    assert drafted[0.99] < drafted[0.003] < drafted[0.0]
    with pytest.raises(ValueError, match="min_confidence"):
        head_drafter(tiny_target, head_path, 1.0)


def test_confidence_stop_keeps_sampled_output_exact(tmp_path):
    target = tiny_llama(20, layers=1, hidden=16, vocab=5, scale=30.0)
    drafter = HeadDrafter(train_head(target, draft_vocab=5, steps=2, tmp_path=tmp_path), target_parts(target),
                          min_confidence=0.3)
    counts = sampled_joint(Engine(target, drafter), HOT, k=3, samples=1000, n_tokens=2)
    assert goodness_of_fit(counts, exact_joint(target, HOT, n_tokens=2)) > 1e-3


@pytest.mark.parametrize("fused", [False, True], ids=["eagle1", "fused"])
def test_save_load_round_trip(tiny_target, head_path, fused_head_path, tmp_path, fused):
    head = DraftHead.load(fused_head_path if fused else head_path)
    again_path = tmp_path / "again.safetensors"
    head.save(again_path)
    again = DraftHead.load(again_path)
    assert again.config == head.config
    for (name, a), (_, b) in zip(head.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name
    assert not any("embed" in n or "lm_head" in n for n in head.state_dict())  # the target's own are reused
    params = SamplingParams(temperature=1.0, seed=3)
    drafts = []
    for h in (head, again):
        drafter = HeadDrafter(h, target_parts(tiny_target))
        engine = Engine(tiny_target, drafter)
        drafts.append(engine.generate(PROMPTS[1], GenerationConfig(max_new_tokens=12, k=3, sampling=params)).token_ids)
    assert drafts[0] == drafts[1]


def test_resumed_training_ends_with_the_same_weights(tiny_target, tmp_path):
    prompts = [[i, i + 1, i + 2] for i in range(10)]
    examples = examples_from(tiny_target, prompts, new_tokens=10)
    parts, hc = target_parts(tiny_target), config_for_target(tiny_target, 64)
    config = TrainConfig(steps=6, batch_size=3, val_examples=2, eval_every=3, ckpt_every=100)
    quiet = dict(progress=False, log=lambda *_: None)
    straight, _ = fit(parts, hc, examples, config, tmp_path / "a.ckpt", **quiet)
    fit(parts, hc, examples, config, tmp_path / "b.ckpt", stop_at=4, **quiet)  # "interrupted" after step 4
    resumed, history = fit(parts, hc, examples, config, tmp_path / "b.ckpt", **quiet)
    assert [h["step"] for h in history] == [3, 6]
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.allclose(a, b, atol=1e-6), name


def test_registry_builds_head_and_combined(tiny_target, head_path):
    loaded = LoadedModel(tiny_target, tokenizer=None, name="tiny")
    assert isinstance(make_drafter(f"head:{head_path}", loaded), HeadDrafter)
    assert isinstance(make_drafter(f"lookup+head:{head_path}", loaded), LookupThenHead)
    with_confidence = make_drafter(f"lookup+head:{head_path}:0.25", loaded)
    assert with_confidence.head.min_confidence == 0.25 and with_confidence.head_max is None
    assert make_drafter(f"head:{head_path}", loaded).min_confidence == 0.0
    assert isinstance(make_drafter("auto", loaded), LookupDrafter)  # no shipped head for this target
    assert make_drafter(f"lookup+head:{head_path}", loaded).head_max == 2  # fp32 on a CPU: rows are dear
    with pytest.raises(ModelLoadError, match="not found"):
        make_drafter("head:/nonexistent/head.safetensors", loaded)


def test_head_drafts_full_rounds_where_verify_rows_are_cheap(tiny_target, head_path, monkeypatch):
    monkeypatch.setattr(type(tiny_target), "cheap_verify_rows", property(lambda self: True))
    loaded = LoadedModel(tiny_target, tokenizer=None, name="tiny")
    assert make_drafter(f"lookup+head:{head_path}", loaded).head_max is None


def test_min_confidence_suffix_parsing(tmp_path):
    from specdec.drafters.combined import split_confidence

    assert split_confidence("heads/h.safetensors:0.3") == ("heads/h.safetensors", 0.3)
    assert split_confidence("heads/h.safetensors") == ("heads/h.safetensors", None)  # None: the head's policy says
    odd = tmp_path / "epoch:3"
    odd.write_text("")
    assert split_confidence(str(odd)) == (str(odd), None)  # an existing file is a path, colon and all
    with pytest.raises(DraftSpecError, match=r"must be in \[0, 1\)"):
        split_confidence("heads/h.safetensors:1.5")


def test_head_for_another_target_is_refused(head_path):
    other = tiny_llama(5, layers=1, hidden=16, vocab=64)
    with pytest.raises(ModelLoadError, match="train a head for this target"):
        head_drafter(other, head_path)


def test_head_for_layers_the_target_lacks_is_refused(tiny_target, tmp_path):
    """A head that reads layer 5 of a 2-layer target is refused when it is loaded, naming the head."""
    from dataclasses import replace

    from specdec.drafters.head_loading import load_head_drafter

    config = replace(config_for_target(tiny_target, 48), feature_layers=(5,))
    DraftHead(config).save(tmp_path / "deep.safetensors")
    with pytest.raises(ModelLoadError, match=r"reads target layers \[5\].*2 layers"):
        load_head_drafter(str(tmp_path / "deep.safetensors"), tiny_target)


def test_fused_head_refuses_features_without_its_layers(tiny_target, fused_head_path):
    drafter = head_drafter(tiny_target, fused_head_path)
    tiny_target.reset()
    _, last_only = tiny_target.forward_with_hidden(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="reads 64 feature columns"):
        drafter.observe(last_only)


def test_resuming_a_checkpoint_of_other_feature_layers_is_refused(tiny_target, tmp_path):
    """The checkpoint's path depends only on --out: a run asking for other layers must not load it."""
    from specdec.errors import InvalidRequestError

    train_head(tiny_target, draft_vocab=48, steps=2, tmp_path=tmp_path, layers=())
    with pytest.raises(InvalidRequestError, match=r"different head \(eagle, feature layers \[\].*feature layers \[0\]"):
        train_head(tiny_target, draft_vocab=48, steps=2, tmp_path=tmp_path, layers=(0,))


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=1.0, seed=2)], ids=["greedy", "t1"])
def test_a_head_round_reads_the_device_once(tiny_target, head_path, count_reads, params):
    """The head drafts K tokens without waiting for the GPU (its ids are picked on the device)."""
    engine = Engine(tiny_target, head_drafter(tiny_target, head_path))
    before = count_reads()  # loading the head reads a few values
    gen = engine.generate(PROMPTS[0], GenerationConfig(max_new_tokens=20, k=3, sampling=params))
    assert gen.stats.drafted > gen.stats.rounds  # rounds of several drafts
    assert count_reads() - before == gen.stats.rounds


def _copy_with_card(path, tmp_path, name: str, **card) -> str:
    """A copy of the head at `path` whose file records `card` (HeadCard fields)."""
    import shutil

    from specdec.drafters.head import write_head_card
    from specdec.drafters.head_policy import HeadCard, HeadPolicy

    out = tmp_path / name
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, out)
    write_head_card(out, HeadCard(card.get("target"), card.get("policy", HeadPolicy())))
    return str(out)


def test_the_policy_in_the_head_file_drives_lookup_plus_head(tiny_target, head_path, tmp_path):
    from specdec.drafters.head import read_head_card
    from specdec.drafters.head_policy import HeadPolicy

    policy = HeadPolicy(min_confidence=0.0, greedy_head_max={"dear-rows": 1}, sampled_head_max={"dear-rows": 3},
                        lookup_when_sampling=False)
    path = _copy_with_card(head_path, tmp_path, "policy.safetensors", policy=policy)
    assert read_head_card(path).policy == policy  # the card survives the file
    loaded = LoadedModel(tiny_target, tokenizer=None, name="tiny")
    drafter = make_drafter(f"lookup+head:{path}", loaded)  # fp32 on a CPU: verify rows are dear
    assert drafter.head_max == 1 and drafter.sampled == (False, 3)
    torch.testing.assert_close(drafter.head.head.fc.weight, DraftHead.load(head_path).fc.weight)  # same weights


def test_a_min_confidence_in_the_policy_is_the_default_and_a_spec_overrides_it(tiny_target, head_path, tmp_path):
    from specdec.drafters.head_policy import HeadPolicy

    path = _copy_with_card(head_path, tmp_path, "confident.safetensors", policy=HeadPolicy(min_confidence=0.2))
    loaded = LoadedModel(tiny_target, tokenizer=None, name="tiny")
    drafter = make_drafter(f"lookup+head:{path}", loaded)
    assert drafter.head.min_confidence == 0.2 and drafter.head_max is None  # confidence ends rounds instead
    assert make_drafter(f"head:{path}:0.5", loaded).min_confidence == 0.5


def test_head_policy_round_trips_and_rejects_unknown_row_costs():
    from specdec.drafters.head_policy import HeadPolicy

    policy = HeadPolicy(greedy_head_max={"dear-rows": 2, "cuda": 5}, sampled_head_max={"cpu": 3},
                        lookup_when_sampling=False, note="why")
    assert HeadPolicy.from_json(policy.to_json()) == policy
    with pytest.raises(ValueError, match="keyed by"):
        HeadPolicy(greedy_head_max={"gpu": 2})


def test_target_identity_survives_a_dtype_and_tells_models_apart(tiny_target):
    from specdec.drafters.head import target_identity
    from specdec.drafters.head_policy import TargetIdentity

    identity = target_identity(tiny_target)
    embed = target_parts(tiny_target).embed
    assert identity.matches(TargetIdentity.of(embed.to(torch.bfloat16), identity.num_layers))
    assert TargetIdentity.from_json(identity.to_json()) == identity
    other = tiny_llama(7, layers=2, scale=8.0)  # the same sizes, other weights
    assert not identity.matches(target_identity(other))
    assert not identity.matches(TargetIdentity.of(embed, identity.num_layers + 1))


def test_auto_picks_the_shipped_head_whose_file_records_this_target(tiny_target, head_path, tmp_path, monkeypatch):
    from specdec.drafters import combined
    from specdec.drafters.head import target_identity
    from specdec.drafters.head_policy import HeadPolicy

    other = target_identity(tiny_llama(7, layers=2, scale=8.0))
    _copy_with_card(head_path, tmp_path / "heads", "a-other.safetensors", target=other)
    mine = _copy_with_card(head_path, tmp_path / "heads", "b-mine.safetensors", target=target_identity(tiny_target),
                           policy=HeadPolicy(lookup_when_sampling=False, sampled_head_max={"dear-rows": 1}))
    _copy_with_card(head_path, tmp_path / "heads", "c-unrecorded.safetensors")
    monkeypatch.setattr(combined, "HEADS_DIR", tmp_path / "heads")
    loaded = LoadedModel(tiny_target, tokenizer=None, name="any display name")
    auto = make_drafter("auto", loaded)
    assert isinstance(auto, LookupThenHead) and auto.name == "lookup+head"
    assert auto.head.name == f"head:{mine}" and auto.head_max == 2 and auto.sampled == (False, 1)
    assert isinstance(make_drafter("auto", LoadedModel(tiny_llama(7, layers=1), None, "x")), LookupDrafter)
