"""The megakernel on head shapes other than the 1B's: the same checks as benchmarks/gpu_megakernel.py
(logits against the Triton step at 8 positions, greedy chains, barriers, the guard after the
partials) for short random nets whose heads take other paths through megakernel.cu: 8 query heads a
KV head, head dim 128 (merge lanes of 8 values), head dim 96 (WIDE refused: the older merge), a
256-wide net (few merge lanes), and the 8B shape (WIDE's 16-chunk rounds spill there: narrowed).

    python benchmarks/gpu_megakernel_shapes.py [--out results/gpu-megakernel-shapes.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from gpu_megakernel import check, graph_ms
from specdec.models import megakernel as mk
from specdec.models.native_llama import NativeLlama, _StepGraph

SHAPES = [  # (label, named size, overrides)
    ("1B, 2 layers", "llama-3.2-1b", {"n_layers": 2}),
    ("8 query heads a KV head", "llama-3.2-1b", {"n_layers": 2, "n_kv_heads": 4}),
    ("head dim 128", "llama-3.2-1b", {"n_layers": 2, "n_heads": 16, "head_dim": 128}),
    ("head dim 96 (no WIDE)", "llama-3.2-1b", {"n_layers": 2, "head_dim": 96}),
    ("dim 256", "llama-3.2-1b", {"n_layers": 2, "dim": 256, "n_heads": 4, "n_kv_heads": 2,
                                 "intermediate": 512, "vocab_size": 4096}),
    ("8B, 4 layers", "llama-3.1-8b", {"n_layers": 4}),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    rows = {}
    for label, size, overrides in SHAPES:
        # compile=False: where the Triton kernels do not take a shape, the reference step runs eager torch
        draft = NativeLlama.random(size, max_length=2048, seed=1, arch_overrides=overrides, compile=False)
        prompt = torch.randint(0, draft.vocab_size, (args.context,),
                               generator=torch.Generator().manual_seed(0)).cuda()
        step = mk.MegakernelStep(draft.net)
        mega, triton = _StepGraph(draft.net, 1, step), draft._graph(1)
        info = {"options": [o for o in mk.OPTIONS if step.defines.get(o)], "merge_round": step.defines.get("MG", "auto"),
                **step.registers(), "check": check(draft, mega, triton, prompt)}
        draft.rollback(0)
        draft.prefill(prompt)
        info["step_ms"] = graph_ms(mega, draft.net, args.context, 20)
        info["triton_ms"] = graph_ms(triton, draft.net, args.context, 20)
        info["timed_out"], info["guard_intact"] = step.barrier_timed_out(), step.guard_intact()
        rows[label] = info
        print(label, json.dumps(info), flush=True)
        del draft, step, mega, triton
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "context": args.context, "shapes": rows}, f, indent=1)
    print(f"\n{'shape':26s} {'rel L2':>7s} {'argmax':>6s} {'guard':>5s} {'timeout':>7s} {'regs':>4s} {'spill':>5s} "
          f"{'round':>5s} {'mega ms':>7s} {'triton':>7s}  options")
    for label, r in rows.items():
        c = r["check"]
        print(f"{label:26s} {max(c['rel_l2_logits']):7.3f} {c['argmax_agree_of_8']:4d}/8 {str(r['guard_intact']):>5s} "
              f"{str(r['timed_out']):>7s} {r['registers']:4d} {r['local_bytes']:5d} {str(r['merge_round']):>5s} "
              f"{r['step_ms']:7.3f} {r['triton_ms']:7.3f}  {' '.join(r['options'])}")


if __name__ == "__main__":
    main()
