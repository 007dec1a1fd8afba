"""`specdec train-draft` end to end at a tiny size: a random tiny Llama with the real tokenizer answers."""

import json

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from specdec.cli import main
from specdec.drafters.head import DraftHead
from specdec.models import default as default_model
from specdec.train.data import shard_paths
from specdec.train.prompts import make_prompts


@pytest.fixture(scope="module")
def tiny_target_dir(tmp_path_factory):
    """A 2-layer random Llama saved with SmolLM2's tokenizer (so the chat template works)."""
    tokenizer = AutoTokenizer.from_pretrained(str(default_model.prepared_dir()))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    path = tmp_path_factory.mktemp("tiny-target")
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def train(target, tmp_path, steps: int, capsys) -> dict:
    rc = main(["train-draft", "--target", str(target), "--out", str(tmp_path / "head.safetensors"),
               "--data-dir", str(tmp_path / "data"), "--device", "cpu", "--prompts", "6", "--max-new-tokens", "8",
               "--gen-batch", "3", "--steps", str(steps), "--eval-every", "2", "--draft-vocab", "256",
               "--threads", "1", "--no-progress"])
    assert rc == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_train_draft_end_to_end_and_resume(tiny_target_dir, tmp_path, capsys):
    report = train(tiny_target_dir, tmp_path, steps=2, capsys=capsys)
    assert report["answers"] == 6 and len(report["val_greedy_agreement"]) == 2
    assert len(shard_paths(tmp_path / "data")) == 2
    head = DraftHead.load(tmp_path / "head.safetensors")
    assert head.config.draft_vocab == 256 and head.config.hidden == 32
    assert (tmp_path / "head.safetensors.ckpt").exists()
    # Asked for more steps, the run reuses the shards and continues from the checkpoint.
    stamps = [p.stat().st_mtime_ns for p in shard_paths(tmp_path / "data")]
    train(tiny_target_dir, tmp_path, steps=4, capsys=capsys)
    assert [p.stat().st_mtime_ns for p in shard_paths(tmp_path / "data")] == stamps
    assert torch.load(tmp_path / "head.safetensors.ckpt", weights_only=False)["step"] == 4


def test_prompts_are_varied_and_not_spec_bench():
    prompts = make_prompts(300, seed=0)
    assert len(set(prompts)) == 300 and prompts == make_prompts(300, seed=0)
    from specdec.bench.specbench import QUESTIONS

    bench = {json.loads(line)["turns"][0] for line in QUESTIONS.read_text().splitlines() if line.strip()}
    assert not bench & set(prompts)
    kinds = ["Translate", "into English", "Summar", "function", "Solve", "Write a", "Pretend", "Document 1"]
    assert all(any(k in p for p in prompts) for k in kinds)


def test_collate_keeps_a_prompt_longer_than_max_len_as_context_only():
    from specdec.train.trainer import collate

    def example(prompt: int, answer: int) -> dict:
        n = prompt + answer
        return {"ids": torch.arange(n, dtype=torch.int32), "features": torch.randn(n - 1, 4).bfloat16(),
                "start": prompt, "top_ids": torch.zeros(answer, 2, dtype=torch.int32),
                "top_p": torch.full((answer, 2), 0.5, dtype=torch.float16)}

    sub_index = torch.arange(64)
    batch = collate([example(20, 10), example(5, 10)], sub_index, max_len=16)
    assert not batch.mask[0].any() and batch.mask[1].sum() == 10  # row 0: its answer lies past max_len
    assert batch.feats.shape == (2, 14, 4) and batch.feats[0].abs().sum() > 0
