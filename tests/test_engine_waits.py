"""What the host waits for. A speculative round reads the device once (on a GPU every read waits
for the queue to drain); plain decoding one step ahead (Engine(overlap=True): the batched engine's
pipelined plain steps) gives the tokens of one step at a time, stops where they stop, and leaves
nothing behind for the next generation."""

import pytest
import torch

from specdec.transfers import HostRead, token_tensor
from specdec.drafters import LookupDrafter, ModelDrafter, NoDrafter
from specdec.engine import Engine, GenerationConfig
from specdec.sampling import SamplingParams
from tests.conftest import VOCAB
from tests.markov import MarkovLM
from tests.test_engine_greedy import PROMPTS, plain_greedy

CPU = torch.device("cpu")
SAMPLINGS = [SamplingParams(), SamplingParams(temperature=1.0, seed=3),
             SamplingParams(temperature=0.8, top_k=8, top_p=0.9, seed=11)]


@pytest.mark.parametrize("params", SAMPLINGS[:2], ids=["greedy", "t1"])
@pytest.mark.parametrize("kind", ["model", "lookup"])
def test_a_round_reads_the_device_once(tiny_target, tiny_draft, count_reads, kind, params):
    drafter = ModelDrafter(tiny_draft, VOCAB) if kind == "model" else LookupDrafter(CPU)
    engine = Engine(tiny_target, drafter)
    gen = engine.generate(PROMPTS[0], GenerationConfig(max_new_tokens=30, k=3, sampling=params))
    assert gen.stats.drafted > 0 and len(gen.token_ids) == 30
    assert count_reads() == gen.stats.rounds


def test_plain_decoding_one_step_ahead_reads_each_token_once(tiny_target, count_reads):
    gen = plain_engine(tiny_target, overlap=True).generate(PROMPTS[1], GenerationConfig(max_new_tokens=12))
    assert count_reads() == len(gen.token_ids) == 12


def plain_engine(target, overlap: bool, **kwargs) -> Engine:
    return Engine(target, NoDrafter(CPU), overlap=overlap, **kwargs)


@pytest.mark.parametrize("params", SAMPLINGS, ids=["greedy", "t1", "warped"])
def test_overlapped_plain_decoding_gives_the_tokens_of_single_steps(tiny_target, params):
    config = GenerationConfig(max_new_tokens=25, sampling=params)
    for prompt in PROMPTS:
        ahead = plain_engine(tiny_target, overlap=True).generate(prompt, config)
        single = plain_engine(tiny_target, overlap=False).generate(prompt, config)
        assert ahead.token_ids == single.token_ids
        assert ahead.finish_reason == single.finish_reason == "length"
        assert ahead.stats.generated == ahead.stats.rounds == 25
        if params.greedy:
            assert ahead.token_ids == plain_greedy(tiny_target, prompt, 25)


def test_a_stop_leaves_the_step_queued_past_it_out_of_the_next_generation(tiny_target):
    prompt = PROMPTS[1]
    expected = plain_greedy(tiny_target, prompt, 20)
    eos = expected[5]
    engine = plain_engine(tiny_target, overlap=True, eos_token_ids=[eos])
    gen = engine.generate(prompt, GenerationConfig(max_new_tokens=20))
    assert gen.token_ids == expected[: expected.index(eos) + 1] and gen.finish_reason == "stop"
    assert engine.generate(prompt, GenerationConfig(max_new_tokens=20, ignore_eos=True)).token_ids == expected
    decode = lambda ids: " ".join(f"t{i}" for i in ids)  # noqa: E731
    engine = plain_engine(tiny_target, overlap=True, decode=decode)
    stop = f"t{expected[7]}"
    gen = engine.generate(prompt, GenerationConfig(max_new_tokens=20, stop=(stop,)))
    assert gen.token_ids == expected[: expected.index(expected[7]) + 1] and gen.finish_reason == "stop"
    assert engine.generate(prompt, GenerationConfig(max_new_tokens=20)).token_ids == expected


class CountingLM:
    """Wraps a CausalLM and counts its forward calls (a MarkovLM: a model without caches to lend,
    so the engine's one slot is this wrapper itself)."""

    def __init__(self, model):
        self._model = model
        self.forwards = 0

    def __getattr__(self, name):
        return getattr(self._model, name)

    def forward(self, tokens):
        self.forwards += 1
        return self._model.forward(tokens)


def test_a_single_new_token_queues_nothing_ahead():
    counting = CountingLM(MarkovLM(VOCAB, seed=0))
    expected = plain_greedy(MarkovLM(VOCAB, seed=0), PROMPTS[0], 1)
    gen = plain_engine(counting, overlap=True).generate(PROMPTS[0], GenerationConfig(max_new_tokens=1))
    assert gen.token_ids == expected
    assert counting.forwards == 1  # the one step fed the prompt's last token; the prefill went through extend


@pytest.mark.parametrize("overlap", [True, False])
def test_the_next_step_is_queued_before_a_token_is_handed_out(overlap):
    counting = CountingLM(MarkovLM(VOCAB, seed=0))
    gen = plain_engine(counting, overlap=overlap).stream(PROMPTS[1], GenerationConfig(max_new_tokens=6))
    seen = [counting.forwards for _ in gen]  # the prefill goes through the wrapped model's extend
    ahead = [min(i + 2, 6) for i in range(6)] if overlap else [i + 1 for i in range(6)]
    assert seen == ahead


def test_overlap_leaves_drafting_engines_to_the_round_loop(tiny_target):
    engine = Engine(tiny_target, LookupDrafter(CPU), overlap=True)
    gen = engine.generate(PROMPTS[0], GenerationConfig(max_new_tokens=40, k=4))
    assert gen.token_ids == plain_greedy(tiny_target, PROMPTS[0], 40)
    assert gen.stats.drafted > 0 and gen.stats.rounds < 40


def test_token_helpers_on_cpu():
    assert token_tensor([3, 1, 4], CPU).tolist() == [3, 1, 4]
    assert HostRead(torch.tensor([7, 9])).values() == [7, 9]


def test_closing_mid_stream_with_a_step_queued_leaves_the_next_generation_exact(tiny_target):
    engine = plain_engine(tiny_target, overlap=True)
    expected = plain_greedy(tiny_target, PROMPTS[0], 15)
    gen = engine.stream(PROMPTS[1], GenerationConfig(max_new_tokens=30))
    for i, _ in enumerate(gen):
        if i == 4:
            break
    gen.close()
    assert len(gen.token_ids) == 5 and gen.finish_reason is None
    assert engine.generate(PROMPTS[0], GenerationConfig(max_new_tokens=15)).token_ids == expected
