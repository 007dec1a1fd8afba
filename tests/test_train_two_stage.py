"""The two-stage self-instruct of the draft-head data: the target's own texts, pasted into requests."""

import torch

from specdec.train import prompts as prompts_module
from specdec.train.data import DataConfig, build_dataset, shard_paths, source_texts
from specdec.train.prompts import SOURCE_KINDS, make_followup_prompts, make_source_prompts, usable_text
from tests.helpers_tiny import default_tokenizer_random_llama, spec_bench_questions

TEXT = ("The city council of Lyon met on Monday to discuss a new plan for public transport. Anna, who leads the "
        "project, said that {n} new buses would arrive next spring and that fares would stay the same. Critics "
        "argued that the plan ignores cyclists, while a survey found that most residents support it. ")


def test_source_prompts_cover_every_kind_and_are_deterministic():
    sources = make_source_prompts(28, seed=0)
    assert sources == make_source_prompts(28, seed=0)
    assert {s.kind for s in sources} == set(SOURCE_KINDS)
    assert not {s.prompt for s in sources} & spec_bench_questions()


def test_followups_embed_the_stage1_texts_and_never_spec_bench():
    sources = make_source_prompts(8, seed=1)
    texts = [TEXT.format(n=i) * 2 for i in range(7)] + ["too short"]
    followups = make_followup_prompts(sources, texts, 40, seed=1)
    assert len(followups) == 40 and followups == make_followup_prompts(sources, texts, 40, seed=1)
    assert all(any(t.strip() in p for t in texts[:7]) for p in followups)  # each pastes at least one text
    assert not any("too short" in p for p in followups)  # unusable texts are never pasted
    assert any("Document 2:" in p for p in followups) and any(p.startswith("Summar") for p in followups)
    bench = spec_bench_questions()
    assert not any(q in p for p in followups for q in bench)
    assert all(len(p) < 3600 for p in followups)  # the pasted material is capped (~800 tokens)
    assert make_followup_prompts(sources, ["no"] * 8, 5) == []


def test_usable_text_rejects_loops():
    assert usable_text(TEXT * 2) and not usable_text("the end " * 60) and not usable_text("short text")


def test_build_dataset_two_stage_pastes_the_targets_own_texts(tmp_path, monkeypatch):
    tokenizer, model = default_tokenizer_random_llama()
    monkeypatch.setattr(prompts_module, "usable_text", lambda text: bool(text.strip()))  # random model: any text
    data = DataConfig(num_prompts=2, max_new_tokens=4, batch_size=2, source_texts=3, followups=3,
                      source_max_new_tokens=6)
    shards = build_dataset(model, tokenizer, tmp_path, data, progress=False)
    names = [p.name for p in shards]
    assert names == ["shard_00000.pt", "shard_src_00000.pt", "shard_src_00001.pt", "shard_use_00000.pt",
                     "shard_use_00001.pt", "shard_use_00002.pt"]  # stage 2: half the batch (long prompts)
    texts = source_texts([p for p in shards if p.name.startswith("shard_src")], tokenizer)
    assert len(texts) == 3
    stage2 = [e for p in shards if p.name.startswith("shard_use") for e in torch.load(p, weights_only=True)]
    prompts = [tokenizer.decode(e["ids"][:e["start"]].tolist()) for e in stage2]
    assert len(prompts) == 3 and all(any(t.strip() in p for t in texts if t.strip()) for p in prompts)
    stamps = [p.stat().st_mtime_ns for p in shards]  # a rerun keeps every finished shard
    assert [p.stat().st_mtime_ns for p in build_dataset(model, tokenizer, tmp_path, data, progress=False)] == stamps
    assert shard_paths(tmp_path) == shards
