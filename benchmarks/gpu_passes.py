"""The ragged pass costs of the random 8B over NativeSlots (bf16, CUDA) and a kernel profile of a
1-row and a 64-row pass, for comparing kernel versions side by side in one device call:

    git archive OLD src | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old/src python3 benchmarks/gpu_passes.py before before.json
    PYTHONPATH=src python3 benchmarks/gpu_passes.py after after.json

(docs/batching.md, "Wide tiles"; results/gpu-h200-wgmma-tiles-*.txt)."""
import collections
import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from gpu_batching import prefilled, step_costs
from specdec.models import triton_ops
from specdec.models.native_slots import NativeSlots

ROWS = [(1, 1), (1, 5), (4, 5), (16, 1), (32, 1), (64, 1), (16, 5), (64, 5)]  # (sequences, tokens each)
CONTEXT = 384


def kernel_profile(slots: NativeSlots, b: int, passes: int = 5) -> dict[str, float]:
    """Microseconds of GPU time a pass of b sequences x 1 token, by kernel (the 8 largest)."""
    seqs = prefilled(slots, b, CONTEXT)
    step = [torch.randint(0, slots.vocab_size, (1,), device=slots.device) for _ in seqs]

    def one_pass():
        slots.forward_ragged(seqs, step)
        for s in seqs:
            slots.rollback(s, CONTEXT)

    for _ in range(3):  # warm-up: graphs captured, tiles tuned
        one_pass()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(passes):
            one_pass()
        torch.cuda.synchronize()
    per_kernel = collections.Counter()
    for event in prof.events():
        if event.device_type.name == "CUDA":
            per_kernel[event.name[:40]] += event.device_time / passes
    for s in seqs:
        slots.release(s)
    return dict(per_kernel.most_common(8))


def main() -> None:
    label, out = sys.argv[1], sys.argv[2]
    slots = NativeSlots.random("llama-3.1-8b", 64, device="cuda", dtype=torch.bfloat16, max_length=512)
    costs = step_costs(slots, ROWS, CONTEXT)
    profiles = {}
    for b in (1, 64):
        profiles[b] = kernel_profile(slots, b)
        print(label, "profile", b, "rows:", {k: round(v) for k, v in profiles[b].items()})
    with open(out, "w") as f:
        json.dump({"label": label, "pass_ms": {f"{b}x{n}": ms for (b, n), ms in costs.items()},
                   "profile_us": profiles, "wide_checks": {str(k): v for k, v in triton_ops.wide_checks.items()},
                   "chosen": {str(k): v for k, v in triton_ops._chosen_tiles.items()}}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
