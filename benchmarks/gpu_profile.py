"""Where a native decode step spends its time on CUDA: per-kernel device time of one step of the
random-weight 8B and 1B shapes (fused Triton kernels), and each layer matrix through the Triton
GEMV against cuBLAS at one row. `python benchmarks/gpu_profile.py` on a CUDA machine."""

import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from specdec.bench.gpu import cuda_median_ms  # noqa: E402
from specdec.models import triton_ops  # noqa: E402
from specdec.models.native_llama import NativeLlama  # noqa: E402


def kernel_table(model, prompt, rows=1, steps=5):
    model.prefill(prompt)
    start = model.cache_len
    net = model.net
    tokens = torch.randint(0, model.vocab_size, (rows,), device="cuda")
    pos = net.slot_ids[start:start + rows]
    for _ in range(3):
        net.forward_static(tokens, pos, fused=model.fused_kernels)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            net.forward_static(tokens, pos, fused=model.fused_kernels)
        torch.cuda.synchronize()
    per = defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            per[ev.name][0] += 1
            per[ev.name][1] += ev.device_time
    model.rollback(0)
    total = sum(t for _, t in per.values()) / steps
    print(f"\n{model.name}: {rows} row(s), kernels sum {total:.0f} us per step")
    for name, (count, t) in sorted(per.items(), key=lambda kv: -kv[1][1])[:14]:
        print(f"  {t / steps:8.1f} us  {count // steps:4d} calls  {t / count:7.2f} us each  {name[:70]}")


def layer_sequence(model, prompt, layer=1):
    """Device time of each kernel of one decoder layer, in launch order (one step, 1 row)."""
    model.prefill(prompt)
    net, start = model.net, model.cache_len
    tokens = torch.randint(0, model.vocab_size, (1,), device="cuda")
    pos = net.slot_ids[start:start + 1]
    for _ in range(3):
        net.forward_static(tokens, pos, fused=True)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        net.forward_static(tokens, pos, fused=True)
        torch.cuda.synchronize()
    model.rollback(0)
    kernels = sorted((ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda ev: ev.time_range.start)
    per_layer = (len(kernels) - 3) // model.arch.n_layers  # embed first; final norm + head last
    first = 1 + layer * per_layer
    print(f"\n{model.name}: the kernels of layer {layer}, one row (eager launches, device time)")
    for ev in kernels[first:first + per_layer] + kernels[-2:]:
        print(f"  {ev.device_time:7.1f} us  {ev.name[:60]}")


def graph_us(fn, weights, calls=4):
    """Device time per call of fn(weight), cycled over weights, captured in one CUDA graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(weights[0])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            for w in weights:
                fn(w)
    return cuda_median_ms(graph.replay, 10) * 1000 / (calls * len(weights))


def tile_table(model, bandwidth):
    """Each layer matrix at one row through every tile the tuner tries, and through cuBLAS."""
    block = model.net.layers[0]
    print(f"\n{model.name}: one row, GEMV time per tile (us; weights streamed from HBM)")
    for name in ("wqkv", "wo", "w13", "w2"):
        w = getattr(block, name).weight
        weights = triton_ops.cold_copies(w)
        x = torch.randn(1, w.shape[1], device="cuda", dtype=w.dtype)
        swiglu = name == "w13"
        n = w.shape[0] // (2 if swiglu else 1)
        times = {}
        for tile in triton_ops.TILES:
            triton_ops._chosen_tiles.clear()
            def call(weight, tile=tile):
                key = (n, w.shape[1], (False, False, swiglu, False, False), w.dtype, w.device)
                triton_ops._chosen_tiles[key] = tile
                return triton_ops.gemv(x, weight, swiglu=swiglu)
            try:
                times[tile] = graph_us(call, weights)
            except Exception:  # noqa: BLE001 - a tile that does not fit
                times[tile] = float("nan")
            # One key, the one set above: had _gemv keyed this call differently, the tuner would
            # have added its own pick and every row of the table would time that.
            assert len(triton_ops._chosen_tiles) == 1, "tile key out of step with triton_ops._gemv"
        cub = graph_us(lambda weight: torch.matmul(x, weight.t()), weights)
        nbytes = w.numel() * w.element_size()
        best = min((t for t in times.values() if t == t))
        print(f"  {name:5} {tuple(w.shape)!s:14} ceiling {nbytes / bandwidth / 1e3:5.1f}  best {best:5.1f}"
              f" ({nbytes / best / 1e3 / bandwidth:.0%})  cuBLAS {cub:5.1f} ({nbytes / cub / 1e3 / bandwidth:.0%})")
        print("        " + "  ".join(f"{t}:{v:.1f}" for t, v in sorted(times.items(), key=lambda kv: kv[1])))
    triton_ops._chosen_tiles.clear()


def main():
    from specdec.bench.gpu import copy_bandwidth

    bandwidth = copy_bandwidth(4.0, 20)
    print(f"copy bandwidth {bandwidth:.0f} GB/s")
    prompt = torch.randint(0, 128256, (512,), device="cuda")
    for i, size in enumerate(["llama-3.1-8b", "llama-3.2-1b"]):
        model = NativeLlama.random(size, max_length=1024, seed=i, kernels="triton")
        kernel_table(model, prompt, 1)
        layer_sequence(model, prompt)
        with torch.inference_mode():
            tile_table(model, bandwidth)
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
