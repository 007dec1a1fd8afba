"""Batch-1 plain decoding through engine.Engine, now a batch of one over the batched engine.

    python benchmarks/batch1_engine.py [--device cuda] [--size llama-3.1-8b] [--context 512] [--tokens 128]

A random-weight NativeLlama (bf16 on CUDA) decodes `--tokens` new tokens greedily after a
`--context`-token prompt, no draft. Printed, as the median of `--runs` alternating runs, in decode
tokens/s (SpecStats.tokens_per_second: prefill excluded, as `specdec generate` reports it):

- engine:              Engine(target, NoDrafter): the batched loop over the target's own cache as
                       its one slot (models.slots.own_cache_slot, the NativeLlama's graphed
                       single-sequence kernels), pipelined plain steps on (the default on CUDA);
- engine, no pipeline: the same with Engine(..., overlap=False): one blocking read a step;
- one-slot NativeSlots: the same loop over slot_model_for(target, 1), the server's ragged path
                       (fused kernels, a plan a step), pipelined: tells that path's cost at batch 1.

On the H200 the single-sequence engine before this change decoded 235-237 tok/s here
(docs/batching.md); compare the `engine` line with that. A smoke run on a CPU:
`python benchmarks/batch1_engine.py --device cpu --size llama-3.2-1b --layers 1 --context 32 --tokens 8`.
"""

import argparse
import statistics

import torch

from specdec.engine.batched import BatchConfig, BatchedEngine
from specdec.drafters.none import NoDrafter
from specdec.engine import Engine, GenerationConfig
from specdec.models.native_llama import NativeLlama
from specdec.models.slots import slot_model_for


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="batch1_engine.py")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", default="llama-3.1-8b")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers (a smoke run)")
    parser.add_argument("--context", type=int, default=512, help="prompt tokens")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens a run")
    parser.add_argument("--runs", type=int, default=5)
    return parser.parse_args()


def native_slots_engine(llama: NativeLlama, pipeline: bool):
    """generate(prompt, config) through the batched loop over a one-slot NativeSlots sharing the llama's weights."""
    batch = BatchedEngine(slot_model_for(llama, 1), lambda: NoDrafter(llama.device),
                          config=BatchConfig(prefill_chunk=llama.max_length, pipeline=pipeline))
    return lambda prompt, config: batch.generate([prompt], config)[0]


def main() -> None:
    args = parse_args()
    cuda = args.device == "cuda"
    overrides = {"n_layers": args.layers} if args.layers else None
    llama = NativeLlama.random(args.size, device=args.device, dtype=torch.bfloat16 if cuda else torch.float32,
                               max_length=args.context + args.tokens + 16, arch_overrides=overrides)
    prompt = torch.randint(0, llama.vocab_size, (args.context,), generator=torch.Generator().manual_seed(0)).tolist()
    config = GenerationConfig(max_new_tokens=args.tokens, k=1, ignore_eos=True)
    runs = {"engine": Engine(llama, NoDrafter(llama.device)).generate,
            "engine, no pipeline": Engine(llama, NoDrafter(llama.device), overlap=False).generate,
            "one-slot NativeSlots": native_slots_engine(llama, pipeline=cuda)}
    rates, tokens = {name: [] for name in runs}, {}
    with torch.inference_mode():
        for run in runs.values():  # the first passes of each row count capture their CUDA graphs
            run(prompt, GenerationConfig(max_new_tokens=4, k=1, ignore_eos=True))
        for _ in range(args.runs):
            for name, run in runs.items():
                result = run(prompt, config)
                rates[name].append(result.stats.tokens_per_second)
                tokens[name] = list(result.token_ids)
    print(f"{llama.name} on {torch.cuda.get_device_name() if cuda else 'cpu'}, context {args.context}, "
          f"{args.tokens} new tokens, greedy, no draft; median of {args.runs} runs (decode tokens/s):")
    for name, values in rates.items():
        print(f"  {name:22s} {statistics.median(values):8.1f} tok/s  (min {min(values):.1f}, max {max(values):.1f})")
    print(f"  same tokens: {len({tuple(t) for t in tokens.values()}) == 1}")


if __name__ == "__main__":
    main()
