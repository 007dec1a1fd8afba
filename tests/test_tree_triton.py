"""Draft trees through the fused Triton attention (triton_attention, ragged_plan, NativeSlots' fused
pass): a tree row's output equals, bit for bit, a single step of that row after its path alone was
decoded into a contiguous cache. Under Triton's interpreter on a CPU, or on CUDA where there is one."""

import pytest
import torch

pytest.importorskip("specdec.models.triton_ops")

from specdec.models import triton_attention  # noqa: E402
from specdec.models.ragged_plan import MetaLayout, RaggedPlan, exact_layout  # noqa: E402
from specdec.trees import depths, path_rows  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
GEN = torch.Generator().manual_seed(0)
# A balanced tree: 2 children per node, 3 levels (15 rows), then a deep branch off row 4 (6 more).
TREE = (-1, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 9, 15, 16, 17, 18, 19)


def randn(*shape):
    return torch.randn(*shape, generator=GEN).to(DEVICE)


def run_attention(plan: RaggedPlan, q, k_cache, v_cache, n_heads, n_kv, stride):
    layout = exact_layout(plan, n_heads // n_kv)
    meta = torch.from_numpy(plan.pack(layout, n_heads // n_kv, 0, 1)).to(DEVICE)
    rows, _ = layout.views(meta, -(-stride // triton_attention.CHUNK))
    return triton_attention.attention(q, k_cache, v_cache, rows.rope, rows.attention, n_heads, n_kv)


def path_cache(cache, base, start, path):
    """A copy of cache [Hkv, S, hd] whose slots base + start + i hold the path's rows' entries."""
    out = cache.clone()
    out[:, base + start:base + start + len(path)] = cache[:, [base + start + r for r in path]]
    return out


@pytest.mark.parametrize("start", [5, 100, 130])  # the tree in the first tile; across a tile and a chunk; past them
def test_tree_rows_attend_as_their_paths_decoded_alone(start):
    """Two sequences in one pass: a tree of 21 rows after `start` cached tokens and a causal one
    of 3 rows. Each tree row against a one-row pass over a cache holding its path contiguously,
    bit for bit; the causal rows against one-row passes too."""
    n_heads, n_kv, hd, stride = 4, 2, 32, 320
    k_cache, v_cache = randn(n_kv, 3 * stride, hd), randn(n_kv, 3 * stride, hd)
    bases, counts = (stride, 0), (len(TREE), 3)
    plan = RaggedPlan(counts, (start, 40), bases, (True, True), trees=(TREE, None))
    q = randn(sum(counts), n_heads * hd)
    out = run_attention(plan, q, k_cache, v_cache, n_heads, n_kv, stride)
    for row, depth in enumerate(depths(TREE)):
        path = path_rows(TREE, row)
        keys, values = path_cache(k_cache, stride, start, path), path_cache(v_cache, stride, start, path)
        single = RaggedPlan((1,), (start + depth,), (stride,), (True,))
        alone = run_attention(single, q[row:row + 1], keys, values, n_heads, n_kv, stride)
        assert torch.equal(out[row], alone[0]), f"tree row {row} (depth {depth})"
    for i in range(3):
        single = RaggedPlan((1,), (40 + i,), (0,), (True,))
        alone = run_attention(single, q[len(TREE) + i:len(TREE) + i + 1], k_cache, v_cache, n_heads, n_kv, stride)
        assert torch.equal(out[len(TREE) + i], alone[0])
