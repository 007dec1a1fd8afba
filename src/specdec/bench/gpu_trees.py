"""`specdec bench gpu --trees`: what draft trees buy on the GPU, with the oracle tree drafter.

Random-weight Llama-3.1-8B-shape target and Llama-3.2-1B-shape draft in bf16 (bench/gpu.py's models);
the target runs as a one-slot NativeSlots (the fused ragged path, CUDA graphs), chains, trees and plain
decoding alike.
Three measurements, printed as a short table and saved as gpu-trees.json:
- the verify cost of a tree pass of 16 / 32 / 64 nodes (speedup.best_tree's shape for the profile)
  against a chain pass of the same rows and a one-row step, and whether every tree row's logits equal,
  bit for bit, those of decoding its path one token at a time;
- end to end at batch 1, greedy: the oracle tree drafter (per-rank profile PROFILE) at several node
  budgets and depths against the oracle chain drafter at alpha = PROFILE[0] over K, both through
  the same engine and paying a head's cost per draft pass (a one-layer model of the target's shape:
  an EAGLE head's decoder layer and LM head), with the speedup the profile and the measured costs
  predict: tau / (verify cost of the rows + draft passes * c), each configuration run once to warm
  up, then timed;
- greedy identity: every oracle run's tokens against plain decoding's.
Oracle numbers measure the engine at a chosen acceptance profile, not any draft: labelled as such.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

PROFILE = (0.6, 0.15, 0.08, 0.05, 0.03)  # the truth at sibling rank i: an EAGLE-2-like per-rank acceptance
TREE_NODES = (16, 32, 64)
SHAPES = ((16, 3), (16, 4), (32, 3), (32, 4), (32, 5), (48, 4), (64, 4))  # (node budget, max depth)
CHAIN_KS = (1, 2, 3, 4, 5, 6)


def pass_ms(slots, prompt, rows: int, tree: tuple[int, ...] | None, reps: int) -> float:
    """Device time of one pass of `rows` new tokens (a tree of those rows, or causal) after the
    prompt in slot 0 (rolled back each time)."""
    import torch

    from specdec.bench.gpu_timing import cuda_median_ms

    slots.release(0)
    slots.forward_ragged([0], [prompt], logits=[False])
    length = slots.cache_len(0)
    tokens = torch.randint(0, slots.vocab_size, (rows,), device=slots.device)

    def once():
        slots.rollback(0, length)
        slots.forward_ragged([0], [tokens], trees=[tree])

    ms = cuda_median_ms(once, reps)
    slots.release(0)
    return ms


def tree_rows_match_paths(slots, prompt, row_parents: tuple[int, ...]) -> dict:
    """Whether each tree row's logits equal decoding its path one token at a time, bit for bit."""
    import torch

    from specdec.trees import path_rows

    tokens = torch.randint(0, slots.vocab_size, (len(row_parents),), device=slots.device)
    slots.release(0)
    slots.forward_ragged([0], [prompt], logits=[False])
    start = slots.cache_len(0)
    together = slots.forward_ragged([0], [tokens], trees=[row_parents]).logits
    equal = 0
    for row in range(len(row_parents)):
        slots.rollback(0, start)
        steps = [slots.forward_ragged([0], [tokens[r:r + 1]]).logits for r in path_rows(row_parents, row)]
        equal += bool(torch.equal(steps[-1][0], together[row]))
    slots.release(0)
    return {"rows": len(row_parents), "rows_bitwise_equal": equal}


def slot_engine_run(slots, drafter, prompts, new_tokens: int, k: int):
    """Greedy generations one at a time through the batched engine over `slots`: (tokens/s over
    decode time, alpha, tau), and the token lists."""
    from specdec.engine import GenerationConfig
    from specdec.engine.batched import BatchConfig, BatchedEngine

    engine = BatchedEngine(slots, lambda: drafter, config=BatchConfig(prefill_chunk=slots.max_length))
    config = GenerationConfig(max_new_tokens=new_tokens, k=k, ignore_eos=True)
    results = [engine.submit(p.tolist(), config, drafter).result() for p in prompts]
    stats = [r.stats for r in results]
    decode = sum(s.decode_time for s in stats)
    drafted, accepted = sum(s.drafted for s in stats), sum(s.accepted for s in stats)
    return {"tokens_per_s": sum(s.generated for s in stats) / decode, "alpha": accepted / drafted if drafted else None,
            "tau": sum(s.generated for s in stats) / sum(s.rounds for s in stats)}, [list(r.token_ids) for r in results]


def section_tree_verify(slots, prompt, one_row_ms: float, reps: int) -> dict:
    from specdec.speedup import best_tree
    from specdec.trees import rows_of

    out = {}
    for n in TREE_NODES:
        plan = best_tree(PROFILE, n)
        rows = rows_of(plan.parents)
        tree_ms, chain_ms = pass_ms(slots, prompt, n + 1, rows, reps), pass_ms(slots, prompt, n + 1, None, reps)
        out[n] = {"tree_ms": tree_ms, "chain_ms": chain_ms, "tree_ratio": tree_ms / one_row_ms,
                  "chain_ratio": chain_ms / one_row_ms, "expected_tau": plan.expected_tokens,
                  "exactness": tree_rows_match_paths(slots, prompt, rows)}
    return out


def section_tree_oracle(target, slots, draft, prompts, c: float, one_row_ms: float, reps: int,
                        new_tokens: int) -> dict:
    """Oracle trees over (node budget, depth) against oracle chains over K, batch 1, greedy, one run,
    all through the batched engine over the one-slot model."""
    from specdec.drafters.none import NoDrafter
    from specdec.drafters.oracle import OracleDrafter
    from specdec.drafters.oracle_tree import OracleTreeDrafter
    from specdec.speedup import best_tree, expected_tokens_per_round
    from specdec.trees import node_depths, rows_of

    plain, truth = slot_engine_run(slots, NoDrafter(target.device), prompts, new_tokens, 1)
    chains, trees, same = {}, {}, []

    def timed(drafter, k):  # a warm-up run (graphs of new sizes are captured there), then the timed one
        for p, ids in zip(prompts, truth):
            drafter.remember(p.tolist(), ids)
        slot_engine_run(slots, drafter, prompts[:1], 16, k)
        res, ids = slot_engine_run(slots, drafter, prompts, new_tokens, k)
        same.extend(a == b for a, b in zip(ids, truth))
        return res

    for k in CHAIN_KS:
        chains[k] = timed(OracleDrafter(target, PROFILE[0], draft, horizon=new_tokens, seed=7), k)
        verify = pass_ms(slots, prompts[0], k + 1, None, reps) / one_row_ms
        chains[k]["predicted"] = expected_tokens_per_round(PROFILE[0], k) / (verify + k * c)
    for n, depth in SHAPES:
        res = timed(OracleTreeDrafter(target, PROFILE, draft, max_depth=depth, horizon=new_tokens, seed=7), n)
        plan = best_tree(PROFILE, n, depth)
        rows = rows_of(plan.parents)
        verify = pass_ms(slots, prompts[0], n + 1, rows, reps) / one_row_ms
        res["predicted"] = plan.expected_tokens / (verify + max(node_depths(plan.parents)) * c)
        res["expected_tau"], res["verify_ratio"] = plan.expected_tokens, verify
        trees[f"{n}x{depth}"] = res
    again, _ = slot_engine_run(slots, NoDrafter(target.device), prompts, new_tokens, 1)
    base = statistics.mean([plain["tokens_per_s"], again["tokens_per_s"]])
    for res in list(chains.values()) + list(trees.values()):
        res["speedup"] = res["tokens_per_s"] / base
        res["measured_over_predicted"] = res["speedup"] / res["predicted"]
    best_chain = max(chains, key=lambda k: chains[k]["speedup"])
    best_tree_shape = max(trees, key=lambda n: trees[n]["speedup"])
    predicted_chain = max(r["predicted"] for r in chains.values())
    predicted_tree = max(r["predicted"] for r in trees.values())
    return {"label": "oracle drafters (engine measurement at a chosen acceptance profile, not a model pair)",
            "profile": PROFILE, "plain_tokens_per_s": base, "chains": chains, "trees": trees,
            "best_chain_k": best_chain, "best_tree": best_tree_shape,
            "tree_over_best_chain": trees[best_tree_shape]["speedup"] / chains[best_chain]["speedup"],
            "predicted_tree_over_best_chain": predicted_tree / predicted_chain,
            "greedy_identity": sum(same) / len(same)}


def run_trees(args) -> int:
    import torch

    from specdec.bench.gpu_timing import build_models, random_prompts, step_ms
    from specdec.models.native_llama import NativeLlama
    from specdec.models.native_slots import NativeSlots, SlotOptions

    if not torch.cuda.is_available():
        print("no CUDA device: `specdec bench gpu --trees` measures the GPU")
        return 2
    start = time.perf_counter()
    res = {"card": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "target": "random-weight Llama-3.1-8B shape, bf16",
           "draft": "a head's cost: one random Llama-3.1-8B-shape decoder layer and its LM head, bf16"}
    new_tokens = 16 if args.smoke else args.new_tokens
    _, target, _ = build_models(args.smoke, max_length=args.context + new_tokens + 256)
    # What a draft head costs a pass: one decoder layer of the target's shape and its LM head.
    draft = NativeLlama.random("llama-3.1-8b", max_length=args.context + new_tokens + 256,
                               arch_overrides={"n_layers": 1}, seed=1)
    # The fused ragged path, where trees run, with graphs for the row counts these runs use only.
    rows = (1, 2, 4, 8, 12, 16, 24, 32, 48, 65)
    slots = NativeSlots.sharing(target, 1, options=SlotOptions(True, True, rows, max(rows)))
    slots.warm_up()
    reps = 5 if args.smoke else 20
    prompt = random_prompts(1, args.context, target.vocab_size, seed=0)[0]
    one_row = pass_ms(slots, prompt, 1, None, reps)
    c = step_ms(draft, prompt, 1, reps) / one_row
    res.update(one_row_ms=one_row, c=c, target_plain_step_ms=step_ms(target, prompt, 1, reps))
    res["verify"] = section_tree_verify(slots, prompt, one_row, reps)
    prompts = random_prompts(1 if args.smoke else args.num_prompts, args.context, target.vocab_size, seed=1)
    res["oracle"] = section_tree_oracle(target, slots, draft, prompts, c, one_row, reps, new_tokens)
    res["elapsed_s"] = time.perf_counter() - start
    path = Path(args.out_dir) / ("gpu-trees-smoke.json" if args.smoke else "gpu-trees.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1, default=str))
    print_trees(res)
    print(f"saved {path}")
    return 0


def print_trees(res: dict) -> None:
    v, o = res["verify"], res["oracle"]
    lines = [f"card: {res['card']}  {res['date']}  one-row step {res['one_row_ms']:.3f} ms, c = {res['c']:.3f}"]
    for n, r in v.items():
        e = r["exactness"]
        lines.append(f"verify {n:>2} nodes: tree {r['tree_ratio']:.3f} / chain {r['chain_ratio']:.3f} of a one-row step; "
                     f"rows bitwise = their paths: {e['rows_bitwise_equal']} of {e['rows']}")
    lines.append(f"oracle profile {o['profile']}, batch 1, greedy; plain {o['plain_tokens_per_s']:.1f} tok/s")
    for k, r in o["chains"].items():
        lines.append(f"  chain K={k:<2}   {r['speedup']:.2f}x (predicted {r['predicted']:.2f}x, "
                     f"{r['measured_over_predicted']:.2f} of it), tau {r['tau']:.2f}")
    for n, r in o["trees"].items():
        lines.append(f"  tree {n:>5} (nodes x depth) {r['speedup']:.2f}x (predicted {r['predicted']:.2f}x, "
                     f"{r['measured_over_predicted']:.2f} of it), tau {r['tau']:.2f} (expected {r['expected_tau']:.2f})")
    lines.append(f"best tree ({o['best_tree']}) / best chain (K={o['best_chain_k']}): {o['tree_over_best_chain']:.3f} "
                 f"(predicted {o['predicted_tree_over_best_chain']:.3f}); greedy identity {o['greedy_identity']:.0%}")
    print("\n".join(["", "=" * 100] + lines + ["=" * 100]), flush=True)
