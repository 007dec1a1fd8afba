"""What a draft step costs around its CUDA graph: graph replay alone, with its input copies, and
through NativeLlama.forward (input copies, replay, the fp32 logits and features out), for the
megakernel and the fused Triton step of one random 1B-shape draft, in one process.

    python benchmarks/gpu_step_overhead.py
"""

from __future__ import annotations

import json

import torch

from specdec.bench.gpu import cuda_median_ms
from specdec.models.native_llama import NativeLlama


def main() -> None:
    out = {}
    for max_length in (2048, 896, 2048):
        out.update(measure(max_length))
    for name, t in out.items():
        print(f"{name:18s} " + "  ".join(f"{k} {v:.3f}" for k, v in t.items()))


def measure(max_length: int) -> dict:
    mega = NativeLlama.random("llama-3.2-1b", max_length=max_length, seed=1, megakernel=True)
    triton = NativeLlama(mega.net, "triton", mega.max_length)
    prompt = torch.randint(0, mega.vocab_size, (512,), device="cuda")
    token = torch.randint(0, mega.vocab_size, (1,), device="cuda")
    out = {}
    for name, model in ((f"megakernel {max_length}", mega), (f"triton {max_length}", triton)):
        model.rollback(0)
        model.prefill(prompt)
        start = model.cache_len
        graph = model._graph(1)

        def inputs():
            graph.tokens[:1].copy_(token)
            graph.pos.copy_(model.net.slot_ids[start:start + 1])

        def forward():
            model.rollback(start)
            model.forward(token)

        def replay_in():
            inputs()
            graph.replay()

        def replay_in_out():
            replay_in()
            graph.logits[:1].to(torch.float32, copy=True)

        inputs()
        out[name] = {"replay": cuda_median_ms(graph.replay, 100), "inputs+replay": cuda_median_ms(replay_in, 100),
                     "inputs+replay+logits": cuda_median_ms(replay_in_out, 100), "forward": cuda_median_ms(forward, 100)}
        print(name, json.dumps(out[name]), flush=True)
    return out


if __name__ == "__main__":
    main()
