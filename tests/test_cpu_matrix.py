"""The CPU layout policy picks from what the CPU is (never from a timing), every layout computes the
same product, and a packed net decodes the same greedy tokens as a plain one; the thread count
leaves busy cores out."""

import os

import pytest
import torch

from specdec.drafters.none import NoDrafter
from specdec.engine import Engine, GenerationConfig
from specdec.models.cpu_matrix import (
    BF16_PACK_ROWS, PLAIN_ROWS_AMX, CpuCaps, CpuLayout, CpuMatrix, choose_layout, linear,
)
from specdec.models.cpu_threads import busy_cores, pick_threads
from specdec.models.native_llama import NativeLlama
from tests.conftest import tiny_llama

MB = 1 << 20
EPYC_AVX2 = CpuCaps(isa="AVX2", amx=False, bf16_units=False, onednn=True, onednn_bf16=False)
EPYC_AVX512 = CpuCaps(isa="AVX512", amx=False, bf16_units=True, onednn=True, onednn_bf16=True)
XEON_AMX = CpuCaps(isa="AVX512", amx=True, bf16_units=True, onednn=True, onednn_bf16=True)
NO_ONEDNN = CpuCaps(isa="DEFAULT", amx=False, bf16_units=False, onednn=False, onednn_bf16=False)
needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs oneDNN")


def test_fp32_one_row_reads_the_plain_copy_except_on_avx512_without_amx():
    assert choose_layout(torch.float32, 540 * MB, EPYC_AVX2) == CpuLayout(one_row="plain", plain_rows=0)
    assert choose_layout(torch.float32, 540 * MB, EPYC_AVX512) == CpuLayout(one_row="packed")


def test_fp32_short_passes_read_out_in_only_with_amx():
    assert choose_layout(torch.float32, 540 * MB, XEON_AMX) == CpuLayout(one_row="plain", plain_rows=PLAIN_ROWS_AMX)
    assert choose_layout(torch.float32, 540 * MB, EPYC_AVX2).plain_rows == 0


def test_plain_copies_only_within_the_memory_budget():
    # two extra copies (transposed and [out, in]) fit in 2 GiB up to 1 GiB of weights, one up to 2 GiB
    assert choose_layout(torch.float32, 1500 * MB, XEON_AMX) == CpuLayout(one_row="plain", plain_rows=0)
    assert choose_layout(torch.float32, 3000 * MB, XEON_AMX) == CpuLayout(one_row="packed")
    assert choose_layout(torch.float32, 3000 * MB, EPYC_AVX2) == CpuLayout(one_row="packed")


def test_bf16_is_packed_alone_and_only_with_bf16_units():
    bf16 = CpuLayout(one_row="packed", pack_rows=BF16_PACK_ROWS, slice_bf16=True)
    assert choose_layout(torch.bfloat16, 270 * MB, XEON_AMX) == bf16
    assert choose_layout(torch.bfloat16, 270 * MB, EPYC_AVX512) == bf16
    assert choose_layout(torch.bfloat16, 270 * MB, EPYC_AVX2) is None  # oneDNN would emulate bf16


def test_nothing_is_packed_without_onednn_or_in_fp16():
    assert choose_layout(torch.float32, 540 * MB, NO_ONEDNN) is None
    assert choose_layout(torch.float16, 270 * MB, XEON_AMX) is None


def test_a_layout_needs_a_prepacked_copy_for_what_it_reads_prepacked():
    with pytest.raises(ValueError, match="one_row"):
        CpuLayout(one_row="fast")
    with pytest.raises(ValueError, match="pack_rows=0"):
        CpuLayout(one_row="packed", pack_rows=0)


LAYOUTS = [CpuLayout(one_row="plain"), CpuLayout(one_row="packed"), CpuLayout(one_row="plain", plain_rows=3),
           CpuLayout(one_row="plain", pack_rows=0)]


@needs_onednn
@pytest.mark.parametrize("shape", [(96, 32), (32, 96)])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cpu_matrix_computes_linear_in_every_layout(shape, layout):
    gen = torch.Generator().manual_seed(0)
    w, b = torch.randn(shape, generator=gen), torch.randn(shape[0], generator=gen)
    m = CpuMatrix(w, layout)
    # wide outputs read a transposed copy for one row; narrow ones keep [out, in]; 'packed' neither
    assert m.transposed == (layout.one_row == "plain" and shape[0] >= shape[1])
    for rows in (1, 2, 3, 4):
        x = torch.randn(rows, shape[1], generator=gen)
        torch.testing.assert_close(linear(x, m), torch.nn.functional.linear(x, w), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(linear(x, m, b), torch.nn.functional.linear(x, w, b), atol=1e-5, rtol=1e-5)


@needs_onednn
@pytest.mark.parametrize("layout", LAYOUTS[:3])
def test_packed_net_gives_the_same_greedy_tokens_as_a_plain_one(layout):
    prompt = [5, 17, 3, 42, 8, 17, 3]
    config = GenerationConfig(max_new_tokens=40, k=4, ignore_eos=True)
    plain = NativeLlama.from_hf(tiny_llama(0).model, "plain", max_length=128, pack=False)
    packed = NativeLlama.from_hf(tiny_llama(0).model, "packed", max_length=128, pack=False)
    assert packed.net.pack_for_cpu(layout) == layout and packed.net.layers[0].packed
    assert not plain.net.layers[0].packed
    want = Engine(plain, NoDrafter(plain.device)).generate(prompt, config).token_ids
    assert Engine(packed, NoDrafter(packed.device)).generate(prompt, config).token_ids == want


@needs_onednn
def test_from_hf_packs_once_with_the_policy_of_this_cpu():
    model = NativeLlama.from_hf(tiny_llama(0).model, "x", max_length=64)
    assert model.net.cpu_layout == choose_layout(torch.float32, 0, CpuCaps.here())  # a tiny model: no budget limit
    with pytest.raises(ValueError, match="runs once"):
        model.net.pack_for_cpu()


@pytest.mark.parametrize("cores, busy, want", [(2, 0.2, 2), (2, 1.4, 1), (2, 5.0, 1), (8, 2.6, 5), (1, 0.0, 1)])
def test_threads_leave_the_busy_cores_out(cores, busy, want):
    assert pick_threads(None, cores, busy).count == want


def test_busy_cores_reads_a_share_of_the_machine():
    assert 0.0 <= busy_cores(0.05) <= (os.cpu_count() or 1)


def test_threads_asked_for_win():
    assert pick_threads(3, 2, 1.9).count == 3 and "--threads" in pick_threads(3, 2, 1.9).why
    assert pick_threads(None, 2, 1.9, omp_env="2").count == 2
    assert pick_threads(None, 2, 0.0, omp_env="").count == 2  # an empty OMP_NUM_THREADS is unset
    assert "1.9 busy" in pick_threads(None, 2, 1.9).describe()
