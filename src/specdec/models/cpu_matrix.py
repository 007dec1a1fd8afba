"""How a CPU holds the native model's matrices: one layout policy, chosen once from what the CPU is.

PyTorch's default CPU matmul repacks the weight on every call once there is more than one row, so
each matrix is reordered once into oneDNN's blocked layout (a 5-token verify pass then costs about
1.3x a 1-token step on a 2-core AMD EPYC, against 2x). A single-token step may read a plain copy
instead, and a pass of 2-3 rows F.linear on [out, in], where those read faster on that CPU.

Which layout wins was measured on the 2-core machines this project runs on (docs/gpu.md and
results/: cpu-few-rows-xeon.txt, gpu-cpu-*.json, cpu-bf16-*.txt), and `choose_layout` writes those
results down as a rule of the CPU's capabilities, the dtype and the weights' size: none of them
changes when other processes load the machine, so a busy machine cannot flip the choice (timing the
layouts at load did: it measured the noise).

bf16 (on a CPU with bf16 units) is held prepacked alone, one kernel for every row count, so a row
gets the same bits alone or inside a verify pass. Where oneDNN still computes a row differently by
its place in a pass (an AMD EPYC with AVX-512 BF16, for 1536 inputs and more), the matrix is
prepacked in input slices that are alike; whether they are is checked by arithmetic at load
(`row_exact_slices`: fixed inputs, bit for bit), not timed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

ONE_ROW_COPY_BYTES = 2 << 30  # the most memory the extra plain copies of a model's matrices may take
FP32_PACK_ROWS = 5  # oneDNN's row hint for fp32 (a verify pass of K + 1 = 5 rows)
BF16_PACK_ROWS = 8  # oneDNN's row hint for bf16: 1-16 rows then cost the same (hint 1 was 40% slower)
BF16_K_CHUNKS = (1024, 512, 256)  # widest input slices tried where a bf16 matrix's rows differ by row count
PLAIN_ROWS_AMX = 3  # on the Xeons with AMX, passes of 2-3 rows read F.linear on [out, in] faster


@dataclass(frozen=True)
class CpuCaps:
    """What the CPU and this PyTorch build can do: fixed for the machine, whatever its load.

    isa: torch.backends.cpu.get_cpu_capability() ("AVX2", "AVX512", "DEFAULT", ...)."""

    isa: str
    amx: bool  # AMX tiles (Intel Xeon, Sapphire Rapids and later)
    bf16_units: bool  # bf16 products in hardware: AVX-512 BF16 or AMX
    onednn: bool  # oneDNN (mkldnn) compiled in: what prepacks
    onednn_bf16: bool  # oneDNN runs bf16 on this CPU

    @classmethod
    def here(cls) -> "CpuCaps":
        onednn = torch.backends.mkldnn.is_available()
        amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
        bf16_units = amx or getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)()
        return cls(isa=torch.backends.cpu.get_cpu_capability(), amx=amx, bf16_units=bf16_units, onednn=onednn,
                   onednn_bf16=onednn and torch.ops.mkldnn._is_mkldnn_bf16_supported())


@dataclass(frozen=True)
class CpuLayout:
    """How every matrix of a CPU model is held and read.

    one_row: what a single-token step reads: "plain" (a transposed copy [in, out] where the output
    is at least as wide as the input, [out, in] as it is otherwise) or "packed" (the prepacked one).
    plain_rows: passes of 2..plain_rows rows read F.linear on [out, in] (0: prepacked from 2 rows).
    pack_rows: oneDNN's row hint for the prepacked copy (0: no prepacked copy; one_row must be "plain").
    slice_bf16: bf16 matrices whose rows differ by row count are prepacked in alike input slices."""

    one_row: str = "plain"
    plain_rows: int = 0
    pack_rows: int = FP32_PACK_ROWS
    slice_bf16: bool = False

    def __post_init__(self):
        if self.one_row not in ("plain", "packed"):
            raise ValueError(f"one_row must be 'plain' or 'packed', not {self.one_row!r}")
        if self.pack_rows == 0 and (self.one_row == "packed" or self.plain_rows):
            raise ValueError("without a prepacked copy (pack_rows=0) every row count reads the plain copy")


def choose_layout(dtype: torch.dtype, weight_bytes: int, caps: CpuCaps,
                  copy_budget: int = ONE_ROW_COPY_BYTES) -> CpuLayout | None:
    """The layout for a model of `weight_bytes` bytes of matrices in `dtype` on a CPU with `caps`
    (None: not prepacked here; the native backend is then not the fast path).

    - bf16, only where the CPU multiplies bf16 in hardware (oneDNN emulates it elsewhere): prepacked
      alone, tuned for 8 rows: a pass of 1-16 rows costs about one step, and its rows match single steps.
    - fp32, one row: the plain copy (a transposed one for wide outputs), 1.05-1.16x plain decoding on
      a 2-core AMD EPYC with AVX2 and 1.26-1.49x on the Xeons with AMX; but on the AMD EPYC with
      AVX-512 (and no AMX) the prepacked matrices decoded faster (23.8 against 21.1 tok/s), so there,
      the only AVX-512 CPU without AMX measured, single steps read the prepacked ones.
    - fp32, 2-3 rows: F.linear on [out, in] on the Xeons with AMX (12-15% cheaper verify passes:
      results/cpu-few-rows-xeon.txt); elsewhere prepacked (on the AVX2 EPYC a 2-row F.linear
      repacked the weight on every call: 156 against 83 ms).
    - Each plain copy costs `weight_bytes` more memory: made only while the copies stay within
      `copy_budget` (a large model reads the prepacked matrices at every row count)."""
    if not caps.onednn or dtype not in (torch.float32, torch.bfloat16):
        return None
    if dtype == torch.bfloat16:
        if not (caps.onednn_bf16 and caps.bf16_units):
            return None
        return CpuLayout(one_row="packed", pack_rows=BF16_PACK_ROWS, slice_bf16=True)
    if weight_bytes > copy_budget or (caps.isa == "AVX512" and not caps.amx):
        return CpuLayout(one_row="packed")
    few_rows = caps.amx and 2 * weight_bytes <= copy_budget  # a third layout: [out, in] beside the transposed one
    return CpuLayout(one_row="plain", plain_rows=PLAIN_ROWS_AMX if few_rows else 0)


def can_pack(dtype: torch.dtype = torch.float32) -> bool:
    """Whether oneDNN can hold CPU matrices of `dtype` prepacked (fp32; bf16 where oneDNN supports it)."""
    caps = CpuCaps.here()
    return caps.onednn and (dtype == torch.float32 or (dtype == torch.bfloat16 and caps.onednn_bf16))


def packs_on_cpu(dtype: torch.dtype) -> bool:
    """Whether the native backend prepacks (and so runs fast) a CPU model of `dtype` here."""
    return choose_layout(dtype, 0, CpuCaps.here()) is not None


def pack_weight(w: torch.Tensor, rows: int) -> torch.Tensor:
    """A CPU weight [out, in] (fp32 or bf16) reordered once into oneDNN's blocked layout, tuned for `rows` rows."""
    return torch.ops.mkldnn._reorder_linear_weight(w.detach(), rows)


def _prepacked(x: torch.Tensor, packed: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")


class CpuMatrix:
    """A weight w [out, in] on a CPU, held as `layout` says; calling it on x [rows, in] gives x @ w.T + b.

    Why a transposed copy for one row: x @ w_t is a broadcast multiply-add into the whole output
    row, where F.linear on [out, in] makes one short dot product (and a horizontal sum) per output.
    Streaming the layer matrices on the 2-core AVX2 EPYC (GB/s): LM head 49152x576 19.8 against
    9.9, gate/up 3072x576 17.4 against 10.3, q/k/v 960x576 13.2 against 9.6; the down projection
    576x1536 reads faster as it is (15.6 against 12.0), so narrower outputs keep [out, in].
    k_chunk (bf16): prepacked in slices of k_chunk input columns whose products add in fp32 in a
    fixed order, then round once."""

    def __init__(self, w: torch.Tensor, layout: CpuLayout, k_chunk: int = 0):
        w = w.detach()
        self.in_features = w.shape[1]
        self.k_chunk = k_chunk
        self.chunks = [pack_weight(w[:, k:k + k_chunk].contiguous(), layout.pack_rows)
                       for k in range(0, w.shape[1], k_chunk)] if k_chunk else []
        self.packed = pack_weight(w, layout.pack_rows) if layout.pack_rows and not k_chunk else None
        self.transposed = layout.one_row == "plain" and w.shape[0] >= w.shape[1]
        self.one_row = None if layout.one_row == "packed" else w.t().contiguous() if self.transposed else w
        self.plain_rows = layout.plain_rows
        self.plain = w if layout.plain_rows else None  # [out, in] for passes of 2..plain_rows rows

    def __call__(self, x: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        rows = x.shape[0]
        if self.chunks:
            return self._sliced(x, b)
        if 1 < rows <= self.plain_rows:
            return F.linear(x, self.plain, b)
        if (rows > 1 or self.one_row is None) and self.packed is not None:
            return _prepacked(x, self.packed, b)
        if not self.transposed:
            return F.linear(x, self.one_row, b)
        return x @ self.one_row if b is None else torch.addmm(b, x, self.one_row)

    def _sliced(self, x: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        total = None
        for i, chunk in enumerate(self.chunks):
            part = _prepacked(x[:, i * self.k_chunk:(i + 1) * self.k_chunk].contiguous(), chunk, None).float()
            total = part if total is None else total + part
        if b is not None:
            total = total + b.float()
        return total.to(x.dtype)


def linear(x: torch.Tensor, w, b: torch.Tensor | None = None) -> torch.Tensor:
    """x [n, in] @ w.T + b, where w is a plain weight [out, in] or a CpuMatrix."""
    if isinstance(w, CpuMatrix):
        return w(x, b)
    return F.linear(x, w, b)


def rows_alike(matrix, in_features: int, dtype: torch.dtype, counts=(2, 3, 5, 9, 16)) -> bool:
    """Whether `matrix` gives each row the same bits in passes of `counts` rows as alone (fixed random rows)."""
    x = torch.randn(max(counts), in_features, generator=torch.Generator().manual_seed(0)).to(dtype)
    alone = torch.cat([matrix(x[i:i + 1]) for i in range(max(counts))])
    return all(torch.equal(matrix(x[:n]), alone[:n]) for n in counts)


def row_exact_slices(w: torch.Tensor, layout: CpuLayout) -> int | None:
    """For a bf16 weight [out, in]: 0 if its prepacked rows are alike at every row count, else the
    widest slicing of its inputs into equal slices of at most BF16_K_CHUNKS[i] columns that makes
    them so (None if none does). Equal slices: 2 x 768 read 1536 inputs ~7% faster than 1024 + 512."""
    k = w.shape[1]
    widths = [-(-k // -(-k // limit)) for limit in BF16_K_CHUNKS if limit < k]
    for k_chunk in [0] + sorted(set(widths), reverse=True):
        if rows_alike(CpuMatrix(w, layout, k_chunk=k_chunk), k, w.dtype):
            return k_chunk
    return None
