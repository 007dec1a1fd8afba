"""Tree passes in the model backends (rule 7 of the design): every row of a draft tree gets the
logits of decoding its own path one token at a time, and keep_rows leaves the cache holding exactly
the kept path.

Backends: transformers (a 4D mask), the native eager path in fp32, and in bf16 with prepacked
matrices (row_count_invariant: there a chain's verify rows equal single steps bit for bit, so a
tree's rows must too); NativeSlots with a tree sharing its pass with chains and prefill chunks.
Where chains are only close to single steps (fp32: a row's bits depend on the row count), trees are
held to the same 1e-5 as tests/test_native_slots.py holds chains.
"""

import pytest
import torch

from specdec.models.cpu_matrix import can_pack
from specdec.models.llama_net import ATTN_SPAN
from specdec.models.native_llama import NativeLlama
from specdec.models.native_slots import NativeSlots
from specdec.models.slots import LoopSlots
from specdec.trees import path_rows
from tests.conftest import VOCAB, tiny_llama
from tests.markov import MarkovLM
from tests.test_native_bf16 import packed_bf16

MAX_LENGTH = 2 * ATTN_SPAN + 64
BRANCHY = (-1, 0, 0, 1, 2, 2, 4, 0)  # rows 1, 2 and 7 siblings under the root; 5 and 4 under 2
DEEP = (-1, 0, 1, 2, 3, 0, 5, 6, 1, 8, 2)  # a chain of 5 with branches off it at depths 1, 2 and 3
BF16 = pytest.mark.skipif(not can_pack(torch.bfloat16), reason="oneDNN without bf16 on this CPU")


def hf_backend():
    return tiny_llama(0, layers=2, scale=8.0)


def native_fp32():
    return NativeLlama.from_hf(tiny_llama(0, layers=2, scale=8.0).model, "fp32", MAX_LENGTH, cuda_graphs=False)


def native_bf16():
    model = packed_bf16(0)
    assert model.net.row_count_invariant  # the path where chains are bit-exact: so must trees be
    return model


BACKENDS = [pytest.param(hf_backend, id="hf"), pytest.param(native_fp32, id="native-fp32"),
            pytest.param(native_bf16, id="native-bf16", marks=BF16)]


def bitwise(model) -> bool:
    """Whether this backend's chain rows equal single steps bit for bit (then tree rows must)."""
    return getattr(getattr(model, "net", None), "row_count_invariant", False)


def assert_same(got: torch.Tensor, want: torch.Tensor, exact: bool) -> None:
    torch.testing.assert_close(got, want, rtol=0, atol=0 if exact else 1e-5)
    if exact:
        assert torch.equal(got, want)


def random_tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def path_logits(model, cached: int, tokens: torch.Tensor, row: int, tree) -> torch.Tensor:
    """Row `row`'s reference [V]: its path decoded one token at a time after the first `cached` tokens."""
    model.rollback(cached)
    return torch.cat([model.forward(tokens[r:r + 1]) for r in path_rows(tree, row)])[-1]


@pytest.mark.parametrize("tree", [BRANCHY, DEEP], ids=["branchy", "deep"])
@pytest.mark.parametrize("cached", [11, ATTN_SPAN - 3])  # the second crosses a block of ATTN_SPAN slots
@pytest.mark.parametrize("make", BACKENDS)
def test_every_tree_row_equals_decoding_its_path(make, cached, tree):
    model = make()
    prefix, tokens = random_tokens(cached, cached), random_tokens(len(tree), len(tree))
    model.prefill(prefix)
    rows = model.forward(tokens, tree=tree)
    assert rows.shape == (len(tree), model.vocab_size) and model.cache_len == cached + len(tree)
    for r in range(len(tree)):
        assert_same(rows[r], path_logits(model, cached, tokens, r, tree), bitwise(model))


@pytest.mark.parametrize("make", BACKENDS)
def test_features_follow_the_tree_rows(make):
    model = make()
    prefix, tokens = random_tokens(9, 1), random_tokens(len(BRANCHY), 2)
    model.prefill(prefix)
    logits, features = model.forward_with_hidden(tokens, (0,), tree=BRANCHY)
    model.rollback(9)
    assert torch.equal(model.forward(tokens, tree=BRANCHY), logits)  # the same pass, features or not
    for r in (3, 6, 7):
        model.rollback(9)
        for step in path_rows(BRANCHY, r):
            _, alone = model.forward_with_hidden(tokens[step:step + 1], (0,))
        assert_same(features[r], alone[0], bitwise(model))


@pytest.mark.parametrize("make", BACKENDS)
def test_keep_rows_leaves_the_cache_holding_exactly_the_path(make):
    model, fresh = make(), make()
    prefix, tokens, after = random_tokens(13, 3), random_tokens(len(DEEP), 4), random_tokens(3, 5)
    model.prefill(prefix)
    model.forward(tokens, tree=DEEP)
    path = path_rows(DEEP, 9)  # [0, 1, 8, 9]: rows out of place
    model.keep_rows(13, path)
    assert model.cache_len == 13 + len(path)
    fresh.prefill(torch.cat([prefix, tokens[path]]))
    assert_same(model.forward(after), fresh.forward(after), bitwise(model))


@pytest.mark.parametrize("make", BACKENDS)
def test_a_chain_given_as_a_tree_is_the_causal_pass(make):
    model = make()
    prefix, tokens = random_tokens(7, 6), random_tokens(5, 7)
    model.prefill(prefix)
    causal = model.forward(tokens)
    model.rollback(7)
    assert torch.equal(model.forward(tokens, tree=(-1, 0, 1, 2, 3)), causal)
    model.keep_rows(7, [0, 1, 2])  # a chain's rows: a rollback
    assert model.cache_len == 10


@pytest.mark.parametrize("tree, why", [((-1, 0, 2, 1), "a parent at its own row"), ((-1, 0, 1), "too short"),
                                       ((0, -1, 0, 1), "row 0 not the root"), ((-1, -1, 0, 1), "two roots")])
@pytest.mark.parametrize("make", BACKENDS[:2])
def test_bad_trees_are_refused_before_the_cache_changes(make, tree, why):
    model = make()
    model.prefill(random_tokens(5, 8))
    with pytest.raises(ValueError, match="row parents"):
        model.forward(random_tokens(4, 9), tree=tree)
    assert model.cache_len == 5


@pytest.mark.parametrize("make", BACKENDS[:2])
def test_bad_kept_rows_are_refused(make):
    model = make()
    model.prefill(random_tokens(5, 8))
    model.forward(random_tokens(4, 9), tree=(-1, 0, 0, 2))
    for start, rows in ((5, [0, 3, 2]), (5, [0, 4]), (10, [0]), (5, [-1, 0])):
        with pytest.raises(ValueError, match="keep_rows"):
            model.keep_rows(start, rows)
    assert model.cache_len == 9


def native_slots(bf16: bool) -> tuple[NativeSlots, NativeLlama]:
    """A NativeSlots of 3 slots and a NativeLlama over the same weights (each sequence alone)."""
    alone = native_bf16() if bf16 else native_fp32()
    return NativeSlots.sharing(alone, 3, MAX_LENGTH), alone


SLOT_KINDS = [pytest.param(False, id="fp32"), pytest.param(True, id="bf16", marks=BF16)]


@pytest.mark.parametrize("bf16", SLOT_KINDS)
def test_slots_tree_rows_in_a_batch_with_a_chain_and_a_prefill_chunk(bf16):
    slots, alone = native_slots(bf16)
    exact = bitwise(alone)  # bf16: a sequence's rows in a batch are its rows alone, bit for bit
    prefixes = [random_tokens(9, 10), random_tokens(5, 11), random_tokens(4, 12)]
    slots.forward_ragged([0, 1, 2], prefixes, logits=[False] * 3)
    new = [random_tokens(len(BRANCHY), 13), random_tokens(4, 14), random_tokens(6, 15)]
    out = slots.forward_ragged([0, 1, 2], new, logits=[True, True, False], trees=[BRANCHY, None, None])
    assert out.offsets == (0, 8, 12, 12)
    assert [slots.cache_len(s) for s in range(3)] == [17, 9, 10]
    alone.prefill(prefixes[0])
    for r in range(len(BRANCHY)):
        assert_same(out.logits_of(0)[r], path_logits(alone, 9, new[0], r, BRANCHY), exact)
    alone.prefill(prefixes[1])
    assert_same(out.logits_of(1), alone.forward(new[1]), exact)


@pytest.mark.parametrize("bf16", SLOT_KINDS)
def test_slots_keep_rows_then_decode_the_path_only(bf16):
    slots, alone = native_slots(bf16)
    exact = bitwise(alone)
    prefixes, trees = [random_tokens(9, 20), random_tokens(6, 21)], [DEEP, BRANCHY]
    slots.forward_ragged([2, 0], prefixes, logits=[False, False])
    new = [random_tokens(len(DEEP), 22), random_tokens(len(BRANCHY), 23)]
    slots.forward_ragged([2, 0], new, trees=trees)
    kept = [path_rows(DEEP, 10), path_rows(BRANCHY, 6)]  # [0, 1, 2, 10] and [0, 2, 4, 6]
    for slot, prefix, rows in zip([2, 0], prefixes, kept):
        slots.keep_rows(slot, len(prefix), rows)
        assert slots.cache_len(slot) == len(prefix) + len(rows)
    after = [random_tokens(3, 24), random_tokens(1, 25)]
    out = slots.forward_ragged([2, 0], after)
    for i, (prefix, tokens, rows) in enumerate(zip(prefixes, new, kept)):
        alone.prefill(torch.cat([prefix, tokens[rows]]))
        assert_same(out.logits_of(i), alone.forward(after[i]), exact)


@pytest.mark.parametrize("bf16", SLOT_KINDS)
def test_a_sequences_tree_rows_do_not_depend_on_the_others_trees(bf16):
    """Slot 0's tree rows, bit for bit, whatever slot 1 brings: another tree, a chain, and in bf16
    (rows alike at every row count) also other row counts and a prefill chunk."""
    slots, _ = native_slots(bf16)
    mine, tokens = random_tokens(7, 30), random_tokens(len(DEEP), 31)
    others = [((-1, 0, 0, 1, 1, 3), True), (None, True), ((-1, 0, 1, 0, 3, 3), True)]
    if bitwise(slots.net):
        others += [((-1, 0, 0), True), (None, False)]
    slots.forward_ragged([0, 1], [mine, random_tokens(5, 32)], logits=[False, False])
    seen = []
    for i, (tree, want) in enumerate(others):
        n = len(tree) if tree else 6 + 5 * (not want)
        out = slots.forward_ragged([1, 0], [random_tokens(n, 40 + i), tokens], logits=[want, True], trees=[tree, DEEP])
        seen.append(out.logits_of(1))
        slots.rollback(0, 7)
        slots.rollback(1, 5)
    assert all(torch.equal(rows, seen[0]) for rows in seen[1:])


def test_loop_slots_hand_each_model_its_tree():
    slots, alone = LoopSlots(hf_backend().with_own_cache, 2), hf_backend()
    prefix, tokens = random_tokens(6, 50), random_tokens(len(BRANCHY), 51)
    slots.forward_ragged([1, 0], [prefix, random_tokens(3, 52)], logits=[False, False])
    out = slots.forward_ragged([0, 1], [random_tokens(2, 53), tokens], trees=[None, BRANCHY])
    alone.prefill(prefix)
    for r in range(len(BRANCHY)):
        assert_same(out.logits_of(1)[r], path_logits(alone, 6, tokens, r, BRANCHY), False)
    slots.keep_rows(1, 6, [0, 2, 5])
    assert [slots.cache_len(0), slots.cache_len(1)] == [5, 9]
    with pytest.raises(ValueError, match="one entry per sequence"):
        slots.forward_ragged([0, 1], [tokens, tokens], trees=[BRANCHY])
    with pytest.raises(ValueError, match="row parents"):
        slots.forward_ragged([0, 1], [tokens, tokens[:3]], trees=[BRANCHY, BRANCHY])


def test_paths_without_tree_passes_refuse_trees_by_name():
    hf = tiny_llama(0, layers=2, scale=8.0).model
    graphed = NativeLlama.from_hf(hf, "graphed", 64, cuda_graphs=True)  # the graphed step, run eagerly on a CPU
    with pytest.raises(NotImplementedError, match="graphed: its graphed torch steps take no draft tree"):
        graphed.forward(random_tokens(4, 60), tree=(-1, 0, 0, 1))
    assert graphed.cache_len == 0
    markov = MarkovLM(VOCAB, seed=0)
    with pytest.raises(NotImplementedError, match="markov cannot verify a draft tree"):
        markov.forward(random_tokens(3, 61), tree=(-1, 0, 0))
    markov.forward(random_tokens(3, 61), tree=(-1, 0, 1))  # a chain: causal rows
    with pytest.raises(NotImplementedError, match="markov cannot keep a tree's path"):
        markov.keep_rows(0, [0, 2])
    markov.keep_rows(0, [0, 1])
    assert markov.cache_len == 2

