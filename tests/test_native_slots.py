"""NativeSlots: the native backend's slot KV cache and its one pass over a ragged batch (CPU fp32).

Every sequence's rows are measured against a NativeLlama running that sequence alone: attention
is the same call, but the matrices run over all T rows of the batch where alone they run over n,
and on a CPU in fp32 a single row reads another layout than several (cpu_matrix.CpuMatrix), so the
logits are close (within 1e-5), greedy tokens identical, and bit-identical only for some calls
(the test prints how many). Then the batched engine over NativeSlots: every sequence's greedy
output equals its own batch-1 plain decoding through engine.Engine over NativeLlama.
"""

import pytest
import torch

from specdec.models.native_llama import NativeLlama
from specdec.models.native_slots import NativeSlots, SlotOptions, slot_stride, split_passes
from tests.conftest import VOCAB
from tests.test_batching import (DECODE, KINDS, BatchConfig, BatchedEngine, NoDrafter, assert_slots_match_alone,
                                 make_drafter, mixed_requests, plain, record_rows, run_arriving)

CPU = torch.device("cpu")
MAX_LENGTH = 512


def native_pair(hf_target, max_slots: int, pack: bool = True) -> tuple[NativeSlots, NativeLlama]:
    """A NativeSlots and a NativeLlama over the same weights (the reference: one sequence alone)."""
    slots = NativeSlots.from_hf(hf_target.model, "tiny slots", max_slots, MAX_LENGTH, pack=pack)
    alone = NativeLlama.from_hf(hf_target.model, "tiny alone", MAX_LENGTH, pack=pack, cuda_graphs=False)
    return slots, alone


@pytest.mark.parametrize("pack", [True, False], ids=["prepacked", "plain"])
def test_native_slots_rows_match_each_sequence_alone(tiny_target, pack):
    slots, _ = native_pair(tiny_target, max_slots=5, pack=pack)

    def alone():
        return NativeLlama.from_hf(tiny_target.model, "alone", MAX_LENGTH, pack=pack, cuda_graphs=False)

    same, total = assert_slots_match_alone(slots, alone, steps=60, exact=False)
    print(f"\nNativeSlots fp32 ({'prepacked' if pack else 'plain'}): logits bit-identical to alone in "
          f"{same}/{total} sequence calls, greedy tokens in {total}/{total}")


def test_one_sequence_in_slot_zero_is_a_native_llama_bit_for_bit(tiny_target):
    """A batch of one sequence runs the very ops a NativeLlama runs alone (the same rows, spans and masks)."""
    slots, alone = native_pair(tiny_target, max_slots=3)
    for n in (9, 1, 1, 4, 1, 6):
        for slot in (0, 2):
            tokens = torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n))
            got = slots.forward_ragged([slot], [tokens]).logits_of(0)
            if slot == 0:
                assert torch.equal(got, alone.forward(tokens))
            else:  # another slot's cache range: the same positions, so the same bits
                assert torch.equal(got, expected)
            expected = got
    assert [slots.cache_len(s) for s in range(3)] == [22, 0, 22]


def test_the_cache_is_sized_once_and_reported(tiny_target):
    slots, _ = native_pair(tiny_target, max_slots=4)
    a = slots.arch
    per_layer = 2 * a.n_kv_heads * 5 * slot_stride(MAX_LENGTH) * a.head_dim * 4  # k and v, fp32; 4 slots and the scratch
    assert slots.kv_cache_bytes == a.n_layers * per_layer
    assert slots.stride >= MAX_LENGTH and slots.max_slots == 4
    with pytest.raises(ValueError, match="roll slot 1 back"):
        slots.rollback(1, 3)


def test_prefill_chunks_skip_the_lm_head_and_features_follow_each_sequence(tiny_target):
    slots, alone = native_pair(tiny_target, max_slots=3)
    prompts = [torch.tensor([5, 6, 7]), torch.tensor([9]), torch.tensor([1, 2, 3, 4, 5])]
    out = slots.forward_ragged([2, 0, 1], prompts, logits=[True, False, False], features=[None, (0,), ()])
    assert out.offsets == (0, 3, 3, 3) and out.logits.shape == (3, VOCAB)
    assert out.features[0] is None and out.features[1].shape == (1, 2 * 32) and out.features[2].shape == (5, 32)
    _, hidden = alone.forward_with_hidden(prompts[2])
    torch.testing.assert_close(out.features[2], hidden, rtol=0, atol=1e-5)
    none = slots.forward_ragged([0, 1], [torch.tensor([3]), torch.tensor([4])], logits=[False, False])
    assert none.logits.shape == (0, VOCAB) and none.offsets == (0, 0, 0)
    assert [slots.cache_len(s) for s in range(3)] == [2, 6, 3]


def test_split_passes_fills_each_pass_and_keeps_a_sequences_pieces_in_order():
    assert split_passes([3, 5, 1], 4) == [[(0, 0, 3), (1, 0, 1)], [(1, 1, 5)], [(2, 0, 1)]]
    assert split_passes([4, 4], 4) == [[(0, 0, 4)], [(1, 0, 4)]]
    assert split_passes([9], 4) == [[(0, 0, 4)], [(0, 4, 8)], [(0, 8, 9)]]
    assert split_passes([2, 1], 512) == [[(0, 0, 2), (1, 0, 1)]]


def test_a_pass_over_more_than_pass_rows_runs_as_several_with_each_sequences_rows(tiny_target, monkeypatch):
    """pass_rows 4 (on CUDA: the largest graph's rows, so that nothing runs unrecorded): a pass of
    prompts and verifies runs as passes of at most 4 rows; each sequence's logits, features and
    cache length are what one unsplit pass gives (within fp32 layout noise on a CPU)."""
    whole, _ = native_pair(tiny_target, max_slots=3)
    split = NativeSlots(whole.net, "split", MAX_LENGTH, 3, options=SlotOptions(fused=False, graphs=False, pass_rows=4))
    gen = torch.Generator().manual_seed(11)
    steps = [([2, 0, 1], [7, 1, 3], [True, False, True], [None, (0,), ()]),
             ([0, 2], [5, 2], [True, True], [(0,), None]),
             ([1], [9], [False], [None])]
    inputs = [(slots_, [torch.randint(0, VOCAB, (n,), generator=gen) for n in counts], want, feats)
              for slots_, counts, want, feats in steps]
    expected = [whole.forward_ragged(s, t, logits=w, features=f) for s, t, w, f in inputs]
    sizes = []
    run = split._run_eager
    monkeypatch.setattr(split, "_run_eager", lambda slots_, tokens, *a: sizes.append(len(tokens)) or run(slots_, tokens, *a))
    for (s, t, w, f), ref in zip(inputs, expected):
        got = split.forward_ragged(s, t, logits=w, features=f)
        assert got.offsets == ref.offsets
        torch.testing.assert_close(got.logits, ref.logits, rtol=0, atol=1e-5)
        for mine, theirs in zip(got.features, ref.features):
            assert (mine is None) == (theirs is None)
            if mine is not None:
                torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-5)
    assert sizes == [4, 4, 3, 4, 3, 4, 4, 1] and max(sizes) <= 4
    assert [split.cache_len(s) for s in range(3)] == [whole.cache_len(s) for s in range(3)] == [6, 12, 9]


def test_batched_engine_over_native_slots_equals_plain_decoding(tiny_target, tiny_draft, monkeypatch):
    """48 sequences (prompts of 1-30 tokens, K 1-6, every drafter kind, arriving over 12 steps) in 8
    slots: each one's greedy tokens are its own batch-1 plain decoding over NativeLlama."""
    requests = mixed_requests(48, seed=3)
    slots, alone = native_pair(tiny_target, max_slots=8)
    engine = BatchedEngine(slots, lambda: NoDrafter(CPU), decode=DECODE, config=BatchConfig(prefill_chunk=8))
    calls = record_rows(engine, monkeypatch)
    drafters = [make_drafter(kind, tiny_target, tiny_draft) for _, _, kind, _ in requests]
    handles = run_arriving(engine, requests, drafters)
    identical = 0
    for (prompt, config, kind, _), handle in zip(requests, handles):
        expected = plain(alone, prompt, config)
        assert handle.done and handle.token_ids == expected.token_ids, (kind, prompt, config)
        identical += 1
    print(f"\nBatchedEngine over NativeSlots: greedy output = batch-1 plain decoding for {identical}/{len(requests)}")
    assert all(sum(h.stats.drafted for h, r in zip(handles, requests) if r[2] == kind) > 0 for kind in KINDS[1:])
    sizes = [len(rows) for rows in calls]
    assert max(sizes) == 8 and len(set(sizes)) > 3  # full batches and ragged ones
    assert all(slots.cache_len(s) == 0 for s in range(8))  # every slot released


def test_slots_sharing_a_native_llama_hold_its_tensors_and_give_its_rows(tiny_target):
    """NativeSlots.sharing (what the server uses, also where no transformers model is kept): no copy
    of a weight, a cache of its own, and each sequence's rows as the llama gives them alone."""
    llama = NativeLlama.from_hf(tiny_target.model, "tiny", MAX_LENGTH, cuda_graphs=False)
    slots = NativeSlots.sharing(llama, max_slots=3)
    assert slots.net.layers[0].w13.weight is llama.net.layers[0].w13.weight
    assert slots.net.layers[0].packed is llama.net.layers[0].packed
    assert slots.net.layers[0].k_cache.data_ptr() != llama.net.layers[0].k_cache.data_ptr()
    tokens = torch.randint(0, VOCAB, (7,), generator=torch.Generator().manual_seed(5))
    out = slots.forward_ragged([2, 0], [tokens, tokens[:3]])
    torch.testing.assert_close(out.logits_of(0), llama.forward(tokens), atol=1e-5, rtol=1e-5)
    llama.reset()
    torch.testing.assert_close(out.logits_of(1), llama.forward(tokens[:3]), atol=1e-5, rtol=1e-5)
