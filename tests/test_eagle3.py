"""EAGLE-3 heads: the checkpoint layout of SpecForge, SGLang and vLLM, loaded, drafted, trained, saved.

A checkpoint is built here by hand from the layout's documented names (not by specdec's own saver),
and its drafts are checked against a reference written in this file from the architecture as those
projects describe it: fc over the target's aux layers, one layer attending over
concat(input_layernorm(embedding), hidden_norm(feature)), the head's own norm and LM head over the
draft vocabulary (draft id j = target id j + d2t[j]), the pre-norm output fed to the next step.
"""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from specdec.drafters import make_drafter
from specdec.drafters.eagle3 import Eagle3Head, load_eagle3
from specdec.drafters.head import config_for_target, target_parts
from specdec.engine import Engine, GenerationConfig
from specdec.errors import DraftSpecError, ModelLoadError
from specdec.models.loader import LoadedModel
from specdec.sampling import SamplingParams
from specdec.train.trainer import TrainConfig, fit
from tests.conftest import tiny_llama
from tests.test_engine_greedy import PROMPTS, plain_greedy
from tests.test_head import drafts_checked_against_training, examples_from

AUX = (0, 1, 3)  # target layers the hand-built head reads (outputs of those 0-based layers)
D, HEADS, KV, FFN, N = 32, 4, 2, 48, 40  # the head's sizes; N: its draft vocabulary (of the target's 64)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(7, layers=5, scale=8.0)


def documented_checkpoint(path, vocab: int = 64, seed: int = 0, **config_extra) -> dict[str, torch.Tensor]:
    """Write an EAGLE-3 directory from the layout's documented names; returns its tensors (fp32)."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape, scale=0.2):
        return torch.randn(*shape, generator=g) * scale

    drafted = torch.randperm(vocab, generator=g)[:N].sort().values  # the draft vocabulary's target ids
    tensors = {
        "fc.weight": w(D, 3 * D), "midlayer.input_layernorm.weight": 1 + w(D), "midlayer.hidden_norm.weight": 1 + w(D),
        "midlayer.self_attn.q_proj.weight": w(HEADS * 8, 2 * D), "midlayer.self_attn.k_proj.weight": w(KV * 8, 2 * D),
        "midlayer.self_attn.v_proj.weight": w(KV * 8, 2 * D), "midlayer.self_attn.o_proj.weight": w(D, HEADS * 8),
        "midlayer.post_attention_layernorm.weight": 1 + w(D), "midlayer.mlp.gate_proj.weight": w(FFN, D),
        "midlayer.mlp.up_proj.weight": w(FFN, D), "midlayer.mlp.down_proj.weight": w(D, FFN),
        "norm.weight": 1 + w(D), "lm_head.weight": w(N, D, scale=2.0),
        "d2t": drafted - torch.arange(N), "t2d": torch.zeros(vocab, dtype=torch.bool).index_fill_(0, drafted, True),
    }
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": D,
              "num_attention_heads": HEADS, "num_key_value_heads": KV, "intermediate_size": FFN,
              "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "vocab_size": vocab,
              "draft_vocab_size": N, "max_position_embeddings": 512,
              "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(AUX)}, **config_extra}
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    return tensors


def _rms(x, weight, eps=1e-6):
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _rope(x, positions):  # x [H, T, hd], Llama's half-split rotation
    hd = x.shape[-1]
    inv = 1.0 / 10000.0 ** (torch.arange(0, hd, 2).float() / hd)
    angles = torch.cat([positions[:, None] * inv[None]] * 2, -1)
    rotated = torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], -1)
    return x * angles.cos() + rotated * angles.sin()


def reference_layer(t: dict, hidden: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
    """The decoder layer over pairs (hidden [T, D], embeds [T, D]) at positions 0..T-1, causal -> [T, D]."""
    a = torch.cat([_rms(embeds, t["midlayer.input_layernorm.weight"]), _rms(hidden, t["midlayer.hidden_norm.weight"])], -1)
    pos = torch.arange(hidden.shape[0]).float()
    q = _rope((a @ t["midlayer.self_attn.q_proj.weight"].T).view(-1, HEADS, 8).transpose(0, 1), pos)
    k = _rope((a @ t["midlayer.self_attn.k_proj.weight"].T).view(-1, KV, 8).transpose(0, 1), pos)
    v = (a @ t["midlayer.self_attn.v_proj.weight"].T).view(-1, KV, 8).transpose(0, 1)
    k, v = k.repeat_interleave(HEADS // KV, 0), v.repeat_interleave(HEADS // KV, 0)
    att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).flatten(1)
    x = hidden + att @ t["midlayer.self_attn.o_proj.weight"].T
    h = _rms(x, t["midlayer.post_attention_layernorm.weight"])
    mlp = (F.silu(h @ t["midlayer.mlp.gate_proj.weight"].T) * (h @ t["midlayer.mlp.up_proj.weight"].T))
    return x + mlp @ t["midlayer.mlp.down_proj.weight"].T


def reference_greedy_draft(t: dict, embed: torch.Tensor, aux: torch.Tensor, context: list[int], k: int) -> list[int]:
    """k greedy drafts after `context`, given the target's aux-layer outputs [len(context) - 1, 3D]."""
    hidden = aux @ t["fc.weight"].T  # pair i: (g_i, the token after position i)
    tokens = list(context[1:])
    drafts = []
    for _ in range(k):
        out = reference_layer(t, hidden, embed[torch.tensor(tokens)])
        j = int((_rms(out[-1], t["norm.weight"]) @ t["lm_head.weight"].T).argmax())
        drafts.append(j + int(t["d2t"][j]))
        hidden, tokens = torch.cat([hidden, out[-1:]]), tokens + [drafts[-1]]
    return drafts


def test_a_checkpoint_in_the_documented_layout_drafts_as_the_reference(target, tmp_path):
    tensors = documented_checkpoint(tmp_path / "eagle3")
    drafter = make_drafter(f"eagle3:{tmp_path / 'eagle3'}", LoadedModel(target, None, "tiny"))
    assert drafter.feature_layers == AUX
    embed = target_parts(target).embed.float()
    for prompt in PROMPTS[:3]:
        context = prompt + plain_greedy(target, prompt, 5)
        target.reset()
        _, feats = target.forward_with_hidden(torch.tensor(context[:-1]), AUX)  # [n, 4D]: aux layers, then last
        drafter.begin(context)
        drafter.observe(feats)
        draft = drafter.propose(context, 5, SamplingParams(temperature=0.0), torch.Generator())
        assert draft.tokens.tolist() == reference_greedy_draft(tensors, embed, feats[:, :3 * D], context, 5)


def test_specdec_saves_the_layout_and_loads_the_same_head(target, tmp_path):
    documented_checkpoint(tmp_path / "theirs")
    head = load_eagle3(tmp_path / "theirs")
    head.save(tmp_path / "ours")
    config = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == N
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(AUX)
    from safetensors.torch import load_file

    theirs, ours = load_file(str(tmp_path / "theirs" / "model.safetensors")), load_file(
        str(tmp_path / "ours" / "model.safetensors"))
    assert set(ours) == set(theirs)
    for name, tensor in theirs.items():
        torch.testing.assert_close(ours[name].to(tensor.dtype), tensor.to(torch.bfloat16).to(tensor.dtype))
    again = load_eagle3(tmp_path / "ours")
    assert again.vocab_ids.tolist() == head.vocab_ids.tolist()


@pytest.mark.parametrize("spec", ["eagle3:{}", "head:{}", "lookup+head:{}", "tree:3x2:eagle3:{}"])
def test_greedy_identity_with_an_eagle3_head(target, tmp_path, spec):
    documented_checkpoint(tmp_path / "eagle3")
    drafter = make_drafter(spec.format(tmp_path / "eagle3"), LoadedModel(target, None, "tiny"))
    engine = Engine(target, drafter)
    for prompt in PROMPTS:
        assert engine.generate(prompt, GenerationConfig(max_new_tokens=24, k=4)).token_ids == plain_greedy(
            target, prompt, 24)


def test_an_eagle3_head_trains_and_drafts_what_training_predicts(target, tmp_path):
    """`--arch eagle3`: trained on the target's answers with training-time test, saved in the layout,
    reloaded; each draft through the engine equals the trainer's unrolled prediction of it."""
    prompts = [[(7 * i + j) % 64 for j in range(3 + i % 4)] for i in range(8)]
    config = TrainConfig(steps=30, batch_size=4, val_examples=2, eval_every=30, ckpt_every=10, unroll=3, lr=3e-3)
    head, history = fit(target_parts(target), config_for_target(target, 48, AUX, arch="eagle3"),
                        examples_from(target, prompts, layers=AUX), config, tmp_path / "head.ckpt", progress=False,
                        log=lambda *_: None)
    assert isinstance(head, Eagle3Head) and len(history[-1]["val_greedy_agreement"]) == 3
    head.save(tmp_path / "trained")
    loaded = load_eagle3(tmp_path / "trained")
    assert drafts_checked_against_training(target, loaded, PROMPTS[0], k=3) > 0


def test_a_hub_snapshot_loads_by_its_id(target, tmp_path, monkeypatch):
    """A head downloaded from a hub (here: placed in the hub cache by hand, offline) loads by its id."""
    from huggingface_hub import constants

    snapshot = tmp_path / "hub" / "models--someone--tiny-eagle3" / "snapshots" / ("a" * 40)
    documented_checkpoint(snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("a" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    drafter = make_drafter("eagle3:someone/tiny-eagle3", LoadedModel(target, None, "tiny"))
    assert drafter.feature_layers == AUX


def test_bad_checkpoints_are_refused_with_what_is_wrong(target, tmp_path):
    tiny = LoadedModel(target, None, "tiny")
    with pytest.raises(DraftSpecError, match="does not exist"):
        make_drafter(f"eagle3:{tmp_path / 'nowhere'}", tiny)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DraftSpecError, match="not an EAGLE-3 checkpoint directory"):
        make_drafter(f"eagle3:{tmp_path / 'empty'}", tiny)
    with pytest.raises(ModelLoadError, match="not an EAGLE-3 head"):
        make_drafter(f"head:{tmp_path / 'empty'}", tiny)
    documented_checkpoint(tmp_path / "deep", num_hidden_layers=2)
    with pytest.raises(ModelLoadError, match="more than one decoder layer"):
        make_drafter(f"eagle3:{tmp_path / 'deep'}", tiny)
    documented_checkpoint(tmp_path / "wide", vocab=80)
    with pytest.raises(ModelLoadError, match="vocabulary 80"):
        make_drafter(f"eagle3:{tmp_path / 'wide'}", tiny)
    documented_checkpoint(tmp_path / "torn")
    from safetensors.torch import load_file

    kept = {k: v for k, v in load_file(str(tmp_path / "torn" / "model.safetensors")).items() if k != "norm.weight"}
    save_file(kept, str(tmp_path / "torn" / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="lacks norm.weight"):
        make_drafter(f"eagle3:{tmp_path / 'torn'}", tiny)


def test_sampled_output_follows_the_target_with_an_eagle3_head():
    """At temperature 1 the head's q over its draft vocabulary goes to the rule: the output's joint
    distribution over two tokens is the target's (chi-square)."""
    from specdec.drafters.head import HeadDrafter
    from tests.test_exactness import HOT, exact_joint, goodness_of_fit, sampled_joint

    tiny = tiny_llama(21, layers=2, hidden=16, vocab=5, scale=30.0)
    torch.manual_seed(3)
    head = Eagle3Head(config_for_target(tiny, 4, (0,), arch="eagle3"), torch.tensor([0, 1, 3, 4]))
    counts = sampled_joint(Engine(tiny, HeadDrafter(head.initialise_from(target_parts(tiny)), target_parts(tiny))),
                           HOT, k=2, samples=1000, n_tokens=2)
    assert goodness_of_fit(counts, exact_joint(tiny, HOT, n_tokens=2)) > 1e-3
