"""Timing primitives and random-weight models for the GPU benchmarks (bench gpu, bench gpu --trees):
CUDA-event medians, the copy ceiling, one step's time at a row count, the real-shape models."""

from __future__ import annotations

import statistics
import time


def cuda_median_ms(fn, reps: int, warmup: int = 3) -> float:
    """Median over reps of fn's device time, each call between two CUDA events."""
    import torch

    for _ in range(warmup):
        fn()
    pairs = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in pairs)


def copy_bandwidth(gib: float, reps: int) -> float:
    """Device-to-device copy, bytes read plus written, in GB/s."""
    import torch

    src = torch.randn(int(gib * (1 << 30)) // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    ms = cuda_median_ms(lambda: dst.copy_(src), reps)
    nbytes = 2 * src.numel() * src.element_size()
    del src, dst
    torch.cuda.empty_cache()
    return nbytes / ms / 1e6


def bytes_per_token(model, context: int) -> int:
    """Bytes a decode step must read: every weight but the embedding table (one row is read),
    plus the KV cache of the context."""
    a = model.arch
    weights = sum(p.numel() * p.element_size() for p in model.net.parameters())
    if not a.tie_embeddings:
        weights -= model.net.embed.weight.numel() * model.net.embed.weight.element_size()
    kv = 2 * a.n_layers * a.n_kv_heads * a.head_dim * context * model.net.layers[0].k_cache.element_size()
    return weights + kv


def decode_loop_ms(model, prompt, steps: int) -> float:
    """Plain greedy decoding with the model's own steps (no engine): ms per token."""
    import torch

    model.prefill(prompt[:-1])
    token = prompt[-1:]
    for _ in range(3):
        token = model.forward(token)[-1].argmax().reshape(1)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        token = model.forward(token)[-1].argmax().reshape(1)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1000 / steps


def step_ms(model, prompt, rows: int, reps: int) -> float:
    """Device time of one forward of `rows` new tokens after the prompt (rolled back each time)."""
    import torch

    model.prefill(prompt)
    length = model.cache_len
    tokens = torch.randint(0, model.vocab_size, (rows,), device=model.device)

    def once():
        model.rollback(length)
        model.forward(tokens)

    return cuda_median_ms(once, reps)


# -- models ---------------------------------------------------------------------------------------
def build_models(smoke: bool, max_length: int, draft_megakernel: bool = False):
    """HF target (random init), the native target on the same weights, and a native random draft."""
    import torch
    from transformers import LlamaForCausalLM

    from specdec.models.llama_config import named_arch
    from specdec.models.native_llama import NativeLlama

    overrides = {"n_layers": 2} if smoke else {}
    arch = named_arch("llama-3.1-8b", **overrides)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            torch.manual_seed(0)
            hf = LlamaForCausalLM(arch.to_hf()).eval()
    finally:
        torch.set_default_dtype(default_dtype)
    target = NativeLlama.from_hf(hf, "random llama-3.1-8b", max_length=max_length, max_graph_rows=65)
    draft = NativeLlama.random("llama-3.2-1b", max_length=max_length, arch_overrides=overrides, seed=1,
                               megakernel=draft_megakernel)
    return hf, target, draft


def random_prompts(count: int, length: int, vocab: int, seed: int):
    import torch

    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (length,), generator=gen).cuda() for _ in range(count)]


# -- sections -------------------------------------------------------------------------------------
