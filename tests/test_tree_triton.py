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


# Positions start .. start + 9: inside the first 64-slot tile; across tiles (64); across chunks (128).
@pytest.mark.parametrize("start", [5, 60, 124])
@pytest.mark.parametrize("group", [2, 4])  # 8 or 4 tokens in a block of 16 query rows
def test_tree_rows_attend_as_their_paths_decoded_alone(start, group):
    """Two sequences in one pass: a tree of 21 rows (10 deep) after `start` cached tokens and a
    causal one of 3 rows. Each tree row against a one-row pass over a cache holding its path
    contiguously, bit for bit; the causal rows against one-row passes too."""
    n_kv, hd, stride = 2, 32, 320
    n_heads = n_kv * group
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


def test_the_plan_packs_a_tree_s_positions_parents_and_span():
    """A tree of 4 rows after 10 cached tokens beside a causal row: positions are 10 + depth, the
    parents go with the rows, and the tree's block carries minus its end (its deepest position + 1)."""
    tree = (-1, 0, 0, 1)
    plan = RaggedPlan(counts=(4, 1), starts=(10, 7), bases=(100, 0), want=(True, True), trees=(tree, None))
    layout = MetaLayout(rows=6, blocks=3, pairs=4)
    rows, _ = layout.views(torch.from_numpy(plan.pack(layout, group=2, scratch=400, scratch_len=8)), chunks=2)
    assert rows.slots.tolist() == [110, 111, 112, 113, 7, 400]  # cached at start + row, as causal rows
    assert rows.rope.tolist() == [10, 11, 11, 12, 7, 0]
    assert rows.attention.parents[:4].tolist() == list(tree)
    assert rows.attention.blocks.tolist() == [[0, 4, 0, 100, -13], [4, 1, 0, 0, 8], [0, 0, 0, 0, 0]]


def test_a_tree_stays_whole_when_a_pass_is_split():
    from specdec.models.native_slots import split_passes

    assert split_passes([3, 4, 2], 5, whole=[False, True, False]) == [[(0, 0, 3)], [(1, 0, 4), (2, 0, 1)], [(2, 1, 2)]]
    assert split_passes([3, 4, 2], 5) == [[(0, 0, 3), (1, 0, 2)], [(1, 2, 4), (2, 0, 2)]]
    with pytest.raises(ValueError, match="tree of 6 rows"):
        split_passes([6], 5, whole=[True])


def test_bad_trees_are_refused_with_the_reason():
    from specdec.models.tree_rows import causal_or_tree

    assert causal_or_tree((-1, 0, 1), 3) is None  # a chain runs as causal rows
    assert causal_or_tree((-1, 0, 0), 3) == (-1, 0, 0)
    with pytest.raises(ValueError, match="3 row parents"):
        causal_or_tree((-1, 0), 3)
    with pytest.raises(ValueError, match="earlier row"):
        causal_or_tree((-1, -1, 0), 3)


def test_path_moves_are_the_rows_out_of_place():
    from specdec.models.triton_cache import path_moves

    assert path_moves(5, [0, 2, 3, 6], length=13) == [(7, 6), (8, 7), (11, 8)]  # row 2 to 6 while row 3 leaves 8
    assert path_moves(5, [0, 1], length=13) == []  # a chain's rows are in place
    with pytest.raises(ValueError, match="increasing rows of the pass"):
        path_moves(5, [0, 3, 2], length=13)
    with pytest.raises(ValueError, match="increasing rows of the pass"):
        path_moves(5, [0, 8], length=13)


@pytest.mark.parametrize("rows", [[0, 2, 3, 6], [0] + list(range(1, 44, 2))])  # 3 moves; 21 (two blocks of moves)
def test_keep_rows_moves_a_path_s_entries_in_every_cache(rows):
    from specdec.models.triton_cache import move_rows, path_moves

    class Layer:
        def __init__(self):
            self.k_cache, self.v_cache = randn(2, 80, 32), randn(2, 80, 32)

    net = type("Net", (), {"layers": [Layer(), Layer()]})()
    before = [(layer.k_cache.clone(), layer.v_cache.clone()) for layer in net.layers]
    start, base, end = 5, 20, 20 + 5 + len(rows)
    move_rows(net, base, path_moves(start, rows, length=start + rows[-1] + 1))
    for layer, (k, v) in zip(net.layers, before):
        for cache, old in ((layer.k_cache, k), (layer.v_cache, v)):
            assert torch.equal(cache[:, base + start:end], old[:, [base + start + r for r in rows]])
            assert torch.equal(cache[:, :base + start], old[:, :base + start])
            assert torch.equal(cache[:, end:], old[:, end:])  # destinations are the first len(rows) slots only

def decode_paths(model, slot: int, tokens: torch.Tensor, tree) -> list[torch.Tensor]:
    """Each tree row's logits [V] decoded along its path one token at a time (one-row passes) in
    `slot`, depth first, rolled back to where it began."""
    out = [None] * len(tree)

    def visit(row):
        out[row] = model.forward_ragged([slot], [tokens[row:row + 1]]).logits_of(0)[0]
        for child in (c for c, p in enumerate(tree) if p == row):
            visit(child)
        model.rollback(slot, model.cache_len(slot) - 1)

    visit(0)
    return out


@pytest.fixture(scope="module")
def fused_slots():
    from specdec.models.native_slots import NativeSlots
    from tests.test_native import hf_model
    from tests.test_triton_kernels import WIDE

    model = hf_model("llama-untied", seed=5, random_norms=True, **WIDE)
    return NativeSlots.from_hf(model, "fused slots", 3, 96, fused=True)


def test_a_tree_pass_gives_each_row_its_path_s_logits_and_keeps_the_accepted_path(fused_slots):
    """A tree of 7 rows beside a causal sequence in one NativeSlots pass: every row's logits are
    those of its path decoded alone, bit for bit; after keep_rows the slot continues as the slot
    that decoded the accepted path alone."""
    model, vocab = fused_slots, fused_slots.vocab_size
    tree = (-1, 0, 0, 1, 1, 2, 4)
    prompt, side = torch.randint(0, vocab, (12,), generator=GEN), torch.randint(0, vocab, (5,), generator=GEN)
    tokens = torch.randint(0, vocab, (len(tree),), generator=GEN)
    for slot in (0, 1):
        model.forward_ragged([slot], [prompt], logits=[False])
    model.forward_ragged([2], [side[:3]], logits=[False])
    out = model.forward_ragged([0, 2], [tokens, side[3:]], trees=[tree, None])
    assert model.cache_len(0) == 12 + len(tree)
    expected = decode_paths(model, 1, tokens, tree)
    for row in range(len(tree)):
        assert torch.equal(out.logits_of(0)[row], expected[row]), f"row {row}"
    path = path_rows(tree, 6)  # rows 0, 1, 4, 6: two of them move
    model.keep_rows(0, 12, path)
    model.forward_ragged([1], [tokens[path]], logits=[False])
    assert model.cache_len(0) == model.cache_len(1) == 12 + len(path)
    nxt = torch.randint(0, vocab, (1,), generator=GEN)
    assert torch.equal(model.forward_ragged([0], [nxt]).logits, model.forward_ragged([1], [nxt]).logits)


def test_a_native_llama_tree_pass_gives_its_paths_graphed_steps_logits():
    """triton_forward.forward_tree over a NativeLlama's cache (slot 0) against the model's own
    fused single-token steps along each path (the graphed steps; run eagerly by the interpreter)."""
    from specdec.models.native_llama import NativeLlama
    from specdec.models.triton_forward import forward_tree
    from tests.test_native import hf_model
    from tests.test_triton_kernels import FUSED, WIDE

    model = NativeLlama.from_hf(hf_model("llama-untied", seed=6, **WIDE), "fused", max_length=64, options=FUSED,
                                pack=False)
    tree = (-1, 0, 0, 2, 1)
    prompt = torch.randint(0, model.vocab_size, (9,), generator=GEN)
    tokens = torch.randint(0, model.vocab_size, (len(tree),), generator=GEN)
    model.forward(prompt)
    logits, _ = forward_tree(model.net, tokens, 9, tree)
    for row in range(len(tree)):
        path = path_rows(tree, row)
        for r in path:
            expected = model.forward(tokens[r:r + 1])[0]
        model.rollback(9)
        assert torch.equal(logits[row].float(), expected), f"row {row}"
