"""Drafters that propose for many sequences at once, and drafters by name per sequence.

Each batched drafter is driven side by side with the same kind one sequence at a time, through the
same texts, features and rollbacks: every sequence's draft in a batch equals its draft alone (tokens
exactly, q to within a row-count rounding). Then the batched engine, over NativeSlots and with
batched drafters of every kind forked per sequence, gives every sequence its batch-1 plain decoding.
"""

import random

import pytest
import torch

from specdec.engine.batched import BatchConfig, BatchedEngine
from specdec.drafters import LookupDrafter, ModelDrafter, NoDrafter
from specdec.drafters.base import Drafter, propose_all
from specdec.drafters.combined import LookupThenHead
from specdec.drafters.head import DraftHead, HeadDrafter, config_for_target, target_parts
from specdec.drafters.model import DraftSlots, SlotDrafter
from specdec.drafters.oracle import OracleDrafter
from specdec.drafters.registry import DraftMenu
from specdec.engine import Engine, GenerationConfig
from specdec.errors import DraftSpecError
from specdec.models.loader import LoadedModel
from specdec.models.native_llama import NativeLlama
from specdec.models.native_slots import NativeSlots
from specdec.models.slots import LoopSlots
from specdec.sampling import SamplingParams
from tests.conftest import VOCAB
from tests.test_batching import DECODE, mixed_requests, plain, run_arriving

CPU = torch.device("cpu")
LAYERS = (0,)  # the feature layers the fused head reads
HIDDEN = 32  # the tiny target's


def untrained_head(target, layers=(), min_confidence: float = 0.0) -> HeadDrafter:
    torch.manual_seed(5)  # an untrained head: poor drafts, but every path of the head runs
    head = DraftHead(config_for_target(target, draft_vocab=48, feature_layers=layers)).eval()
    return HeadDrafter(head, target_parts(target), max_length=512, min_confidence=min_confidence)


def prototype(kind: str, target, draft) -> Drafter:
    """One drafter of a kind, to be forked for each sequence (the batched way)."""
    if kind == "lookup":
        return LookupDrafter(CPU)
    if kind == "head":
        return untrained_head(target)
    if kind == "head-fused-conf":
        return untrained_head(target, LAYERS, min_confidence=0.2)
    if kind == "lookup+head":
        return LookupThenHead(LookupDrafter(CPU), untrained_head(target), head_max=3)
    if kind == "model-loop":  # a transformers draft: one cache per slot, exact by construction
        return SlotDrafter(DraftSlots(LoopSlots(draft.with_own_cache, 10)), VOCAB)
    if kind == "model-native":  # the draft on NativeSlots: one pass over every sequence's rows
        return SlotDrafter(DraftSlots(NativeSlots.from_hf(draft.model, "draft slots", 10, 512)), VOCAB)
    assert kind == "oracle"
    pool = DraftSlots(NativeSlots.from_hf(draft.model, "oracle cost", 10, 512))
    return OracleDrafter(target.with_own_cache(), alpha=0.7, horizon=16, draft_slots=pool)


BATCHED = ("lookup", "head", "head-fused-conf", "lookup+head", "model-loop", "model-native", "oracle")


class Texts:
    """Sequences growing round by round as an engine grows them: each round keeps a random prefix
    of the draft and adds one token; the target's features of the kept text go to the drafters."""

    def __init__(self, target, count: int, seed: int):
        self.rng = random.Random(seed)
        self.target = target.with_own_cache()
        self.contexts = [[self.rng.randrange(VOCAB) for _ in range(self.rng.choice([1, 2, 6, 11]))]
                         for _ in range(count)]
        self.observed = [0] * count

    def begin(self, drafters) -> None:
        for drafter, context in zip(drafters, self.contexts):
            drafter.begin(list(context))

    def feed(self, drafter_sets) -> None:
        """Every drafter of each set reads the features of its sequence's text it has not seen."""
        for i, context in enumerate(self.contexts):
            self.target.reset()
            _, feats = self.target.forward_with_hidden(torch.tensor(context), LAYERS)  # [L, 2D]
            for drafters in drafter_sets:
                if drafters[i].needs_target_features:
                    width = (len(drafters[i].feature_layers) + 1) * HIDDEN  # the layers it reads, then the last
                    drafters[i].observe(feats[self.observed[i]:len(context) - 1, -width:])
            self.observed[i] = len(context) - 1

    def keep(self, drafts, drafter_sets) -> None:
        """Keep a random prefix of each draft and one more token; every drafter forgets the rest."""
        for i, draft in enumerate(drafts):
            kept = self.rng.randint(0, len(draft)) if draft is not None else 0
            tokens = draft.tokens[:kept].tolist() if draft is not None else []
            valid = len(self.contexts[i]) + kept
            for drafters in drafter_sets:
                drafters[i].commit(valid)
            self.contexts[i] += tokens + [self.rng.randrange(VOCAB)]


def assert_same_draft(batched, alone, kind) -> None:
    if batched is None:
        assert alone is None or len(alone) == 0
        return
    assert torch.equal(batched.tokens, alone.tokens), kind
    assert (batched.q is None) == (alone.q is None), kind
    if batched.q is not None:
        torch.testing.assert_close(batched.q, alone.q, rtol=0, atol=1e-6)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("kind", BATCHED)
def test_a_batched_drafter_drafts_what_it_drafts_alone(tiny_target, tiny_draft, kind, sampled):
    count, rounds = 5, 7
    made = prototype(kind, tiny_target, tiny_draft)
    twin = prototype(kind, tiny_target, tiny_draft) if kind == "oracle" else made  # an oracle's n-th fork: its seed from (seed, n)
    together, alone = [made.fork() for _ in range(count)], [twin.fork() for _ in range(count)]
    texts = Texts(tiny_target, count, seed=len(kind))
    params = [SamplingParams(temperature=0.7 + 0.2 * i, top_k=(0, 20)[i % 2], seed=i) if sampled
              else SamplingParams() for i in range(count)]
    gens = [[torch.Generator().manual_seed(i) for i in range(count)] for _ in range(2)]
    texts.begin(together)
    texts.begin(alone)
    drafted = 0
    for r in range(rounds):
        texts.feed([together, alone])
        ks = [1 + (i + r) % 5 for i in range(count)]
        batch = propose_all(together, texts.contexts, ks, params, gens[0])
        for i in range(count):
            one = alone[i].propose(texts.contexts[i], ks[i], params[i], gens[1][i])
            assert_same_draft(batch[i], one, kind)
            drafted += len(one)
        texts.keep(batch, [together, alone])
    assert drafted > 0
    for a, b in zip(gens[0], gens[1]):  # the same draws from each sequence's generator
        assert torch.equal(a.get_state(), b.get_state())


def test_draft_steps_run_as_one_forward_for_all_sequences(tiny_target, tiny_draft, monkeypatch):
    made = prototype("model-native", tiny_target, tiny_draft)
    drafters = [made.fork() for _ in range(4)]
    calls, logit_rows = [], []
    forward = made.pool.model.forward_ragged

    def spy(slots, tokens, **kw):
        out = forward(slots, tokens, **kw)
        calls.append(list(slots))
        logit_rows.append(out.logits.shape[0])
        return out

    monkeypatch.setattr(made.pool.model, "forward_ragged", spy)
    contexts = [[5, 6, 7], [9], [t % VOCAB for t in range(1, 300)], [8, 8]]
    for d, c in zip(drafters, contexts):
        d.begin(c)
    calls.clear()
    drafts = propose_all(drafters, contexts, [3, 1, 3, 2], [SamplingParams()] * 4, [None] * 4)
    assert [len(d) for d in drafts] == [3, 1, 3, 2]
    # The drafter more than CATCH_UP_TOKENS behind reads all but its last token first, with no logits;
    # then one call a draft step over the sequences still drafting, the first one with the few unseen
    # rows of the others (not the 299 of a prompt read with its drafts).
    assert calls == [[2], [0, 1, 2, 3], [0, 2, 3], [0, 2]]
    assert logit_rows == [0, 3 + 1 + 1 + 2, 3, 2]
    for d in drafters:
        d.end()
    assert sorted(made.pool._free) == list(range(10))


def forked_drafter(kind: str, prototypes: dict, target, draft) -> Drafter:
    if kind == "none":
        return NoDrafter(CPU)
    if kind not in prototypes:
        prototypes[kind] = prototype(kind, target, draft)
    return prototypes[kind].fork()


@pytest.mark.parametrize("seed", [0, 1])
def test_batched_engine_with_batched_drafters_equals_plain_decoding(tiny_target, tiny_draft, seed):
    kinds = ("none",) + BATCHED
    requests = [(p, c, kinds[i % len(kinds)], t) for i, (p, c, _, t) in enumerate(mixed_requests(28, seed))]
    slots = NativeSlots.from_hf(tiny_target.model, "tiny slots", 6, 512)
    engine = BatchedEngine(slots, lambda: NoDrafter(CPU), decode=DECODE, config=BatchConfig(prefill_chunk=8))
    prototypes: dict = {}
    handles = run_arriving(engine, requests, [forked_drafter(r[2], prototypes, tiny_target, tiny_draft)
                                              for r in requests])
    drafted = dict.fromkeys(kinds, 0)
    for (prompt, config, kind, _), handle in zip(requests, handles):
        assert handle.token_ids == plain(tiny_target, prompt, config).token_ids, (kind, prompt, config)
        drafted[kind] += handle.stats.drafted
    assert all(drafted[kind] > 0 for kind in BATCHED)
    for kind in ("model-loop", "model-native", "oracle"):  # every sequence gave its draft slot back
        assert sorted(prototypes[kind].lease.pool._free) == list(range(10))


def test_batched_engine_at_batch_one_gives_the_engine_tokens(tiny_target):
    """BatchedEngine over one slot against engine.Engine over NativeLlama, drafting and sampling."""
    slots = NativeSlots.from_hf(tiny_target.model, "tiny slots", 1, 512)
    alone = NativeLlama.from_hf(tiny_target.model, "tiny alone", 512, cuda_graphs=False)
    head = untrained_head(tiny_target)
    for prompt, params in (([3, 4, 5, 3, 4, 5, 3], SamplingParams()), ([9, 8], SamplingParams(temperature=1, seed=3))):
        config = GenerationConfig(max_new_tokens=20, k=3, sampling=params)
        for drafter in (LookupDrafter(CPU), head):
            engine = BatchedEngine(slots, lambda: NoDrafter(CPU))
            got = engine.submit(prompt, config, drafter=drafter.fork()).result()
            assert list(got.token_ids) == Engine(alone, drafter.fork()).generate(prompt, config).token_ids


def test_a_draft_menu_serves_kinds_by_name_with_shared_weights(tiny_target, tiny_draft, tmp_path, monkeypatch):
    from specdec.models import loader

    monkeypatch.setattr(loader, "load_model", lambda name, **kw: LoadedModel(tiny_draft, None, name))
    monkeypatch.setattr(loader, "same_vocabulary", lambda target, draft: True)
    path = tmp_path / "head.safetensors"
    untrained_head(tiny_target).head.save(path)
    menu = DraftMenu(LoadedModel(tiny_target, None, "tiny"), max_slots=4)
    kinds = ["lookup", "none", f"head:{path}", "tiny-draft", "oracle:0.8"]
    first, second = ([menu.fresh(kind) for kind in kinds] for _ in range(2))
    assert all(a is not b for a, b in zip(first, second))
    assert first[2].head is second[2].head and first[2]._k is not second[2]._k  # weights shared, cache not
    assert isinstance(first[3], SlotDrafter) and first[3].pool is second[3].pool  # one draft slot model
    assert isinstance(first[3].pool.model, LoopSlots) and first[3].pool.model.max_slots == 4
    engine = BatchedEngine(LoopSlots(tiny_target.with_own_cache, 4), menu.factory("lookup"))
    config = GenerationConfig(max_new_tokens=12, k=3)
    prompts = [[5, 6, 7, 5, 6], [9], [1, 2, 3, 1, 2, 3], [4, 4]]
    handles = [engine.submit(p, config, drafter=menu.fresh(kind)) for p, kind in zip(prompts, kinds)]
    handles.append(engine.submit([7, 7, 7], config))  # the factory's kind
    engine.run()
    for prompt, handle in zip(prompts + [[7, 7, 7]], handles):
        assert list(handle.result().token_ids) == plain(tiny_target, prompt, config).token_ids
    assert handles[3].stats.drafted > 0


def test_a_kind_that_cannot_fork_is_refused_by_name(tiny_target):
    class OneSequence(Drafter):
        name = "one-sequence"

        def propose(self, context, k, params, generator):
            raise AssertionError("never drafts")

    with pytest.raises(DraftSpecError, match="one-sequence draft cannot draft for several sequences"):
        OneSequence().fork()
    native = NativeLlama.from_hf(tiny_target.model, "one cache", 512, cuda_graphs=False)
    with pytest.raises(DraftSpecError, match="holds one sequence's cache"):
        ModelDrafter(native, VOCAB).fork()
    assert isinstance(ModelDrafter(native, VOCAB).for_batch(3).pool.model, NativeSlots)


def test_a_batch_drafter_s_slots_are_as_long_as_asked(tiny_target):
    """for_batch(max_slots, max_length): a draft model's slots hold the target's slot length (the server
    passes it), not the draft model's whole context; none given, the model's."""
    from specdec.models.native_llama import NativeLlama

    native = NativeLlama.from_hf(tiny_target.model, "one cache", 512, cuda_graphs=False)
    assert ModelDrafter(native, VOCAB).for_batch(3, 96).pool.model.max_length == 96
    assert ModelDrafter(native, VOCAB).for_batch(3).pool.model.max_length == 512
    oracle = OracleDrafter(tiny_target, alpha=0.5, draft_model=native, horizon=8)
    assert oracle.for_batch(3, 96).lease.pool.model.max_length == 96


def test_the_batch_table_measures_every_drafter_at_every_size(tiny_target, tiny_draft):
    from specdec.bench.batch import batch_table, parse_batch_sizes
    from specdec.errors import InvalidRequestError

    slots = NativeSlots.from_hf(tiny_target.model, "tiny slots", 4, 512)
    engine = BatchedEngine(slots, lambda: NoDrafter(CPU))
    prompts = [[5, 6, 7, 5, 6], [9, 3], [1, 2, 3, 1, 2, 3]]
    lookup = LookupDrafter(CPU)
    oracle = lambda alpha: OracleDrafter(tiny_target.with_own_cache(), alpha, horizon=8, seed=1)  # noqa: E731
    points = batch_table(engine, prompts, [1, 4], 8, {"lookup": (lookup.fork, 3)}, oracle, oracle_k=3)
    assert [(p.drafter, p.batch) for p in points][:5] == [("plain", 1), ("lookup", 1), ("oracle 0.6", 1),
                                                           ("oracle 0.8", 1), ("oracle 0.9", 1)]
    assert len(points) == 10 and all(p.tokens_per_s > 0 for p in points)
    assert all((p.predicted is not None) == p.drafter.startswith("oracle") for p in points)
    assert all(p.alpha is not None and p.speedup > 0 for p in points if p.drafter != "plain")
    assert not engine.busy and sorted(engine._free) == [0, 1, 2, 3]
    with pytest.raises(InvalidRequestError, match="--batch takes"):
        parse_batch_sizes("1,x")


def test_build_batched_runtime_reports_its_kv_cache(tmp_path):
    from specdec.runtime import build_batched_runtime
    from tests.helpers_tiny import tiny_model_dir

    lines = []
    runtime = build_batched_runtime(str(tiny_model_dir(tmp_path / "target", seed=0)), draft="lookup", device="cpu", threads=1,
                                    max_num_seqs=3, max_length=128, report=lines.append)
    slots = runtime.engine.target
    assert isinstance(slots, NativeSlots) and slots.max_slots == 3 and slots.max_length == 128
    assert runtime.kv_cache_bytes == slots.kv_cache_bytes > 0
    assert lines == [runtime.kv_cache_line()] and "3 sequences x 128 tokens" in lines[0]
    handles = [runtime.engine.submit([5, 6, 7], GenerationConfig(max_new_tokens=6, k=2)) for _ in range(4)]
    runtime.engine.run()
    assert len({tuple(h.token_ids) for h in handles}) == 1 and isinstance(runtime.drafters.fresh("none"), NoDrafter)
