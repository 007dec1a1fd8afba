"""The CPU layouts of the native backend side by side, and the thread count, on this machine.

    python benchmarks/cpu_layouts.py [--trials 9] [--rows 1,2,3,5] [--tokens 32] [--threads 1,2] [--spin 1]

Loads the embedded default (fp32) once per layout: the one cpu_matrix.choose_layout picks here,
and the others it could have picked (one-row steps through the prepacked matrices; passes of 2-3
rows through F.linear on [out, in]). For each thread count, times one forward over n new tokens on
a cached 512-token prompt and then plain greedy decoding through the engine, the layouts
alternating trial by trial so the machine's drift hits them alike, and prints medians. --spin N
keeps N other processes spinning on the cores meanwhile (a shared machine). Nothing here decides
anything at load: this is how the policy was checked.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

import torch

from specdec.bench.common import parse_ints
from specdec.bench.scoreboard import machine_name
from specdec.bench.verify_cost import prompt_tokens, time_alternating
from specdec.drafters.none import NoDrafter
from specdec.engine import Engine, GenerationConfig
from specdec.models.cpu_matrix import CpuCaps, CpuLayout, choose_layout
from specdec.models.cpu_threads import use_threads
from specdec.models.loader import load_model
from specdec.models.native_llama import NativeLlama

CANDIDATES = {"one row plain, 2+ prepacked": CpuLayout(one_row="plain"),
              "every row count prepacked": CpuLayout(one_row="packed"),
              "one row plain, 2-3 [out,in]": CpuLayout(one_row="plain", plain_rows=3)}


def models_by_layout(hf) -> tuple[dict[str, NativeLlama], CpuLayout]:
    """One native model per candidate layout over the same weights; and the policy's layout."""
    models = {}
    for name, layout in CANDIDATES.items():
        models[name] = NativeLlama.from_hf(hf, name, max_length=1024, pack=False)
        models[name].net.pack_for_cpu(layout)
    matrices = [p for name, p in hf.named_parameters() if name.endswith("proj.weight")]
    size = sum(w.numel() * w.element_size() for w in matrices + [hf.get_output_embeddings().weight])
    return models, choose_layout(torch.float32, size, CpuCaps.here())


def decode_rates(models: dict, prompt: list[int], tokens: int, trials: int) -> dict[str, list[float]]:
    """Plain greedy tokens/s through the engine, the models alternating trial by trial."""
    config = GenerationConfig(max_new_tokens=tokens, k=1, ignore_eos=True)
    rates: dict[str, list[float]] = {name: [] for name in models}
    with torch.inference_mode():
        for _ in range(trials):
            for name, model in models.items():
                generation = Engine(model, NoDrafter(model.device)).generate(prompt, config)
                rates[name].append(generation.stats.tokens_per_second)
    return rates


def report(models: dict, policy_name: str, times: dict, rates: dict, rows: list[int]) -> None:
    names = list(models)
    print(f"{'rows':>12s} " + " ".join(f"{n + (' *' if n == policy_name else ''):>30s}" for n in names))
    for n in rows:
        print(f"{n:>12d} " + " ".join(f"{statistics.median(times[name][n]) * 1e3:27.1f} ms" for name in names))
    print(f"{'decode tok/s':>12s} " + " ".join(f"{statistics.median(rates[name]):30.1f}" for name in names))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=9)
    p.add_argument("--rows", type=parse_ints, default=parse_ints("1,2,3,5"))
    p.add_argument("--tokens", type=int, default=32, help="new tokens per decode run")
    p.add_argument("--threads", type=parse_ints, default=None, help="thread counts to try (default: specdec's choice)")
    p.add_argument("--spin", type=int, default=0, help="other processes spinning on the cores meanwhile")
    args = p.parse_args(argv)
    loaded = load_model("default", device="cpu", backend="hf")
    models, policy = models_by_layout(loaded.model.model)
    policy_name = next((n for n, layout in CANDIDATES.items() if layout == policy), str(policy))
    prompt = prompt_tokens(loaded.tokenizer, 512)
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.spin)]
    try:
        for threads in args.threads or [None]:
            chosen = use_threads(threads)
            print(f"\n{machine_name()}, {CpuCaps.here()}, {chosen.describe()}, {args.spin} spinning, "
                  f"medians of {args.trials} alternated trials (* = choose_layout's pick here)")
            times = time_alternating(models, prompt, args.rows, args.trials)
            report(models, policy_name, times, decode_rates(models, prompt, args.tokens, args.trials), args.rows)
    finally:
        for s in spinners:
            s.kill()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
