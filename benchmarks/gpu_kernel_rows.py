"""Each fused decode kernel on its own, on a GPU: does a token row get the same bits alone as among 9
rows? (A whole step is checked by `specdec bench gpu`; this says which kernel breaks it.)

Shapes of the Llama-3.2-1B layer in bf16, random inputs; every kernel with a plain and a split-K tile,
fed inputs from the kernels that feed it in a step (embed -> T = 1 sums of squares, a GEMV epilogue ->
one per column tile).

    python benchmarks/gpu_kernel_rows.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from specdec.models import triton_ops as T  # noqa: E402

DEV, DT = "cuda", torch.bfloat16
D, HD, H, HKV, I, S, N = 2048, 64, 32, 8, 8192, 1024, 9
GEN = torch.Generator(device=DEV).manual_seed(0)


def randn(*shape, scale=1.0):
    return (torch.randn(*shape, device=DEV, generator=GEN) * scale).to(DT)


def report(name: str, together: torch.Tensor, apart: torch.Tensor) -> None:
    same = int((together == apart).reshape(N, -1).all(-1).sum())
    diff = (together.float() - apart.float()).abs().max().item()
    print(f"  {name:28} rows equal {same}/{N}  max diff {diff:.3g}", flush=True)


def row(inp: T.NormInput, i: int) -> T.NormInput:
    return T.NormInput(inp.scaled[i:i + 1].contiguous(), inp.sq[i:i + 1].contiguous(), inp.eps)


def check(tile: tuple) -> None:
    T._chosen_tiles.clear()
    T._tune = lambda launch, w, tiles=T.TILES: tile  # one tile for every shape (no timing)
    print(f"tile (BLOCK_N, BLOCK_K, warps, stages, split-K) = {tile}")
    table, g, g2 = randn(1000, D), randn(D) + 1, randn(D) + 1
    wqkv, wo = randn((H + 2 * HKV) * HD, D, scale=0.02), randn(D, H * HD, scale=0.02)
    w13, w2 = randn(2 * I, D, scale=0.02), randn(D, I, scale=0.02)
    angles = torch.randn(S, HD // 2, device=DEV, generator=GEN)
    cos, sin = angles.cos().repeat(1, 2).to(DT), angles.sin().repeat(1, 2).to(DT)
    tokens, pos = torch.randint(0, 1000, (N,), device=DEV, generator=GEN), torch.arange(500, 500 + N, device=DEV)
    res, act, att = randn(N, D), randn(N, I), randn(N, H * HD)
    x, inp = T.embed(tokens, table, g, 1e-5)
    alone = [T.embed(tokens[i:i + 1], table, g, 1e-5)[1] for i in range(N)]
    report("embed x * g", inp.scaled, torch.cat([a.scaled for a in alone]))
    report("embed sums of squares", inp.sq, torch.cat([a.sq for a in alone]))
    report("gemv (w2)", T.gemv(act, w2), torch.cat([T.gemv(act[i:i + 1], w2) for i in range(N)]))
    h, h_in = T.gemv_then_norm(att, wo, g2, 1e-5, residual=res)
    outs = [T.gemv_then_norm(att[i:i + 1], wo, g2, 1e-5, residual=res[i:i + 1]) for i in range(N)]
    report("gemv_then_norm y (wo)", h, torch.cat([o[0] for o in outs]))
    report("gemv_then_norm y * g", h_in.scaled, torch.cat([o[1].scaled for o in outs]))
    report("gemv_then_norm sums", h_in.sq, torch.cat([o[1].sq for o in outs]))
    for name, source in (("T = 1", inp), ("T > 1", h_in)):
        report(f"normed swiglu (w13), {name}", T.gemv(source, w13, swiglu=True),
               torch.cat([T.gemv(row(source, i), w13, swiglu=True) for i in range(N)]))
        caches = [torch.zeros(HKV, S, HD, device=DEV, dtype=DT) for _ in range(2)]
        q = T.qkv_rope(source, wqkv, None, cos, sin, pos, *caches, H, HKV)
        k = caches[0][:, pos].transpose(0, 1).reshape(N, -1).clone()
        caches[0].zero_()
        q1 = torch.cat([T.qkv_rope(row(source, i), wqkv, None, cos, sin, pos[i:i + 1], *caches, H, HKV)
                        for i in range(N)])
        report(f"qkv_rope q, {name}", q, q1)
        report(f"qkv_rope k, {name}", k, caches[0][:, pos].transpose(0, 1).reshape(N, -1))


def main() -> int:
    with torch.inference_mode():
        for tile in ((32, 256, 4, 4, 1), (16, 256, 4, 4, 4)):
            check(tile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
