"""Two versions of the fused decode kernels side by side on a GPU: this checkout's triton_ops against
an earlier copy of the module (e.g. `git show REV:src/specdec/models/triton_ops.py > before.py`).

Random-weight Llama-3.2-1B and Llama-3.1-8B shapes in bf16, both versions over the same net: graphed
step times at 1 and 9 rows (the versions interleaved, medians of medians), fraction of the copy
ceiling, c, whether 9 rows give single steps' logits bit for bit, and how far the two versions'
logits are apart.

    python benchmarks/gpu_layer_ab.py --before before.py [--out-dir DIR]
"""

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from specdec.bench.gpu import bytes_per_token, copy_bandwidth, random_prompts, row_invariance, step_ms  # noqa: E402
from specdec.models.native_llama import NativeLlama  # noqa: E402


def load_module(path: str):
    spec = importlib.util.spec_from_file_location("triton_ops_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def before_model(base: NativeLlama, before) -> NativeLlama:
    """A model over base's net whose graphed steps run the earlier module's layer (its LlamaNet._run contract)."""
    net = base.net
    model = NativeLlama(net, f"{base.name} before", base.max_length, cuda_graphs=base.cuda_graphs, kernels="triton")

    def step(tokens, pos, fused=True, capture=()):
        return net._run(tokens, pos, None, net.slots, before.fused_layer_step, False, before.rms_norm,
                        before.gemv, capture)

    model._step_fn = step
    return model


def measure(size: str, before, prompt, bandwidth: float, seed: int, rounds: int = 3) -> dict:
    base = NativeLlama.random(size, max_length=1024, seed=seed, kernels="triton")
    models = {"before": before_model(base, before), "after": NativeLlama(base.net, "after", 1024, kernels="triton")}
    for m in models.values():
        m.capture(1, 9)
    times = {label: {1: [], 9: []} for label in models}
    for _ in range(rounds):  # interleaved: the card's drift hits both alike
        for label, m in models.items():
            for rows in (1, 9):
                times[label][rows].append(step_ms(m, prompt, rows, 20))
                m.rollback(0)
    nbytes = bytes_per_token(base, len(prompt))
    res, logits = {}, {}
    for label, m in models.items():
        m.prefill(prompt[:-4])
        logits[label] = torch.cat([m.forward(prompt[i:i + 1]) for i in range(len(prompt) - 4, len(prompt))])
        m.rollback(0)
        one, nine = (statistics.median(times[label][r]) for r in (1, 9))
        res[label] = {"step_ms_1": one, "step_ms_9": nine, "ratio_9": nine / one, "runs_1": times[label][1],
                      "fraction_of_ceiling": nbytes / one / 1e6 / bandwidth,
                      "row_invariance": row_invariance(m, prompt)}
    ref = logits["before"]
    res["after_vs_before_rel_err"] = float((logits["after"] - ref).norm() / ref.norm())
    res["argmax_agree"] = float((logits["after"].argmax(-1) == ref.argmax(-1)).float().mean())
    res["speedup_1"] = res["before"]["step_ms_1"] / res["after"]["step_ms_1"]
    print(size, json.dumps(res, default=str), flush=True)
    return res


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="path of the earlier triton_ops.py")
    parser.add_argument("--out-dir", default="results")
    args = parser.parse_args()
    before = load_module(args.before)
    bandwidth = copy_bandwidth(4.0, 20)
    prompt = random_prompts(1, 512, 128256, seed=0)[0]
    res = {"card": torch.cuda.get_device_name(0), "torch": torch.__version__, "copy_bandwidth_gbs": bandwidth,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "before": args.before}
    with torch.inference_mode():
        for i, size in enumerate(("llama-3.2-1b", "llama-3.1-8b")):
            res[size] = measure(size, before, prompt, bandwidth, seed=i)
            torch.cuda.empty_cache()
    out = Path(args.out_dir) / "gpu-layer-ab.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=str))
    d, t = res["llama-3.2-1b"], res["llama-3.1-8b"]
    print(f"\n{res['card']}  {res['date']}  copy ceiling {bandwidth:.0f} GB/s")
    for label in ("before", "after"):
        print(f"{label:7} 1B {d[label]['step_ms_1']:.3f} ms ({d[label]['fraction_of_ceiling']:.0%})  "
              f"8B {t[label]['step_ms_1']:.3f} ms ({t[label]['fraction_of_ceiling']:.0%})  "
              f"c {d[label]['step_ms_1'] / t[label]['step_ms_1']:.3f}  9/1 rows {d[label]['ratio_9']:.3f} "
              f"{t[label]['ratio_9']:.3f}  rows bitwise {d[label]['row_invariance']['bitwise_equal']} "
              f"{t[label]['row_invariance']['bitwise_equal']}")
    print(f"after/before step: 1B {1 / d['speedup_1']:.3f}  8B {1 / t['speedup_1']:.3f};  logits rel err "
          f"{d['after_vs_before_rel_err']:.2e} / {t['after_vs_before_rel_err']:.2e}, argmax agree "
          f"{d['argmax_agree']:.0%} / {t['argmax_agree']:.0%}")
    print(f"saved {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
