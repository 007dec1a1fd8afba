"""The fused Triton kernels of the native path (run on the CPU through Triton's interpreter): each
kernel against its torch arithmetic, whole steps against the eager torch forward, and greedy
speculative decoding through them equal to plain greedy decoding."""

import pytest
import torch

triton_ops = pytest.importorskip("specdec.models.triton_ops")

from specdec.models import triton_attention  # noqa: E402

from specdec.drafters.lookup import LookupDrafter  # noqa: E402
from specdec.drafters.none import NoDrafter  # noqa: E402
from specdec.engine import Engine, GenerationConfig  # noqa: E402
from specdec.models.llama_net import rms_norm, rotate  # noqa: E402
from specdec.models.native_llama import NativeLlama, NativeOptions  # noqa: E402
from tests.test_native import SMALL, assert_same_steps, hf_model  # noqa: E402

GEN = torch.Generator().manual_seed(0)


def randn(*shape):
    return torch.randn(*shape, generator=GEN)


# A model the fused kernels take: head dim 32 (a q/k/v tile holds 16 columns of each half of a head).
WIDE = dict(hidden_size=128, intermediate_size=192)
# The graphed steps through the kernels, as on CUDA (here Triton's interpreter runs them, without capture).
FUSED = NativeOptions(graphs=True, fused=True)


@pytest.mark.parametrize("rows", [1, 5, 17])
def test_gemv_prologue_and_epilogues_match_torch(rows):
    x, w, bias, norm, res = randn(rows, 48), randn(40, 48), randn(40), randn(48), randn(rows, 40)
    close = dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(triton_ops.gemv(x, w), x @ w.T, **close)
    torch.testing.assert_close(triton_ops.gemv(x, w, bias=bias, residual=res), res + x @ w.T + bias, **close)
    torch.testing.assert_close(triton_ops.rms_norm(x, norm, 1e-5), rms_norm(x, norm, 1e-5), **close)
    gate, up = (x @ w.T).chunk(2, dim=-1)
    torch.testing.assert_close(triton_ops.gemv(x, w, swiglu=True), torch.nn.functional.silu(gate) * up, **close)


@pytest.mark.parametrize("split", [1, 3])
@pytest.mark.parametrize("rows", [1, 17])
def test_norms_folded_into_the_gemvs_match_rms_norm_then_gemv(rows, split, monkeypatch):
    """No norm kernel: the kernel that writes x leaves x * g and x's sums of squares per column
    tile (embed, gemv_then_norm), and the next GEMV scales its accumulator by rstd. Each result
    against rms_norm then the product, with split-K too, and 48 columns (three 16-column tiles)."""
    monkeypatch.setattr(triton_ops, "_chosen_tiles", {})
    monkeypatch.setattr(triton_ops, "INTERPRETER_TILE", triton_ops.Tile(16, 32, 4, 1, split))
    close = dict(atol=1e-4, rtol=1e-4)
    table, g1, g2 = randn(30, 48), randn(48) + 1, randn(48) + 1
    tokens = torch.randint(0, 30, (rows,), generator=GEN)
    w, w2, res, bias = randn(48, 48), randn(40, 48), randn(rows, 48), randn(48)
    x, inp = triton_ops.embed(tokens, table, g1, 1e-5)
    torch.testing.assert_close(x, table[tokens])
    torch.testing.assert_close(triton_ops.gemv(inp, w2), rms_norm(x, g1, 1e-5) @ w2.T, **close)
    h, h_in = triton_ops.gemv_then_norm(x, w, g2, 1e-5, bias=bias, residual=res)
    torch.testing.assert_close(h, res + x @ w.T + bias, **close)
    assert h_in.sq.shape == (rows, 3)  # one sum per 16-column tile of the interpreter's tile
    gate, up = (rms_norm(h, g2, 1e-5) @ w2.T).chunk(2, dim=-1)
    torch.testing.assert_close(triton_ops.gemv(h_in, w2, swiglu=True), torch.nn.functional.silu(gate) * up,
                               **close)
    assert not triton_ops._tile_counters(x.device).any()


@pytest.mark.parametrize("block_n", [16, 32, 64])
def test_sums_of_squares_are_per_16_columns_whatever_the_tile(block_n, monkeypatch):
    """The sums a GEMV leaves for the next norm are over SQ_COLS columns each, not over the tile's
    BLOCK_N: a wide tile (batched passes) must leave the very sums a narrow one (single steps) does."""
    monkeypatch.setattr(triton_ops, "_chosen_tiles", {})
    monkeypatch.setattr(triton_ops, "INTERPRETER_TILE", triton_ops.Tile(block_n, 32, 4, 1, 1))
    x, w, g = randn(5, 48), randn(80, 48), randn(80) + 1  # 80 columns: the last 16-column chunk in a part tile
    h, h_in = triton_ops.gemv_then_norm(x, w, g, 1e-5)
    assert h_in.sq.shape == (5, 5)
    torch.testing.assert_close(h_in.sq, (h * h).view(5, 5, 16).sum(-1), atol=1e-3, rtol=1e-5)
    torch.testing.assert_close(h_in.scaled, h * g)


def test_wide_tiles_keep_the_narrow_tiles_split_k_slices():
    """A wide tile (64 rows and more columns a program, for passes of more than 16 rows) may change
    BLOCK_N, BLOCK_K and warps, never where the split-K slices start: the partial sums stay the same."""
    for k, narrow in [(4096, (16, 256, 4, 4, 1)), (14336, (32, 512, 8, 3, 4)), (4096, (16, 512, 4, 3, 2)),
                      (100, (16, 32, 4, 1, 3))]:
        narrow = triton_ops.Tile(*narrow)
        split, per_split = narrow[4], -(-(-(-k // narrow[4])) // narrow[1]) * narrow[1]
        wide = triton_ops._wide_tiles(k, 4096)(narrow)
        assert wide and narrow not in wide
        for block_n, block_k, _, _, s, block_m in wide:
            assert s == split and block_n > narrow[0] and block_m == 64
            assert -(-(-(-k // s)) // block_k) * block_k == per_split


@pytest.mark.parametrize("block_m", [16, 64])
@pytest.mark.parametrize("split", [2, 3])
def test_split_k_gemv_matches_torch_and_resets_its_counters(split, block_m, monkeypatch):
    """Split-K: the last program of a tile adds the partials. Every epilogue, K not a multiple of
    the slices, 17 rows (two row blocks), each row also computed alone, 40 rows of a 16-row matrix
    (the partials sized by row blocks, not column blocks); the tile counters are back
    at zero for the next GEMV. With 16 rows a program (a narrow tile) and 64 (a wide one). (Bit-for-bit row invariance is checked on a GPU by `specdec bench
    gpu`: the interpreter's numpy products are not row-invariant even without split-K.)"""
    x, w, bias, res = randn(17, 100), randn(40, 100), randn(40), randn(17, 40)
    monkeypatch.setattr(triton_ops, "_chosen_tiles", {})
    monkeypatch.setattr(triton_ops, "INTERPRETER_TILE", triton_ops.Tile(16, 32, 4, 1, split, block_m))
    close = dict(atol=1e-4, rtol=1e-4)
    both = triton_ops.gemv(x, w, bias=bias, residual=res)
    torch.testing.assert_close(both, res + x @ w.T + bias, **close)
    gate, up = (x @ w.T).chunk(2, dim=-1)
    torch.testing.assert_close(triton_ops.gemv(x, w, swiglu=True), torch.nn.functional.silu(gate) * up, **close)
    alone = torch.cat([triton_ops.gemv(x[i:i + 1], w, bias=bias, residual=res[i:i + 1]) for i in range(17)])
    torch.testing.assert_close(alone, both, **close)
    tall, narrow = randn(40, 100), randn(16, 100)  # more row blocks (3) than column blocks (1)
    torch.testing.assert_close(triton_ops.gemv(tall, narrow), tall @ narrow.T, **close)
    assert not triton_ops._tile_counters(x.device).any()


@pytest.mark.parametrize("block_m", [16, 64])
@pytest.mark.parametrize("bias", [False, True])
def test_qkv_rope_and_attention_match_torch(bias, block_m, monkeypatch):
    """The q/k/v GEMV of normalised x with RoPE in its epilogue (q out, k and v into the cache at
    their positions), then attention over the cache split in chunks, against torch."""
    monkeypatch.setattr(triton_ops, "_chosen_tiles", {})
    monkeypatch.setattr(triton_ops, "INTERPRETER_TILE", triton_ops.Tile(16, 32, 4, 1, 1, block_m))
    n_heads, n_kv, hd, slots, n, d = 4, 2, 32, 320, 5, 48
    pos = torch.arange(254, 254 + n)  # across a chunk boundary of the split attention (256)
    angles = randn(slots, hd // 2)
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)  # RoPE tables repeat their halves
    k_cache, v_cache = randn(n_kv, slots, hd), randn(n_kv, slots, hd)
    x, g = randn(n, d), randn(d) + 1
    w, b = randn((n_heads + 2 * n_kv) * hd, d), (randn((n_heads + 2 * n_kv) * hd) if bias else None)
    inp = triton_ops.NormInput(x * g, (x * x).sum(-1)[:, None], 1e-5)
    q = triton_ops.qkv_rope(inp, w, b, cos, sin, pos, pos, k_cache, v_cache, n_heads, n_kv)
    qkv = rms_norm(x, g, 1e-5) @ w.T + (b if bias else 0)
    q_ref, k_ref, v_ref = qkv.split([n_heads * hd, n_kv * hd, n_kv * hd], dim=-1)
    close = dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(q, rotate(q_ref.view(n, n_heads, hd), cos[pos, None], sin[pos, None]).reshape(n, -1), **close)
    torch.testing.assert_close(k_cache[:, pos], rotate(k_ref.view(n, n_kv, hd), cos[pos, None], sin[pos, None]).transpose(0, 1),
                               **close)
    torch.testing.assert_close(v_cache[:, pos], v_ref.view(n, n_kv, hd).transpose(0, 1), **close)

    out = triton_attention.attention(q, k_cache, v_cache, pos, triton_attention.one_sequence(n, n_heads // n_kv, slots, pos.device),
                                     n_heads, n_kv)
    for i, p in enumerate(pos.tolist()):  # each token sees the slots up to its own position
        keys = k_cache[:, :p + 1].repeat_interleave(n_heads // n_kv, 0)
        values = v_cache[:, :p + 1].repeat_interleave(n_heads // n_kv, 0)
        ref = torch.nn.functional.scaled_dot_product_attention(q[i].view(n_heads, 1, hd), keys, values)
        torch.testing.assert_close(out[i], ref.reshape(-1), **close)  # exp2 with log2(e) folded in: fp32 rounding


@pytest.mark.parametrize("variant", ["llama3-rope-scaling", "qwen2-qkv-bias"])
def test_fused_steps_match_the_eager_forward(variant):
    model = hf_model(variant, random_norms=True, **WIDE)
    eager = NativeLlama.from_hf(model, "eager", max_length=64, pack=False)
    fused = NativeLlama.from_hf(model, "fused", max_length=64, options=FUSED, pack=False)
    assert fused.options.fused
    tokens = torch.randint(0, SMALL["vocab_size"], (40,), generator=torch.Generator().manual_seed(2))
    assert_same_steps(eager, fused, tokens, [20, 1, 5, 1, 2, 3, 7], layers=(0,))


def test_greedy_speculation_through_fused_kernels_equals_plain_greedy():
    """The plumbing of verify steps (positions, cache writes, masks, rollback) through the kernels.
    Under the interpreter NumPy may round a row differently by its place in a 16-row tile, so this
    does not prove bit-identity; `specdec bench gpu` checks that on a GPU (row_invariance)."""
    model = NativeLlama.from_hf(hf_model("llama-untied", seed=4, **WIDE), "fused", max_length=96, options=FUSED,
                                pack=False)
    prompt = [5, 9, 13, 5, 9, 13, 5, 9, 13, 5, 9]  # repetitive, so prompt lookup drafts
    config = GenerationConfig(max_new_tokens=24, k=4, ignore_eos=True)
    plain = Engine(model, NoDrafter(model.device)).generate(prompt, config)
    spec = Engine(model, LookupDrafter(model.device)).generate(prompt, config)
    assert spec.stats.drafted > 0
    assert spec.token_ids == plain.token_ids


def test_fused_kernels_are_chosen_by_device_and_shape(monkeypatch):
    model = hf_model("llama-untied", **WIDE)
    assert not NativeLlama.from_hf(model, "x", max_length=32, cuda_graphs=True).options.fused  # CUDA only
    with pytest.raises(ValueError, match="graphs=True"):
        NativeLlama.from_hf(model, "x", max_length=32, options=NativeOptions(graphs=False, fused=True))
    fused = NativeLlama.from_hf(model, "x", max_length=32, options=FUSED)  # pack left default
    assert fused.options.fused and fused.net._packed_lm is None  # the kernels read plain weights
    with pytest.raises(ValueError, match="head dim 16 is not a power of two >= 32"):
        NativeLlama.from_hf(hf_model("llama-untied"), "x", max_length=32, options=FUSED)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="run on CUDA"):
        NativeLlama.from_hf(model, "x", max_length=32, options=FUSED)


def test_programmatic_launch_only_where_supported():
    assert not triton_ops.uses_pdl(torch.device("cpu"))  # no Hopper GPU here (and the interpreter): plain launches
