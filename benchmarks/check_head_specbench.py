"""Teacher-forced agreement of draft heads on Spec-Bench answers: python benchmarks/check_head_specbench.py HEAD...

The target answers the first `--per-category` Spec-Bench questions of each category greedily (at
most `--max-new-tokens` tokens; measured only, never trained on), then each head is scored on those
answers: the share of answer tokens in its sub-vocabulary and its greedy agreement with the target
per draft step (`--unroll` steps), per category and overall. It is the check that
`benchmarks/train_head_gpu.py --check-per-category` runs after training, on any device and heads.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from train_head_gpu import check_on_specbench  # benchmarks/train_head_gpu.py, beside this script

from specdec.drafters.head_loading import load_head
from specdec.models.loader import load_model
from specdec.train.trainer import TrainConfig


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("heads", nargs="+", help="draft heads (.safetensors files, EAGLE-3 directories)")
    p.add_argument("--target", default="default")
    p.add_argument("--device", default="cpu")
    p.add_argument("--per-category", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--unroll", type=int, default=2, help="draft steps to score")
    p.add_argument("--out", default=None, help="JSON file for the results")
    args = p.parse_args(argv)
    heads = {Path(h).stem: Path(h) for h in args.heads}
    target = load_model(args.target, device=args.device, dtype="fp32", backend="hf")
    layers = sorted({i for path in heads.values() for i in load_head(path, target.model).config.feature_layers})
    result = check_on_specbench(target, heads, args.per_category, args.max_new_tokens,
                                TrainConfig(unroll=args.unroll), tuple(layers))
    for group, by_head in result.items():
        print(f"{group:15s} " + "  ".join(f"{name} {r['coverage']:.3f} " + " / ".join(f"{a:.2f}" for a in r["agreement"])
                                          for name, r in by_head.items()))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
