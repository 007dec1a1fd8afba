"""The Llama-family network, written out (gpt-fast style): RMSNorm, RoPE, grouped-query attention
over a preallocated KV cache, SwiGLU.

Shapes: n new tokens of one sequence (batch 1), D = dim, H query heads, Hkv KV heads, G = H // Hkv,
hd = head dim, S = cache slots. The cache of a layer is k, v: [Hkv, S, hd]; a token at position p
lives in slot p, so rolling back is only a shorter length (the caller keeps it) and the stale slots
are overwritten later.

q, k and v are one fused matmul, and gate and up another: fewer, larger kernels (one launch
instead of three on a GPU; one pass over x on a CPU).

On a CPU each matrix is held as a CpuMatrix (`LlamaNet.pack_for_cpu`): prepacked for oneDNN for
passes of several rows (PyTorch's default CPU matmul repacks the weight on every call once there is
more than one row, so a 5-token verify pass cost about twice a 1-token step on the 2-core test
machine; prepacked, about 1.3x: docs/gpu.md, "Prepacked weights make a verify pass cheap on a CPU"),
and for single-token steps in whichever plain layout a one-row product reads faster.
"""

from __future__ import annotations

import logging
import os
import time

import torch
import torch.nn.functional as F
from torch import nn

from specdec.models.llama_config import LlamaArch

log = logging.getLogger(__name__)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise in fp32 and cast back before the weight, exactly as transformers does."""
    if x.dtype == torch.float32:  # the same arithmetic in one fused op (fewer small ops on a CPU)
        return F.rms_norm(x, weight.shape, weight, eps)
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def linear(x: torch.Tensor, w, b: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w.T + b, where w is a plain weight [out, in] or a CpuMatrix."""
    if isinstance(w, CpuMatrix):
        return w(x, b)
    return F.linear(x, w, b)


def can_pack(dtype: torch.dtype = torch.float32) -> bool:
    """Whether oneDNN can hold CPU matrices of `dtype` prepacked (fp32; bf16 where oneDNN supports it)."""
    if not torch.backends.mkldnn.is_available():
        return False
    return dtype == torch.float32 or (dtype == torch.bfloat16 and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def has_bf16_units() -> bool:
    """Whether this CPU multiplies bf16 in hardware (AVX-512 BF16 or AMX tiles). There a prepacked
    bf16 pass of 1 to 16 rows costs about the same (docs/gpu.md), so the native backend runs bf16
    targets too; elsewhere oneDNN emulates bf16 and the generic backend is left to them."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def packs_on_cpu(dtype: torch.dtype) -> bool:
    """Whether the native backend prepacks (and so runs fast) a CPU model of `dtype`."""
    return can_pack(dtype) and (dtype == torch.float32 or has_bf16_units())


def pack_weight(w: torch.Tensor, rows: int = 5) -> torch.Tensor:
    """A CPU weight [out, in] (fp32 or bf16) reordered once into oneDNN's blocked layout, tuned for `rows` rows."""
    return torch.ops.mkldnn._reorder_linear_weight(w.detach(), rows)


SINGLE_ROW_COPY_BYTES = 2 << 30  # the most memory the single-row copies of pack_for_cpu may take
ATTN_SPAN = 128  # eager steps attend over whole blocks of this many cache slots (forward_eager)
BF16_PACK_ROWS = 8  # oneDNN's row hint for bf16 matrices: 1-16 rows then cost the same (hint 1 was 40% slower)
BF16_K_CHUNKS = (1024, 512, 256)  # widest input slices tried where a bf16 matrix's rows differ by row count
EXACT_PASS_ROWS = 64  # row_exact passes up to this many tokens attend token by token (verify passes; not prefill)


class CpuMatrix:
    """A weight [out, in] on a CPU, held in the layout each row count reads fastest.

    bf16 (pack_for_cpu on a CPU with bf16 units): prepacked alone, for every row count. With
    k_chunk, prepacked in slices of k_chunk input columns whose products add in fp32 in a fixed
    order, then round once: where oneDNN computes a row differently by its place in a pass of
    several rows (on a 2-core AMD EPYC with AVX-512 BF16, every matrix with 1536 or more inputs;
    up to 1024 every row was alike), the slices are computed alike. The rest of this note is about fp32.

    One row (every decode step): transposed, [in, out], when the output is at least as wide as the
    input: x @ w_t is a broadcast multiply-add into the whole output row, where F.linear on [out, in]
    makes one short dot product (and a horizontal sum) per output. Streaming the layer matrices from
    memory on the 2-core test machine (GB/s; docs/gpu.md): LM head 49152x576 19.8 against 9.9,
    gate/up 3072x576 17.4 against 10.3, q/k/v 960x576 13.2 against 9.6; the down projection
    576x1536 reads faster as it is (15.6 against 12.0), so narrower outputs keep [out, in].
    Several rows (a verify pass): prepacked for oneDNN (`multi_rows`), since PyTorch's GEMM
    repacks the weight on every call and a 5-row x @ w_t read only 3-10 GB/s. For 2-4 rows the
    faster layout depends on the CPU (on a 2-core Xeon with AVX-512, F.linear on [out, in] read 16-20
    GB/s at 2-3 rows against 11-18 prepacked, and 9-14 against 12-18 at 5), so tune_few_rows times
    both; with `few_rows` > 0, rows 2..few_rows go through F.linear on [out, in].
    Holding both layouts doubles the weight memory (LlamaNet.pack_for_cpu does it only up to
    SINGLE_ROW_COPY_BYTES); single_row="packed" keeps only the prepacked one (the layout before)."""

    SINGLE_ROW = ("layout", "packed")

    def __init__(self, w: torch.Tensor, multi_rows: int = 5, single_row: str = "layout", keep_plain: bool = False,
                 k_chunk: int = 0):
        if single_row not in self.SINGLE_ROW:
            raise ValueError(f"single_row must be one of {self.SINGLE_ROW}, not {single_row!r}")
        w = w.detach()
        self.in_features = w.shape[1]
        self.chunks = [pack_weight(w[:, k:k + k_chunk].contiguous(), multi_rows)
                       for k in range(0, w.shape[1], k_chunk)] if k_chunk else []
        self.k_chunk = k_chunk
        self.packed = pack_weight(w, multi_rows) if multi_rows and not k_chunk else None
        self.single_packed = single_row == "packed" and self.packed is not None
        self.transposed = w.shape[0] >= w.shape[1] and not self.single_packed
        self.one_row = None if self.single_packed else w.t().contiguous() if self.transposed else w
        self.plain = w if keep_plain else None  # [out, in] for passes of 2..few_rows rows
        self.few_rows = 0

    def __call__(self, x: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        rows = x.shape[0]
        if self.chunks:
            return self._sliced(x, b)
        if 1 < rows <= self.few_rows:
            return F.linear(x, self.plain, b)
        if (rows > 1 or self.single_packed) and self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, b, "none", [], "")
        if not self.transposed:
            return F.linear(x, self.one_row, b)
        return x @ self.one_row if b is None else torch.addmm(b, x, self.one_row)

    def _sliced(self, x: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        total = None
        for i, chunk in enumerate(self.chunks):
            part = torch.ops.mkldnn._linear_pointwise(x[:, i * self.k_chunk:(i + 1) * self.k_chunk].contiguous(),
                                                      chunk, None, "none", [], "").float()
            total = part if total is None else total + part
        if b is not None:
            total = total + b.float()
        return total.to(x.dtype)


def rows_alike(matrix: CpuMatrix, in_features: int, dtype: torch.dtype, counts=(2, 3, 5, 9, 16)) -> bool:
    """Whether `matrix` gives each row the same bits in passes of `counts` rows as alone (random rows)."""
    x = torch.randn(max(counts), in_features, generator=torch.Generator().manual_seed(0)).to(dtype)
    alone = torch.cat([matrix(x[i:i + 1]) for i in range(max(counts))])
    return all(torch.equal(matrix(x[:n]), alone[:n]) for n in counts)


def row_exact_slices(w: torch.Tensor, multi_rows: int) -> int | None:
    """For a bf16 weight: 0 if its prepacked rows are alike at every row count, else the widest
    slicing of its inputs into equal slices of at most BF16_K_CHUNKS[i] columns that makes them so
    (None if none does). Equal slices: 2 x 768 read 1536 inputs ~7% faster than 1024 + 512."""
    k = w.shape[1]
    widths = [-(-k // -(-k // limit)) for limit in BF16_K_CHUNKS if limit < k]
    for k_chunk in [0] + sorted(set(widths), reverse=True):
        if rows_alike(CpuMatrix(w, multi_rows, single_row="packed", k_chunk=k_chunk), k, w.dtype):
            return k_chunk
    return None


def _prepacked(x: torch.Tensor, m: CpuMatrix) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, m.packed, None, "none", [], "")


def _pass_seconds(matrices: list[CpuMatrix], product) -> float:
    """Wall time of product(m) for every matrix: one forward's worth of weight reads."""
    start = time.perf_counter()
    for m in matrices:
        product(m)
    return time.perf_counter() - start


def tune_single_row(matrices: list[CpuMatrix], repeats: int = 5) -> str:
    """Time one pass over all `matrices` at one row in their single-row layout against prepacked
    (alternating, best of `repeats`); where prepacked reads at least 3% faster, every step reads it
    and the single-row copies are dropped (on a 2-core AMD EPYC with AVX-512 the prepacked matrices
    decoded 23.8 tok/s against 21.1, where on the Xeon and the AVX2 EPYC the layout won). -> the
    layout applied, "layout" or "packed"; SPECDEC_CPU_SINGLE_ROW=layout|packed forces it."""
    forced = os.environ.get("SPECDEC_CPU_SINGLE_ROW")
    if forced is not None and forced not in CpuMatrix.SINGLE_ROW:
        raise ValueError(f"SPECDEC_CPU_SINGLE_ROW must be one of {CpuMatrix.SINGLE_ROW}, got {forced!r}")
    if not all(m.one_row is not None and m.packed is not None for m in matrices):
        return "packed" if all(m.single_packed for m in matrices) else "layout"
    xs = {k: torch.randn(1, k) for k in {m.in_features for m in matrices}}

    def product(packed: bool):
        return lambda m: _prepacked(xs[m.in_features], m) if packed else m(xs[m.in_features])

    choice = forced
    if choice is None:
        _pass_seconds(matrices, product(True)), _pass_seconds(matrices, product(False))  # warm-up
        times = {True: float("inf"), False: float("inf")}
        for _ in range(repeats):
            for packed in (False, True):
                times[packed] = min(times[packed], _pass_seconds(matrices, product(packed)))
        choice = "packed" if times[True] < 0.97 * times[False] else "layout"
    if choice == "packed":
        for m in matrices:
            m.single_packed, m.transposed, m.one_row = True, False, None
    return choice


def tune_few_rows(matrices: list[CpuMatrix], max_rows: int = 8, repeats: int = 3) -> int:
    """Time one pass over all `matrices` (a forward's worth of weight reads) at 2, 3, ... rows,
    F.linear on [out, in] against prepacked; set and return few_rows = the largest row count up to
    which F.linear was faster at every count (0: prepacked from 2 rows, and the plain copies are
    dropped). Overridden by the environment variable SPECDEC_CPU_FEW_ROWS (for reproducible runs)."""
    def pass_time(rows: int, plain: bool) -> float:
        xs = {k: torch.randn(rows, k) for k in {m.in_features for m in matrices}}
        product = (lambda m: F.linear(xs[m.in_features], m.plain)) if plain else \
            (lambda m: _prepacked(xs[m.in_features], m))
        return min(_pass_seconds(matrices, product) for _ in range(repeats))

    forced = os.environ.get("SPECDEC_CPU_FEW_ROWS")
    few = 0
    if forced is not None:
        if not forced.isdigit():
            raise ValueError(f"SPECDEC_CPU_FEW_ROWS must be a whole number >= 0 (rows read as [out, in]), "
                             f"got {forced!r}")
        few = int(forced)
    elif all(m.plain is not None and m.packed is not None for m in matrices):
        pass_time(2, True), pass_time(2, False)  # warm-up
        for rows in range(2, max_rows + 1):
            if pass_time(rows, True) >= pass_time(rows, False):
                break
            few = rows
    for m in matrices:
        m.few_rows = few if m.plain is not None else 0
        if not m.few_rows:
            m.plain = None
    return max((m.few_rows for m in matrices), default=0)  # what was applied (0 without plain copies)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in the half-split layout of HF checkpoints: x [..., hd]; cos, sin [..., hd] broadcast
    against x (e.g. x [n, heads, hd] with cos [n, 1, hd]). The reference every copy follows."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def layer_step(
    x: torch.Tensor, attn_norm: torch.Tensor, wqkv: torch.Tensor, bqkv: torch.Tensor | None,
    wo: torch.Tensor, bo: torch.Tensor | None, ffn_norm: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None,
    cos: torch.Tensor, sin: torch.Tensor, kv_len: int, n_heads: int, n_kv_heads: int, eps: float,
    token_spans: tuple[int, ...] = (),
) -> torch.Tensor:
    """One decoder layer on x [n, D]; writes this step's k, v into the cache at `pos` [n].

    mask: [G*n, kv_len] additive (0 where the row may attend, -inf elsewhere; built once per step,
    not per layer), or None when every cached slot up to kv_len may be seen (a single token).
    cos, sin: [n, hd], the RoPE tables at the tokens' positions. token_spans: one SDPA call per
    token over its own span of slots (its G query rows, the call its single-token step makes), so
    that a verify pass attends exactly as n single steps would.
    """
    n = x.shape[0]
    hd = k_cache.shape[-1]
    group = n_heads // n_kv_heads
    qkv = linear(rms_norm(x, attn_norm, eps), wqkv, bqkv)  # [n, (H + 2 Hkv) hd]
    q, k, v = qkv.split([n_heads * hd, n_kv_heads * hd, n_kv_heads * hd], dim=-1)
    q = rotate(q.view(n, n_heads, hd), cos[:, None], sin[:, None])
    k = rotate(k.view(n, n_kv_heads, hd), cos[:, None], sin[:, None])
    k_cache[:, pos] = k.transpose(0, 1)
    v_cache[:, pos] = v.view(n, n_kv_heads, hd).transpose(0, 1)
    # GQA without copying the cache: the G query heads of a KV head become G*n query rows.
    q = q.view(n, n_kv_heads, group, hd).permute(1, 2, 0, 3).reshape(1, n_kv_heads, group * n, hd)
    keys, values = k_cache[None, :, :kv_len], v_cache[None, :, :kv_len]  # [1, Hkv, kv_len, hd]
    if token_spans:  # query rows are (g, token): token m's G rows are q[..., g * n + m, :]
        per_token = q.view(1, n_kv_heads, group, n, hd)
        masks = mask.view(group, n, kv_len)
        out = torch.stack([F.scaled_dot_product_attention(per_token[:, :, :, m], keys[:, :, :span], values[:, :, :span],
                                                          attn_mask=masks[:, m, :span])
                           for m, span in enumerate(token_spans)], dim=3)  # [1, Hkv, G, n, hd]
    else:
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
    out = out.reshape(n_kv_heads, group, n, hd).permute(2, 0, 1, 3).reshape(n, n_heads * hd)
    h = x + linear(out, wo, bo)
    gate, up = linear(rms_norm(h, ffn_norm, eps), w13).chunk(2, dim=-1)  # [n, I] each
    return h + linear(F.silu(gate) * up, w2)


class Block(nn.Module):
    """The weights of one decoder layer, and its KV cache: k, v [Hkv, S, hd] (one tensor per layer,
    which the fused kernels and the megakernel address directly)."""

    def __init__(self, arch: LlamaArch, slots: int):
        super().__init__()
        hd, d = arch.head_dim, arch.dim
        self.attn_norm = nn.Parameter(torch.ones(d))
        self.wqkv = nn.Linear(d, (arch.n_heads + 2 * arch.n_kv_heads) * hd, bias=arch.qkv_bias)
        self.wo = nn.Linear(arch.n_heads * hd, d, bias=arch.out_bias)
        self.ffn_norm = nn.Parameter(torch.ones(d))
        self.w13 = nn.Linear(d, 2 * arch.intermediate, bias=False)  # gate rows, then up rows
        self.w2 = nn.Linear(arch.intermediate, d, bias=False)
        self.register_buffer("k_cache", torch.empty(arch.n_kv_heads, slots, hd), persistent=False)
        self.register_buffer("v_cache", torch.empty(arch.n_kv_heads, slots, hd), persistent=False)
        self.packed: dict[str, CpuMatrix] = {}  # CPU only: the matrices by name (see pack_for_cpu)

    def weights(self) -> tuple:
        w = {name: self.packed.get(name, getattr(self, name).weight) for name in ("wqkv", "wo", "w13", "w2")}
        return (self.attn_norm, w["wqkv"], self.wqkv.bias, w["wo"], self.wo.bias,
                self.ffn_norm, w["w13"], w["w2"])


class LlamaNet(nn.Module):
    """Weights, RoPE tables and a KV cache of `slots` positions. Knows nothing of the cache length."""

    def __init__(self, arch: LlamaArch, slots: int):
        super().__init__()
        self.arch = arch
        self.slots = slots
        self.embed = nn.Embedding(arch.vocab_size, arch.dim)
        self.layers = nn.ModuleList(Block(arch, slots) for _ in range(arch.n_layers))
        self.norm = nn.Parameter(torch.ones(arch.dim))
        self.lm_head = None if arch.tie_embeddings else nn.Linear(arch.dim, arch.vocab_size, bias=False)
        self.register_buffer("slot_ids", torch.empty(slots, dtype=torch.long), persistent=False)
        self.register_buffer("cos", torch.empty(slots, arch.head_dim), persistent=False)  # [S, hd]
        self.register_buffer("sin", torch.empty(slots, arch.head_dim), persistent=False)
        self._packed_lm: CpuMatrix | None = None  # the LM head, by pack_for_cpu
        self.few_rows = 0  # passes of 2..few_rows rows read [out, in] (pack_for_cpu times it)
        self.single_row = "packed"  # or "layout": what a single-token step reads (pack_for_cpu times it)
        # True when every matrix gives a row the same bits at any row count (bf16 prepacked on a
        # CPU): eager attention then keeps that too (forward_eager).
        self.row_exact = False

    @torch.no_grad()
    def reset_buffers(self) -> None:
        """Fill the cache with zeros and the RoPE tables (angles in fp32, then cast, as HF does)."""
        # Zeros, not garbage: masked slots still enter the attention product, and NaN * 0 is NaN.
        for layer in self.layers:
            layer.k_cache.zero_()
            layer.v_cache.zero_()
        self.slot_ids.copy_(torch.arange(self.slots))
        angles = torch.outer(torch.arange(self.slots).float(), self.arch.rope_inv_freq())  # [S, hd/2]
        angles = torch.cat([angles, angles], dim=-1)
        self.cos.copy_(angles.cos())
        self.sin.copy_(angles.sin())

    def lm_weight(self) -> torch.Tensor:
        return self.embed.weight if self.lm_head is None else self.lm_head.weight

    @torch.no_grad()
    def pack_for_cpu(self, single_row: str | None = None) -> None:
        """Hold every matrix as a CpuMatrix (fp32 on a CPU: a single-row layout, a oneDNN-prepacked
        one, and [out, in] for passes of 2..few_rows rows when timing finds that faster here; bf16:
        the prepacked one alone, which reads 1-16 rows in about the same time). The
        layer parameters are then emptied (the CpuMatrix holds what is needed); the embedding
        stays plain for lookups and the head drafter. single_row None: the single-row layout where
        timing finds it faster than prepacked (tune_single_row) and its second copy of the matrices
        stays under SINGLE_ROW_COPY_BYTES, else steps of one row read the prepacked matrices too (a
        large model on a CPU keeps one copy)."""
        matrices = [getattr(block, name).weight for block in self.layers for name in ("wqkv", "wo", "w13", "w2")]
        size = sum(w.numel() * w.element_size() for w in matrices + [self.lm_weight()])
        bf16 = self.lm_weight().dtype == torch.bfloat16
        timed_single_row = single_row is None and not bf16
        if bf16:  # one kernel for every row count: what makes its rows bit for bit alike (row_exact)
            single_row = "packed"
        elif single_row is None:
            single_row = "layout" if size <= SINGLE_ROW_COPY_BYTES else "packed"
        keep_plain = single_row == "layout" and 2 * size <= SINGLE_ROW_COPY_BYTES  # room for a third layout
        options = dict(single_row=single_row, keep_plain=keep_plain, multi_rows=BF16_PACK_ROWS if bf16 else 5)
        # bf16: per matrix shape, the input slicing under which every row is computed alike (checked here)
        slices = {tuple(w.shape): row_exact_slices(w, BF16_PACK_ROWS) for w in matrices + [self.lm_weight()]} \
            if bf16 else {}
        for block in self.layers:
            for name in ("wqkv", "wo", "w13", "w2"):
                w = getattr(block, name).weight
                block.packed[name] = CpuMatrix(w, **options, k_chunk=slices.get(tuple(w.shape)) or 0)
                getattr(block, name).weight = nn.Parameter(torch.empty(0), requires_grad=False)
        self._packed_lm = CpuMatrix(self.lm_weight(), **options, k_chunk=slices.get(tuple(self.lm_weight().shape)) or 0)
        self.single_row = single_row
        if timed_single_row and single_row == "layout":  # whichever single-row layout reads faster here
            self.single_row = tune_single_row([m for block in self.layers for m in block.packed.values()]
                                              + [self._packed_lm])
        self.row_exact = bf16 and None not in slices.values()
        if bf16 and not self.row_exact:
            log.warning("bf16 matrices of shapes %s give rows that differ by row count on this CPU, even in "
                        "slices: verify passes may not match single steps bit for bit",
                        [shape for shape, k in slices.items() if k is None])
        self.few_rows = tune_few_rows([m for block in self.layers for m in block.packed.values()] + [self._packed_lm])

    def _run(self, tokens: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor | None, kv_len: int,
             token_spans: tuple[int, ...] = (), capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens, pos [n]; mask and kv_len as layer_step takes them -> logits [n, V] and features
        [n, (len(capture) + 1) * D]: the outputs of the layers in `capture` (a draft head's
        multi-layer features), then the final-norm features."""
        a = self.arch
        x = self.embed(tokens)  # [n, D]
        cos, sin = self.cos[pos], self.sin[pos]  # [n, hd]
        captured = []
        for i, layer in enumerate(self.layers):
            x = layer_step(x, *layer.weights(), layer.k_cache, layer.v_cache, pos, mask, cos, sin,
                           kv_len, a.n_heads, a.n_kv_heads, a.norm_eps, token_spans)
            if i in capture:
                captured.append(x)
        hidden = rms_norm(x, self.norm, a.norm_eps)  # [n, D]
        lm = self.lm_weight() if self._packed_lm is None else self._packed_lm
        features = torch.cat(captured + [hidden], dim=-1) if captured else hidden
        return linear(hidden, lm), features  # [n, V], [n, (len(capture) + 1) * D]

    def forward_eager(self, tokens: torch.Tensor, start: int,
                      capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [n] at positions start..start+n-1; each sees the slots up to its own position.
        capture: layers whose outputs come before the final-norm features (see _run).

        With row_exact, attention always runs with a mask over whole blocks of ATTN_SPAN slots, and
        a pass of 2..EXACT_PASS_ROWS tokens (a verify pass) attends token by token, each token's
        query rows over its own span: the very call its single-token step makes, so a token gets
        the same bits alone or inside a verify pass. One SDPA call over several tokens' rows did
        not: over exactly start+n slots without a mask, 1-4 of 16 rows differed in the last bits
        on a Xeon; masked over blocks, one row in 16 at one layer on an AMD EPYC, as a batch too;
        enough to flip bf16 near-ties. Otherwise (fp32, whose layouts differ by row count anyway)
        a single token attends over exactly start+1 slots without a mask, ~3% faster a step on the Xeon."""
        n = tokens.shape[0]
        span = start + n
        if self.row_exact:
            span = self._whole_blocks(span)
        pos = self.slot_ids[start:start + n]
        mask = self._additive_mask(pos, self.slot_ids[:span]) if n > 1 or self.row_exact else None
        spans = ()
        if self.row_exact and 1 < n <= EXACT_PASS_ROWS:
            spans = tuple(self._whole_blocks(start + m + 1) for m in range(n))
        return self._run(tokens, pos, mask, span, spans, capture)

    def forward_static(self, tokens: torch.Tensor, pos: torch.Tensor, fused: bool = False,
                       capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """Fixed shapes for CUDA graphs: tokens, pos [n] (device tensors); attends over all S slots
        with a mask built on the device, so the host never has to say how long the cache is, and
        every row goes through the same SDPA call whatever n is. fused: the Triton kernels of
        triton_ops instead (six per layer, each row computed independently of the row count;
        they mask by position inside the attention kernel)."""
        if fused:
            from specdec.models import triton_ops

            return triton_ops.forward(self, tokens, pos, capture)
        mask = self._additive_mask(pos, self.slot_ids)  # [G*n, S]
        return self._run(tokens, pos, mask, self.slots, capture=capture)

    def _whole_blocks(self, length: int) -> int:
        """The slots a row_exact step attends over for `length` tokens: whole ATTN_SPAN blocks."""
        return min(self.slots, -(-length // ATTN_SPAN) * ATTN_SPAN)

    def _additive_mask(self, pos: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        """[G*n, len(slots)]: 0 where the row's position may see the slot (slot <= pos), else -inf."""
        visible = slots[None, :] <= pos[:, None]  # [n, L]
        mask = torch.zeros(visible.shape, dtype=self.cos.dtype, device=pos.device)
        return mask.masked_fill_(~visible, float("-inf")).repeat(self.arch.group, 1)


def build_net(arch: LlamaArch, slots: int, device: torch.device, dtype: torch.dtype) -> LlamaNet:
    """An uninitialised net allocated straight on `device` in `dtype` (no fp32 copy of 8B weights
    on the host first); fill it with load_hf_state or init_random."""
    with torch.device("meta"):
        net = LlamaNet(arch, slots)
    net = net.to(dtype).to_empty(device=device)
    net.reset_buffers()
    return net


def load_hf_state(net: LlamaNet, state: dict[str, torch.Tensor]) -> None:
    """Copy a transformers Llama/Mistral/Qwen2 state_dict into the fused layout."""
    def get(name):
        return state[name]

    with torch.no_grad():
        net.embed.weight.copy_(get("model.embed_tokens.weight"))
        net.norm.copy_(get("model.norm.weight"))
        if net.lm_head is not None:
            net.lm_head.weight.copy_(state.get("lm_head.weight", get("model.embed_tokens.weight")))
        for i, block in enumerate(net.layers):
            p = f"model.layers.{i}."
            attn = [p + f"self_attn.{x}_proj" for x in "qkv"]
            block.wqkv.weight.copy_(torch.cat([get(a + ".weight") for a in attn]))
            if block.wqkv.bias is not None:
                block.wqkv.bias.copy_(torch.cat([get(a + ".bias") for a in attn]))
            block.wo.weight.copy_(get(p + "self_attn.o_proj.weight"))
            if block.wo.bias is not None:
                block.wo.bias.copy_(get(p + "self_attn.o_proj.bias"))
            block.w13.weight.copy_(torch.cat([get(p + "mlp.gate_proj.weight"), get(p + "mlp.up_proj.weight")]))
            block.w2.weight.copy_(get(p + "mlp.down_proj.weight"))
            block.attn_norm.copy_(get(p + "input_layernorm.weight"))
            block.ffn_norm.copy_(get(p + "post_attention_layernorm.weight"))


def init_random(net: LlamaNet, seed: int = 0) -> None:
    """Random weights (normal, std 0.02; norms 1) for timing at a real size. Generated where the
    net lives, so an 8B model is filled on the GPU in a second."""
    gen = torch.Generator(device=net.embed.weight.device).manual_seed(seed)
    with torch.no_grad():
        for name, param in net.named_parameters():
            if name.endswith("norm"):
                param.fill_(1.0)
            elif name.endswith("bias"):
                param.zero_()
            else:
                param.normal_(0.0, 0.02, generator=gen)
