"""bf16 on a CPU: the native backend with prepacked bf16 matrices (the fast path where the CPU
multiplies bf16 in hardware) gives every token the same logits, bit for bit, whether it is decoded
alone or inside a verify pass; so greedy speculative output equals plain output by construction."""

import pytest
import torch

from specdec.drafters import ModelDrafter, NoDrafter
from specdec.engine import Engine, GenerationConfig
from specdec.models import cpu_matrix, llama_net
from specdec.models.cpu_matrix import BF16_PACK_ROWS, CpuLayout, can_pack
from specdec.models.llama_net import ATTN_SPAN
from specdec.models.native_llama import NativeLlama
from tests.conftest import tiny_llama

pytestmark = pytest.mark.skipif(not can_pack(torch.bfloat16), reason="oneDNN without bf16 on this CPU")


BF16 = CpuLayout(one_row="packed", pack_rows=BF16_PACK_ROWS, slice_bf16=True)  # choose_layout's bf16 layout


def packed_bf16(seed: int, layers: int = 2) -> NativeLlama:
    hf = tiny_llama(seed, layers=layers, scale=8.0).model.to(torch.bfloat16)
    model = NativeLlama.from_hf(hf, f"bf16-{seed}", max_length=2 * ATTN_SPAN + 64)
    if not model.net.layers[0].packed:  # a CPU without bf16 units: pack anyway, to test the path
        model.net.pack_for_cpu(BF16)
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


def row_wise(w: torch.Tensor):
    """x @ w.T computed one row at a time: alike at every row count by construction."""
    return lambda x: torch.stack([(row[None, :] * w).sum(-1) for row in x])


def test_rows_alike_tells_a_row_count_dependent_product():
    w = torch.randn(8, 24, generator=torch.Generator().manual_seed(0))
    assert cpu_matrix.rows_alike(row_wise(w), 24, torch.float32)
    shifted = row_wise(w)
    assert not cpu_matrix.rows_alike(lambda x: shifted(x) + (x.shape[0] > 1) * 1e-3, 24, torch.float32)


def test_sliced_bf16_matrix_computes_the_product():
    gen = torch.Generator().manual_seed(1)
    w, x = torch.randn(40, 96, generator=gen).bfloat16(), torch.randn(5, 96, generator=gen).bfloat16()
    bias = torch.randn(40, generator=gen).bfloat16()
    sliced = cpu_matrix.CpuMatrix(w, BF16, k_chunk=32)
    assert len(sliced.chunks) == 3 and sliced.packed is None
    ref = x.float() @ w.float().T + bias.float()
    torch.testing.assert_close(sliced(x, bias).float(), ref, atol=0.3, rtol=0.02)


def test_pack_slices_the_shapes_whose_rows_differ(monkeypatch, caplog):
    """Where a bf16 matrix's rows differ by row count (as a CPU's oneDNN did for 1536 inputs), it is
    prepacked in input slices that are alike; where no slicing helps, the net is not row_count_invariant."""
    monkeypatch.setattr(cpu_matrix, "BF16_K_CHUNKS", (32, 16))
    # pretend that the one-piece product of the down projection (64 inputs) differs by row count
    monkeypatch.setattr(cpu_matrix, "rows_alike", lambda m, k, dtype: m.k_chunk > 0 or k < 64)
    model = packed_bf16(0)
    assert model.net.layers[0].packed["w2"].k_chunk == 32 and model.net.layers[0].packed["w13"].k_chunk == 0
    assert model.net.row_count_invariant
    reference = NativeLlama.from_hf(tiny_llama(0, scale=8.0).model.to(torch.bfloat16), "plain", max_length=64,
                                    pack=False)
    tokens = torch.tensor([5, 17, 3, 42, 8])
    torch.testing.assert_close(model.prefill(tokens), reference.prefill(tokens), atol=0.1, rtol=0.05)
    monkeypatch.setattr(cpu_matrix, "rows_alike", lambda m, k, dtype: False)
    assert not packed_bf16(0).net.row_count_invariant
    assert "differ by row count" in caplog.text


def test_verify_passes_attend_token_by_token_where_rows_must_match():
    """A row_count_invariant pass of several tokens calls attention once per token, with a single step's
    shapes (SDPA over several tokens' rows, even as a batch, gave some rows other bits on one
    CPU); the result is the batched attention's, closely."""
    model = packed_bf16(0)
    tokens = torch.randint(0, model.vocab_size, (30,), generator=torch.Generator().manual_seed(3))
    model.prefill(tokens[:20])
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return sdpa(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(llama_net.F, "scaled_dot_product_attention", counting)
        by_token = model.forward(tokens[20:25])
    one_token = torch.Size([1, model.arch.n_kv_heads, model.arch.group, model.arch.head_dim])
    assert calls == [one_token] * (5 * model.arch.n_layers)
    model.rollback(20)
    model.net.row_count_invariant = False  # the batched attention, for comparison
    torch.testing.assert_close(model.forward(tokens[20:25]), by_token, atol=0.05, rtol=0.02)
