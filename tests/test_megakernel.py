"""The megakernel draft step (models/megakernel.py): what can be checked without a GPU.

Its numerics and speed are measured on an H200 by benchmarks/gpu_megakernel.py and `specdec bench
gpu`; here: the CUDA source compiles (NVRTC needs no GPU) for the shapes it claims, the host's
mirror of the kernel's parameter block has the kernel's layout (a static_assert in the source),
unsupported shapes and devices get a clear reason, and the engine refuses such a model as a target.
"""

from __future__ import annotations

import re

import pytest
import torch

from specdec.drafters.none import NoDrafter
from specdec.engine import Engine
from specdec.errors import UnsupportedHereError
from specdec.models import megakernel as mk
from specdec.models.llama_config import named_arch
from specdec.models.native_llama import NativeLlama


def _nvrtc_or_skip():
    try:
        mk._nvrtc()
    except OSError as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("size, overrides", [("llama-3.2-1b", {}), ("llama-3.1-8b", {}),
                                             ("llama-2-7b", {}),  # intermediate 11008: one-load units
                                             ("llama-3.2-1b", {"qkv_bias": True, "out_bias": True})])
def test_kernel_compiles_for_supported_shapes(size, overrides):
    _nvrtc_or_skip()
    arch = named_arch(size, **overrides)
    assert mk.unsupported_shape(arch) is None
    cubin = mk._compile(tuple(sorted(mk.macros(arch).items())), (9, 0))
    assert cubin[:4] == b"\x7fELF"  # machine code for sm_90, with the Params size check passed


def test_each_option_set_compiles_as_benchmarked():
    """benchmarks/gpu_megakernel.py adds the options one by one; every such build must compile."""
    _nvrtc_or_skip()
    arch, on = named_arch("llama-3.2-1b"), ()
    for option in ("",) + mk.OPTIONS:
        on += (option,) if option else ()
        cubin = mk._compile(tuple(sorted(mk.macros(arch, options=on).items())), (9, 0))
        assert cubin[:4] == b"\x7fELF", on


def test_options_are_checked():
    with pytest.raises(ValueError, match="megakernel options are"):
        mk.macros(named_arch("llama-3.2-1b"), options=("FLOW", "FAST"))
    assert mk.macros(named_arch("llama-3.2-1b"))["FUSED"] == 1  # all of them by default


def test_fused_down_projection_says_which_shapes_it_takes():
    assert mk.fused_unsupported(named_arch("llama-3.2-1b"), 132) is None
    assert mk.fused_unsupported(named_arch("llama-3.1-8b"), 132) is None
    reason = mk.fused_unsupported(named_arch("llama-3.2-1b", dim=3072), 132)  # 3072 / 8 does not divide 512
    assert reason and "3072" in reason
    reason = mk.fused_unsupported(named_arch("llama-3.2-1b"), 16)  # 8192 features on 16 blocks: 512 a block
    assert reason and "gate/up features" in reason


def test_head_options_say_which_shapes_they_take():
    assert mk.unsupported_options(named_arch("llama-3.2-1b"), 132) == {}
    assert mk.unsupported_options(named_arch("llama-3.1-8b"), 132) == {}
    refused = mk.head_options_unsupported(named_arch("llama-3.2-1b", head_dim=96))  # 24 lanes of 4 a head
    assert set(refused) == {"WIDE"} and "96" in refused["WIDE"]
    refused = mk.head_options_unsupported(named_arch("smollm2-135m"))  # 9 heads of 16 lanes: not whole warps
    assert set(refused) == {"WIDE"} and "9 x 64" in refused["WIDE"]


@pytest.mark.parametrize("overrides", [{"head_dim": 64, "n_heads": 32, "n_kv_heads": 4},  # TinyLlama's heads
                                       {"n_kv_heads": 2},  # 16 query heads a KV head
                                       {"head_dim": 256, "n_heads": 8, "n_kv_heads": 2},
                                       {"head_dim": 96}])   # WIDE refused
def test_kernel_compiles_with_the_options_each_head_shape_takes(overrides):
    _nvrtc_or_skip()
    arch = named_arch("llama-3.2-1b", **overrides)
    options = tuple(o for o in mk.OPTIONS if o not in mk.unsupported_options(arch, 132))
    assert mk._compile(tuple(sorted(mk.macros(arch, options=options).items())), (9, 0))[:4] == b"\x7fELF"


def test_narrower_merge_rounds_compile():
    """MegakernelStep narrows WIDE's merge rounds where the widest would spill registers."""
    _nvrtc_or_skip()
    arch = named_arch("llama-3.2-1b")
    for chunks in mk.MERGE_ROUNDS:
        defines = {**mk.macros(arch), "MG": chunks}
        assert mk._compile(tuple(sorted(defines.items())), (9, 0))[:4] == b"\x7fELF", chunks


def test_timing_build_compiles():
    _nvrtc_or_skip()
    cubin = mk._compile(tuple(sorted(mk.macros(named_arch("llama-3.2-1b"), timing=True).items())), (9, 0))
    assert cubin[:4] == b"\x7fELF"


def test_params_mirror_lists_the_kernel_fields_in_order():
    source = mk.SOURCE.read_text()
    body = re.search(r"struct Params \{(.*?)\};", source, re.S).group(1)
    names = []
    for line in body.splitlines():
        declaration = line.split("//")[0].strip().rstrip(";")
        if declaration:
            names += [re.findall(r"\w+", declarator)[-1] for declarator in declaration.split(",")]
    assert names == [name for name, _ in mk._Params._fields_]


def test_params_struct_refuses_a_missing_field():
    fields = {name: 1 for name, _ in mk._Params._fields_}
    assert mk.params_struct(fields).max_chunks == 1
    del fields["max_chunks"]
    with pytest.raises(ValueError, match="missing.*max_chunks"):
        mk.params_struct(fields)


def test_unit_size_fits_every_matrix():
    assert mk.default_loads(named_arch("llama-3.2-1b")) == 4
    assert mk.default_loads(named_arch("llama-2-7b")) == 1  # 11008 = 43 x 256


def test_unsupported_shape_says_why():
    reason = mk.unsupported_shape(named_arch("smollm2-135m"))  # dim 576
    assert reason and "divisible by 256" in reason and "576" in reason


def test_megakernel_off_cuda_is_a_clear_error():
    with pytest.raises(ValueError, match=r"megakernel=True: .*CUDA"):
        NativeLlama.random("llama-3.2-1b", device="cpu", dtype=torch.float32, max_length=64,
                           arch_overrides={"n_layers": 1, "dim": 256, "intermediate": 512, "vocab_size": 512,
                                           "n_heads": 4, "n_kv_heads": 2}, megakernel=True)


def test_engine_refuses_a_megakernel_target():
    model = NativeLlama.random("llama-3.2-1b", device="cpu", dtype=torch.float32, max_length=64,
                               arch_overrides={"n_layers": 1, "dim": 256, "intermediate": 512, "vocab_size": 512,
                                               "n_heads": 4, "n_kv_heads": 2})
    model.megakernel = True  # as a model built with megakernel=True on a GPU
    assert not model.verify_rows_match_steps
    with pytest.raises(UnsupportedHereError, match="cannot be a target.*as a draft only"):
        Engine(model, NoDrafter(model.device))
