"""Short verify passes on a CPU: prepacked matrices against F.linear on [out, in], side by side.

    python benchmarks/cpu_few_rows.py [--trials 15] [--n 1,2,3,4,5]

Loads the embedded default twice on the native CPU path: once with every pass of 2+ rows through
the oneDNN-prepacked matrices (SPECDEC_CPU_FEW_ROWS=0, the layout before), once as `load_model`
now chooses (tune_few_rows times both layouts at load). Then times one forward over n new tokens on
a cached 512-token prompt, the two models alternating within each trial, and prints the medians and
each one's ratio to its own single-token step. Which layout wins depends on the CPU; this measures it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from specdec.bench.common import parse_ints  # noqa: E402
from specdec.bench.verify_cost import median_cells, prompt_tokens, time_alternating  # noqa: E402
from specdec.models.loader import load_model  # noqa: E402


def load_with(few_rows: str | None):
    if few_rows is None:
        os.environ.pop("SPECDEC_CPU_FEW_ROWS", None)
    else:
        os.environ["SPECDEC_CPU_FEW_ROWS"] = few_rows
    return load_model("default")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=15)
    p.add_argument("--n", type=parse_ints, default=parse_ints("1,2,3,4,5"))
    args = p.parse_args(argv)
    models = {"prepacked from 2 rows": load_with("0"), "timed at load": load_with(None)}
    chosen = models["timed at load"].model.net.few_rows
    prompt = prompt_tokens(models["timed at load"].tokenizer, 512)
    times = time_alternating({name: loaded.model for name, loaded in models.items()}, prompt, args.n, args.trials)
    print(f"few_rows chosen at load: {chosen} (rows 2..{chosen} read [out, in] through F.linear)")
    print(f"{'rows':>4s} " + " ".join(f"{name:>30s}" for name in models))
    for n in args.n:
        print(f"{n:>4d} " + " ".join(f"{c:>30s}" for c in median_cells(times, n, args.n[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
