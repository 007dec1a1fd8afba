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
    assert head.config.feature_layers == (0,)  # --feature-layers auto on a 2-layer target
    shard = torch.load(shard_paths(tmp_path / "data")[0], weights_only=True)
    assert shard[0]["layers"].tolist() == [0] and shard[0]["features"].shape[1] == 2 * 32
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


def test_bad_feature_layers_are_a_clear_error(tiny_target_dir, tmp_path, capsys):
    for spec, message in [("1", "increasing indices in 0..0"), ("a,b", "comma-separated layer indices")]:
        rc = main(["train-draft", "--target", str(tiny_target_dir), "--out", str(tmp_path / "h.safetensors"),
                   "--device", "cpu", "--feature-layers", spec, "--no-progress"])
        assert rc == 2 and message in capsys.readouterr().err


def test_collate_takes_the_columns_of_the_head_s_layers():
    """Data keeps layers (0, 2) and the final feature; a head reading layer 2 gets [l2, final], its
    feature targets are the final features; a head reading layer 1 is refused with what to do."""
    from specdec.errors import InvalidRequestError
    from specdec.train.trainer import collate

    feats = torch.arange(9 * 12, dtype=torch.float32).reshape(9, 12).bfloat16()  # [n-1, 3 * D], D = 4
    example = {"ids": torch.arange(10, dtype=torch.int32), "features": feats, "start": 4,
               "top_ids": torch.zeros(6, 2, dtype=torch.int32), "top_p": torch.full((6, 2), 0.5, dtype=torch.float16),
               "layers": torch.tensor([0, 2], dtype=torch.int32)}
    batch = collate([example], torch.arange(16), max_len=16, layers=(2,))
    assert torch.equal(batch.feats[0], feats[:8, 4:].float())
    assert torch.equal(batch.feat_targets[0], feats[1:9, 8:].float())
    assert collate([example], torch.arange(16), max_len=16, layers=(0, 2)).feats.shape == (1, 8, 12)
    assert collate([example], torch.arange(16), max_len=16).feats.shape == (1, 8, 4)
    with pytest.raises(InvalidRequestError, match="--feature-layers"):
        collate([example], torch.arange(16), max_len=16, layers=(1,))


def test_default_data_dir_is_per_choice_of_layers():
    from specdec.train.pipeline import default_data_dir

    assert default_data_dir("default").name == "default"
    assert default_data_dir("default", (2, 15, 27)).name == "default-layers-2-15-27"


def test_data_decoding_is_generates_greedy_answer_with_its_features_and_probabilities(tiny_target_dir):
    """The data builder's own decoding loop answers exactly as transformers' generate() does, and
    keeps the final-norm feature and the top-k probabilities of each position (left-padded batch)."""
    from specdec.train.data import _encode_chat, _eos_ids, decode_batch

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_target_dir))
    model = LlamaForCausalLM.from_pretrained(str(tiny_target_dir)).eval()
    encoded = [_encode_chat(tokenizer, p) for p in ["Name a colour.", "Write a long poem about the sea, please."]]
    width = max(len(e) for e in encoded)
    ids = torch.tensor([[0] * (width - len(e)) + e for e in encoded])
    attention = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
    eos = _eos_ids(model, tokenizer)
    answers, feats, top_ids, top_p = decode_batch(model, ids, attention, 12, False, eos, top_k=4)
    _, with_layer, _, _ = decode_batch(model, ids, attention, 12, False, eos, top_k=4, layers=(0,))
    assert torch.equal(with_layer[..., 32:], feats)  # the final-norm feature comes last
    with torch.no_grad():
        ref = model.generate(input_ids=ids, attention_mask=attention, max_new_tokens=12, do_sample=False,
                             pad_token_id=0, output_hidden_states=True, output_logits=True,
                             return_dict_in_generate=True)
    assert torch.equal(answers, ref.sequences[:, width:])
    ref_feats = torch.cat([step[-1] for step in ref.hidden_states], dim=1)  # the LM head's input
    ref_layer0 = torch.cat([step[1] for step in ref.hidden_states], dim=1)  # the first layer's output
    for row, e in enumerate(encoded):
        real = slice(width - len(e), None)  # padding positions hold nothing
        assert torch.allclose(feats[row, real].float(), ref_feats[row, real], rtol=2e-2, atol=1e-2)
        assert torch.allclose(with_layer[row, real, :32].float(), ref_layer0[row, real], rtol=2e-2, atol=1e-2)
    probs = torch.stack(ref.logits, dim=1).softmax(-1)  # [B, R, V]
    assert torch.equal(top_ids[..., 0].long(), probs.argmax(-1))
    assert torch.allclose(top_p.float(), probs.topk(4, dim=-1).values, atol=1e-3)


def test_batches_by_length_are_runs_of_neighbours_seeded_by_step():
    from specdec.train.trainer import TrainConfig, draw_batch

    examples = sorted(({"ids": torch.zeros(n, dtype=torch.int32)} for n in range(10, 400, 3)),
                      key=lambda e: e["ids"].shape[0])
    config = TrainConfig(batch_size=8)
    batches = [draw_batch(examples, step, config) for step in range(20)]
    assert all(len(b) == 8 for b in batches)
    spans = [max(e["ids"].shape[0] for e in b) - min(e["ids"].shape[0] for e in b) for b in batches]
    assert max(spans) == 7 * 3  # eight neighbours: the batch pads to about its own length
    assert len({b[0]["ids"].shape[0] for b in batches}) > 5  # different places in the list
    assert [len(e["ids"]) for e in draw_batch(examples, 3, config)] == [len(e["ids"]) for e in batches[3]]
    mixed = draw_batch(examples, 3, TrainConfig(batch_size=8, by_length=False))
    assert max(e["ids"].shape[0] for e in mixed) - min(e["ids"].shape[0] for e in mixed) > 21


def test_grouped_decode_attention_equals_transformers_sdpa_with_a_mask():
    """The data builder's decode attention (query heads of one KV head as rows of one block) gives
    what transformers' sdpa path gives with the KV heads repeated, for a padded batch."""
    from types import SimpleNamespace

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from specdec.train.data import _grouped_attention_forward

    torch.manual_seed(0)
    b, heads, kv_heads, length, d = 3, 6, 2, 11, 8
    query, key, value = torch.randn(b, heads, 1, d), torch.randn(b, kv_heads, length, d), torch.randn(b, kv_heads, length, d)
    mask = torch.ones(b, 1, 1, length, dtype=torch.bool)
    mask[0, ..., :4] = False  # a left-padded row
    mask[1, ..., 9:] = False  # slots not written yet
    module = SimpleNamespace(num_key_value_groups=heads // kv_heads, is_causal=True, training=False)
    ours, _ = _grouped_attention_forward(module, query, key, value, mask, scaling=d ** -0.5)
    ref, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=d ** -0.5)
    assert ours.shape == ref.shape == (b, 1, heads, d)
    assert torch.allclose(ours, ref, atol=1e-6)  # a wrong head-to-KV-head map would differ (random K/V)
