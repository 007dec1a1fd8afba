"""The native Llama-family backend computes what transformers computes, and its cache rolls back."""

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
    from specdec.models import llama_net
    from specdec.models.loader import load_model, wrap_backend

    model = hf_model("llama-tied")
    assert isinstance(wrap_backend(model, "x", "native"), NativeLlama)
    auto = wrap_backend(model, "x", "auto")  # fp32 on a CPU with oneDNN: native, prepacked
    assert isinstance(auto, NativeLlama) and auto.net.layers[0].packed and auto.model is model
    # bf16 on a CPU: native where the CPU multiplies bf16 in hardware, else transformers.
    monkeypatch.setattr(llama_net, "has_bf16_units", lambda: False)
    assert isinstance(wrap_backend(model.to(torch.bfloat16), "x", "auto"), HFCausalLM)
    if llama_net.can_pack(torch.bfloat16):
        monkeypatch.setattr(llama_net, "has_bf16_units", lambda: True)
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


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
@pytest.mark.parametrize("shape", [(96, 32), (32, 96)])
@pytest.mark.parametrize("single_row", ["layout", "packed"])
def test_cpu_matrix_computes_linear_in_every_layout(shape, single_row):
    from specdec.models.llama_net import CpuMatrix, linear

    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(shape, generator=gen), torch.randn(shape[0], generator=gen)
    m = CpuMatrix(w, single_row=single_row)
    # wide outputs read a transposed copy for one row; narrow ones keep [out, in]; 'packed' neither
    assert m.transposed == (single_row == "layout" and shape[0] >= shape[1])
    for few_rows in (0, 3):  # rows 2..few_rows read [out, in] (tune_few_rows' choice)
        m.plain, m.few_rows = w, few_rows
        for rows in (1, 2, 4):
            x = torch.randn(rows, shape[1], generator=gen)
            torch.testing.assert_close(linear(x, m), torch.nn.functional.linear(x, w), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(linear(x, m, b), torch.nn.functional.linear(x, w, b), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="single_row"):
        CpuMatrix(w, single_row="fast")


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
def test_few_row_layout_is_chosen_by_timing_and_can_be_forced(monkeypatch):
    """pack_for_cpu times F.linear on [out, in] against prepacked for short passes and keeps the
    plain copies only when they are used; SPECDEC_CPU_FEW_ROWS forces the choice, and the logits of
    short verify passes are the same (fp32 tolerance) whichever layout reads them."""
    model = hf_model("llama-untied")
    timed = NativeLlama.from_hf(model, "timed", max_length=64)
    mats = [m for block in timed.net.layers for m in block.packed.values()] + [timed.net._packed_lm]
    assert 0 <= timed.net.few_rows <= 8
    assert all(m.few_rows == timed.net.few_rows and (m.plain is not None) == (m.few_rows > 0) for m in mats)
    monkeypatch.setenv("SPECDEC_CPU_FEW_ROWS", "0")
    packed = NativeLlama.from_hf(model, "packed", max_length=64)
    monkeypatch.setenv("SPECDEC_CPU_FEW_ROWS", "4")
    plain = NativeLlama.from_hf(model, "plain", max_length=64)
    assert (packed.net.few_rows, plain.net.few_rows) == (0, 4)
    assert plain.net.layers[0].packed["wqkv"].plain is not None and packed.net._packed_lm.plain is None
    tokens = torch.randint(0, SMALL["vocab_size"], (16,), generator=torch.Generator().manual_seed(3))
    assert_same_steps(packed, plain, tokens, [6, 2, 3, 4, 1])


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
def test_few_rows_reports_what_it_applied_and_checks_the_override(monkeypatch):
    from specdec.models.llama_net import CpuMatrix, tune_few_rows

    w = torch.randn(48, 16)
    monkeypatch.setenv("SPECDEC_CPU_FEW_ROWS", "4")
    packed_only = CpuMatrix(w, single_row="packed")  # no [out, in] copy kept: nothing to apply
    assert tune_few_rows([packed_only]) == 0 and packed_only.few_rows == 0
    kept = CpuMatrix(w, keep_plain=True)
    assert tune_few_rows([kept]) == 4 and kept.few_rows == 4 and kept.plain is not None
    for bad in ("-1", "auto"):
        monkeypatch.setenv("SPECDEC_CPU_FEW_ROWS", bad)
        with pytest.raises(ValueError, match="SPECDEC_CPU_FEW_ROWS must be a whole number"):
            tune_few_rows([CpuMatrix(w, keep_plain=True)])


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
def test_large_models_keep_one_copy_on_a_cpu(monkeypatch):
    """The single-row copies are made only while they are small; otherwise every step reads the
    prepacked matrices, and the logits are the same either way (within fp32 tolerance)."""
    from specdec.models import llama_net

    model = hf_model("llama-untied")
    monkeypatch.setenv("SPECDEC_CPU_SINGLE_ROW", "layout")  # keep the copies even where prepacked is faster
    small = NativeLlama.from_hf(model, "small", max_length=64)
    monkeypatch.setattr(llama_net, "SINGLE_ROW_COPY_BYTES", 0)
    large = NativeLlama.from_hf(model, "large", max_length=64)
    assert small.net.layers[0].packed["w13"].one_row is not None
    assert large.net.layers[0].packed["w13"].one_row is None and large.net._packed_lm.single_packed
    tokens = torch.randint(0, SMALL["vocab_size"], (12,), generator=torch.Generator().manual_seed(2))
    assert_same_steps(small, large, tokens, [8, 1, 1, 2])


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")
def test_single_row_layout_is_chosen_by_timing_and_can_be_forced(monkeypatch):
    """A single-token step reads the single-row copies or the prepacked matrices, whichever timing
    at load finds faster (SPECDEC_CPU_SINGLE_ROW forces it); prepacked drops the copies, and the
    logits agree either way (fp32 tolerance)."""
    from specdec.models.llama_net import CpuMatrix, tune_single_row

    model = hf_model("llama-untied")
    timed = NativeLlama.from_hf(model, "timed", max_length=64)
    assert timed.net.single_row in ("layout", "packed")
    mats = [m for block in timed.net.layers for m in block.packed.values()] + [timed.net._packed_lm]
    assert all((m.one_row is None) == (timed.net.single_row == "packed") for m in mats)
    forced = {}
    for choice in ("layout", "packed"):
        monkeypatch.setenv("SPECDEC_CPU_SINGLE_ROW", choice)
        forced[choice] = NativeLlama.from_hf(model, choice, max_length=64)
        assert forced[choice].net.single_row == choice
    assert forced["packed"].net._packed_lm.single_packed and forced["layout"].net._packed_lm.one_row is not None
    tokens = torch.randint(0, SMALL["vocab_size"], (12,), generator=torch.Generator().manual_seed(5))
    assert_same_steps(forced["layout"], forced["packed"], tokens, [6, 1, 1, 2, 1])
    monkeypatch.setenv("SPECDEC_CPU_SINGLE_ROW", "fastest")
    with pytest.raises(ValueError, match="SPECDEC_CPU_SINGLE_ROW must be one of"):
        tune_single_row([CpuMatrix(torch.randn(8, 4))])
