"""Quantized self-drafts: weight-only int8/int4 layers, and greedy identity through the engine."""

import pytest
import torch
from torch import nn

from specdec.drafters import DRAFT_KINDS, make_drafter
from specdec.drafters.none import NoDrafter
from specdec.drafters.quantized import DynamicInt8Linear, Int4Linear, Int8Linear
from specdec.engine import Engine, GenerationConfig
from specdec.models.loader import LoadedModel


@pytest.fixture(scope="module")
def linear():
    torch.manual_seed(0)
    return nn.Linear(64, 32, bias=True)


@pytest.mark.parametrize("packed", [True, False])
def test_int8_linear_is_close_to_fp32(linear, packed):
    x = torch.randn(3, 64)
    q = Int8Linear(linear, packed=packed)
    assert q.weight_int8.dtype == torch.int8 and q.weight_int8.shape == (32, 64)
    torch.testing.assert_close(q(x), linear(x), atol=0.02, rtol=0.02)


@pytest.mark.parametrize("rows", [1, 2, 5])  # 5 rows: a prefill, through the dequantized GEMM
def test_int4_packed_kernel_matches_dequantized_weights(linear, rows):
    x = torch.randn(rows, 64)
    packed, plain = Int4Linear(linear, packed=True), Int4Linear(linear, packed=False)
    assert packed.packed and not plain.packed
    torch.testing.assert_close(packed(x), plain(x), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(plain(x), linear(x), atol=0.1, rtol=0.1)  # 16 levels per group of 32


def test_dynamic_int8_is_close_to_fp32(linear):
    x = torch.randn(1, 64)
    torch.testing.assert_close(DynamicInt8Linear(linear)(x), linear(x), atol=0.05, rtol=0.05)


def test_self_drafts_are_registered():
    assert {"self-int8", "self-int4", "self-bf16", "self-int8-dynamic"} <= {kind.syntax for kind in DRAFT_KINDS}


@pytest.mark.parametrize("spec", ["self-int8", "self-int4", "self-bf16", "self-int8-dynamic", "self-int4-dequant"])
def test_self_draft_keeps_greedy_output_identical(tiny_target, spec):
    loaded = LoadedModel(tiny_target, None, "tiny")
    drafter = make_drafter(spec, loaded)
    assert drafter.name.startswith(spec.split("-dequant")[0].replace("-dynamic", ""))
    prompt = [1, 5, 9, 3, 7]
    config = GenerationConfig(max_new_tokens=24, k=3, ignore_eos=True)
    plain = Engine(tiny_target, NoDrafter(tiny_target.device)).generate(prompt, config)
    spec_run = Engine(tiny_target, drafter).generate(prompt, config)
    assert spec_run.token_ids == plain.token_ids
    assert spec_run.stats.accepted > 0  # a copy of the target agrees with it most of the time


def test_target_is_left_untouched(tiny_target):
    make_drafter("self-int4", LoadedModel(tiny_target, None, "tiny"))
    linears = [m for m in tiny_target.model.modules() if isinstance(m, nn.Linear)]
    assert linears and all(m.weight.dtype == torch.float32 for m in linears)


def test_self_draft_of_a_native_target_is_quantized(tiny_target):
    """The native CPU backend computes with prepacked matrices; the self-draft must still be int8."""
    from specdec.models.native_llama import NativeLlama

    native = NativeLlama.from_hf(tiny_target.model, "tiny-native", max_length=128)
    drafter = make_drafter("self-int8", LoadedModel(native, None, "tiny"))
    assert any(isinstance(m, Int8Linear) for m in drafter.model.model.modules())
    prompt = [1, 5, 9, 3, 7]
    config = GenerationConfig(max_new_tokens=16, k=3, ignore_eos=True)
    plain = Engine(native, NoDrafter(native.device)).generate(prompt, config)
    assert Engine(native, drafter).generate(prompt, config).token_ids == plain.token_ids
