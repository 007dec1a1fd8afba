"""The megakernel draft step (models/megakernel.py): what can be checked without a GPU.

Its numerics and speed are measured on an H200 by `specdec bench gpu --draft-megakernel`; here: the CUDA source compiles (NVRTC needs no GPU) for the shapes it claims, the host's
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


GRID = 132  # an H200's multiprocessors


def _compiles(defines: dict) -> bool:
    return mk._compile(tuple(sorted(defines.items())), (9, 0))[:4] == b"\x7fELF"  # sm_90 machine code


# Every variant the host builds: each head shape with the FUSED and WIDE it takes, and WIDE's narrower rounds.
SHAPES = [("llama-3.2-1b", {}), ("llama-3.1-8b", {}),
          ("llama-2-7b", {}),  # intermediate 11008: one-load units
          ("llama-3.2-1b", {"qkv_bias": True, "out_bias": True}),
          ("llama-3.2-1b", {"head_dim": 64, "n_heads": 32, "n_kv_heads": 4}),  # TinyLlama's heads
          ("llama-3.2-1b", {"n_kv_heads": 2}),  # 16 query heads a KV head
          ("llama-3.2-1b", {"head_dim": 256, "n_heads": 8, "n_kv_heads": 2}),
          ("llama-3.2-1b", {"head_dim": 96}),  # WIDE refused
          ("llama-3.2-1b", {"dim": 3072})]  # FUSED refused


@pytest.mark.parametrize("size, overrides", SHAPES)
def test_kernel_compiles_for_every_variant_the_host_builds(size, overrides):
    _nvrtc_or_skip()
    arch = named_arch(size, **overrides)
    assert mk.unsupported_shape(arch) is None
    defines = mk.macros(arch, GRID)
    assert _compiles(defines)  # with the Params size check passed
    lanes = arch.head_dim // mk.merge_values(arch)
    for chunks in [n for n in mk.MERGE_ROUNDS if n < min(16, lanes)] if defines["WIDE"] else []:
        assert _compiles({**defines, "MG": chunks}), chunks


def test_variants_follow_the_shape():
    assert mk.macros(named_arch("llama-3.2-1b"), GRID)["FUSED"] == 1
    assert mk.macros(named_arch("llama-3.2-1b"), GRID)["WIDE"] == 1
    assert mk.macros(named_arch("llama-3.2-1b", dim=3072), GRID)["FUSED"] == 0
    assert mk.macros(named_arch("llama-3.2-1b", head_dim=96), GRID)["WIDE"] == 0


def test_fused_down_projection_says_which_shapes_it_takes():
    assert mk.fused_unsupported(named_arch("llama-3.2-1b"), GRID) is None
    assert mk.fused_unsupported(named_arch("llama-3.1-8b"), GRID) is None
    reason = mk.fused_unsupported(named_arch("llama-3.2-1b", dim=3072), GRID)  # 3072 / 8 does not divide 512
    assert reason and "3072" in reason
    reason = mk.fused_unsupported(named_arch("llama-3.2-1b"), 16)  # 8192 features on 16 blocks: 512 a block
    assert reason and "gate/up features" in reason


def test_wide_merge_says_which_head_shapes_it_takes():
    assert mk.wide_unsupported(named_arch("llama-3.2-1b")) is None
    assert mk.wide_unsupported(named_arch("llama-3.1-8b")) is None
    reason = mk.wide_unsupported(named_arch("llama-3.2-1b", head_dim=96))  # 24 lanes of 4 a head
    assert reason and "96" in reason
    reason = mk.wide_unsupported(named_arch("smollm2-135m"))  # 9 heads of 16 lanes: not whole warps
    assert reason and "9 x 64" in reason


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


def test_engine_refuses_a_megakernel_target(monkeypatch):
    model = NativeLlama.random("llama-3.2-1b", device="cpu", dtype=torch.float32, max_length=64,
                               arch_overrides={"n_layers": 1, "dim": 256, "intermediate": 512, "vocab_size": 512,
                                               "n_heads": 4, "n_kv_heads": 2})
    monkeypatch.setattr(NativeLlama, "megakernel", True)  # as a model built with megakernel=True on a GPU
    assert not model.verify_rows_match_steps
    with pytest.raises(UnsupportedHereError, match="cannot be a target.*as a draft only"):
        Engine(model, NoDrafter(model.device))
