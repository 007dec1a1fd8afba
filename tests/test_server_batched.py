"""The batched server through the official openai client: n choices as sequences of one batch,
logprobs from the target's own p, and concurrent requests that share engine steps yet get the
answers they get alone."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest
import torch

from tests.server_tiny_model import shared_server, tiny_root

openai = pytest.importorskip("openai")

PROMPT = "hello what is the draft token"
MSG = [{"role": "user", "content": "why is the cat fast"}]


@pytest.fixture(scope="module")
def server():
    return shared_server("--max-queue", "2")  # 8 slots (the default --max-num-seqs)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference():
    """The tiny target in transformers and its tokenizer: p recomputed here, alone."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny_root() / "target"
    return AutoModelForCausalLM.from_pretrained(path).float().eval(), AutoTokenizer.from_pretrained(path)


def reference_logp(reference, prompt_ids: list[int], generated: list[int], temperature: float) -> torch.Tensor:
    """[len(generated), V] log p at each generated position (temperature 0: the untruncated softmax)."""
    model, _ = reference
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids + generated[:-1]])).logits[0, len(prompt_ids) - 1:].float()
    return torch.log_softmax(logits / (temperature or 1.0), -1)


def sampled(client, seed, n=1, **kw):
    return client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=1.0, seed=seed, n=n,
                                     extra_body={"ignore_eos": True}, **kw)


def test_n_choices_are_n_sequences_seeded_seed_plus_i(client):
    out = sampled(client, seed=5, n=3)
    assert [c.index for c in out.choices] == [0, 1, 2] and out.usage.completion_tokens == 36
    alone = [sampled(client, seed=5 + i).choices[0].text for i in range(3)]
    assert [c.text for c in out.choices] == alone
    assert len(set(alone)) > 1  # three different sequences, not one copied


def test_streamed_choices_reassemble_to_the_whole_answers(client):
    whole = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=16, temperature=0.9, seed=3, n=2)
    chunks = list(client.chat.completions.create(model="tiny", messages=MSG, max_tokens=16, temperature=0.9,
                                                 seed=3, n=2, stream=True, stream_options={"include_usage": True}))
    texts = ["", ""]
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == [c.message.content for c in whole.choices]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_greedy_choices_agree_with_the_single_answer(client):
    one = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=20, temperature=0)
    two = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=20, temperature=0, n=2)
    assert [c.message.content for c in two.choices] == [one.choices[0].message.content] * 2


def test_completion_logprobs_are_the_targets_own(client, reference):
    _, tokenizer = reference
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    out = client.completions.create(model="tiny", prompt=prompt_ids, max_tokens=16, temperature=0, logprobs=3,
                                    extra_body={"ignore_eos": True})
    lp = out.choices[0].logprobs
    vocab = tokenizer.get_vocab()
    generated = [vocab[t] for t in lp.tokens]
    logp = reference_logp(reference, prompt_ids, generated, 0.0)
    for j, token in enumerate(generated):
        assert lp.token_logprobs[j] == pytest.approx(float(logp[j, token]), abs=1e-3)
        best = torch.topk(logp[j], 3).indices.tolist()
        assert list(lp.top_logprobs[j]) == [tokenizer.decode([i]) for i in best]
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:j]) for j in range(len(lp.tokens))]


def test_chat_logprobs_streamed_match_the_whole_answer_and_p(client, reference):
    _, tokenizer = reference
    kw = dict(model="tiny", messages=MSG, max_tokens=14, temperature=0.7, seed=9, logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**kw)
    streamed = [entry for chunk in client.chat.completions.create(stream=True, **kw)
                for choice in chunk.choices if choice.logprobs for entry in choice.logprobs.content]
    content = whole.choices[0].logprobs.content
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    assert len(content) == whole.usage.completion_tokens
    prompt_ids = tokenizer.apply_chat_template(MSG, add_generation_prompt=True, tokenize=True)
    prompt_ids = list(prompt_ids["input_ids"] if hasattr(prompt_ids, "keys") else prompt_ids)
    vocab = tokenizer.get_vocab()
    logp = reference_logp(reference, prompt_ids, [vocab[e.token] for e in content], 0.7)
    for j, entry in enumerate(content):
        assert entry.logprob == pytest.approx(float(logp[j, vocab[entry.token]]), abs=1e-3)
        assert [t.token for t in entry.top_logprobs] == [tokenizer.decode([i]) for i in torch.topk(logp[j], 2).indices]
        assert entry.bytes == list(entry.token.encode())


def step_counts(url: str) -> tuple[float, float]:
    text = httpx.get(url + "/metrics").text
    values = [float(re.search(rf"^specdec:{name}_total\{{[^}}]*\}} (\S+)$", text, re.M).group(1))
              for name in ("engine_steps", "engine_step_sequences")]
    return values[0], values[1]


def test_concurrent_requests_share_steps_and_get_their_own_answers(server, client):
    prompts = [f"{a} {b} runs over the" for a in ("one", "two", "three") for b in ("cat", "dog")]

    def ask(c, prompt):
        return c.completions.create(model="tiny", prompt=prompt, max_tokens=30, temperature=0,
                                    extra_body={"ignore_eos": True})

    alone = [ask(client, p).choices[0].text for p in prompts]
    steps, sequences = step_counts(server.url)

    async def together():
        async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as c:
            return await asyncio.gather(*(ask(c, p) for p in prompts))

    answers = [r.choices[0].text for r in asyncio.run(together())]
    assert answers == alone
    steps_after, sequences_after = step_counts(server.url)
    assert (sequences_after - sequences) / (steps_after - steps) > 1.5  # they decoded in batches


def test_the_model_card_reports_the_batch_capacity(server):
    card = httpx.get(server.url + "/v1/models").json()["data"][0]["specdec"]
    assert card["max_num_seqs"] == 8 and card["max_queue"] == 2 and card["kv_cache_bytes"] > 0


def test_the_servers_drafters_are_forks_that_share_the_loaded_draft(monkeypatch):
    """Every sequence drafts with a fork of the draft model loaded at start: one draft slot model, no
    second load however many sequences run, its slots no longer than the target's."""
    from specdec.cli import build_parser
    from specdec.commands.serve import build_state
    from specdec.drafters.model import SlotDrafter
    from specdec.models import loader
    from tests.server_tiny_model import build_tiny_models

    loads = []
    load_model = loader.load_model
    monkeypatch.setattr(loader, "load_model", lambda name, **kw: loads.append(name) or load_model(name, **kw))
    target, draft = build_tiny_models(tiny_root())
    argv = ["serve", "--target", str(target), "--draft", str(draft), "--max-num-seqs", "3", "--max-model-len", "64",
            "--threads", "1"]
    state = build_state(build_parser().parse_args(argv))
    try:
        forks = [state.drafters.fresh(str(draft)) for _ in range(5)]
        assert loads.count(str(draft)) == 1  # at start, for the runtime; never for a fork
        assert all(isinstance(f, SlotDrafter) and f.pool is forks[0].pool for f in forks)
        assert forks[0].pool.model.max_slots == 3 and len(set(map(id, forks))) == 5
        # the draft's slots hold what the target's do, not the draft model's whole context (160 here)
        assert forks[0].pool.model.max_length == state.slots.max_length == 64
        assert {type(state.drafters.fresh(name)).__name__ for name in ("none", "lookup")} == {"NoDrafter",
                                                                                             "LookupDrafter"}
    finally:
        state.worker.shutdown()


def test_a_drain_s_abort_reaches_a_running_stream_as_its_error_not_as_a_finish():
    """abort_all (the drain's deadline) against the engine thread: the running choice's client gets the
    shutting-down error, never the 'abort' finish its cancellation also produces. The error's delivery
    is slowed here, so that an engine thread free to see the cancellation before it is queued would
    get its finish to the client first (as it once did, now and then, in the SIGTERM test)."""
    from specdec.cli import build_parser
    from specdec.commands.serve import build_state
    from specdec.generation import GenerationConfig
    from specdec.server.protocol import APIError
    from specdec.server.worker import DoneEvent, ErrorEvent, Job, TokenEvent
    from tests.server_tiny_model import CONTEXT, build_tiny_models

    target, _ = build_tiny_models(tiny_root())
    state = build_state(build_parser().parse_args(["serve", "--target", str(target), "--draft", "none",
                                                   "--max-num-seqs", "2", "--threads", "1"]))
    worker = state.worker

    async def run() -> list[object]:
        job = Job("none", [1, 2, 3], (GenerationConfig(max_new_tokens=CONTEXT - 8, ignore_eos=True),))
        events, got = worker.submit(job), []
        async for event in events:
            got.append(event)
            if isinstance(event, TokenEvent) and len(got) == 1:  # it runs: slow the error down, abort
                emit = worker._live[id(job)][1]
                worker._live[id(job)] = (job, lambda e: (time.sleep(0.3) if isinstance(e, ErrorEvent) else None,
                                                         emit(e)))
                worker.abort_all(APIError(503, "shutting down", None, "shutting_down"))
        return got

    try:
        got = asyncio.run(run())
    finally:
        worker.shutdown()
    assert isinstance(got[-1], ErrorEvent), got[-1]
    assert not any(isinstance(e, DoneEvent) for e in got)
