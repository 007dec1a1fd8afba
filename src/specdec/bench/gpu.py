"""`specdec bench gpu`: the fast path at real sizes, in one run (about 5-8 minutes on an H200).

Random-weight Llama-3.1-8B-shape target and Llama-3.2-1B-shape draft in bf16 (timings are honest,
acceptance is not: the speedups use the oracle drafter, labelled as such). Measures the copy
bandwidth ceiling, plain decode against it, the verify-cost curve, c, oracle speedups against the
formula, transformers generate() on the same weights, bf16 logits native vs transformers, and the
greedy identity rate of speculative vs plain decoding. `--cpu`: the embedded default through the
native path against transformers generate() on this machine's CPU.

Prints a short table last; saves everything as JSON (gpu-h200.json or gpu-cpu.json) in --out-dir.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

from specdec.commands import add_tensor_parallel_flag
from specdec.bench.gpu_timing import (
    build_models,
    bytes_per_token,
    copy_bandwidth,
    decode_loop_ms,
    random_prompts,
    step_ms,
)
from specdec.errors import InvalidRequestError, UnsupportedHereError

SIZES = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 24, 32, 48, 64]
ALPHAS = [0.6, 0.8, 0.9]


def register(sub) -> None:
    p = sub.add_parser("gpu", help="fast path on CUDA at real sizes (or --cpu: native vs transformers on CPU)")
    add_flags(p)
    p.set_defaults(func=run)


def add_flags(p) -> None:
    p.add_argument("--cpu", action="store_true", help="CPU: embedded default, native vs transformers generate()")
    p.add_argument("--smoke", action="store_true", help="2-layer models and few repeats: shake out errors fast")
    p.add_argument("--out-dir", default=os.environ.get("OUT", "results"), help="where the JSON goes")
    p.add_argument("--context", type=int, default=512, help="prompt length for the decode timings")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens per generation in the engine runs")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for torch (0: the cores less the busy ones)")
    p.add_argument("--no-hf-compile", action="store_true", help="skip transformers' static cache + compile row")
    p.add_argument("--batch", default=None, help="batch sizes for the batched engine's table, e.g. 1,4,16,64 (with --cpu: the embedded model)")
    p.add_argument("--num-prompts", type=int, default=3,
                   help="prompts for the oracle engine runs of --trees (more narrow the oracle's luck)")
    p.add_argument("--trees", action="store_true",
                   help="draft trees only: tree verify cost and exactness, oracle trees against oracle chains "
                        "(bench/gpu_trees.py)")
    p.add_argument("--draft-megakernel", action="store_true",
                   help="the draft's single-token steps through the megakernel (Hopper; models/megakernel.py)")
    add_tensor_parallel_flag(p)


def run(args) -> int:
    check_tensor_parallel(args)
    if args.trees:
        from specdec.bench.gpu_trees import run_trees

        return run_trees(args)
    if args.batch:
        from specdec.bench.batch import run_cpu_batch, run_gpu_batch

        return run_cpu_batch(args) if args.cpu else run_gpu_batch(args)
    return run_cpu(args) if args.cpu else run_gpu(args)


def check_tensor_parallel(args) -> None:
    """Size 1 is the single-GPU bench; a larger size is validated, then refused: its timings (all-reduce
    time a step, % of the summed copy ceiling) await a multi-GPU machine to be written and checked on."""
    world = args.tensor_parallel_size
    if world == 1:
        return
    if args.cpu:
        raise InvalidRequestError("--cpu benches one process; drop --tensor-parallel-size")
    import torch

    from specdec.models.llama_config import named_arch
    from specdec.parallel.shard import check_divisible

    check_divisible(named_arch("llama-3.1-8b"), world)
    visible = torch.cuda.device_count()
    if visible < world:
        raise UnsupportedHereError(f"--tensor-parallel-size {world} needs {world} GPUs; {visible} are visible")
    raise UnsupportedHereError("bench gpu has no tensor-parallel timings yet (they await a multi-GPU machine); "
                               f"`specdec generate --tensor-parallel-size {world}` runs a sharded target")


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_flags(parser)
    return run(parser.parse_args(argv))


# -- timing helpers ------------------------------------------------------------------------------
def section_decode(target, draft, prompt, bandwidth_gbs: float, smoke: bool) -> dict:
    steps = 32 if smoke else 256
    loop = statistics.median(decode_loop_ms(target, prompt, steps) for _ in range(3))
    nbytes = bytes_per_token(target, len(prompt))
    achieved = nbytes / loop / 1e6
    draft_loop = statistics.median(decode_loop_ms(draft, prompt, steps) for _ in range(3))
    return {"context": len(prompt), "ms_per_token": loop, "tokens_per_s": 1000 / loop,
            "bytes_per_token": nbytes, "achieved_gbs": achieved, "fraction_of_ceiling": achieved / bandwidth_gbs,
            "draft_ms_per_token": draft_loop, "draft_bytes_per_token": bytes_per_token(draft, len(prompt))}


def row_invariance(model, prompt, rows: int = 9) -> dict:
    """Does a verify pass give each row bit-for-bit the logits of single-token steps?"""
    import torch

    model.rollback(0)
    model.prefill(prompt[:-rows])
    together = model.forward(prompt[-rows:])
    model.rollback(model.cache_len - rows)
    apart = torch.cat([model.forward(prompt[i:i + 1]) for i in range(len(prompt) - rows, len(prompt))])
    model.rollback(0)
    return {"bitwise_equal": bool(torch.equal(together, apart)),
            "rows_equal": int((together == apart).all(-1).sum()), "rows": rows,
            "max_abs_diff": float((together - apart).abs().max())}


def section_verify_curve(target, draft, prompt, smoke: bool) -> dict:
    reps = 5 if smoke else 20
    curve = {n: step_ms(target, prompt, n, reps) for n in SIZES}
    draft_step = step_ms(draft, prompt, 1, reps * 2)
    one = curve[1]
    return {"step_ms": curve, "ratio": {n: ms / one for n, ms in curve.items()},
            "draft_step_ms": draft_step, "c": draft_step / one,
            "row_invariance_33": row_invariance(target, prompt, 33)}  # three 16-row blocks


def engine_run(target, drafter, prompts, new_tokens: int, k: int):
    """Greedy generations through the engine; (tokens/s over decode time, alpha, tau, token lists)."""
    from specdec.engine import Engine, GenerationConfig

    engine = Engine(target, drafter)
    config = GenerationConfig(max_new_tokens=new_tokens, k=k, ignore_eos=True)
    gens = [engine.generate(p.tolist(), config) for p in prompts]
    generated = sum(g.stats.generated for g in gens)
    decode = sum(g.stats.decode_time for g in gens)
    drafted = sum(g.stats.drafted for g in gens)
    accepted = sum(g.stats.accepted for g in gens)
    rounds = sum(g.stats.rounds for g in gens)
    return {"tokens_per_s": generated / decode, "alpha": accepted / drafted if drafted else None,
            "tau": generated / rounds}, [g.token_ids for g in gens]


def section_oracle(target, draft, prompts, c: float, verify_ratio: dict, new_tokens: int) -> dict:
    """End-to-end speedup over plain decoding (same engine), oracle drafter, per alpha and K."""
    from specdec.drafters.none import NoDrafter
    from specdec.drafters.oracle import OracleDrafter
    from specdec.speedup import best_k, expected_speedup

    plain_runs, out = [], {"label": "oracle drafter (engine measurement, not a model pair)", "alphas": {}}
    plain, continuations = engine_run(target, NoDrafter(target.device), prompts, new_tokens, 1)
    plain_runs.append(plain["tokens_per_s"])
    for alpha in ALPHAS:
        oracle = OracleDrafter(target, alpha, draft, horizon=new_tokens, seed=7)
        for p, cont in zip(prompts, continuations):
            oracle.remember(p.tolist(), cont)
        k_calc = best_k(alpha, c).k
        ks = sorted({2, 3, 4, 5, 6, 8, 10, k_calc})
        target.capture(*range(1, max(ks) + 2))  # every graph a run uses (its last rounds draft fewer) before the clock runs
        draft.capture(1, 2)
        rows = {}
        for k in ks:
            res, _ = engine_run(target, oracle, prompts, new_tokens, k)
            res["predicted"] = expected_speedup(alpha, k, c)
            res["predicted_with_verify_cost"] = expected_speedup(alpha, k, c, verify_ratio.get(k + 1, 1.0))
            res["predicted_at_measured_alpha"] = expected_speedup(res["alpha"], k, c)
            rows[k] = res
        again, _ = engine_run(target, NoDrafter(target.device), prompts, new_tokens, 1)
        plain_runs.append(again["tokens_per_s"])
        base = statistics.mean(plain_runs[-2:])  # the plain runs either side of this alpha's sweep
        for res in rows.values():
            res["speedup"] = res["tokens_per_s"] / base
            res["within_10pct_of_formula"] = abs(res["speedup"] / res["predicted"] - 1) <= 0.10
        best = max(rows, key=lambda k: rows[k]["speedup"])
        out["alphas"][alpha] = {"k_calc": k_calc, "k_best": best, "plain_tokens_per_s": base, "by_k": rows}
    out["plain_tokens_per_s_runs"] = plain_runs
    return out


def section_identity(target, draft, prompts, new_tokens: int, k: int) -> dict:
    """Greedy speculative vs plain output through the target's own step path (the fused Triton
    kernels where they take the shape), with the oracle drafter at alpha 0.8."""
    from specdec.drafters.none import NoDrafter
    from specdec.drafters.oracle import OracleDrafter

    label = "triton" if target.options.fused else "torch"
    out = {"k": k, "prompts": len(prompts), "new_tokens": new_tokens, "oracle_alpha": 0.8, "path": label}
    target.capture(1, k + 1)
    plain, plain_ids = engine_run(target, NoDrafter(target.device), prompts, new_tokens, 1)
    oracle = OracleDrafter(target, 0.8, draft, horizon=new_tokens, seed=3)
    for p, ids in zip(prompts, plain_ids):
        oracle.remember(p.tolist(), ids)
    spec, spec_ids = engine_run(target, oracle, prompts, new_tokens, k)
    same = [a == b for a, b in zip(plain_ids, spec_ids)]
    first_diff = [next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), len(a))
                  for a, b in zip(plain_ids, spec_ids)]
    out[label] = {"identity_rate": sum(same) / len(same), "first_divergence": first_diff,
                  "plain_tokens_per_s": plain["tokens_per_s"], "spec_tokens_per_s": spec["tokens_per_s"],
                  "spec_alpha": spec["alpha"]}
    return out


def section_logits(hf, target, prompt) -> dict:
    """bf16 logits of the native model against transformers on the same weights."""
    import torch

    from specdec.models.hf import HFCausalLM

    ref = HFCausalLM(hf, "hf")
    ref_prefill, nat_prefill = ref.prefill(prompt[:-8]), target.prefill(prompt[:-8])
    ref_steps = torch.cat([ref.forward(prompt[i:i + 1]) for i in range(len(prompt) - 8, len(prompt))])
    nat_steps = torch.cat([target.forward(prompt[i:i + 1]) for i in range(len(prompt) - 8, len(prompt))])
    ref.reset()
    hf.float()  # an fp32 reference on the same weights (bf16 -> fp32 -> bf16 is lossless)
    exact_prefill = ref.prefill(prompt[:-8])
    exact_steps = torch.cat([ref.forward(prompt[i:i + 1]) for i in range(len(prompt) - 8, len(prompt))])
    ref.reset()
    hf.to(torch.bfloat16)

    def rel(a, b):
        return float((a - b).norm() / b.norm())

    return {"prefill_rel_err": rel(nat_prefill, ref_prefill), "decode_rel_err": rel(nat_steps, ref_steps),
            "native_bf16_vs_fp32_rel_err": rel(torch.cat([nat_prefill, nat_steps]), torch.cat([exact_prefill, exact_steps])),
            "hf_bf16_vs_fp32_rel_err": rel(torch.cat([ref_prefill, ref_steps]), torch.cat([exact_prefill, exact_steps])),
            "prefill_argmax_agree": float((nat_prefill.argmax(-1) == ref_prefill.argmax(-1)).float().mean()),
            "decode_argmax_agree": float((nat_steps.argmax(-1) == ref_steps.argmax(-1)).float().mean())}


def hf_generate_tps(hf, prompt, new_tokens: int, **kwargs) -> float:
    """transformers generate(), greedy: decode tokens/s (a 1-token generate subtracts the prefill)."""
    import torch

    ids = prompt[None]

    def timed(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, **kwargs)
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    timed(new_tokens)  # warm-up (and compilation, for the static cache)
    timed(new_tokens)
    return (new_tokens - 1) / (timed(new_tokens) - timed(1))


# -- the runs ---------------------------------------------------------------------------------------
def run_gpu(args) -> int:
    import torch

    from specdec.bench.scoreboard import machine_name
    from specdec.drafters.none import NoDrafter

    if not torch.cuda.is_available():
        print("no CUDA device: run `specdec bench gpu --cpu` for the CPU comparison")
        return 2
    t_start = time.perf_counter()
    smoke = args.smoke
    res = {"card": torch.cuda.get_device_name(0), "machine": machine_name(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "smoke": smoke,
           "target": "random-weight Llama-3.1-8B shape, bf16", "draft": "random-weight Llama-3.2-1B shape, bf16",
           "draft_megakernel": args.draft_megakernel}
    import transformers

    res["transformers"] = transformers.__version__
    out_path = Path(args.out_dir) / ("gpu-smoke.json" if smoke else "gpu-h200.json")

    def save(section, value):
        res[section] = value
        res["elapsed_s"] = time.perf_counter() - t_start
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(res, indent=1, default=str))
        print(f"[{res['elapsed_s']:6.1f}s] {section}: done", flush=True)

    save("copy_bandwidth_gbs", copy_bandwidth(0.5 if smoke else 4.0, 5 if smoke else 20))
    new_tokens = 16 if smoke else args.new_tokens
    hf, target, draft = build_models(smoke, max_length=args.context + max(new_tokens, 256) + 128,
                                     draft_megakernel=args.draft_megakernel)
    save("params", {"target": sum(p.numel() for p in target.net.parameters()),
                    "draft": sum(p.numel() for p in draft.net.parameters())})
    ctx_prompt = random_prompts(1, args.context, target.vocab_size, seed=0)[0]
    save("logits_vs_hf", section_logits(hf, target, ctx_prompt[:128]))
    save("decode", section_decode(target, draft, ctx_prompt, res["copy_bandwidth_gbs"], smoke))
    engine_plain, _ = engine_run(target, NoDrafter(target.device), [ctx_prompt], new_tokens, 1)
    save("decode_through_engine_tps", engine_plain["tokens_per_s"])
    save("verify", section_verify_curve(target, draft, ctx_prompt, smoke))
    prompts = random_prompts(1 if smoke else 3, args.context, target.vocab_size, seed=1)
    save("oracle", section_oracle(target, draft, prompts, res["verify"]["c"], res["verify"]["ratio"], new_tokens))
    id_prompts = random_prompts(2 if smoke else 10, 64 if smoke else 256, target.vocab_size, seed=2)
    save("identity", section_identity(target, draft, id_prompts, new_tokens if smoke else 96, k=5))
    del target, draft
    torch.cuda.empty_cache()
    hf_tokens = 8 if smoke else 64
    save("hf_generate_eager_tps", hf_generate_tps(hf, ctx_prompt, hf_tokens))
    print_table(res)
    if not args.no_hf_compile and time.perf_counter() - t_start < (60 if smoke else 330):
        try:
            tps = hf_generate_tps(hf, ctx_prompt, hf_tokens, cache_implementation="static")
        except Exception as exc:  # noqa: BLE001 - a peer row that fails is reported, not fatal
            tps = f"failed: {str(exc).splitlines()[0][:200]}"
        save("hf_generate_static_compile_tps", tps)
    else:
        save("hf_generate_static_compile_tps", "skipped (time budget)")
    print_table(res)
    print(f"saved {out_path}")
    return 0


def print_table(res: dict) -> None:
    d, v, o = res["decode"], res["verify"], res["oracle"]
    ident = res["identity"]
    lines = [
        f"card: {res['card']}  torch {res['torch']}  transformers {res['transformers']}  {res['date']}",
        f"copy bandwidth ceiling          {res['copy_bandwidth_gbs']:8.0f} GB/s",
        f"plain decode @ctx {d['context']:<5}        {d['tokens_per_s']:8.1f} tok/s  "
        f"({d['ms_per_token']:.2f} ms, {d['fraction_of_ceiling']:.0%} of ceiling; through the engine "
        f"{res['decode_through_engine_tps']:.1f} tok/s)",
        f"verify(8)/verify(1)             {v['ratio'][8]:8.3f}   (16: {v['ratio'][16]:.2f}, 32: {v['ratio'][32]:.2f},"
        f" 64: {v['ratio'][64]:.2f}); 33 rows bitwise = single steps: {v['row_invariance_33']['bitwise_equal']}",
        f"c = draft step / target step    {v['c']:8.3f}   ({v['draft_step_ms']:.3f} / {v['step_ms'][1]:.3f} ms)",
    ]
    for alpha, a in o["alphas"].items():
        kc, kb = a["by_k"][a["k_calc"]], a["by_k"][a["k_best"]]
        lines.append(f"oracle alpha {alpha}: K_calc={a['k_calc']} {kc['speedup']:.2f}x (formula {kc['predicted']:.2f}x)"
                     f"  best K={a['k_best']} {kb['speedup']:.2f}x (formula {kb['predicted']:.2f}x)")
    points = [r for a in o["alphas"].values() for r in a["by_k"].values()]
    lines.append(f"oracle (alpha, K) points within 10% of the formula: "
                 f"{sum(r['within_10pct_of_formula'] for r in points)} of {len(points)}")
    eager = res.get("hf_generate_eager_tps")
    if isinstance(eager, float):
        lines.append(f"HF generate eager               {eager:8.1f} tok/s  native plain is {d['tokens_per_s'] / eager:.1f}x")
    static = res.get("hf_generate_static_compile_tps")
    if static is not None:
        lines.append(f"HF generate static+compile      {static if isinstance(static, str) else f'{static:8.1f} tok/s'}")
    lg = res["logits_vs_hf"]
    lines.append(f"bf16 logits vs HF: rel err prefill {lg['prefill_rel_err']:.2e} decode {lg['decode_rel_err']:.2e},"
                 f" argmax agree {lg['decode_argmax_agree']:.0%}; vs fp32: native {lg['native_bf16_vs_fp32_rel_err']:.2e}"
                 f" HF {lg['hf_bf16_vs_fp32_rel_err']:.2e}")
    m = ident[ident["path"]]
    lines.append(f"greedy identity ({ident['path']}): {m['identity_rate']:.0%} of {ident['prompts']} prompts, "
                 f"plain {m['plain_tokens_per_s']:.0f} tok/s, spec(oracle .8, K={ident['k']}) "
                 f"{m['spec_tokens_per_s']:.0f} tok/s")
    print("\n".join(["", "=" * 100] + lines + ["=" * 100]), flush=True)


def run_cpu(args) -> int:
    """Plain greedy decoding of the embedded default: native path vs transformers generate(), A/B alternating."""
    import torch

    from specdec.bench.scoreboard import machine_name
    from specdec.models.cpu_threads import use_threads
    from specdec.models.loader import load_model
    from specdec.runtime import encode_prompt

    use_threads(args.threads or None)
    loaded = load_model("default", device="cpu", backend="hf")
    hf = loaded.model.model
    engines = _cpu_engines(hf, loaded.name)
    prompt = encode_prompt(loaded.tokenizer, "Write a short story about a lighthouse keeper who finds a message in a bottle.")
    n = 16 if args.smoke else 64
    rates, same = _cpu_rates(engines, hf, prompt, n, loaded.tokenizer.eos_token_id, args.smoke)
    layout = engines["native"].target.net.cpu_layout
    res = {"machine": machine_name(), "torch": torch.__version__, "model": loaded.name, "new_tokens": n,
           "threads": torch.get_num_threads(), "load_average": os.getloadavg(),
           "native_one_row": layout.one_row, "native_plain_rows": layout.plain_rows,
           "native_tokens_per_s": rates["native"], "hf_generate_tokens_per_s": rates["hf"],
           "ratio_median": _median_ratio(rates["native"], rates["hf"]), "same_tokens": same,
           "native_bf16_tokens_per_s": rates["bf16"], "native_prepacked_single_row_tokens_per_s": rates["prepacked"],
           "layout_gain_median": _median_ratio(rates["native"], rates["prepacked"]),
           "bf16_ratio_median": _median_ratio(rates["bf16"], rates["hf"]),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    out_path = Path(args.out_dir) / "gpu-cpu.json"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(res, indent=1))
    _print_cpu(res, loaded.name)
    return 0


def _cpu_engines(hf, name: str) -> dict:
    """Engines without a draft over the native model as shipped, with every step prepacked, and in bf16."""
    import torch

    from specdec.drafters.none import NoDrafter
    from specdec.engine import Engine
    from specdec.models.cpu_matrix import CpuLayout
    from specdec.models.llama_net import build_net, load_hf_state
    from specdec.models.native_llama import NativeLlama

    native = NativeLlama.from_hf(hf, name, max_length=1024)
    # the other single-row layout: every step through the oneDNN-prepacked matrices
    prepacked = NativeLlama.from_hf(hf, name + " prepacked", max_length=1024, pack=False)
    prepacked.net.pack_for_cpu(CpuLayout(one_row="packed"))
    bf16_net = build_net(native.arch, native.net.slots, native.device, torch.bfloat16)
    load_hf_state(bf16_net, hf.state_dict())  # copy_ rounds the fp32 weights; hf stays fp32
    bf16 = NativeLlama(bf16_net, name + " bf16", max_length=1024)
    return {key: Engine(model, NoDrafter(native.device))
            for key, model in (("native", native), ("prepacked", prepacked), ("bf16", bf16))}


def _cpu_rates(engines: dict, hf, prompt: list[int], n: int, eos: int, smoke: bool) -> tuple[dict, bool]:
    """Tokens/s of each engine and of hf.generate(), alternating run by run; and whether all gave the same tokens."""
    import torch

    from specdec.generation import GenerationConfig

    config = GenerationConfig(max_new_tokens=n, k=1, ignore_eos=True)
    ids = torch.tensor([prompt])
    rates, same = {key: [] for key in (*engines, "hf")}, True
    with torch.inference_mode():
        if not smoke:  # first calls allocate and warm caches: untimed
            for engine in engines.values():
                engine.generate(prompt, GenerationConfig(max_new_tokens=4, k=1, ignore_eos=True))
            hf.generate(ids, max_new_tokens=4, do_sample=False)
        for _ in range(1 if smoke else 5):
            gens = {key: engine.generate(prompt, config) for key, engine in engines.items()}
            for key, gen in gens.items():
                rates[key].append(gen.stats.tokens_per_second)
            gen = gens["native"]
            same = same and gens["prepacked"].token_ids == gen.token_ids
            t0 = time.perf_counter()
            hf.generate(ids, max_new_tokens=1, do_sample=False)
            t1 = time.perf_counter()
            out = hf.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
            t2 = time.perf_counter()
            rates["hf"].append((n - 1) / ((t2 - t1) - (t1 - t0)))
            # generate() with min_new_tokens bans EOS, the engine (ignore_eos) emits it: compare up to it.
            cut = gen.token_ids.index(eos) if eos in gen.token_ids else n
            same = same and out[0, len(prompt):len(prompt) + cut].tolist() == gen.token_ids[:cut]
    return rates, same


def _median_ratio(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b))


def _print_cpu(res: dict, name: str) -> None:
    med = {key: statistics.median(res[key]) for key in ("native_tokens_per_s", "native_prepacked_single_row_tokens_per_s",
                                                       "hf_generate_tokens_per_s", "native_bf16_tokens_per_s")}
    print(f"CPU ({res['machine']}, {res['threads']} threads, load average {res['load_average'][0]:.1f}), "
          f"{name}, {res['new_tokens']} new tokens, greedy, A/B alternating:")
    print(f"  native path (engine, no draft): {med['native_tokens_per_s']:6.1f} tok/s  {res['native_tokens_per_s']}"
          f"  (one-row steps read: {res['native_one_row']}, cpu_matrix.choose_layout)")
    print(f"  native, every step prepacked:   {med['native_prepacked_single_row_tokens_per_s']:6.1f} tok/s  "
          f"{res['native_prepacked_single_row_tokens_per_s']}  (layout gain {res['layout_gain_median']:.2f}x)")
    print(f"  transformers generate():        {med['hf_generate_tokens_per_s']:6.1f} tok/s  {res['hf_generate_tokens_per_s']}")
    print(f"  ratio native / generate:        {res['ratio_median']:6.2f}x   same tokens: {res['same_tokens']}")
    print(f"  native path in bf16 weights:    {med['native_bf16_tokens_per_s']:6.1f} tok/s  {res['native_bf16_tokens_per_s']}"
          f"  ({res['bf16_ratio_median']:.2f}x generate in fp32; other numerics, not like for like)")
