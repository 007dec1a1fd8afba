"""The batch table: aggregate tokens/s of the batched engine at several batch sizes, plain and drafting.

Device-agnostic: give it a SlotModel (NativeSlots on the CPU, the Triton path on CUDA), prompts, and
drafter factories; `sync` waits for the device (torch.cuda.synchronize on CUDA). For the oracle at
each alpha the prediction is the formula's, tau / (K c + verify_ratio), with verify_ratio measured
at that batch size (a verify of B x (K + 1) rows over a plain step of B rows), so the table shows
where speculation stops paying as the batch grows. `specdec bench gpu --cpu --batch 1,4,16` runs it
on the embedded default model.
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

ALPHAS = (0.6, 0.8, 0.9)


@dataclass(frozen=True)
class BatchPoint:
    """One cell: `drafter` at `batch` sequences at once, K drafts a round."""

    drafter: str
    batch: int
    k: int
    tokens_per_s: float  # aggregate: every sequence's generated tokens over the wall time of the run
    alpha: float | None
    speedup: float | None = None  # over plain decoding at the same batch size
    predicted: float | None = None  # the formula's speedup (oracle rows)


def run_batch(engine, prompts: Sequence[list[int]], batch: int, config, factory, sync=lambda: None):
    """`batch` sequences (prompts cycled) submitted at once and run to the end: (aggregate tokens/s,
    acceptance rate or None, every sequence's tokens)."""
    sync()
    start = time.perf_counter()
    handles = [engine.submit(prompts[i % len(prompts)], config, drafter=factory()) for i in range(batch)]
    engine.run()
    sync()
    seconds = time.perf_counter() - start
    results = [h.result() for h in handles]
    drafted = sum(r.stats.drafted for r in results)
    alpha = sum(r.stats.accepted for r in results) / drafted if drafted else None
    return sum(len(r.token_ids) for r in results) / seconds, alpha, [list(r.token_ids) for r in results]


def verify_ratio(slots, batch: int, k: int, sync=lambda: None, context: int = 32, reps: int = 3) -> float:
    """Time of one forward of batch x (k + 1) rows over one of batch x 1 rows (slots hold `context` tokens)."""
    import torch

    ids = [torch.full((context,), 7, dtype=torch.long, device=slots.device) for _ in range(batch)]
    slots.forward_ragged(list(range(batch)), ids, logits=[False] * batch)

    def timed(rows: int) -> float:
        tokens = [torch.full((rows,), 11, dtype=torch.long, device=slots.device) for _ in range(batch)]
        times = []
        for _ in range(reps):
            sync()
            start = time.perf_counter()
            slots.forward_ragged(list(range(batch)), tokens)
            sync()
            times.append(time.perf_counter() - start)
            for s in range(batch):
                slots.rollback(s, context)
        return statistics.median(times)

    ratio = timed(k + 1) / timed(1)
    for s in range(batch):
        slots.release(s)
    return ratio


def batch_table(engine, prompts: Sequence[list[int]], batch_sizes: Sequence[int], new_tokens: int,
                drafters: dict[str, tuple[Callable, int]], oracle: Callable[[float], object] | None = None,
                oracle_k: int = 4, c: float = 0.0, sync=lambda: None) -> list[BatchPoint]:
    """At each batch size: plain decoding, each of `drafters` (label -> (factory, K)), and with
    oracle (alpha -> an OracleDrafter prototype, forked per sequence) the oracle at ALPHAS with K
    oracle_k against the formula at draft cost c. Greedy, ignore_eos, new_tokens each."""
    from specdec.drafters.none import NoDrafter
    from specdec.generation import GenerationConfig
    from specdec.speedup import expected_speedup

    points = []
    for batch in batch_sizes:
        config = GenerationConfig(max_new_tokens=new_tokens, k=1, ignore_eos=True)
        plain, _, outputs = run_batch(engine, prompts, batch, config, lambda: NoDrafter(engine.target.device), sync)
        points.append(BatchPoint("plain", batch, 0, plain, None, 1.0))
        for label, (factory, k) in drafters.items():
            tps, alpha, _ = run_batch(engine, prompts, batch, GenerationConfig(max_new_tokens=new_tokens, k=k, ignore_eos=True),
                                      factory, sync)
            points.append(BatchPoint(label, batch, k, tps, alpha, tps / plain))
        if oracle is None:
            continue
        ratio = verify_ratio(engine.target, batch, oracle_k, sync)
        for alpha in ALPHAS:
            prototype = oracle(alpha)
            for i in range(min(batch, len(prompts))):
                prototype.remember(prompts[i], outputs[i])
            tps, measured, _ = run_batch(engine, prompts, batch, GenerationConfig(max_new_tokens=new_tokens,
                                                                                  k=oracle_k, ignore_eos=True),
                                         _seeded_forks(prototype), sync)
            points.append(BatchPoint(f"oracle {alpha}", batch, oracle_k, tps, measured, tps / plain,
                                     expected_speedup(alpha, oracle_k, c, ratio)))
    return points


def _seeded_forks(prototype) -> Callable:
    """Forks of an oracle, the i-th corrupting with seed i: sequences of one prompt get their own
    draws (so the measured alpha averages over them), the same whatever their companions."""
    seeds = itertools.count()

    def fork():
        twin = prototype.fork()
        twin.generator.manual_seed(next(seeds))
        return twin

    return fork


def print_batch_table(points: list[BatchPoint]) -> None:
    print(f"{'drafter':<14}{'batch':>6}{'K':>4}{'tok/s':>10}{'alpha':>8}{'speedup':>9}{'formula':>9}")
    for p in points:
        alpha = "" if p.alpha is None else f"{p.alpha:.2f}"
        speedup = "" if p.speedup is None else f"{p.speedup:.2f}x"
        predicted = "" if p.predicted is None else f"{p.predicted:.2f}x"
        print(f"{p.drafter:<14}{p.batch:>6}{p.k:>4}{p.tokens_per_s:>10.1f}{alpha:>8}{speedup:>9}{predicted:>9}")


def plot_speedup(points: list[BatchPoint], path: Path, title: str) -> Path:
    """Speedup over plain decoding against batch size, one line a drafter (dashed: the formula)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label in dict.fromkeys(p.drafter for p in points if p.drafter != "plain"):
        rows = [p for p in points if p.drafter == label]
        line, = ax.plot([p.batch for p in rows], [p.speedup for p in rows], marker="o", label=label)
        if rows[0].predicted is not None:
            ax.plot([p.batch for p in rows], [p.predicted for p in rows], ls="--", color=line.get_color())
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="sequences in the batch", ylabel="speedup over plain decoding at that batch")
    ax.set_title(title, fontsize=8)
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def as_json(points: list[BatchPoint]) -> list[dict]:
    return [asdict(p) for p in points]


# -- `specdec bench gpu --cpu --batch 1,4,16` ---------------------------------------------------------
CPU_PROMPTS = ("Write a short story about a lighthouse keeper who finds a message in a bottle.",
               "Explain how a rainbow forms, step by step.",
               "List five uses of a paperclip and say why each works.",
               "Summarize the water cycle for a ten-year-old.")


def parse_batch_sizes(text: str) -> list[int]:
    from specdec.errors import InvalidRequestError

    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise InvalidRequestError(f"--batch takes comma-separated sizes of at least 1, e.g. 1,4,16; not {text!r}")
    return sizes


def batch_one(runtime, prompt: list[int], new_tokens: int) -> dict:
    """Plain greedy decoding of one prompt at batch 1 (wall time, prefill included): engine.Engine (the
    same loop over a slot model of one slot) against the table's BatchedEngine of max(batch) slots."""
    from specdec.drafters.none import NoDrafter
    from specdec.engine import Engine, GenerationConfig

    config = GenerationConfig(max_new_tokens=new_tokens, k=1, ignore_eos=True)
    engine = Engine(runtime.target.model, NoDrafter(runtime.target.model.device))
    engine.generate(prompt, GenerationConfig(max_new_tokens=2, ignore_eos=True))  # warm
    start = time.perf_counter()
    alone = engine.generate(prompt, config).token_ids
    engine_tps = len(alone) / (time.perf_counter() - start)
    batched_tps, _, outputs = run_batch(runtime.engine, [prompt], 1, config, lambda: NoDrafter(engine.target.device))
    return {"engine_tokens_per_s": engine_tps, "batched_tokens_per_s": batched_tps, "same_tokens": outputs[0] == alone}


def run_cpu_batch(args) -> int:
    import json

    import torch

    from specdec.bench.scoreboard import machine_name
    from specdec.drafters.oracle import OracleDrafter
    from specdec.runtime import build_batched_runtime, encode_prompt

    sizes = parse_batch_sizes(args.batch)
    runtime = build_batched_runtime("default", draft="none", device="cpu", threads=args.threads or None,
                                    max_num_seqs=max(sizes), max_length=1024)
    prompts = [encode_prompt(runtime.target.tokenizer, text) for text in CPU_PROMPTS]
    n = args.new_tokens
    one = batch_one(runtime, prompts[0], n)
    print(f"batch 1, plain, {n} tokens: engine.Engine {one['engine_tokens_per_s']:.1f} tok/s, BatchedEngine "
          f"{one['batched_tokens_per_s']:.1f} tok/s, same tokens: {one['same_tokens']}")
    oracle = lambda alpha: OracleDrafter(runtime.target.model, alpha, horizon=n, seed=7)  # noqa: E731
    points = batch_table(runtime.engine, prompts, sizes, n, {"auto": (runtime.drafters.factory("auto"), 4)},
                         oracle, oracle_k=4, c=0.0)
    title = f"{runtime.target.name} on {machine_name()}, {torch.get_num_threads()} threads"
    print(f"{title}, {n} new tokens a sequence, greedy, aggregate tokens/s (oracle: no draft cost, c = 0):")
    print_batch_table(points)
    out = Path(args.out_dir)
    plot = plot_speedup(points, out / "batch-cpu.png", title)
    out.joinpath("batch-cpu.json").write_text(json.dumps(
        {"machine": machine_name(), "threads": torch.get_num_threads(), "new_tokens": n, "kv_cache":
         runtime.kv_cache_line(), "batch_one": one, "points": as_json(points),
         "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, indent=1))
    print(f"saved {out / 'batch-cpu.json'} and {plot}")
    return 0


def step_seconds(slots, sync, rows: int = 1, context: int = 32, reps: int = 8) -> float:
    """Median time of one pass of one sequence of `rows` new tokens after `context` cached ones."""
    import torch

    slots.forward_ragged([0], [torch.full((context,), 7, dtype=torch.long, device=slots.device)], logits=[False])
    times = []
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        slots.forward_ragged([0], [torch.full((rows,), 11, dtype=torch.long, device=slots.device)])
        sync()
        times.append(time.perf_counter() - start)
        slots.rollback(0, context)
    slots.release(0)
    return statistics.median(times[2:])


def run_gpu_batch(args) -> int:
    """`specdec bench gpu --batch 1,4,16,64`: the random Llama-3.1-8B target on the fused ragged
    path (NativeSlots, bf16, CUDA graphs), plain decoding and the oracle at ALPHAS, its draft cost
    paid by a random Llama-3.2-1B drafting for every sequence at once (DraftSlots), c measured here."""
    import json

    import torch

    from specdec.engine.batched import BatchedEngine
    from specdec.drafters.model import DraftSlots
    from specdec.drafters.none import NoDrafter
    from specdec.drafters.oracle import OracleDrafter
    from specdec.models.native_slots import NativeSlots

    sizes = parse_batch_sizes(args.batch)
    n, most = args.new_tokens, max(sizes)
    overrides = {"n_layers": 2} if args.smoke else None
    target = NativeSlots.random("llama-3.1-8b", most, max_length=1024, arch_overrides=overrides)
    draft = NativeSlots.random("llama-3.2-1b", most, max_length=1024, arch_overrides=overrides)
    for model in (target, draft):  # every graph before any timing (a capture costs about a second)
        model.capture(*model.options.graph_rows)
    sync = torch.cuda.synchronize
    c = step_seconds(draft, sync) / step_seconds(target, sync)
    print(f"{target.name} on the fused ragged path: KV cache {target.kv_cache_bytes / 2**30:.2f} GiB for {most} "
          f"sequences x 1024; draft {draft.name}, c = {c:.3f}")
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, target.vocab_size, (32,), generator=gen).tolist() for _ in range(most)]
    engine = BatchedEngine(target, lambda: NoDrafter(target.device))
    oracle = lambda alpha: OracleDrafter(target, alpha, horizon=n + 8, seed=7, draft_slots=DraftSlots(draft))  # noqa: E731
    points = batch_table(engine, prompts, sizes, n, {}, oracle, oracle_k=4, c=c, sync=sync)
    title = f"{target.name}, bf16, {torch.cuda.get_device_name()}"
    print(f"{title}, {n} new tokens a sequence, greedy, aggregate tokens/s (oracle K 4, draft cost c = {c:.3f}):")
    print_batch_table(points)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    out.joinpath("batch-gpu.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name(), "new_tokens": n, "c": c, "points": as_json(points),
         "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}, indent=1))
    print(f"saved {out / 'batch-gpu.json'} and {plot_speedup(points, out / 'batch-gpu.png', title)}")
    return 0
