"""Self-instruct questions for the draft-head data: the target writes lists of questions, then answers them."""

import torch

from specdec.train import prompts as prompts_module
from specdec.train.data import DataConfig, build_dataset, shard_paths, source_texts
from specdec.train.prompts import make_prompts, make_question_list_prompts, make_question_prompts, parse_questions
from tests.helpers_tiny import default_tokenizer_random_llama, spec_bench_questions

LIST = """Here are five questions people often ask about tides:

1. What causes the tides?
2. **How often do tides change?**
3. "Why are some tides higher than others?"
4. What causes the tides?
5. How to read a tide table:
- Do tides affect fishing in any way?

These are just a few examples."""


def test_parse_questions_keeps_distinct_list_items_that_read_as_requests():
    assert parse_questions(LIST) == ["What causes the tides?", "How often do tides change?",
                                     "Why are some tides higher than others?", "Do tides affect fishing in any way?"]
    assert parse_questions(LIST, most=2) == ["What causes the tides?", "How often do tides change?"]
    assert parse_questions("Tides are caused by the Moon. They change twice a day.") == []  # no list: nothing


def test_question_list_prompts_are_deterministic_and_never_spec_bench():
    lists = make_question_list_prompts(200, seed=0)
    assert lists == make_question_list_prompts(200, seed=0) and lists != make_question_list_prompts(200, seed=1)
    assert len(set(lists)) > 190 and not set(lists) & spec_bench_questions()


def test_question_prompts_ask_every_parsed_question_once():
    prompts = make_question_prompts([LIST, "no list here", LIST], seed=0)
    assert prompts == make_question_prompts([LIST, "no list here", LIST], seed=0)
    assert len(prompts) == 8  # four questions from each list, none from the text without one
    for question, prompt in zip(parse_questions(LIST) * 2, prompts):
        assert question in prompt  # as asked, with a wish about the answer or a second question after it


def test_make_prompts_mixes_german_news_to_translate_and_grows_by_prefix():
    prompts = make_prompts(400, seed=0)
    assert prompts[:150] == make_prompts(150, seed=0)  # the GPU driver relies on it when it adds batches
    assert any("German" in p and " hat " in p for p in prompts)
    assert not set(prompts) & spec_bench_questions()


def test_build_dataset_answers_the_targets_own_questions(tmp_path, monkeypatch):
    tokenizer, model = default_tokenizer_random_llama()
    # A random model writes no lists: take each of its texts as two questions.
    monkeypatch.setattr(prompts_module, "parse_questions", lambda text, most=5: [f"{text} ?", f"Why {text} ?"])
    data = DataConfig(num_prompts=2, max_new_tokens=4, batch_size=2, question_lists=3, list_max_new_tokens=5)
    shards = build_dataset(model, tokenizer, tmp_path, data, progress=False)
    assert [p.name for p in shards] == ["shard_00000.pt", "shard_ans_00000.pt", "shard_ans_00001.pt",
                                        "shard_ans_00002.pt", "shard_ask_00000.pt", "shard_ask_00001.pt"]
    lists = source_texts([p for p in shards if p.name.startswith("shard_ask")], tokenizer)
    answers = [e for p in shards if p.name.startswith("shard_ans") for e in torch.load(p, weights_only=True)]
    asked = [tokenizer.decode(e["ids"][:e["start"]].tolist()) for e in answers]
    assert len(lists) == 3 and len(asked) == 6
    assert all(f"{text} ?" in prompt for text, prompt in zip([t for t in lists for _ in (0, 1)], asked))
    stamps = [p.stat().st_mtime_ns for p in shards]  # a rerun keeps every finished shard
    assert [p.stat().st_mtime_ns for p in build_dataset(model, tokenizer, tmp_path, data, progress=False)] == stamps
    assert shard_paths(tmp_path) == shards
