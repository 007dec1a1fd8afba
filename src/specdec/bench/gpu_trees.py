"""`specdec bench gpu --trees`: what draft trees buy on the GPU, with the oracle tree drafter.

Random-weight Llama-3.1-8B-shape target and Llama-3.2-1B-shape draft in bf16 (bench/gpu.py's models);
the target runs as a one-slot NativeSlots (the fused ragged path, CUDA graphs), chains, trees and plain
decoding alike.
Three measurements, printed as a short table and saved as gpu-trees.json:
- the verify cost of a tree pass of 16 / 32 / 64 nodes (speedup.best_tree's shape for the profile)
  against a chain pass of the same rows and a one-row step, and whether every tree row's logits equal,
  bit for bit, those of decoding its path one token at a time;
- end to end at batch 1, greedy: the oracle tree drafter (per-rank profile PROFILE, the 1B draft's
  passes paid per depth) at several node budgets against the oracle chain drafter at alpha =
  PROFILE[0] over K, both through the same engine, with the speedup the profile and the measured
  costs predict: tau / (verify cost of the rows + depth * c);
- greedy identity: every oracle run's tokens against plain decoding's.
Oracle numbers measure the engine at a chosen acceptance profile, not any draft: labelled as such.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

PROFILE = (0.7, 0.1, 0.05, 0.03)  # the truth at sibling rank i: EAGLE-2-like per-rank acceptance
TREE_NODES = (16, 32, 64)
BUDGETS = (8, 16, 32, 64)
CHAIN_KS = (3, 4, 5, 6, 8)


def pass_ms(slots, prompt, rows: int, tree: tuple[int, ...] | None, reps: int) -> float:
    """Device time of one pass of `rows` new tokens (a tree of those rows, or causal) after the
    prompt in slot 0 (rolled back each time)."""
    import torch

    from specdec.bench.gpu import cuda_median_ms

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

    out = {}
    for n in TREE_NODES:
        plan = best_tree(PROFILE, n)
        rows = (-1,) + tuple(p + 1 for p in plan.parents)
        tree_ms, chain_ms = pass_ms(slots, prompt, n + 1, rows, reps), pass_ms(slots, prompt, n + 1, None, reps)
        out[n] = {"tree_ms": tree_ms, "chain_ms": chain_ms, "tree_ratio": tree_ms / one_row_ms,
                  "chain_ratio": chain_ms / one_row_ms, "expected_tau": plan.expected_tokens,
                  "exactness": tree_rows_match_paths(slots, prompt, rows)}
    return out


def section_tree_oracle(target, slots, draft, prompts, c: float, one_row_ms: float, reps: int,
                        new_tokens: int) -> dict:
    """Oracle trees over node budgets against oracle chains over K, batch 1, greedy, one run, all
    through the batched engine over the one-slot model (the oracles record on the target)."""
    from specdec.drafters.none import NoDrafter
    from specdec.drafters.oracle import OracleDrafter
    from specdec.drafters.oracle_tree import OracleTreeDrafter
    from specdec.speedup import best_tree, expected_speedup
    from specdec.trees import node_depths

    plain, truth = slot_engine_run(slots, NoDrafter(target.device), prompts, new_tokens, 1)
    chains, trees, same = {}, {}, []
    for k in CHAIN_KS:
        oracle = OracleDrafter(target, PROFILE[0], draft, horizon=new_tokens, seed=7)
        for p, ids in zip(prompts, truth):
            oracle.remember(p.tolist(), ids)
        res, ids = slot_engine_run(slots, oracle, prompts, new_tokens, k)
        res["predicted"] = expected_speedup(PROFILE[0], k, c)
        chains[k], same = res, same + [a == b for a, b in zip(ids, truth)]
    for n in BUDGETS:
        oracle = OracleTreeDrafter(target, PROFILE, draft, horizon=new_tokens, seed=7)
        for p, ids in zip(prompts, truth):
            oracle.remember(p.tolist(), ids)
        plan = best_tree(PROFILE, n)
        rows = (-1,) + tuple(p + 1 for p in plan.parents)
        verify_ratio = pass_ms(slots, prompts[0], n + 1, rows, reps) / one_row_ms
        res, ids = slot_engine_run(slots, oracle, prompts, new_tokens, n)
        res["predicted"] = plan.expected_tokens / (verify_ratio + max(node_depths(plan.parents)) * c)
        res["expected_tau"], res["verify_ratio"] = plan.expected_tokens, verify_ratio
        trees[n], same = res, same + [a == b for a, b in zip(ids, truth)]
    again, _ = slot_engine_run(slots, NoDrafter(target.device), prompts, new_tokens, 1)
    base = statistics.mean([plain["tokens_per_s"], again["tokens_per_s"]])
    for res in list(chains.values()) + list(trees.values()):
        res["speedup"] = res["tokens_per_s"] / base
        res["measured_over_predicted"] = res["speedup"] / res["predicted"]
    best_chain = max(chains, key=lambda k: chains[k]["speedup"])
    best_tree_n = max(trees, key=lambda n: trees[n]["speedup"])
    return {"label": "oracle drafters (engine measurement at a chosen acceptance profile, not a model pair)",
            "profile": PROFILE, "plain_tokens_per_s": base, "chains": chains, "trees": trees,
            "best_chain_k": best_chain, "best_tree_nodes": best_tree_n,
            "tree_over_best_chain": trees[best_tree_n]["speedup"] / chains[best_chain]["speedup"],
            "greedy_identity": sum(same) / len(same)}


def run_trees(args) -> int:
    import torch

    from specdec.bench.gpu import build_models, random_prompts, step_ms
    from specdec.models.native_slots import NativeSlots, SlotOptions

    if not torch.cuda.is_available():
        print("no CUDA device: `specdec bench gpu --trees` measures the GPU")
        return 2
    start = time.perf_counter()
    res = {"card": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "target": "random-weight Llama-3.1-8B shape, bf16", "draft": "random-weight Llama-3.2-1B shape, bf16"}
    new_tokens = 16 if args.smoke else args.new_tokens
    _, target, draft = build_models(args.smoke, max_length=args.context + new_tokens + 256)
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
    prompts = random_prompts(1 if args.smoke else 3, args.context, target.vocab_size, seed=1)
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
        lines.append(f"  chain K={k:<2}   {r['speedup']:.2f}x (predicted {r['predicted']:.2f}x), tau {r['tau']:.2f}")
    for n, r in o["trees"].items():
        lines.append(f"  tree {n:>2} nodes {r['speedup']:.2f}x (predicted {r['predicted']:.2f}x, "
                     f"{r['measured_over_predicted']:.2f} of it), tau {r['tau']:.2f} (expected {r['expected_tau']:.2f})")
    lines.append(f"best tree ({o['best_tree_nodes']} nodes) / best chain (K={o['best_chain_k']}): "
                 f"{o['tree_over_best_chain']:.3f}; greedy identity {o['greedy_identity']:.0%}")
    print("\n".join(["", "=" * 100] + lines + ["=" * 100]), flush=True)
