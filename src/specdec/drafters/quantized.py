"""Self-drafts: a low-precision copy of the target drafts for it (`self-int8`, `self-int4`, `self-bf16`).

The copy shares the target's tokenizer by construction, so any target gets a draft with no second
model to download. Weights are quantized per output channel (int8) or per group of 32 inputs (int4),
activations stay in the target's float type (weight-only quantization).

Kernels: where PyTorch has a packed low-precision matmul for the device (CPU: `_weight_int8pack_mm`,
`_weight_int4pack_mm_for_cpu`) the copy uses it; elsewhere it dequantizes on the fly. Measured on an
AVX2-only CPU (no AVX-512) both packed kernels are still slower than MKL's fp32 GEMV (c > 1), so
`self-int8-dynamic` adds the one int8 kernel that is vectorised for AVX2: FBGEMM's dynamic linear,
which also quantizes activations (per tensor, per call): cheaper, at a lower acceptance rate. The
path taken is in the drafter's name, e.g. `self-int8[packed]`; `bench sweep` measures its c.
"""

from __future__ import annotations

import copy
import warnings
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from specdec.drafters.base import Drafter
from specdec.drafters.model import ModelDrafter
from specdec.errors import ModelLoadError

INT4_GROUP = 32
# The packed CPU kernels are matrix-vector kernels: cost grows with every row. Longer inputs (a draft's
# prefill) go through a dequantized GEMM instead, which is far faster there and computes the same weights.
PACKED_MAX_ROWS = 2
KERNELS = ("auto", "packed", "dequant", "dynamic")


def packed_kernels_available(device: torch.device) -> bool:
    """PyTorch's packed weight-only int8/int4 kernels used here are the CPU ones.

    (The CUDA int4 kernel wants bf16 and its own tile layout; on CUDA we dequantize on the fly.)
    """
    return device.type == "cpu"


class Int8Linear(nn.Module):
    """y = x W^T + b with W stored as int8 [N, K] and one fp scale per output channel [N]."""

    def __init__(self, linear: nn.Linear, packed: bool):
        super().__init__()
        weight = linear.weight.detach().float()  # [N, K]
        scale = weight.abs().amax(dim=1).clamp(min=1e-8) / 127.0  # [N]
        q = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
        dtype = linear.weight.dtype
        self.register_buffer("weight_int8", q)  # [N, K] int8
        self.register_buffer("scale", scale.to(dtype))  # [N]
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)
        self.packed = packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] -> [..., N]
        flat = x.reshape(-1, x.shape[-1])  # [M, K]
        if self.packed and flat.shape[0] <= PACKED_MAX_ROWS:
            y = torch.ops.aten._weight_int8pack_mm(flat, self.weight_int8, self.scale.to(flat.dtype))
        else:  # a per-channel scale commutes with the matmul: scale the output, not the weight
            y = F.linear(flat, self.weight_int8.to(flat.dtype)) * self.scale.to(flat.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], y.shape[-1])


class Int4Linear(nn.Module):
    """Weight-only int4, asymmetric, one (scale, zero) per group of 32 inputs: w = (q - 8) * scale + zero."""

    def __init__(self, linear: nn.Linear, packed: bool, group: int = INT4_GROUP):
        super().__init__()
        weight = linear.weight.detach().float()  # [N, K]
        n, k = weight.shape
        if k % group:
            raise ModelLoadError(f"an int4 self-draft needs every layer's input size divisible by {group}, and "
                                 f"one has {k}: use self-int8 or self-bf16")
        grouped = weight.reshape(n, k // group, group)  # [N, G, 32]
        low, high = grouped.amin(-1), grouped.amax(-1)  # [N, G]
        scale = ((high - low) / 15.0).clamp(min=1e-8)
        q = torch.round((grouped - low[..., None]) / scale[..., None]).clamp(0, 15).to(torch.int32)
        zero = low + 8.0 * scale  # torch's int4 kernels centre codes at 8
        packed = packed and n % 16 == 0  # the CPU packing works on blocks of 16 output rows
        self.group, self.out_features, self.packed = group, n, packed
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)
        if packed:
            self.register_buffer("weight_packed",
                                 torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.reshape(n, k), 1))  # [N, K/2]
            self.register_buffer("scales_and_zeros", torch.stack([scale, zero], -1).transpose(0, 1).contiguous())
        self.register_buffer("codes", q.to(torch.int8))  # [N, G, 32], values 0..15 (for the GEMM path)
        self.register_buffer("scale", scale)  # [N, G]
        self.register_buffer("zero", zero)  # [N, G]

    def dequantized(self) -> torch.Tensor:
        """The weight [N, K] these codes stand for (the fallback path's matmul operand)."""
        w = (self.codes.float() - 8.0) * self.scale[..., None] + self.zero[..., None]
        return w.reshape(self.out_features, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] -> [..., N]
        flat = x.reshape(-1, x.shape[-1])  # [M, K]
        if self.packed and flat.shape[0] <= PACKED_MAX_ROWS:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                flat, self.weight_packed, self.group, self.scales_and_zeros.to(flat.dtype))
        else:
            y = F.linear(flat, self.dequantized().to(flat.dtype))
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], y.shape[-1])


class DynamicInt8Linear(nn.Module):
    """W8A8 dynamic: int8 weights per output channel, activations quantized per call (FBGEMM/x86, CPU only)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()  # [N, K]
        scale = (weight.abs().amax(dim=1).clamp(min=1e-8) / 127.0).double()
        zeros = torch.zeros(weight.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # quantized tensors are deprecated in favour of torchao, still shipped
            warnings.simplefilter("ignore")
            qweight = torch.quantize_per_channel(weight, scale, zeros, 0, torch.qint8)
            bias = None if linear.bias is None else linear.bias.detach().float()
            self._packed = torch.ops.quantized.linear_prepack(qweight, bias)
        self.dtype = linear.weight.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x [..., K] -> [..., N]
        flat = x.reshape(-1, x.shape[-1]).float()  # [M, K]
        y = torch.ops.quantized.linear_dynamic(flat, self._packed, True)  # reduce_range: 7-bit activations
        return y.to(x.dtype).reshape(*x.shape[:-1], y.shape[-1])


def quantize_linears(module: nn.Module, make: Callable[[nn.Linear], nn.Module]) -> int:
    """Replace every nn.Linear below `module` (the LM head included) in place; returns how many."""
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, make(child))
            count += 1
        else:
            count += quantize_linears(child, make)
    return count


def _modules_of(model) -> list[nn.Module]:
    return [v for v in vars(model).values() if isinstance(v, nn.Module)]


def _copy_with_modules(model):
    """A deep copy whose nn.Linear layers do the work. The native backend computes with prepacked
    matrices on a CPU, not its nn.Linear modules, so its self-draft is built from the transformers
    model it keeps as `.model`."""
    from specdec.models.hf import HFCausalLM
    from specdec.models.native_llama import NativeLlama

    if isinstance(model, NativeLlama) and model.model is not None:
        return HFCausalLM(copy.deepcopy(model.model), model.name)
    return copy.deepcopy(model)


def self_copy(target, precision: str, kernel: str = "auto"):
    """A copy of the target's CausalLM in `precision` (int8, int4, bf16); the target is left untouched."""
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; use one of {', '.join(KERNELS)}")
    draft = _copy_with_modules(target.model)
    draft.reset()
    modules = _modules_of(draft)
    if not modules:
        raise ModelLoadError(f"cannot make a self-draft of {target.name!r}: its backend holds no torch module")
    if precision == "bf16":
        for m in modules:
            m.to(torch.bfloat16)
        draft.name = "self-bf16"
        return draft
    if kernel == "dynamic":
        if precision != "int8" or draft.device.type != "cpu":
            raise ModelLoadError("the dynamic (W8A8) kernel exists for int8 on the CPU only")
        make, path = DynamicInt8Linear, "dynamic"
    else:
        packed = packed_kernels_available(draft.device) and kernel in ("auto", "packed")
        cls = {"int8": Int8Linear, "int4": Int4Linear}[precision]
        make, path = (lambda lin: cls(lin, packed)), ("packed" if packed else "dequant")
    with torch.no_grad():
        replaced = sum(quantize_linears(m, make) for m in modules)
    if not replaced:
        raise ModelLoadError(f"cannot make a self-draft of {target.name!r}: no linear layers found")
    draft.name = f"self-{precision}[{path}]"
    return draft


def self_drafter(target, precision: str, kernel: str = "auto") -> Drafter:
    """`self-int8`, `self-int4`, `self-bf16` and their kernel variants (registry.py): the copy as a draft."""
    draft = self_copy(target, precision, kernel)
    return ModelDrafter(draft, target.model.vocab_size, name=draft.name)
