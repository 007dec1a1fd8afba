"""The native Llama-family backend computes what transformers computes, and its cache rolls back."""

from dataclasses import replace

import pytest
import torch
from transformers import GPT2Config, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from specdec.drafters.model import ModelDrafter
from specdec.drafters.none import NoDrafter
from specdec.engine import Engine, GenerationConfig
from specdec.models.hf import HFCausalLM
from specdec.models.llama_config import unsupported_reason
from specdec.models.native_llama import NativeLlama

SMALL = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
VARIANTS = {
    "llama-untied": (LlamaConfig, LlamaForCausalLM, dict(tie_word_embeddings=False)),
    "llama-tied": (LlamaConfig, LlamaForCausalLM, dict(tie_word_embeddings=True)),
    "llama3-rope-scaling": (LlamaConfig, LlamaForCausalLM, dict(rope_parameters=LLAMA3_ROPE, rope_scaling=LLAMA3_ROPE)),
    "llama-attention-bias": (LlamaConfig, LlamaForCausalLM, dict(attention_bias=True)),
    "qwen2-qkv-bias": (Qwen2Config, Qwen2ForCausalLM, dict(tie_word_embeddings=False)),
    "mistral": (MistralConfig, MistralForCausalLM, dict(sliding_window=None, head_dim=16)),
}


def hf_model(variant: str, seed: int = 0, random_norms: bool = False, **overrides):
    """A tiny random model of `variant` (SMALL, changed by overrides); random_norms: RMSNorm weights
    around 1 instead of exactly 1 (where a test must see the norm weight's effect)."""
    config_cls, model_cls, extra = VARIANTS[variant]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**{**SMALL, **extra, **overrides})).float().eval()
    with torch.no_grad():  # random biases (HF initialises them to zero, which would test nothing)
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.5)
            if random_norms and name.endswith("norm.weight"):
                p.normal_(1.0, 0.3)
    return model


def assert_same_steps(ref, native, tokens, chunks, layers=()):
    """Feed the same chunks to both models; logits and features agree at every step."""
    start = 0
    for size in chunks:
        piece = tokens[start:start + size]
        ref_logits, ref_hidden = ref.forward_with_hidden(piece, layers)
        logits, hidden = native.forward_with_hidden(piece, layers)
        torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(hidden, ref_hidden, atol=1e-4, rtol=1e-4)
        start += size
    assert native.cache_len == ref.cache_len == start


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_match_transformers(variant):
    model = hf_model(variant)
    assert unsupported_reason(model.config) is None
    ref, native = HFCausalLM(model, variant), NativeLlama.from_hf(model, variant, max_length=128)
    tokens = torch.randint(0, SMALL["vocab_size"], (40,), generator=torch.Generator().manual_seed(1))
    assert_same_steps(ref, native, tokens, [12, 1, 5, 1, 1, 9, 11])


def test_static_graph_path_matches_eager():
    """The fixed-shape path the CUDA graphs replay (device-side mask over every slot) gives the
    eager path's logits; on CPU it runs without capture."""
    model = hf_model("llama3-rope-scaling")
    eager = NativeLlama.from_hf(model, "eager", max_length=64)
    static = NativeLlama.from_hf(model, "static", max_length=64, cuda_graphs=True)
    tokens = torch.randint(0, SMALL["vocab_size"], (40,), generator=torch.Generator().manual_seed(2))
    assert_same_steps(eager, static, tokens, [20, 1, 5, 1, 2, 3])


def test_multi_layer_features_match_transformers():
    """forward_with_hidden(tokens, layers): the outputs of the named layers, then the final-norm
    features, equal transformers' hidden states, on the eager and the fixed-shape (graph) paths."""
    model = model_cls_with_layers(4)
    ref = HFCausalLM(model, "ref")
    tokens = torch.randint(0, SMALL["vocab_size"], (30,), generator=torch.Generator().manual_seed(4))
    for graphs in (False, True):
        native = NativeLlama.from_hf(model, "native", max_length=64, cuda_graphs=graphs)
        ref.reset()
        assert_same_steps(ref, native, tokens, [9, 1, 4, 1, 2], layers=(0, 2))
    _, features = native.forward_with_hidden(tokens[:2], (1,))
    assert features.shape == (2, 2 * SMALL["hidden_size"])
    for bad in [(3,), (2, 0), (1, 1), (-1,)]:  # the last layer, unordered, repeated, negative
        with pytest.raises(ValueError, match="feature layers"):
            native.forward_with_hidden(tokens[:1], bad)


def model_cls_with_layers(n_layers: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(5)
    return LlamaForCausalLM(LlamaConfig(**{**SMALL, "num_hidden_layers": n_layers})).float().eval()


def test_rollback_only_moves_the_length():
    model = hf_model("llama-untied")
    native = NativeLlama.from_hf(model, "n", max_length=64, cuda_graphs=True)
    tokens = torch.randint(0, SMALL["vocab_size"], (30,), generator=torch.Generator().manual_seed(3))
    native.prefill(tokens[:10])
    wanted = native.forward(tokens[10:14])  # [4, V]
    native.forward(tokens[20:25])  # a rejected continuation
    native.rollback(10)
    assert native.cache_len == 10
    torch.testing.assert_close(native.forward(tokens[10:14]), wanted)
    with pytest.raises(ValueError, match="cannot roll back"):
        native.rollback(15)
    native.reset()
    assert native.cache_len == 0
    with pytest.raises(ValueError, match="exceed the cache"):
        native.forward(torch.zeros(65, dtype=torch.long))


def test_unsupported_configs_are_named():
    assert "sliding-window" in unsupported_reason(MistralConfig(sliding_window=128, max_position_embeddings=4096))
    assert "RoPE type" in unsupported_reason(LlamaConfig(rope_parameters={"rope_type": "yarn", "factor": 2.0}))
    assert "model type" in unsupported_reason(GPT2Config())


def test_greedy_speculative_equals_plain_on_native():
    target = NativeLlama.from_hf(hf_model("llama-tied", seed=0), "target", max_length=128, cuda_graphs=True)
    draft = NativeLlama.from_hf(hf_model("llama-tied", seed=1), "draft", max_length=128)
    prompt = [5, 17, 3, 42, 8]
    config = GenerationConfig(max_new_tokens=40, k=4, ignore_eos=True)
    plain = Engine(target, NoDrafter(target.device)).generate(prompt, config)
    spec = Engine(target, ModelDrafter(draft, target.vocab_size)).generate(prompt, config)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.rounds < plain.stats.rounds or spec.stats.accepted == 0


def test_embedded_default_matches_transformers():
    from specdec.models.loader import load_model

    loaded = load_model("default", device="cpu", backend="hf")
    native = NativeLlama.from_hf(loaded.model.model, "default", max_length=64)
    tokens = torch.tensor(loaded.tokenizer("The capital of France is Paris, and the capital of").input_ids)
    assert_same_steps(loaded.model, native, tokens, [len(tokens) - 3, 1, 2])


def test_backend_choice(monkeypatch):
    from transformers import GPT2LMHeadModel

    from specdec.errors import ModelLoadError
    from specdec.models import cpu_matrix
    from specdec.models.loader import load_model, wrap_backend

    model = hf_model("llama-tied")
    assert isinstance(wrap_backend(model, "x", "native"), NativeLlama)
    auto = wrap_backend(model, "x", "auto")  # fp32 on a CPU with oneDNN: native, prepacked
    assert isinstance(auto, NativeLlama) and auto.net.layers[0].packed and auto.model is model
    # bf16 on a CPU: native where the CPU multiplies bf16 in hardware, else transformers.
    here = cpu_matrix.CpuCaps.here()
    monkeypatch.setattr(cpu_matrix.CpuCaps, "here", classmethod(lambda cls: replace(here, bf16_units=False)))
    assert isinstance(wrap_backend(model.to(torch.bfloat16), "x", "auto"), HFCausalLM)
    if here.onednn_bf16:
        monkeypatch.setattr(cpu_matrix.CpuCaps, "here", classmethod(lambda cls: replace(here, bf16_units=True)))
        auto = wrap_backend(model, "x", "auto")
        assert isinstance(auto, NativeLlama) and auto.net.layers[0].packed["w13"].packed.dtype == torch.bfloat16
    model.float()
    assert isinstance(wrap_backend(model, "x", "hf"), HFCausalLM)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=32))
    assert isinstance(wrap_backend(gpt2, "g", "auto"), HFCausalLM)
    with pytest.raises(ModelLoadError, match="backend native cannot run"):
        wrap_backend(gpt2, "g", "native")
    with pytest.raises(ModelLoadError, match="unknown backend"):
        load_model("default", backend="fast")
