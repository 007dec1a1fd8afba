"""The Llama-family network, written out (gpt-fast style): RMSNorm, RoPE, grouped-query attention
over a preallocated KV cache, SwiGLU.

Shapes: n new tokens of one sequence (batch 1), D = dim, H query heads, Hkv KV heads, G = H // Hkv,
hd = head dim, S = cache slots. The cache of a layer is k, v: [Hkv, S, hd]; a token at position p
lives in slot p, so rolling back is only a shorter length (the caller keeps it) and the stale slots
are overwritten later.

q, k and v are one fused matmul, and gate and up another: fewer, larger kernels (one launch
instead of three on a GPU; one pass over x on a CPU).

On a CPU each matrix is held as a CpuMatrix (cpu_matrix.py: one layout policy, chosen once from
the CPU's capabilities) and the layers just call `linear(x, w)`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from specdec.models.cpu_matrix import CpuCaps, CpuLayout, CpuMatrix, choose_layout, linear, row_exact_slices
from specdec.models.llama_config import LlamaArch
from specdec.models.tree_rows import paths, row_positions, sees
from specdec.trees import depths

log = logging.getLogger(__name__)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise in fp32 and cast back before the weight, exactly as transformers does."""
    if x.dtype == torch.float32:  # the same arithmetic in one fused op (fewer small ops on a CPU)
        return F.rms_norm(x, weight.shape, weight, eps)
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


ATTN_SPAN = 128  # eager steps attend over whole blocks of this many cache slots (forward_eager)
EXACT_PASS_ROWS = 64  # row-count invariant passes up to this many tokens attend token by token (verify passes)


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [T, head_dim] for positions [T] (Llama's half-split rotary layout)."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    angles = positions.float()[:, None] * inv[None]  # [T, hd/2]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE in the half-split layout of HF checkpoints: x [..., hd]; cos, sin [..., hd] broadcast
    against x (e.g. x [n, heads, hd] with cos [n, 1, hd]). The reference every copy follows."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


@dataclass(frozen=True)
class SeqSpan:
    """How one sequence's rows of a pass attend: rows row .. row + n - 1 of the pass see its own
    cache slots base .. base + kv_len - 1. mask: [G*n, kv_len] additive (0 where the row may attend,
    -inf elsewhere; built once per pass, not per layer), or None when every slot up to kv_len may be
    seen (a single token). token_spans: one SDPA call per token over its own first slots (its G
    query rows, the call its single-token step makes), so that a verify pass attends exactly as n
    single steps would."""

    row: int
    n: int
    base: int
    kv_len: int
    mask: torch.Tensor | None
    token_spans: tuple[int, ...] = ()
    paths: "PathLayout | None" = None


@dataclass(frozen=True)
class PathLayout:
    """A tree pass attending token by token (SeqSpan.token_spans): the sequence's new rows sit at its
    cache slots start.. (row r at start + r), and paths[r] is row r's path (root first, itself last).
    Before row r's call its path's entries are laid out at start, start + 1, ..., as decoding the
    path one token at a time lays them out, so the call's inputs are its single step's."""

    start: int
    paths: tuple[tuple[int, ...], ...]


def layer_step(
    x: torch.Tensor, attn_norm: torch.Tensor, wqkv: torch.Tensor, bqkv: torch.Tensor | None,
    wo: torch.Tensor, bo: torch.Tensor | None, ffn_norm: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor,
    k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    seqs: Sequence[SeqSpan], n_heads: int, n_kv_heads: int, eps: float,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """One decoder layer on x [T, D], the rows of one or more sequences; writes their k, v into the
    cache at `pos` [T] (cache slots). cos, sin: [T, hd], the RoPE tables at each token's position
    inside its own sequence. seqs: which rows attend over which slots, one SeqSpan a sequence in
    row order; every matrix runs once over all T rows, attention once per sequence. reduce: under
    tensor parallelism (parallel/shard.py) the sum over ranks of a row-split matrix's partial
    output [T, D], applied after wo and w2; None on one device."""
    t = x.shape[0]
    hd = k_cache.shape[-1]
    qkv = linear(rms_norm(x, attn_norm, eps), wqkv, bqkv)  # [T, (H + 2 Hkv) hd]
    q, k, v = qkv.split([n_heads * hd, n_kv_heads * hd, n_kv_heads * hd], dim=-1)
    q = rotate(q.view(t, n_heads, hd), cos[:, None], sin[:, None])
    k = rotate(k.view(t, n_kv_heads, hd), cos[:, None], sin[:, None])
    k_cache[:, pos] = k.transpose(0, 1)
    v_cache[:, pos] = v.view(t, n_kv_heads, hd).transpose(0, 1)
    outs = [attend(q[s.row:s.row + s.n], k_cache, v_cache, s) for s in seqs]
    out = outs[0] if len(outs) == 1 else torch.cat(outs)  # [T, H hd]
    reduce = reduce or (lambda partial: partial)
    h = x + reduce(linear(out, wo, bo))
    gate, up = linear(rms_norm(h, ffn_norm, eps), w13).chunk(2, dim=-1)  # [T, I] each
    return h + reduce(linear(F.silu(gate) * up, w2))


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seq: SeqSpan) -> torch.Tensor:
    """One sequence's attention: q [n, H, hd] (rotated) over its slots of k, v [Hkv, S, hd] -> [n, H hd]."""
    n, n_heads, hd = q.shape
    n_kv_heads = k_cache.shape[0]
    group = n_heads // n_kv_heads
    # GQA without copying the cache: the G query heads of a KV head become G*n query rows.
    q = q.reshape(n, n_kv_heads, group, hd).permute(1, 2, 0, 3).reshape(1, n_kv_heads, group * n, hd)
    end = seq.base + seq.kv_len
    keys, values = k_cache[None, :, seq.base:end], v_cache[None, :, seq.base:end]  # [1, Hkv, kv_len, hd]
    if seq.token_spans:  # query rows are (g, token): token m's G rows are q[..., g * n + m, :]
        per_token = q.view(1, n_kv_heads, group, n, hd)
        masks = seq.mask.view(group, n, seq.kv_len)

        def call(m: int) -> torch.Tensor:  # [1, Hkv, G, hd]
            span = seq.token_spans[m]
            return F.scaled_dot_product_attention(per_token[:, :, :, m], keys[:, :, :span], values[:, :, :span],
                                                  attn_mask=masks[:, m, :span])

        outs = [call(m) for m in range(n)] if seq.paths is None else on_paths(k_cache, v_cache, seq, call)
        out = torch.stack(outs, dim=3)  # [1, Hkv, G, n, hd]
    else:
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=seq.mask)
    return out.reshape(n_kv_heads, group, n, hd).permute(2, 0, 1, 3).reshape(n, n_heads * hd)


def on_paths(k_cache: torch.Tensor, v_cache: torch.Tensor, seq: SeqSpan,
             call: Callable[[int], torch.Tensor]) -> list[torch.Tensor]:
    """call(r) for each row r of a tree pass (seq.paths), the cache slots base + start .. laid out
    as row r's path first (PathLayout); the pass's own entries (row r at start + r) are put back
    afterwards. k, v: [Hkv, S, hd]; only the path's d + 1 entries move per row, never the prefix."""
    first = seq.base + seq.paths.start
    own_k, own_v = k_cache[:, first:first + seq.n].clone(), v_cache[:, first:first + seq.n].clone()  # [Hkv, n, hd]
    laid = list(range(seq.n))  # which row's entries sit at first + i now
    outs = []
    for r, path in enumerate(seq.paths.paths):
        if laid[:len(path)] != list(path):
            k_cache[:, first:first + len(path)] = own_k[:, list(path)]
            v_cache[:, first:first + len(path)] = own_v[:, list(path)]
            laid[:len(path)] = path
        outs.append(call(r))
    if laid != list(range(seq.n)):
        k_cache[:, first:first + seq.n] = own_k
        v_cache[:, first:first + seq.n] = own_v
    return outs


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
        self.cpu_layout: CpuLayout | None = None  # how pack_for_cpu holds the matrices (None: plain)
        # True when every matrix gives a row the same bits at any row count (bf16 prepacked on a
        # CPU): eager attention then keeps that too (forward_eager). Set by pack_for_cpu.
        self.row_count_invariant = False
        # Tensor parallelism only (parallel/shard.py, set once when the shard is built): sums the
        # partial outputs of the row-split matrices over ranks. None: the whole model is here.
        self.reduce_partial: Callable[[torch.Tensor], torch.Tensor] | None = None

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
    def pack_for_cpu(self, layout: CpuLayout | None = None) -> CpuLayout | None:
        """Hold every matrix as a CpuMatrix in `layout` (None: cpu_matrix.choose_layout's choice for
        this CPU, dtype and size; where it is None the net stays plain) and return the layout used.
        Once, before the net is used (from_hf). The layer parameters are then emptied (the
        CpuMatrix holds what is needed); the embedding stays plain for lookups and the head drafter.
        bf16 with slice_bf16: each matrix shape prepacked whole or in the input slices under which
        its rows are computed alike at every row count (checked by arithmetic, row_exact_slices)."""
        if self.cpu_layout is not None:
            raise ValueError("pack_for_cpu runs once: this net is already packed")
        matrices = [getattr(block, name).weight for block in self.layers for name in ("wqkv", "wo", "w13", "w2")]
        lm = self.lm_weight()
        if layout is None:
            size = sum(w.numel() * w.element_size() for w in matrices + [lm])
            layout = choose_layout(lm.dtype, size, CpuCaps.here())
            if layout is None:
                return None
        sliced = layout.slice_bf16 and lm.dtype == torch.bfloat16
        slices = {tuple(w.shape): row_exact_slices(w, layout) for w in matrices + [lm]} if sliced else {}
        for block in self.layers:
            for name in ("wqkv", "wo", "w13", "w2"):
                w = getattr(block, name).weight
                block.packed[name] = CpuMatrix(w, layout, k_chunk=slices.get(tuple(w.shape)) or 0)
                getattr(block, name).weight = nn.Parameter(torch.empty(0), requires_grad=False)
        self._packed_lm = CpuMatrix(lm, layout, k_chunk=slices.get(tuple(lm.shape)) or 0)
        self.cpu_layout = layout
        self.row_count_invariant = sliced and None not in slices.values()
        if sliced and not self.row_count_invariant:
            log.warning("bf16 matrices of shapes %s give rows that differ by row count on this CPU, even in "
                        "slices: verify passes may not match single steps bit for bit",
                        [shape for shape, k in slices.items() if k is None])
        return layout

    def run_rows(self, tokens: torch.Tensor, pos: torch.Tensor, seqs: Sequence[SeqSpan],
                 capture: tuple[int, ...] = (), rope_pos: torch.Tensor | None = None,
                 head_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens, pos [T] (the cache slots they go to); seqs as layer_step takes them; rope_pos [T]
        each token's position inside its own sequence (None: pos, one sequence from slot 0);
        head_rows [R] the rows the LM head runs over (None: all) -> logits [R, V] and features
        [T, (len(capture) + 1) * D]: the outputs of the layers in `capture` (a draft head's
        multi-layer features), then the final-norm features."""
        a = self.arch
        x = self.embed(tokens)  # [T, D]
        rope_pos = pos if rope_pos is None else rope_pos
        cos, sin = self.cos[rope_pos], self.sin[rope_pos]  # [T, hd]
        captured = []
        for i, layer in enumerate(self.layers):
            x = layer_step(x, *layer.weights(), layer.k_cache, layer.v_cache, pos, cos, sin, seqs,
                           a.n_heads, a.n_kv_heads, a.norm_eps, self.reduce_partial)
            if i in capture:
                captured.append(x)
        hidden = rms_norm(x, self.norm, a.norm_eps)  # [T, D]
        lm = self.lm_weight() if self._packed_lm is None else self._packed_lm
        features = torch.cat(captured + [hidden], dim=-1) if captured else hidden
        head_in = hidden if head_rows is None else hidden[head_rows]
        logits = linear(head_in, lm) if head_in.shape[0] else head_in.new_empty(0, a.vocab_size)
        return logits, features  # [R, V], [T, (len(capture) + 1) * D]

    def forward_eager(self, tokens: torch.Tensor, start: int, capture: tuple[int, ...] = (),
                      tree: tuple[int, ...] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """tokens [n] at positions start..start+n-1; each sees the slots up to its own position.
        capture: layers whose outputs come before the final-norm features (see run_rows). tree:
        row parents (tree_rows.causal_or_tree's, not a chain) or None: row r at position
        start + depth(r), its k, v at slot start + r, seeing the slots before start and its path."""
        n = tokens.shape[0]
        span = self.eager_span(0, 0, start, n, self.slots, tree)
        rope = None if tree is None else row_positions(start, n, tree).to(tokens.device)
        return self.run_rows(tokens, self.slot_ids[start:start + n], [span], capture, rope)

    @torch.no_grad()
    def keep_rows(self, first: int, rows: Sequence[int]) -> None:
        """Every layer's k, v entries at cache slots first + rows (increasing) moved to first, first + 1, ..."""
        if list(rows) == list(range(len(rows))):
            return
        src = torch.tensor([first + r for r in rows], device=self.slot_ids.device)
        for layer in self.layers:
            for cache in (layer.k_cache, layer.v_cache):  # [Hkv, S, hd]
                cache[:, first:first + len(rows)] = cache.index_select(1, src)

    def eager_span(self, row: int, base: int, start: int, n: int, limit: int,
                   tree: tuple[int, ...] | None = None) -> SeqSpan:
        """How the eager pass attends for one sequence whose n new tokens (rows row.. of the pass)
        sit at positions start.. of its cache, slots base .. base + limit - 1.

        With row_count_invariant, attention always runs with a mask over whole blocks of ATTN_SPAN slots, and
        a pass of 2..EXACT_PASS_ROWS tokens (a verify pass) attends token by token, each token's
        query rows over its own span: the very call its single-token step makes, so a token gets
        the same bits alone or inside a verify pass. One SDPA call over several tokens' rows did
        not: over exactly start+n slots without a mask, 1-4 of 16 rows differed in the last bits
        on a Xeon; masked over blocks, one row in 16 at one layer on an AMD EPYC, as a batch too;
        enough to flip bf16 near-ties. Otherwise (fp32, whose layouts differ by row count anyway)
        a single token attends over exactly start+1 slots without a mask, ~3% faster a step on the Xeon.

        tree (row parents, not a chain; None: causal rows): token by token, each row's call is its
        single step's, over its path laid out at slots start.. (PathLayout), so its mask row is the
        causal one at its position start + depth; in one call, the mask shows each row the slots
        before start and its own path's rows where the pass wrote them (start + r)."""
        span = start + n
        if self.row_count_invariant:
            span = self._whole_blocks(span, limit)
        by_token = self.row_count_invariant and 1 < n <= EXACT_PASS_ROWS
        mask = self._span_mask(start, n, span, tree, by_token)
        if not by_token:
            return SeqSpan(row, n, base, span, mask)
        ends = range(start + 1, start + n + 1) if tree is None else (start + d + 1 for d in depths(tree))
        spans = tuple(self._whole_blocks(end, limit) for end in ends)
        return SeqSpan(row, n, base, span, mask, spans, None if tree is None else PathLayout(start, paths(tree)))

    def forward_static(self, tokens: torch.Tensor, pos: torch.Tensor, fused: bool = False,
                       capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
        """Fixed shapes for CUDA graphs: tokens, pos [n] (device tensors); attends over all S slots
        with a mask built on the device, so the host never has to say how long the cache is, and
        every row goes through the same SDPA call whatever n is. fused: the Triton kernels of
        triton_ops instead (six per layer, each row computed independently of the row count;
        they mask by position inside the attention kernel)."""
        if fused:
            from specdec.models import triton_forward

            return triton_forward.forward(self, tokens, pos, capture)
        mask = self._additive_mask(pos, self.slot_ids)  # [G*n, S]
        return self.run_rows(tokens, pos, [SeqSpan(0, tokens.shape[0], 0, self.slots, mask)], capture)

    @staticmethod
    def _whole_blocks(length: int, limit: int) -> int:
        """The slots a row_count_invariant step attends over for `length` tokens: whole ATTN_SPAN
        blocks, at most `limit` (the sequence's own slots)."""
        return min(limit, -(-length // ATTN_SPAN) * ATTN_SPAN)

    def _span_mask(self, start: int, n: int, span: int, tree: tuple[int, ...] | None,
                   by_token: bool) -> torch.Tensor | None:
        """eager_span's mask [G*n, span], or None (one token seeing every slot up to its own)."""
        if tree is not None and not by_token:
            return self._tree_mask(start, tree, span)
        if n == 1 and not self.row_count_invariant:
            return None
        if tree is None:  # positions inside the sequence, as the mask sees them
            positions = self.slot_ids[start:start + n]
        else:  # token by token a row sees its path laid out at start..: causal at start + depth
            positions = row_positions(start, n, tree).to(self.slot_ids.device)
        return self._additive_mask(positions, self.slot_ids[:span])

    def _tree_mask(self, start: int, tree: tuple[int, ...], span: int) -> torch.Tensor:
        """[G*n, span]: 0 where row r may see the slot (before start, or a row of its path at
        start + that row), else -inf."""
        n = len(tree)
        visible = torch.zeros(n, span, dtype=torch.bool)
        visible[:, :start] = True
        visible[:, start:start + n] = sees(tree)
        mask = torch.zeros(visible.shape, dtype=self.cos.dtype).masked_fill_(~visible, float("-inf"))
        return mask.repeat(self.arch.group, 1).to(self.slot_ids.device)

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
