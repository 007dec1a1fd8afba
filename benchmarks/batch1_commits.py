"""Batch-1 plain decoding through engine.Engine with whatever specdec is on PYTHONPATH: for comparing
commits side by side on one machine (Engine's API is the same before and after the batched engine).

    git archive 7130c38 src | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old/src python3 benchmarks/batch1_commits.py old
    PYTHONPATH=src python3 benchmarks/batch1_commits.py new

The random Llama-3.1-8B in bf16 on CUDA (a 512-token prompt, 96 new tokens, greedy, no draft); prints
the median of five runs' decode tokens/s (SpecStats.tokens_per_second) after a warm-up, and their
median prefill time (decode rates compare only if both engines keep the prefill out of them alike).
"""

import statistics
import sys
import time

import torch

from specdec.drafters.none import NoDrafter
from specdec.engine import Engine, GenerationConfig
from specdec.models.native_llama import NativeLlama

label = sys.argv[1] if len(sys.argv) > 1 else "this"
t0 = time.time()
llama = NativeLlama.random("llama-3.1-8b", device="cuda", dtype=torch.bfloat16, max_length=512 + 96 + 16)
prompt = torch.randint(0, llama.vocab_size, (512,), generator=torch.Generator().manual_seed(0)).tolist()
engine = Engine(llama, NoDrafter(llama.device))
with torch.inference_mode():
    engine.generate(prompt, GenerationConfig(max_new_tokens=4, k=1, ignore_eos=True))
    config = GenerationConfig(max_new_tokens=96, k=1, ignore_eos=True)
    stats = [engine.generate(prompt, config).stats for _ in range(5)]
rates = [s.tokens_per_second for s in stats]
print(f"[{label}] engine batch 1, 8B random, ctx 512, 96 tokens: median {statistics.median(rates):.1f} tok/s "
      f"(all {', '.join(f'{r:.1f}' for r in rates)}); prefill {statistics.median(s.prefill_time for s in stats) * 1e3:.1f} ms; "
      f"set-up {time.time() - t0:.0f} s", flush=True)
