"""Programmatic dependent launch (PDL) side by side: the graphed decode step of the random-weight
8B and 1B shapes through the Triton kernels, per PDL mode, interleaved, with a bitwise check that
the mode changes no logit. `python benchmarks/gpu_pdl.py` on a Hopper GPU."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from specdec.bench.gpu import step_ms  # noqa: E402
from specdec.models import triton_ops  # noqa: E402
from specdec.models.native_llama import NativeLlama  # noqa: E402

MODES = list(triton_ops.PDL_MODES)


def main():
    prompt = torch.randint(0, 128256, (512,), device="cuda")
    results = {}
    for i, size in enumerate(["llama-3.1-8b", "llama-3.2-1b"]):
        base = NativeLlama.random(size, max_length=1024, seed=i, kernels="triton")
        models, logits = {}, {}
        for mode in MODES:
            with triton_ops.programmatic_launch(mode):
                m = NativeLlama(base.net, f"{size} {mode}", base.max_length, kernels="triton")
                m.prefill(prompt)
                logits[mode] = m.forward(prompt[:1])
                m.rollback(0)
                step_ms(m, prompt, 1, 3)  # capture
                step_ms(m, prompt, 9, 3)
            models[mode] = m
        times = {mode: {1: [], 9: []} for mode in MODES}
        for _ in range(3):  # interleaved rounds
            for mode in MODES:
                for rows in (1, 9):
                    times[mode][rows].append(step_ms(models[mode], prompt, rows, 20))
        results[size] = {mode: {rows: sorted(v)[1] for rows, v in t.items()} for mode, t in times.items()}
        same = {mode: bool(torch.equal(logits[mode], logits["off"])) for mode in MODES}
        print(f"\n{size}: graphed step ms (median of 3 interleaved medians of 20)")
        for mode in MODES:
            r = results[size][mode]
            print(f"  {mode:15} 1 row {r[1]:.3f}  9 rows {r[9]:.3f}  vs off {r[1] / results[size]['off'][1]:.3f}"
                  f"  logits bitwise = off: {same[mode]}")
        del base, models
        torch.cuda.empty_cache()
    print("\nc per mode: " + "  ".join(
        f"{mode} {results['llama-3.2-1b'][mode][1] / results['llama-3.1-8b'][mode][1]:.3f}" for mode in MODES))


if __name__ == "__main__":
    main()
