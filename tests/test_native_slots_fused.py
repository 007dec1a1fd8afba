"""NativeSlots on the fused Triton kernels (run here by Triton's interpreter, as on CUDA but without
graph capture): the ragged pass's host plan, attention per sequence inside one kernel, and whole
ragged passes against each sequence run alone through NativeLlama's fused steps. Bit-identity
across batches needs the GPU's arithmetic (the interpreter's NumPy may round a row by its place in
a tile): `python benchmarks/gpu_batching.py slots` checks it on CUDA."""

import pytest
import torch

pytest.importorskip("specdec.models.triton_ops")

from specdec.engine.batched import BatchedEngine  # noqa: E402
from specdec.drafters.lookup import LookupDrafter  # noqa: E402
from specdec.engine import GenerationConfig  # noqa: E402
from specdec.models import triton_attention  # noqa: E402
from specdec.models.native_llama import NativeLlama  # noqa: E402
from specdec.models.native_slots import NativeSlots, SlotOptions  # noqa: E402
from specdec.models.ragged_plan import MetaLayout, RaggedPlan  # noqa: E402
from tests.test_native import SMALL, hf_model  # noqa: E402
from tests.test_triton_kernels import FUSED, WIDE  # noqa: E402

GEN = torch.Generator().manual_seed(0)
MAX_LENGTH = 160  # a slot's stride of 192 cache slots: two attention chunks


def test_the_plan_places_rows_blocks_and_padding():
    """Two sequences (3 tokens after 5 cached in slot base 200; 1 token after 130 at base 0), G = 4:
    the first has 12 query rows (one block), the second 4; padding rows go to the scratch region."""
    plan = RaggedPlan(counts=(3, 1), starts=(5, 130), bases=(200, 0), want=(False, True))
    layout = MetaLayout(rows=6, blocks=3, pairs=5)
    meta = torch.from_numpy(plan.pack(layout, group=4, scratch=400, scratch_len=8))
    rows, head = layout.views(meta, chunks=2)
    assert rows.slots.tolist() == [205, 206, 207, 130, 400, 401]
    assert rows.rope.tolist() == [5, 6, 7, 130, 0, 0]
    assert head[:1].tolist() == [3]  # only the second sequence's row feeds the logits
    blocks = rows.attention.blocks.tolist()
    assert blocks == [[0, 3, 0, 200, 8], [3, 1, 0, 0, 131], [0, 0, 0, 0, 0]]  # spans: last position + 1; padding
    pairs, count = rows.attention.work
    assert count.item() == 3 and pairs[:3].tolist() == [[0, 0], [1, 0], [1, 1]]  # 131 positions: two chunks
    with pytest.raises(ValueError, match="attention blocks"):
        plan.pack(MetaLayout(rows=6, blocks=1, pairs=5), 4, 400, 8)


def test_ragged_attention_gives_each_sequence_its_own_cache():
    """Three sequences at their own cache bases, one attention call with a work list: each token
    against torch over its own slots only; padding rows come out zero."""
    n_heads, n_kv, hd, stride = 4, 2, 32, 320
    k_cache, v_cache = torch.randn(n_kv, 4 * stride, hd, generator=GEN), torch.randn(n_kv, 4 * stride, hd, generator=GEN)
    plan = RaggedPlan(counts=(5, 1, 2), starts=(250, 0, 140), bases=(0, 2 * stride, stride), want=(True,) * 3)
    layout = MetaLayout.for_rows(9, max_seqs=3, group=2, stride=stride)
    rows, _ = layout.views(torch.from_numpy(plan.pack(layout, 2, 3 * stride, stride)), -(-stride // 128))
    q = torch.randn(9, n_heads * hd, generator=GEN)
    out = triton_attention.attention(q, k_cache, v_cache, rows.rope, rows.attention, n_heads, n_kv)
    for row, (slot, pos) in enumerate(zip(rows.slots[:8].tolist(), rows.rope[:8].tolist())):
        first = slot - pos  # the sequence's base
        keys = k_cache[:, first:slot + 1].repeat_interleave(n_heads // n_kv, 0)
        values = v_cache[:, first:slot + 1].repeat_interleave(n_heads // n_kv, 0)
        ref = torch.nn.functional.scaled_dot_product_attention(q[row].view(n_heads, 1, hd), keys, values)
        torch.testing.assert_close(out[row], ref.reshape(-1), atol=1e-5, rtol=1e-5)
    assert not out[8].any()


@pytest.fixture(scope="module")
def wide_model():
    return hf_model("llama-untied", seed=3, random_norms=True, **WIDE)


def test_fused_ragged_passes_match_each_sequence_alone(wide_model):
    """Prefill chunks, verifies and single steps of three sequences in one pass each time, rolled
    back as a verify would: each sequence's logits as NativeLlama's fused steps give them alone."""
    slots = NativeSlots.from_hf(wide_model, "fused slots", 3, MAX_LENGTH, fused=True)
    assert slots.options == SlotOptions(fused=True, graphs=False)
    alone = [NativeLlama.from_hf(wide_model, f"alone {i}", MAX_LENGTH, options=FUSED, pack=False) for i in range(3)]
    units = [[(2, 7), (0, 3), (1, 1)], [(0, 5), (2, 1)], [(1, 4), (0, 1), (2, 3)]]  # (slot, tokens) per pass
    for step, unit in enumerate(units):
        tokens = [torch.randint(0, SMALL["vocab_size"], (n,), generator=GEN) for _, n in unit]
        out = slots.forward_ragged([s for s, _ in unit], tokens)
        for i, ((slot, _), new) in enumerate(zip(unit, tokens)):
            torch.testing.assert_close(out.logits_of(i), alone[slot].forward(new), atol=2e-5, rtol=1e-5)
        slots.rollback(unit[0][0], slots.cache_len(unit[0][0]) - 1)  # the first sequence rejects its last token
        alone[unit[0][0]].rollback(alone[unit[0][0]].cache_len - 1)


def test_batched_greedy_speculation_on_fused_slots_equals_plain_alone(wide_model):
    slots = NativeSlots.from_hf(wide_model, "fused slots", 3, MAX_LENGTH, fused=True)
    engine = BatchedEngine(slots, lambda: LookupDrafter(slots.device))
    prompts = [[5, 9, 13, 5, 9, 13, 5, 9], [7, 7, 8, 7, 7, 8, 7], [3, 1, 4, 1, 5, 9, 2, 6, 5]]
    config = GenerationConfig(max_new_tokens=12, k=3, ignore_eos=True)
    results = engine.generate(prompts, config)
    for prompt, result in zip(prompts, results):
        model = NativeLlama.from_hf(wide_model, "alone", MAX_LENGTH, options=FUSED, pack=False)
        expected, context = [], list(prompt)
        model.forward(torch.tensor(context[:-1]))
        for _ in range(12):
            token = int(model.forward(torch.tensor(context[-1:])).argmax(-1))
            context.append(token)
            expected.append(token)
        assert list(result.token_ids) == expected
    assert sum(r.stats.drafted for r in results) > 0
