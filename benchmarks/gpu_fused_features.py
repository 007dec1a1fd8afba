"""A draft head's multi-layer features (EAGLE-3) on the GPU fast path: `python benchmarks/gpu_fused_features.py`.

On the random-weight Llama-3.2-1B shape in bf16 through the graphed Triton kernels it checks that
1. forward_with_hidden(tokens, layers) returns the outputs of those layers beside the final-norm
   features: the logits and the final slice bit-for-bit those of a call without layers, the layer
   slices equal to the eager (uncaptured) path's within bf16 rounding;
2. greedy speculative decoding with a (random) fused head drafting K=3 gives plain greedy decoding's
   tokens, token for token;
and times the graphed verify step of 4 rows with and without the captured layers.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from specdec.drafters.head import DraftHead, HeadConfig, HeadDrafter, TargetParts, auto_feature_layers  # noqa: E402
from specdec.drafters.none import NoDrafter  # noqa: E402
from specdec.engine import Engine, GenerationConfig  # noqa: E402
from specdec.models.native_llama import NativeLlama  # noqa: E402


def timed(fn, reps: int = 50) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def main() -> None:
    model = NativeLlama.random("llama-3.2-1b", max_length=1024, seed=0, kernels="triton")
    arch = model.arch
    layers = auto_feature_layers(arch.n_layers)
    prompt = torch.randint(0, arch.vocab_size, (300,), device="cuda")
    model.prefill(prompt)
    base = model.cache_len
    logits, plain = model.forward_with_hidden(prompt[:4])
    model.rollback(base)
    logits_l, fused = model.forward_with_hidden(prompt[:4], layers)
    model.rollback(base)
    _, eager = model.net.forward_eager(prompt[:4], base, layers)
    d = arch.dim
    rel = ((fused[:, :-d].float() - eager[:, :-d].float()).norm() / eager[:, :-d].float().norm()).item()
    same = torch.equal(logits, logits_l) and torch.equal(plain, fused[:, -d:])

    torch.manual_seed(0)
    config = HeadConfig(hidden=d, num_heads=arch.n_heads, num_kv_heads=arch.n_kv_heads,
                        intermediate=arch.intermediate, vocab_size=arch.vocab_size, draft_vocab=8192,
                        rope_theta=500000.0, feature_layers=layers)
    head = DraftHead(config).cuda().eval()
    net = model.net
    parts = TargetParts(net.embed.weight, net.norm, arch.norm_eps, net.lm_weight())
    engine = Engine(model, HeadDrafter(head, parts, max_length=1024))
    plain = Engine(model, NoDrafter(model.device))
    identical = []
    for seed in range(4):
        p = torch.randint(0, arch.vocab_size, (64,), generator=torch.Generator().manual_seed(seed)).tolist()
        # Plain decoding through the same engine: its prompt's last token runs in a graphed step, as
        # with a draft (a long eager prefill over it rounds differently in bf16).
        want = plain.generate(p, GenerationConfig(max_new_tokens=48, k=1)).token_ids
        identical.append(engine.generate(p, GenerationConfig(max_new_tokens=48, k=3)).token_ids == want)

    print(f"\nfeature layers {layers} of {arch.n_layers}; logits and final features bit-for-bit without them: {same}; "
          f"layer slices vs eager: relative error {rel:.2e}")
    print(f"greedy identity with a fused head, K=3, 4 prompts x 48 tokens: {identical}", flush=True)

    model.prefill(prompt)  # the engine left another text in the cache

    def verify(with_layers):
        model.rollback(base)
        model.forward_with_hidden(prompt[:4], layers if with_layers else ())

    ms = {name: timed(lambda w=w: verify(w)) for name, w in (("without layers", False), ("with layers", True))}
    print("graphed 4-row verify (host included): " + "  ".join(f"{k} {v:.3f} ms" for k, v in ms.items()))


if __name__ == "__main__":
    main()
