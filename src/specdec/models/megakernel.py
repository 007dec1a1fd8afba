"""A draft's single-token step as one persistent CUDA kernel (megakernel.cu), for Hopper GPUs.

The fused Triton path runs a step as six kernels a layer; on an H200 the 1B shape's small matrices
then stream at 35-59% of the copy ceiling, because every kernel fills and drains the memory pipe
(docs/gpu.md). The megakernel keeps one block on every SM for the whole step, with three grid
barriers a layer (megakernel.cu's header says how); on an H200 its 1B-shape step is 0.808 ms against
0.942 for the Triton kernels in `specdec bench gpu --draft-megakernel`, through NativeLlama.forward.
Two of its variants follow the model's shape: FUSED (gate/up and a split-K down projection in one
phase) where `fused_unsupported` allows it, WIDE (wide merge rounds) where `wide_unsupported` does,
with its merge rounds narrowed where the widest would spill registers.
Its logits are not bit-equal to the Triton kernels' (another reduction order), so it is for draft
models only: a draft's numerics never reach the output, since the target's verify pass decides
every token. `NativeLlama(megakernel=True)` uses it for single-token steps and the engine refuses
such a model as a target.

The kernel is compiled at first use by NVRTC (the `nvidia-cuda-nvrtc` library that PyTorch's CUDA
wheels install) and launched through the CUDA driver API, both through ctypes: no compiler or build
step at install time. `unavailable(arch, device)` says why it cannot run (no CUDA, an older GPU,
no NVRTC, an unsupported shape); `MegakernelStep(net)` raises that reason as a ValueError.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import sys
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("megakernel.cu")
THREADS = 512
MERGE_ROUNDS = (16, 8, 4)  # WIDE: chunks merged per round of loads, widest first (the first that does not spill)
LOADS_IN_FLIGHT = (4, 2, 1)  # 16-byte weight loads per lane in a GEMV unit (two units in flight): the first that fits
RED, ATT_T, ACT_MAX = 4096, 64, 256  # as in megakernel.cu
GUARD, GUARD_VALUE = 65536, -12345.0  # floats after the attention partials, and what they hold
_LAYER_FIELDS = ("wqkv", "bqkv", "wo", "bo", "attn_norm", "ffn_norm", "w13", "w2", "w2t", "k_cache", "v_cache")


class _Params(ctypes.Structure):
    """megakernel.cu's `Params`, field for field (the kernel's one argument, passed by value)."""

    _fields_ = [(name, ctypes.c_void_p) for name in (
        "layers", "embed", "final_norm", "lm_head", "cos", "sin", "token", "pos",
        "resid", "q", "part", "act", "acc", "logits", "hidden", "sync", "flag")] + \
        [("eps", ctypes.c_float)] + \
        [(name, ctypes.c_int) for name in ("n_layers", "slots", "vocab", "max_chunks")]


def params_struct(fields: dict) -> _Params:
    """The kernel's parameter block; every field must be given (ctypes would silently leave a
    missing one 0, as a missing max_chunks once did: every attention partial then shared a slot)."""
    names = [name for name, _ in _Params._fields_]
    if sorted(fields) != sorted(names):
        raise ValueError(f"megakernel parameters: missing {sorted(set(names) - set(fields))}, "
                         f"unknown {sorted(set(fields) - set(names))}")
    return _Params(**fields)


def unavailable(arch, device: torch.device) -> str | None:
    """Why the megakernel cannot run this arch on this device, or None."""
    if device.type != "cuda":
        return f"the megakernel runs on CUDA GPUs (this model is on {device.type})"
    if torch.cuda.get_device_capability(device)[0] < 9:
        return "the megakernel needs a Hopper or newer GPU (compute capability 9.0+)"
    reason = unsupported_shape(arch)
    if reason:
        return reason
    try:
        _nvrtc()
    except OSError as exc:
        return str(exc)
    return None


def unsupported_shape(arch) -> str | None:
    """Why the kernel's tiling cannot take this model's sizes, or None."""
    for what, n in _widths(arch).items():
        if n % 256:
            return f"the megakernel needs {what} divisible by 256 (it is {n})"
    if arch.head_dim % 8 or arch.head_dim > 256 or arch.n_heads % arch.n_kv_heads:
        return f"the megakernel does not support head dim {arch.head_dim} with {arch.n_heads}/{arch.n_kv_heads} heads"
    if (arch.n_heads // arch.n_kv_heads) * ATT_T > 4 * THREADS:
        return "the megakernel supports at most 32 query heads per KV head"
    return None


def _library(names: list[str], patterns: list[str], what: str) -> ctypes.CDLL:
    for name in names:  # an already loaded copy (PyTorch loads its CUDA libraries) or one on the path
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    for pattern in patterns:
        for path in sorted(glob.glob(pattern), reverse=True):
            try:
                return ctypes.CDLL(path)
            except OSError:
                pass
    raise OSError(f"the megakernel needs {what}, which was not found; install PyTorch's CUDA wheels "
                  f"(they bring nvidia-cuda-nvrtc) or set CUDA_HOME")


@functools.cache
def _nvrtc() -> ctypes.CDLL:
    roots = [os.path.join(p, "nvidia") for p in sys.path if os.path.isdir(os.path.join(p, "nvidia"))]
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    patterns = [os.path.join(r, "*", "lib", "libnvrtc.so*") for r in roots] + \
               [os.path.join(cuda_home, "lib64", "libnvrtc.so*")]
    return _library(["libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"], patterns, "NVRTC (libnvrtc)")


@functools.cache
def _driver() -> ctypes.CDLL:
    return _library(["libcuda.so.1", "libcuda.so"], [], "the CUDA driver (libcuda)")


def _check(result: int, call: str) -> None:
    if result:
        text = ctypes.c_char_p()
        _driver().cuGetErrorString(result, ctypes.byref(text))
        raise RuntimeError(f"megakernel: {call} failed: {result} {text.value.decode() if text.value else ''}")


def _widths(arch) -> dict[str, int]:
    return {"dim": arch.dim, "intermediate": arch.intermediate, "heads x head dim": arch.n_heads * arch.head_dim}


def default_loads(arch) -> int:
    """The most 16-byte loads a lane can put in one GEMV unit: a unit must tile every matrix row."""
    return next(u for u in LOADS_IN_FLIGHT if all(n % (256 * u) == 0 for n in _widths(arch).values()))


def macros(arch, grid: int) -> dict[str, int]:
    """The kernel's compile-time sizes, and the variants this shape takes on `grid` blocks."""
    return {"D": arch.dim, "H": arch.n_heads, "HKV": arch.n_kv_heads, "HD": arch.head_dim,
            "FF": arch.intermediate, "NT": THREADS, "U": default_loads(arch),
            "QKV_BIAS": int(arch.qkv_bias), "O_BIAS": int(arch.out_bias),
            "FUSED": int(fused_unsupported(arch, grid) is None), "WIDE": int(wide_unsupported(arch) is None)}


def fused_unsupported(arch, grid: int) -> str | None:
    """Why the FUSED option cannot take this shape on `grid` blocks, or None."""
    if THREADS % (arch.dim // 8) or arch.dim % 8:
        return f"FUSED needs dim / 8 to divide {THREADS} (dim is {arch.dim})"
    if -(-arch.intermediate // grid) > ACT_MAX:
        return f"FUSED needs at most {ACT_MAX} gate/up features a block ({arch.intermediate} on {grid} blocks)"
    return None


def merge_values(arch) -> int:
    """WIDE: values of one head a merging thread takes (megakernel.cu's WV); head_dim / it lanes share a head."""
    return 8 if arch.n_heads * arch.head_dim // THREADS >= 8 else 4


def wide_unsupported(arch) -> str | None:
    """WIDE (megakernel.cu's header) splits a head's values into lanes of 4 or 8: why this head shape
    cannot take it, or None (without it the kernel merges 4 values a thread, 8 chunks a round)."""
    values = merge_values(arch)
    share = arch.head_dim // values
    if arch.head_dim % values or share & (share - 1) or share > 32 or (arch.n_heads * share) % 32:
        return (f"WIDE needs a head dim that splits into 1-32 lanes (a power of two) of {values} values "
                f"and heads x lanes a multiple of 32 ({arch.n_heads} x {arch.head_dim})")
    return None


@functools.cache
def _compile(defines: tuple[tuple[str, int], ...], capability: tuple[int, int]) -> bytes:
    """The kernel's machine code (cubin) for these sizes and this GPU."""
    nvrtc = _nvrtc()
    prog = ctypes.c_void_p()
    source = SOURCE.read_bytes()
    if nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source, b"megakernel.cu", 0, None, None):
        raise RuntimeError("megakernel: nvrtcCreateProgram failed")
    options = [f"--gpu-architecture=sm_{capability[0]}{capability[1]}", "--std=c++17", "-lineinfo"] + \
              [f"-D{k}={v}" for k, v in defines] + [f"-DPARAMS_SIZE={ctypes.sizeof(_Params)}"]
    argv = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
    try:
        status = nvrtc.nvrtcCompileProgram(prog, len(options), argv)
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        if status:
            raise RuntimeError(f"megakernel: NVRTC could not compile megakernel.cu:\n{log.value.decode()}")
        nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        if nvrtc.nvrtcGetCUBIN(prog, cubin):
            raise RuntimeError("megakernel: nvrtcGetCUBIN failed")
        return cubin.raw
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))


class _Kernel:
    """The loaded kernel function of one compiled variant (in the current CUDA context)."""

    def __init__(self, cubin: bytes, shared_bytes: int):
        drv = _driver()
        self.module, self.function = ctypes.c_void_p(), ctypes.c_void_p()
        self._image = ctypes.create_string_buffer(cubin)  # the module keeps pointing at it
        _check(drv.cuModuleLoadData(ctypes.byref(self.module), self._image), "cuModuleLoadData")
        _check(drv.cuModuleGetFunction(ctypes.byref(self.function), self.module, b"megakernel_step"),
               "cuModuleGetFunction")
        _check(drv.cuFuncSetAttribute(self.function, 8, shared_bytes), "cuFuncSetAttribute")  # max dynamic smem
        self.shared_bytes = shared_bytes
        blocks = ctypes.c_int()
        _check(drv.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(blocks), self.function, THREADS,
                                                               ctypes.c_size_t(shared_bytes)), "occupancy")
        if blocks.value < 1:
            raise RuntimeError("megakernel: one block does not fit on a multiprocessor")

    def attribute(self, index: int) -> int:
        value = ctypes.c_int()
        _check(_driver().cuFuncGetAttribute(ctypes.byref(value), index, self.function), "cuFuncGetAttribute")
        return value.value

    def launch(self, grid: int, params: _Params, stream: int) -> None:
        args = (ctypes.c_void_p * 1)(ctypes.addressof(params))
        _check(_driver().cuLaunchKernel(self.function, grid, 1, 1, THREADS, 1, 1, self.shared_bytes,
                                        ctypes.c_void_p(stream), args, None), "cuLaunchKernel")


class MegakernelStep:
    """LlamaNet.forward_static for one token through the megakernel: (tokens [1], pos [1]) ->
    (logits [1, V] bf16, final-norm features [1, D]). Its outputs and scratch live here, so one
    instance serves one captured graph. Launches use every SM: nothing may run beside it."""

    def __init__(self, net):
        arch, device = net.arch, net.slot_ids.device
        reason = unavailable(arch, device)
        if reason is None and net.embed.weight.dtype != torch.bfloat16:
            reason = f"the megakernel runs bf16 weights (these are {net.embed.weight.dtype})"
        if reason:
            raise ValueError(reason)
        self.net, self.arch, self.grid = net, arch, self._grid(device)
        self.defines = macros(arch, self.grid)
        # FUSED streams W2 transposed ([FF][D]: a block's features are one contiguous range)
        self.w2t = [block.w2.weight.t().contiguous() for block in net.layers] if self.defines["FUSED"] else []
        self.max_chunks = -(-net.slots // ATT_T)
        self._allocate(device)
        self.layers = torch.tensor([[self._ptr(block, name, i) for name in _LAYER_FIELDS]
                                    for i, block in enumerate(net.layers)],
                                   dtype=torch.int64, device=device)
        self.kernel = self._build(torch.cuda.get_device_capability(device))
        self._params: dict[tuple[int, int], _Params] = {}

    def _allocate(self, device) -> None:
        """The step's outputs and scratch (fp32 unless said)."""
        a = self.arch
        h, hd = a.n_heads, a.head_dim
        f32 = dict(dtype=torch.float32, device=device)
        self.resid = torch.zeros(a.dim, **f32)
        self.q = torch.zeros(h * hd, **f32)
        # attention partials (means as bf16 in the first half of the acc area, then max and sum), and
        # a guard after them that no launch may touch
        n_part = h * self.max_chunks * (hd + 2)
        self._part_and_guard = torch.full((n_part + GUARD,), GUARD_VALUE, **f32)
        self.part = self._part_and_guard[:n_part]
        self.part.zero_()
        self.act = torch.zeros(a.intermediate, **f32)
        self.acc = torch.zeros(2 * a.dim, **f32)  # FUSED: the down projection's sums, by layer parity
        self.logits = torch.zeros(1, a.vocab_size, dtype=torch.bfloat16, device=device)
        self.hidden = torch.zeros(1, a.dim, dtype=torch.bfloat16, device=device)
        self.sync = torch.zeros(2 + a.n_kv_heads, dtype=torch.int64, device=device)
        self.flag = torch.zeros(1, dtype=torch.int32, device=device)

    def _build(self, capability: tuple[int, int]) -> "_Kernel":
        """Compile and load the kernel; WIDE takes the widest merge round (chunks a round, MG) that
        does not spill registers: 16 chunks fit the 1B shape's kernel, the 8B shape's spills with 16
        and fits with 8 (ptxas, sm_90)."""
        a = self.arch
        g, hd = a.n_heads // a.n_kv_heads, a.head_dim
        xs = max(a.dim, a.intermediate, a.n_heads * hd)
        att = g * hd + ATT_T * (2 * hd + 1) + g * ATT_T + 2 * g  # phase_attention's q, k, v, scores, stats
        shared = 4 * (xs + 2 * RED + 32 + 2 * hd + ACT_MAX + att)
        kernel = _Kernel(_compile(tuple(sorted(self.defines.items())), capability), shared)
        narrower = [n for n in MERGE_ROUNDS if n < min(16, hd // merge_values(a))]  # the kernel's MG: min(16, lanes)
        for chunks in narrower if self.defines["WIDE"] else ():
            if kernel.attribute(3) == 0:  # no local (spill) bytes
                break
            self.defines["MG"] = chunks
            kernel = _Kernel(_compile(tuple(sorted(self.defines.items())), capability), shared)
        return kernel

    @staticmethod
    def _grid(device) -> int:
        return torch.cuda.get_device_properties(device).multi_processor_count

    def _ptr(self, block, name: str, index: int) -> int:
        tensor = {"bqkv": block.wqkv.bias, "bo": block.wo.bias, "k_cache": block.k_cache,
                  "v_cache": block.v_cache, "attn_norm": block.attn_norm, "ffn_norm": block.ffn_norm,
                  "w2t": self.w2t[index] if self.w2t else None}.get(name)
        if tensor is None and name in ("wqkv", "wo", "w13", "w2"):
            tensor = getattr(block, name).weight
        return 0 if tensor is None else tensor.data_ptr()

    def _params_for(self, tokens: torch.Tensor, pos: torch.Tensor) -> _Params:
        key = (tokens.data_ptr(), pos.data_ptr())
        if key not in self._params:  # kept alive: a captured launch read it when it was captured
            net, a = self.net, self.arch
            fields = dict(
                layers=self.layers.data_ptr(), embed=net.embed.weight.data_ptr(), final_norm=net.norm.data_ptr(),
                lm_head=net.lm_weight().data_ptr(), cos=net.cos.data_ptr(), sin=net.sin.data_ptr(),
                token=tokens.data_ptr(), pos=pos.data_ptr(), resid=self.resid.data_ptr(), q=self.q.data_ptr(),
                part=self.part.data_ptr(), act=self.act.data_ptr(), acc=self.acc.data_ptr(),
                logits=self.logits.data_ptr(), hidden=self.hidden.data_ptr(), sync=self.sync.data_ptr(),
                flag=self.flag.data_ptr(),
                eps=a.norm_eps, n_layers=a.n_layers, slots=net.slots, vocab=a.vocab_size, max_chunks=self.max_chunks)
            self._params[key] = params_struct(fields)
        return self._params[key]

    def __call__(self, tokens: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if tokens.shape != (1,) or tokens.dtype != torch.long or pos.dtype != torch.long:
            raise ValueError("the megakernel step takes one token and its position (int64 tensors of shape [1])")
        self.kernel.launch(self.grid, self._params_for(tokens, pos), torch.cuda.current_stream().cuda_stream)
        return self.logits, self.hidden

    def guard_intact(self) -> bool:
        """Whether every launch so far left the floats after the attention partials alone (a check
        on the kernel's partial indexing, which once wrote past them and still gave right logits)."""
        return bool((self._part_and_guard[self.part.numel():] == GUARD_VALUE).all())

    def barrier_timed_out(self) -> bool:
        """Whether a launch's grid barrier ever gave up waiting (its step's results are garbage)."""
        return bool(self.flag.item())
