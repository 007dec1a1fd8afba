"""bf16 on a CPU: the native backend with prepacked bf16 matrices (the fast path where the CPU
multiplies bf16 in hardware) gives every token the same logits, bit for bit, whether it is decoded
alone or inside a verify pass; so greedy speculative output equals plain output by construction."""

import pytest
import torch

from specdec.drafters import ModelDrafter, NoDrafter
from specdec.engine import Engine, GenerationConfig
from specdec.models.llama_net import ATTN_SPAN, can_pack
from specdec.models.native_llama import NativeLlama
from tests.conftest import tiny_llama

pytestmark = pytest.mark.skipif(not can_pack(torch.bfloat16), reason="oneDNN without bf16 on this CPU")


def packed_bf16(seed: int, layers: int = 2) -> NativeLlama:
    hf = tiny_llama(seed, layers=layers, scale=8.0).model.to(torch.bfloat16)
    model = NativeLlama.from_hf(hf, f"bf16-{seed}", max_length=2 * ATTN_SPAN + 64)
    if not model.net.layers[0].packed:  # a CPU without bf16 units: pack anyway, to test the path
        model.net.pack_for_cpu()
    assert model.net.layers[0].packed["wqkv"].packed.dtype == torch.bfloat16
    return model


@pytest.mark.parametrize("cached", [40, ATTN_SPAN - 3, 2 * ATTN_SPAN - 1])  # inside a block, across its end
@pytest.mark.parametrize("n", [2, 5, 9, 17])
def test_verify_pass_equals_single_steps_bit_for_bit(cached, n):
    model = packed_bf16(0)
    tokens = torch.randint(0, model.vocab_size, (cached + n,), generator=torch.Generator().manual_seed(n))
    model.prefill(tokens[:cached])
    together = model.forward(tokens[cached:])
    model.rollback(cached)
    alone = torch.cat([model.forward(tokens[cached + i:cached + i + 1]) for i in range(n)])
    assert torch.equal(together, alone)


def test_greedy_speculative_equals_plain_in_bf16():
    target, draft = packed_bf16(0), packed_bf16(1, layers=1)
    prompt = [5, 17, 3, 42, 8]
    config = GenerationConfig(max_new_tokens=150, k=5, ignore_eos=True)  # crosses a block of ATTN_SPAN slots
    plain = Engine(target, NoDrafter(target.device)).generate(prompt, config)
    spec = Engine(target, ModelDrafter(draft, target.vocab_size)).generate(prompt, config)
    assert spec.token_ids == plain.token_ids
    assert spec.stats.rounds < plain.stats.rounds or spec.stats.accepted == 0


def test_bf16_rows_are_cheap_and_fp32_rows_are_not():
    assert packed_bf16(0).cheap_verify_rows
    fp32 = NativeLlama.from_hf(tiny_llama(0).model, "fp32", max_length=64)
    assert fp32.net.layers[0].packed and not fp32.cheap_verify_rows
