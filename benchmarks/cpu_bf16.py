"""Verify passes on a CPU in fp32 and in bf16, side by side: python benchmarks/cpu_bf16.py

Loads the embedded default twice on the native CPU path (fp32, and bf16 with its matrices
prepacked for oneDNN, which `auto` picks where the CPU has bf16 units), times one forward over n
new tokens on a cached 512-token prompt, the two models alternating within each trial, and prints
the medians with each one's ratio to its own single-token step. It also checks that bf16 gives a
token the same logits, bit for bit, alone or in a verify pass of every n (what keeps greedy
speculative output equal to plain output).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from specdec.bench.common import parse_ints  # noqa: E402
from specdec.bench.verify_cost import median_cells, prompt_tokens, time_alternating  # noqa: E402
from specdec.models.cpu_matrix import CpuCaps  # noqa: E402
from specdec.models.loader import load_model  # noqa: E402


def rows_equal_single_steps(model, prompt: list[int], n: int) -> bool:
    ids = torch.tensor(prompt + prompt[:n])
    model.prefill(ids[:len(prompt)])
    together = model.forward(ids[len(prompt):])
    model.rollback(len(prompt))
    alone = torch.cat([model.forward(ids[len(prompt) + i:len(prompt) + i + 1]) for i in range(n)])
    model.reset()
    return torch.equal(together, alone)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=11)
    p.add_argument("--n", type=parse_ints, default=parse_ints("1,2,3,4,5,6,8,12,16"))
    args = p.parse_args(argv)
    models = {dtype: load_model("default", dtype=dtype) for dtype in ("fp32", "bf16")}
    prompt = prompt_tokens(models["fp32"].tokenizer, 512)
    times = time_alternating({name: loaded.model for name, loaded in models.items()}, prompt, args.n, args.trials)
    bf16 = models["bf16"].model
    print(f"bf16 units: {CpuCaps.here().bf16_units}; bf16 backend: {type(bf16).__name__}, "
          f"cheap verify rows: {bf16.cheap_verify_rows}")
    print(f"{'rows':>4s} " + " ".join(f"{name:>22s}" for name in models) + "   bf16 rows = single steps")
    for n in args.n:
        same = rows_equal_single_steps(bf16, prompt, n) if n > 1 else ""
        print(f"{n:>4d} " + " ".join(f"{c:>22s}" for c in median_cells(times, n, args.n[0])) + f"   {same}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
