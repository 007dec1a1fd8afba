"""The engine's own cost per token, before and after a change, side by side in one process.

    python benchmarks/gpu_engine_ab.py --before OLD_ENGINE.py [--out engine-ab.json]

OLD_ENGINE.py is an earlier src/specdec/engine.py (e.g. `git show REV:src/specdec/engine.py`); both
engines drive the same random-weight Llama-3.1-8B-shape target and Llama-3.2-1B-shape draft in bf16
through plain decoding and the oracle drafter, alternating run by run. Prints tokens/s of each
(wall clock around generate(), prefill included, the same yardstick for both; and each engine's own
decode-time figure), their ratio, whether both gave the same tokens, how many synchronising calls
PyTorch saw per round (torch.cuda.set_sync_debug_mode), and the bare decode loop (no engine) for
reference; checks on the device that an EOS stop with the step queued ahead leaves the cache as
the round loop does. `--smoke`: tiny models on the CPU, to shake out errors.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from specdec.bench.gpu import decode_loop_ms  # noqa: E402
from specdec.drafters.none import NoDrafter  # noqa: E402
from specdec.drafters.oracle import OracleDrafter  # noqa: E402
from specdec.engine import Engine, GenerationConfig  # noqa: E402
from specdec.models.native_llama import NativeLlama  # noqa: E402

ORACLE = ((0.6, 2), (0.8, 4), (0.9, 6))  # (alpha, K): the calculator's K at c = 0.23


def load_engine_class(path: str):
    spec = importlib.util.spec_from_file_location("engine_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module.Engine


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run(engine, prompts, new_tokens: int, k: int) -> tuple[dict, list[list[int]]]:
    """Greedy generations: tokens/s by the wall clock (prefill included) and by the engine's stats."""
    config = GenerationConfig(max_new_tokens=new_tokens, k=k, ignore_eos=True)
    device = engine.target.device.type
    synchronize(device)
    t0 = time.perf_counter()
    gens = [engine.generate(p, config) for p in prompts]
    synchronize(device)
    wall = time.perf_counter() - t0
    tokens = sum(g.stats.generated for g in gens)
    return ({"wall": tokens / wall, "stats": tokens / sum(g.stats.decode_time for g in gens),
             "rounds": sum(g.stats.rounds for g in gens)}, [g.token_ids for g in gens])


def syncs_per_round(engine, prompt, new_tokens: int, k: int) -> float | None:
    """Synchronising calls PyTorch reports (set_sync_debug_mode("warn")) per round of one generation."""
    if engine.target.device.type != "cuda":
        return None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            res, _ = run(engine, [prompt], new_tokens, k)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught) / res["rounds"]


def eos_check(target, prompt: list[int], continuation: list[int]) -> dict:
    """Plain decoding (one step queued ahead on CUDA) stopped by an EOS in the middle."""
    eos = continuation[10]
    gen = Engine(target, NoDrafter(target.device), eos_token_ids=[eos], overlap=True).generate(
        prompt, GenerationConfig(max_new_tokens=len(continuation)))
    expected = continuation[: continuation.index(eos) + 1]
    return {"tokens_equal": gen.token_ids == expected, "finish_reason": gen.finish_reason,
            "cache_is_text_minus_one": target.cache_len == len(prompt) + len(gen.token_ids) - 1}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--before", required=True, help="path of the earlier engine.py")
    p.add_argument("--out", default=None, help="JSON file for the full results")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args()

    engines = {"before": load_engine_class(args.before), "after": Engine}
    if args.smoke:
        device, sizes, args.context, args.new_tokens, args.rounds = "cpu", ("smollm2-135m", "smollm2-135m"), 32, 12, 1
        options = {"arch_overrides": {"n_layers": 2}, "dtype": torch.float32}
    else:
        device, sizes, options = "cuda", ("llama-3.1-8b", "llama-3.2-1b"), {}
    target = NativeLlama.random(sizes[0], device=device, max_length=1024, **options)
    draft = NativeLlama.random(sizes[1], device=device, max_length=1024, seed=1, **options)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, target.vocab_size, (args.context,), generator=gen).tolist()
               for _ in range(args.prompts)]
    target.capture(*range(1, max(k for _, k in ORACLE) + 2))  # every row count a generation's last rounds use
    draft.capture(1, 2)
    _, continuations = run(Engine(target, NoDrafter(target.device)), prompts, args.new_tokens, 1)

    def drafter(name):
        if name == "plain":
            return NoDrafter(target.device), 1
        alpha, k = ORACLE[int(name[-1])]
        oracle = OracleDrafter(target, alpha, draft, horizon=args.new_tokens, seed=7)
        for prompt, cont in zip(prompts, continuations):
            oracle.remember(prompt, cont)
        return oracle, k

    configs = ["plain"] + [f"oracle{i}" for i in range(len(ORACLE))]
    speeds = {(c, e): [] for c in configs for e in engines}
    same = {c: True for c in configs}
    for r in range(args.rounds):
        for c in configs:
            order = list(engines) if r % 2 == 0 else list(reversed(engines))
            outputs = {}
            for e in order:
                d, k = drafter(c)
                tps, outputs[e] = run(engines[e](target, d), prompts, args.new_tokens, k)
                speeds[c, e].append(tps)
            same[c] &= outputs["before"] == outputs["after"] == continuations
    syncs = {c: {} for c in configs}
    for c in configs:
        for e in engines:
            d, k = drafter(c)
            syncs[c][e] = syncs_per_round(engines[e](target, d), prompts[0], args.new_tokens, k)
    bare = statistics.median(decode_loop_ms(target, torch.tensor(prompts[0], device=device), 2 * args.new_tokens)
                             for _ in range(3)) if device == "cuda" else float("nan")
    eos = eos_check(target, prompts[0], continuations[0])
    res = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "oracle": ORACLE,
           "bare_loop_tokens_per_s": 1000 / bare, "eos_check": eos, "rounds": args.rounds,
           "by_config": {c: {e: {m: statistics.median(r[m] for r in speeds[c, e]) for m in ("wall", "stats")}
                             for e in engines} | {"runs": {e: speeds[c, e] for e in engines},
                                                  "syncs_per_round": syncs[c], "same_tokens": same[c]}
                         for c in configs}}
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=2))
    print(f"{res['device']}; bare decode loop (no engine) {res['bare_loop_tokens_per_s']:.1f} tok/s; "
          f"EOS stop with a step queued ahead: {eos}")
    print("tok/s: wall clock around generate() (prefill included) | the engine's stats (decode time)")
    print(f"{'run':<20}{'before':>16}{'after':>16}{'after/before':>14}{'syncs/round b, a':>18}  same tokens")
    for c in configs:
        row = res["by_config"][c]
        label = c if c == "plain" else "oracle a={} K={}".format(*ORACLE[int(c[-1])])
        b, a = row["before"], row["after"]
        sync = "  ".join("-" if v is None else f"{v:.2f}" for v in row["syncs_per_round"].values())
        print(f"{label:<20}{b['wall']:>8.1f} |{b['stats']:>6.1f}{a['wall']:>8.1f} |{a['stats']:>6.1f}"
              f"{a['wall'] / b['wall']:>14.3f}{sync:>18}  {row['same_tokens']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
