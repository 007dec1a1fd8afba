"""The batched engine on the GPU: is every sequence's output its batch-1 output, in bf16?

    python benchmarks/gpu_batched_engine.py [--device cuda] [--size llama-3.2-1b] [--layers 2]
                                            [--slots 4] [--sequences 12] [--tokens 32]

Each slot of a LoopSlots is its own NativeLlama with the same random weights (seed 0), and a
reference NativeLlama runs each sequence alone through engine.Engine. Sequences have mixed prompt
lengths, K, arrivals and drafters (none, lookup, a random draft model of its own); more sequences
than slots, so they queue. Greedy: each one's tokens must equal its plain batch-1 decoding. Sampled:
a seed must give Engine's tokens. Run twice: prefill in one chunk (as Engine prefills), and in
chunks of 16 tokens, where a prefill's row count differs from Engine's (on a GPU a GEMM's kernel,
hence its bits, may follow the row count: the identity rate says whether it does here). A loop of
models brings no speedup; the wall times are printed only to show what the loop costs.
"""

import argparse
import random
import time

import torch

from specdec.batching import BatchConfig, BatchedEngine
from specdec.drafters import LookupDrafter, ModelDrafter, NoDrafter
from specdec.engine import Engine, GenerationConfig
from specdec.models.native_llama import NativeLlama
from specdec.models.slots import LoopSlots
from specdec.sampling import SamplingParams


def native(args, layers: int, seed: int) -> NativeLlama:
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    return NativeLlama.random(args.size, device=args.device, dtype=dtype, max_length=512, seed=seed,
                              arch_overrides={"n_layers": layers})


def requests(args, vocab: int) -> list[tuple[list[int], GenerationConfig, str, int]]:
    """(prompt, config, drafter kind, arrival step); every third sequence samples with its own seed."""
    rng = random.Random(0)
    out = []
    for i in range(args.sequences):
        base = [rng.randrange(vocab) for _ in range(rng.choice([1, 3, 10, 20]))]
        prompt = (base * 3)[:rng.choice([1, 5, 17, 40, 60])]
        sampling = SamplingParams(temperature=1.0, seed=i) if i % 3 == 2 else SamplingParams()
        config = GenerationConfig(max_new_tokens=args.tokens, k=rng.randrange(1, 6), sampling=sampling)
        out.append((prompt, config, ("none", "lookup", "model")[i % 3], rng.randrange(0, 8)))
    return out


def drafter(kind: str, draft_factory, device):
    if kind == "none":
        return NoDrafter(device)
    if kind == "lookup":
        return LookupDrafter(device)
    model = draft_factory()
    return ModelDrafter(model, model.vocab_size)


def run_batched(engine: BatchedEngine, reqs, draft_factory, device):
    handles, step = [None] * len(reqs), 0
    while step <= max(r[3] for r in reqs) or engine.busy:
        for i, (prompt, config, kind, arrival) in enumerate(reqs):
            if arrival == step:
                handles[i] = engine.submit(prompt, config, drafter=drafter(kind, draft_factory, device))
        engine.step()
        step += 1
    return [h.token_ids for h in handles]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", default="llama-3.2-1b")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--sequences", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    reference = native(args, args.layers, seed=0)
    drafts = [native(args, 1, seed=1) for _ in range(args.sequences)]  # one per model-drafted sequence
    draft_pool = iter(drafts)
    reqs = requests(args, reference.vocab_size)
    device = reference.device
    start = time.perf_counter()
    alone = [Engine(reference, drafter(kind, lambda: next(draft_pool), device)).generate(p, c).token_ids
             for p, c, kind, _ in reqs]
    print(f"alone, one at a time: {time.perf_counter() - start:.2f} s")
    slots = LoopSlots(lambda: native(args, args.layers, seed=0), args.slots)
    for chunk in (512, 16):
        draft_pool = iter(drafts)
        engine = BatchedEngine(slots, lambda: NoDrafter(device), config=BatchConfig(prefill_chunk=chunk))
        start = time.perf_counter()
        outputs = run_batched(engine, reqs, lambda: next(draft_pool), device)
        seconds = time.perf_counter() - start
        same = sum(a == b for a, b in zip(alone, outputs))
        greedy = [i for i, r in enumerate(reqs) if r[1].sampling.greedy]
        same_greedy = sum(alone[i] == outputs[i] for i in greedy)
        print(f"batched, {args.slots} slots, prefill chunk {chunk}: {seconds:.2f} s; identical to alone: "
              f"{same}/{len(reqs)} (greedy {same_greedy}/{len(greedy)}, sampled {same - same_greedy}/"
              f"{len(reqs) - len(greedy)})")


if __name__ == "__main__":
    main()
