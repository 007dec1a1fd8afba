"""The ragged rule (verify.ragged_outcome) on the GPU at the real vocabulary: exact per sequence, no
host synchronisation inside, and what one call costs the host and the GPU.

    python benchmarks/gpu_ragged_rule.py [--device cuda] [--vocab 128256]

For batches of 1, 4, 16 and 64 sequences (K_i from 0 to 8; greedy, one-hot and sampled drafts; varied
SamplingParams) it checks that every sequence settles exactly as greedy_outcome / sampled_outcome
alone with a clone of its generator, and that the generators end in the same state; counts the
synchronising calls inside ragged_outcome (torch.cuda.set_sync_debug_mode("warn")); and prints the
median host time of one call and its GPU time (CUDA events).
"""

import argparse
import statistics
import time
import warnings
from itertools import accumulate

import torch

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--vocab", type=int, default=128256)
    args = parser.parse_args()
    device = torch.device(args.device)
    g = torch.Generator().manual_seed(0)
    for b in (1, 4, 16, 64):
        batch = make_batch(b, args.vocab, device, g)
        line = f"B={b:3d} T={batch['p'].shape[0]:4d} exact per sequence: {exact(batch, device)}"
        if device.type == "cuda":
            host_ms, gpu_ms = timing(batch, device)
            line += f"  syncs inside: {syncs(batch, device)}  host {host_ms:.2f} ms  GPU {gpu_ms:.2f} ms per call"
        print(line, flush=True)


if __name__ == "__main__":
    main()
