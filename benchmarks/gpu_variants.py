"""Side-by-side step times of the native model's variants (compile scope x attention kernel), to
choose the defaults: `python benchmarks/gpu_variants.py` on a CUDA machine. Prints one line each."""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from specdec.bench.gpu import cuda_median_ms  # noqa: E402
from specdec.models.llama_net import layer_step  # noqa: E402
from specdec.models.native_llama import NativeLlama  # noqa: E402

VARIANTS = [("layer", False), ("layer", True), ("step", False), ("step", True), (False, False)]


def step_ms(model, prompt, rows):
    model.prefill(prompt)
    length = model.cache_len
    tokens = torch.randint(0, model.vocab_size, (rows,), device="cuda")

    def once():
        model.rollback(length)
        model.forward(tokens)

    return cuda_median_ms(once, 30)


def main():
    t0 = time.perf_counter()
    nets = {size: NativeLlama.random(size, max_length=1024, seed=i).net
            for i, size in enumerate(["llama-3.1-8b", "llama-3.2-1b"])}
    prompt = torch.randint(0, 128256, (512,), device="cuda")
    for size, net in nets.items():
        eager = NativeLlama(net, "eager", 1024, cuda_graphs=False)
        reference = eager.prefill(prompt)[-4:]
        for compile_mode, math in VARIANTS:
            net.layer_fn, net.math_attention = layer_step, math
            model = NativeLlama(net, "v", 1024, compile=compile_mode)
            one, nine = step_ms(model, prompt, 1), step_ms(model, prompt, 9)
            model.rollback(0)
            model.prefill(prompt[:508])
            got = torch.cat([model.forward(prompt[i:i + 1]) for i in range(508, 512)])
            err = float((got - reference).norm() / reference.norm())
            print(f"[{time.perf_counter() - t0:5.0f}s] {size:13} compile={compile_mode!s:5} math_attention={math!s:5}"
                  f" step(1) {one:.3f} ms  step(9) {nine:.3f} ms  ratio {nine / one:.3f}  rel err vs eager {err:.1e}",
                  flush=True)


if __name__ == "__main__":
    main()
