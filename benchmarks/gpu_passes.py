"""The ragged pass costs of the random 8B over NativeSlots (bf16, CUDA) and a kernel profile of a
1-row and a 64-row pass, for comparing kernel versions side by side in one device call:

    git archive OLD src | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old/src python3 benchmarks/gpu_passes.py before before.json
    PYTHONPATH=src python3 benchmarks/gpu_passes.py after after.json

(docs/batching.md, "Wide tiles"; results/gpu-h200-wgmma-tiles-*.txt)."""
import collections
import json
import sys

sys.path.insert(0, "benchmarks")
import torch
from gpu_batching import step_costs
from specdec.models.native_slots import NativeSlots

label, out = sys.argv[1], sys.argv[2]
slots = NativeSlots.random("llama-3.1-8b", 64, device="cuda", dtype=torch.bfloat16, max_length=512)
rows = [(1, 1), (1, 5), (4, 5), (16, 1), (32, 1), (64, 1), (16, 5), (64, 5)]
costs = step_costs(slots, rows)
profile = {}
try:
    from torch.profiler import profile as prof, ProfilerActivity
    for b in (1, 64):
        seqs = list(range(b))
        for s in seqs:
            slots.rollback(s, 0)
            slots.forward_ragged([s], [torch.randint(0, slots.vocab_size, (384,), device="cuda")], logits=[False])
        step = [torch.randint(0, slots.vocab_size, (1,), device="cuda") for _ in seqs]
        for _ in range(3):
            slots.forward_ragged(seqs, step); [slots.rollback(s, 384) for s in seqs]
        torch.cuda.synchronize()
        with prof(activities=[ProfilerActivity.CUDA]) as p:
            for _ in range(5):
                slots.forward_ragged(seqs, step); [slots.rollback(s, 384) for s in seqs]
            torch.cuda.synchronize()
        per = collections.Counter()
        for e in p.events():
            if e.device_type.name == "CUDA":
                per[e.name[:40]] += e.device_time / 5
        profile[b] = dict(per.most_common(8))
        for s in seqs:
            slots.release(s)
        print(label, "profile", b, "rows:", {k: round(v) for k, v in profile[b].items()})
except Exception as e:  # the profile is a detail; the pass costs are the point
    print("profile failed:", repr(e))
from specdec.models import triton_ops
json.dump({"label": label, "pass_ms": {f"{b}x{n}": ms for (b, n), ms in costs.items()},
           "profile_us": profile, "wide_checks": {str(k): v for k, v in triton_ops.wide_checks.items()},
           "chosen": {str(k): v for k, v in getattr(triton_ops, "_chosen_tiles", {}).items()}},
          open(out, "w"), indent=1, default=str)
