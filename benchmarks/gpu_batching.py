"""Batching on the GPU, two checks (docs/batching.md; results/gpu-h200-batching.txt).

`rule`: The ragged rule (verify.ragged_outcome) on the GPU at the real vocabulary: exact per sequence, no
host synchronisation inside, and what one call costs the host and the GPU.

    python benchmarks/gpu_batching.py rule [--device cuda] [--vocab 128256]

For batches of 1, 4, 16 and 64 sequences (K_i from 0 to 8; greedy, one-hot and sampled drafts; varied
SamplingParams) it checks that every sequence settles exactly as greedy_outcome / sampled_outcome
alone with a clone of its generator, and that the generators end in the same state; counts the
synchronising calls inside ragged_outcome (torch.cuda.set_sync_debug_mode("warn")); and prints the
median host time of one call and its GPU time (CUDA events).

`slots`: NativeSlots on the GPU in bf16: is every sequence's greedy output its batch-1 output, and what do batches buy?

    python benchmarks/gpu_batching.py slots [--device cuda] [--size llama-3.1-8b] [--layers N]
                                          [--sequences 64] [--tokens 32] [--batches 1,4,16,64]

A NativeSlots of max(batches) slots and a batch-1 NativeLlama hold the same random weights (seed 0).
Identity: `--sequences` greedy sequences (prompts of 1-100 tokens, K 1-5, no drafter or prompt
lookup, arriving over 8 steps) through the BatchedEngine over NativeSlots; each one's tokens are
compared with its plain batch-1 decoding through engine.Engine over NativeLlama, eager (the same
torch layers, cuBLAS over n rows instead of T) and graphed (today's product path: Triton kernels in
CUDA graphs), and with the same sequence run alone through the BatchedEngine over NativeSlots
(rule 6 of the design in its strict form: a sequence's tokens do not depend on its companions).
NativeSlots runs the portable eager path (cuBLAS, SDPA per sequence): cuBLAS picks its kernel by
the row count, so bits, and on near-ties greedy tokens, may follow the batch; the counts say how often.
Throughput: plain decoding of B sequences at once (prompts of 32 tokens, --tokens new ones each),
aggregate tokens/s of the decode steps, beside batch-1 Engine over the eager and graphed NativeLlama.
"""

import argparse
import random
import statistics
import sys
import time
import warnings
from itertools import accumulate

import torch

from specdec.engine.batched import BatchConfig, BatchedEngine
from specdec.drafters import LookupDrafter, NoDrafter
from specdec.engine import Engine, GenerationConfig
from specdec.models.native_llama import NativeLlama
from specdec.models.native_slots import NativeSlots
from specdec.sampling import SamplingParams, warp_logits, warp_ragged
from specdec.verify import greedy_outcome, ragged_outcome, sampled_outcome

PARAMS = [SamplingParams(), SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=50),
          SamplingParams(temperature=1.0, top_p=0.9), SamplingParams(temperature=0.8, min_p=0.05)]


def make_batch(b: int, vocab: int, device: torch.device, g: torch.Generator) -> dict:
    """A random ragged round: logits [T, V], drafts [D], q [D_q, V] and per-sequence details."""
    ks = torch.randint(0, 9, (b,), generator=g).tolist()
    params = [PARAMS[i % len(PARAMS)] for i in range(b)]
    logits = torch.randn(sum(ks) + b, vocab, generator=g).mul_(3).to(device)
    offsets = [0, *accumulate(k + 1 for k in ks)]
    p = warp_ragged(logits, offsets, params)
    drafts, qs = [], []  # per sequence; q None for a one-hot draft
    for i, k in enumerate(ks):
        draft_logits = logits[offsets[i]:offsets[i] + k] + torch.randn(k, vocab, generator=g).to(device)
        if params[i].greedy or i % 3 == 1:  # argmax drafts: one-hot q
            drafts.append(draft_logits.argmax(-1))
            qs.append(None)
        else:
            q = warp_logits(draft_logits, params[i])
            drafts.append(torch.multinomial(q, 1).reshape(k) if k else torch.zeros(0, dtype=torch.long, device=device))
            qs.append(q)
    given = [q for q in qs if q is not None]
    q_offsets = [0, *accumulate(0 if q is None else q.shape[0] for q in qs)]
    return dict(p=p, offsets=offsets, draft_tokens=torch.cat(drafts), q=torch.cat(given) if given else None,
                q_offsets=q_offsets if given else None, params=params, drafts=drafts, qs=qs)


def generators(b: int, device: torch.device, seed: int) -> list[torch.Generator]:
    return [torch.Generator(device=device).manual_seed(seed + i) for i in range(b)]


def call(batch: dict, gens) -> tuple[torch.Tensor, torch.Tensor]:
    return ragged_outcome(batch["p"], batch["offsets"], batch["draft_tokens"], batch["q"], batch["q_offsets"],
                          batch["params"], gens)


def exact(batch: dict, device: torch.device) -> bool:
    gens, alone = generators(len(batch["params"]), device, 7), generators(len(batch["params"]), device, 7)
    num_accepted, next_token = call(batch, gens)
    ok = True
    for i, (lo, hi) in enumerate(zip(batch["offsets"], batch["offsets"][1:])):
        p_i, d_i = batch["p"][lo:hi], batch["drafts"][i]
        if batch["params"][i].greedy:
            n, t = greedy_outcome(p_i.argmax(-1), d_i)
        else:
            n, t = sampled_outcome(p_i, d_i, batch["qs"][i], alone[i])
        ok &= (int(n), int(t)) == (int(num_accepted[i]), int(next_token[i]))
        ok &= torch.equal(gens[i].get_state(), alone[i].get_state())
    return ok


def syncs(batch: dict, device: torch.device) -> int:
    gens = generators(len(batch["params"]), device, 3)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        call(batch, gens)
        torch.cuda.set_sync_debug_mode("default")
    for w in caught:
        print("   sync:", str(w.message).splitlines()[0])
    return len(caught)


def timing(batch: dict, device: torch.device, reps: int = 30) -> tuple[float, float]:
    gens = generators(len(batch["params"]), device, 5)
    host, gpu = [], []
    for _ in range(reps):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        call(batch, gens)
        host.append((time.perf_counter() - t0) * 1e3)
        end.record()
        end.synchronize()
        gpu.append(start.elapsed_time(end))
    return statistics.median(host), statistics.median(gpu)


def rule_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="gpu_batching.py rule")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--vocab", type=int, default=128256)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    for b in (1, 4, 16, 64):
        batch = make_batch(b, args.vocab, device, g)
        line = f"B={b:3d} T={batch['p'].shape[0]:4d} exact per sequence: {exact(batch, device)}"
        if device.type == "cuda":
            host_ms, gpu_ms = timing(batch, device)
            line += f"  syncs inside: {syncs(batch, device)}  host {host_ms:.2f} ms  GPU {gpu_ms:.2f} ms per call"
        print(line, flush=True)


MAX_LENGTH = 512


def requests(n: int, tokens: int, vocab: int, seed: int = 0) -> list[tuple[list[int], GenerationConfig, str, int]]:
    """(prompt, config, drafter kind, arrival step), greedy."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        base = [rng.randrange(vocab) for _ in range(rng.choice([1, 3, 10, 20]))]
        prompt = (base * 10)[:rng.choice([1, 5, 17, 40, 100])]
        config = GenerationConfig(max_new_tokens=tokens, k=rng.randrange(1, 6))
        out.append((prompt, config, ("none", "lookup")[i % 2], rng.randrange(0, 8)))
    return out


def drafter(kind: str, device):
    return NoDrafter(device) if kind == "none" else LookupDrafter(device)


def run_batched(engine: BatchedEngine, reqs) -> list[list[int]]:
    handles, step = [None] * len(reqs), 0
    while step <= max(r[3] for r in reqs) or engine.busy:
        for i, (prompt, config, kind, arrival) in enumerate(reqs):
            if arrival == step:
                handles[i] = engine.submit(prompt, config, drafter=drafter(kind, engine.target.device))
        engine.step()
        step += 1
    return [h.token_ids for h in handles]


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def identity(slots: NativeSlots, references: dict[str, NativeLlama], args) -> None:
    reqs = requests(args.sequences, args.tokens, slots.vocab_size)
    device = slots.device
    batched = run_batched(BatchedEngine(slots, lambda: NoDrafter(device)), reqs)
    alone_in_slots = [run_batched(BatchedEngine(slots, lambda: NoDrafter(device)), [(p, c, k, 0)])[0]
                      for p, c, k, _ in reqs]
    outputs = {"NativeSlots alone (B=1)": alone_in_slots}
    for label, model in references.items():
        outputs[f"NativeLlama {label}, plain"] = [Engine(model, NoDrafter(device)).generate(p, c).token_ids
                                                  for p, c, _, _ in reqs]
    for label, expected in outputs.items():
        diffs = [first_difference(got, want) for got, want in zip(batched, expected)]
        same = sum(d is None for d in diffs)
        where = sorted(d for d in diffs if d is not None)
        print(f"greedy identity, BatchedEngine over NativeSlots ({args.sequences} sequences, {slots.max_slots} slots) "
              f"vs {label}: {same}/{len(reqs)} sequences identical"
              + (f"; first differences at tokens {where}" if where else ""))


def throughput(slots: NativeSlots, references: dict[str, NativeLlama], args) -> None:
    device = slots.device
    rng = random.Random(1)
    config = GenerationConfig(max_new_tokens=args.tokens)
    for label, model in references.items():
        prompt = [rng.randrange(slots.vocab_size) for _ in range(32)]
        Engine(model, NoDrafter(device)).generate(prompt, config)  # warm-up (graph capture)
        result = Engine(model, NoDrafter(device)).generate(prompt, config)
        print(f"batch 1, Engine over NativeLlama {label}: {result.stats.tokens_per_second:.1f} tokens/s")
    base = None
    for b in args.batches:
        # Untimed first: the first pass of more than 16 rows tunes the wide tiles (seconds).
        BatchedEngine(slots, lambda: NoDrafter(device)).generate(
            [[rng.randrange(slots.vocab_size) for _ in range(32)] for _ in range(b)], GenerationConfig(max_new_tokens=2))
        engine = BatchedEngine(slots, lambda: NoDrafter(device), config=BatchConfig(prefill_chunk=256))
        handles = [engine.submit([rng.randrange(slots.vocab_size) for _ in range(32)], config) for _ in range(b)]
        engine.step()  # the prefills
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        engine.run()
        seconds = time.perf_counter() - start
        rate = sum(len(h.token_ids) for h in handles) / seconds
        base = base or rate
        print(f"batch {b:3d}, BatchedEngine over NativeSlots, plain: {rate:8.1f} tokens/s aggregate "
              f"({rate / base:.2f}x batch {args.batches[0]})")


def prefilled(slots: NativeSlots, b: int, context: int) -> list[int]:
    """Slots 0..b-1 holding `context` random tokens each (prefilled eagerly, a prompt at a time)."""
    seqs = list(range(b))
    for s in seqs:
        slots.rollback(s, 0)
        slots.forward_ragged([s], [torch.randint(0, slots.vocab_size, (context,), device=slots.device)],
                             logits=[False])
    return seqs


def step_costs(slots: NativeSlots, row_counts: list[tuple[int, int]], context: int = 384) -> dict[tuple[int, int], float]:
    """Median GPU time (ms) of one forward_ragged of b sequences of n new tokens each after
    `context` cached ones (graph replay included, host plan included): the ragged verify-cost curve."""
    device, out = slots.device, {}
    for b, n in row_counts:
        seqs = prefilled(slots, b, context)
        step = [torch.randint(0, slots.vocab_size, (n,), device=device) for _ in seqs]
        times = []
        for _ in range(12):
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            slots.forward_ragged(seqs, step)
            torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
            for s in seqs:
                slots.rollback(s, context)
        out[b, n] = statistics.median(times[2:]) * 1e3
        for s in seqs:
            slots.release(s)
        print(f"ragged pass: {b:3d} sequences x {n} tokens ({b * n:4d} rows) after {context}: {out[b, n]:.3f} ms")
    return out


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a round emits with k drafts each accepted with probability alpha (and the bonus)."""
    return k + 1 if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def speculation(slots: NativeSlots, reference: NativeLlama, costs: dict, args) -> list[dict]:
    """Aggregate tokens/s of plain decoding and of oracle speculation (alpha 0.6/0.8/0.9, K drafts,
    no draft cost) at each batch size, beside the formula: E[tokens](alpha, K) x t(B) / t(B (K + 1))."""
    from specdec.drafters.oracle import OracleDrafter, record_greedy

    device, rng, rows = slots.device, random.Random(2), []
    config = GenerationConfig(max_new_tokens=args.tokens, k=args.k, ignore_eos=True)
    for b in args.batches:
        prompts = [[rng.randrange(slots.vocab_size) for _ in range(32)] for _ in range(b)]
        truth = [record_greedy(reference, p, args.tokens + args.k + 2) for p in prompts]
        plain_rate = None
        for alpha in (None, 0.6, 0.8, 0.9):
            def make(i, alpha=alpha):
                if alpha is None:
                    return NoDrafter(device)
                oracle = OracleDrafter(reference, alpha, seed=i)
                oracle.remember(prompts[i], truth[i])
                return oracle
            engine = BatchedEngine(slots, lambda: NoDrafter(device))
            handles = [engine.submit(p, config, drafter=make(i)) for i, p in enumerate(prompts)]
            engine.step()  # the prefills
            torch.cuda.synchronize(device)
            start = time.perf_counter()
            engine.run()
            rate = sum(len(h.token_ids) for h in handles) / (time.perf_counter() - start)
            plain_rate = plain_rate or rate
            predicted = None if alpha is None else \
                expected_tokens(alpha, args.k) * costs[b, 1] / costs[b, args.k + 1]
            rows.append(dict(batch=b, alpha=alpha, k=args.k, tokens_per_s=rate, speedup=rate / plain_rate,
                             predicted=predicted))
            print(f"batch {b:3d} " + ("plain          " if alpha is None else f"oracle a={alpha} K={args.k}")
                  + f": {rate:8.1f} tokens/s aggregate, {rate / plain_rate:.2f}x plain"
                  + ("" if predicted is None else f" (formula {predicted:.2f}x)"))
    return rows


def slots_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="gpu_batching.py slots")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", default="llama-3.1-8b")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers for a quick run")
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--batches", default="1,4,16,64")
    parser.add_argument("--k", type=int, default=4, help="drafts per round of the oracle runs")
    parser.add_argument("--json", default=None, help="write the step costs and speedups here")
    args = parser.parse_args(argv)
    args.batches = [int(b) for b in args.batches.split(",")]
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    overrides = {"n_layers": args.layers} if args.layers else None
    slots = NativeSlots.random(args.size, max(args.batches + [args.sequences]), device=args.device, dtype=dtype,
                               max_length=MAX_LENGTH, arch_overrides=overrides)
    print(f"{slots.name} in {dtype}: KV cache of {slots.max_slots} slots x {MAX_LENGTH} tokens = "
          f"{slots.kv_cache_bytes / 2**30:.2f} GiB")
    eager = NativeLlama.random(args.size, device=args.device, dtype=dtype, max_length=MAX_LENGTH,
                               arch_overrides=overrides, cuda_graphs=False)
    references = {"eager": eager}
    if args.device == "cuda":  # the same weights and cache, in today's graphed steps
        references["graphed"] = NativeLlama(eager.net, eager.name, MAX_LENGTH)
    identity(slots, references, args)
    throughput(slots, references, args)
    if args.device == "cuda":
        costs = step_costs(slots, [(b, n) for b in args.batches for n in (1, args.k + 1)])
        rows = speculation(slots, references["graphed"], costs, args)
        if args.json:
            import json

            with open(args.json, "w") as f:
                json.dump({"model": slots.name, "step_ms": {f"{b}x{n}": ms for (b, n), ms in costs.items()},
                           "runs": rows}, f, indent=1)


def plot_main(argv: list[str]) -> None:
    """The speedup of oracle speculation over plain decoding against the batch size, measured and by
    the formula, from a `slots --json` file: python benchmarks/gpu_batching.py plot IN.json OUT.png"""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    source, target = argv
    runs = [r for r in json.load(open(source))["runs"] if r["alpha"] is not None]
    fig, ax = plt.subplots(figsize=(6, 4))
    for alpha in sorted({r["alpha"] for r in runs}):
        mine = [r for r in runs if r["alpha"] == alpha]
        line, = ax.plot([r["batch"] for r in mine], [r["speedup"] for r in mine], marker="o",
                        label=f"alpha {alpha} measured")
        ax.plot([r["batch"] for r in mine], [r["predicted"] for r in mine], linestyle="--", color=line.get_color(),
                label=f"alpha {alpha} formula")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set(xscale="log", xlabel="sequences in the batch", ylabel="speculation / plain (aggregate tokens/s)",
           title=f"Oracle speculation (K {runs[0]['k']}) against batch size, H200, 8B bf16")
    ax.set_xticks(sorted({r["batch"] for r in runs}), labels=[str(b) for b in sorted({r["batch"] for r in runs})])
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(target, dpi=120)
    print(f"wrote {target}")


def main() -> None:
    checks = {"rule": rule_main, "slots": slots_main, "plot": plot_main}
    if len(sys.argv) < 2 or sys.argv[1] not in checks:
        raise SystemExit(f"usage: python benchmarks/gpu_batching.py {{{'|'.join(checks)}}} [options]")
    checks[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()
