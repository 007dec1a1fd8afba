"""Where a native decode step spends its time on CUDA: per-kernel device time of one step of the
random-weight 8B and 1B shapes (fused Triton kernels), and each layer matrix through the Triton
GEMV against cuBLAS at one row. `python benchmarks/gpu_profile.py` on a CUDA machine."""

import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
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


def graph_us(fn, calls=20):
    """Device time per call of fn, captured 20 times in one CUDA graph (no host launch cost)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return cuda_median_ms(graph.replay, 20) * 1000 / calls


def gemv_table(model, bandwidth):
    block = model.net.layers[0]
    d = model.arch.dim
    print(f"\n{model.name}: one row, Triton GEMV vs cuBLAS (GB/s of the matrix read)")
    for name in ("wqkv", "wo", "w13", "w2"):
        w = getattr(block, name).weight
        x = torch.randn(1, w.shape[1], device="cuda", dtype=w.dtype)
        res = torch.randn(1, w.shape[0] // (2 if name == "w13" else 1), device="cuda", dtype=w.dtype)
        norm = torch.ones(d, device="cuda", dtype=w.dtype)
        normed = name in ("wqkv", "w13")  # as in the layer: the RMSNorm kernel, then the GEMV
        kwargs = {"wqkv": {}, "wo": dict(residual=res), "w13": dict(swiglu=True), "w2": dict(residual=res)}[name]
        t_tri = graph_us(lambda: triton_ops.gemv(triton_ops.rms_norm(x, norm, 1e-5) if normed else x, w, **kwargs))
        tile = next(t for key, t in triton_ops._chosen_tiles.items() if key[:2] == (res.shape[1], w.shape[1]))
        t_cub = graph_us(lambda: F.linear(x, w))
        nbytes = w.numel() * w.element_size()
        print(f"  {name:5} {tuple(w.shape)!s:14} triton {t_tri:6.1f} us {nbytes / t_tri / 1e3:5.0f} GB/s"
              f"  cuBLAS {t_cub:6.1f} us {nbytes / t_cub / 1e3:5.0f} GB/s  ceiling {nbytes / bandwidth / 1e3:5.1f} us"
              f"  [BLOCK_N, BLOCK_K, warps, stages, split-K = {tile}]")


def main():
    from specdec.bench.gpu import copy_bandwidth

    bandwidth = copy_bandwidth(4.0, 20)
    print(f"copy bandwidth {bandwidth:.0f} GB/s")
    prompt = torch.randint(0, 128256, (512,), device="cuda")
    for i, size in enumerate(["llama-3.1-8b", "llama-3.2-1b"]):
        model = NativeLlama.random(size, max_length=1024, seed=i, kernels="triton")
        gemv_table(model, bandwidth)
        kernel_table(model, prompt, 1)
        kernel_table(model, prompt, 9)
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
