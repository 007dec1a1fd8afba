"""`specdec bench structured`: structured output (the extraction workload, data/structured/) decoded
plainly and speculatively, with and without the JSON schema, through the same engine.

Five modes per task, alternating their order task by task (A/B):
- plain: no drafter, no constraint;             - spec: the drafter, no constraint;
- plain constrained: no drafter, the schema, no grammar drafts (one token a step, the mask on p);
- grammar drafts: no drafter, the schema, the tokens the grammar dictates drafted for free;
- spec constrained: the drafter and the schema (grammar drafts first, then the drafter's).
With --mask-check, two more (MASK_CHECK): spec constrained with its verify masks in line, and again as is.
Reported: tokens/s of each, speculation's gain constrained and unconstrained, the share of forced
tokens (emitted where the mask allowed one token only) and of grammar drafts kept, the share of
constrained outputs that validate (jsonschema), greedy identity of every constrained mode with plain
constrained, and the grammar's host time per step, absolute and as a fraction of a plain step: in the
step's critical path (the draft's walk, the wait for the masks, unpacking them, the rollback), and
the verify masks computed beside the target's pass (constraints/overlap.py).

`--random-8b` (CUDA): the target is a random-weight Llama-3.1-8B (bf16, the native backend, CUDA
graphs), the embedded model's tokenizer constrains its 128256 logits (tokens past 49152 never
allowed), the drafter is prompt lookup. Acceptance means nothing there; the mask's cost against an
8B step does.
"""

from __future__ import annotations

import argparse
import json
import time

from specdec.commands import positive_int

MODES = ("plain", "spec", "plain constrained", "grammar drafts", "spec constrained")
# --mask-check: speculative constrained with the verify masks computed before the target's pass (the
# step's critical path) instead of beside it, and an A/A copy of spec constrained (the run's noise).
MASK_CHECK = ("spec constrained, masks in line", "spec constrained, A/A copy")


def register(sub) -> None:
    p = sub.add_parser("structured", help="structured output: plain vs speculative, with and without the schema",
                       description="The extraction workload decoded plainly and speculatively, constrained and not.")
    from specdec.bench.common import add_answer_flags, add_bench_flags

    add_bench_flags(p, draft_default="auto")
    add_answer_flags(p, k=4, max_new_tokens=96)
    p.add_argument("--tasks", type=positive_int, default=8,
                   help="tasks to run, one schema after another (default: %(default)s, the workload has 32)")
    p.add_argument("--random-8b", action="store_true",
                   help="a random-weight Llama-3.1-8B target on CUDA (mask cost against an 8B step)")
    p.add_argument("--prompts", choices=sorted(PROMPT_STYLES), default="task",
                   help="task: the instruction and the text; schema: then the JSON schema too (default: %(default)s)")
    p.add_argument("--mask-check", action="store_true",
                   help="add spec constrained with its masks in line (not beside the pass) and an A/A copy")
    p.add_argument("--tokenizer", metavar="DIR", default=None,
                   help="with --random-8b: the tokenizer's folder (default: the embedded model's; "
                        "benchmarks/structured_gpu_prepare.sh copies it for a machine without it)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specdec.bench.common import setup
    from specdec.constraints.workload import load_tasks

    setup(args)
    target, tokenizer, eos, drafter, name = _random_8b(args) if args.random_8b else _loaded(args)
    tasks = _spread(load_tasks(), args.tasks)
    engines = _engines(target, tokenizer, eos, drafter, args.mask_check)
    _warm_up(engines, tokenizer, tasks[0], args.prompts)
    totals, checks = _run_tasks(engines, tokenizer, tasks, args)
    report(args, name, drafter.name, totals, checks)
    return 0


def _loaded(args):
    from specdec.drafters import make_drafter
    from specdec.models.loader import load_model
    from specdec.runtime import eos_ids

    loaded = load_model(args.target, device=args.device, dtype=args.dtype, backend=args.backend)
    return loaded.model, loaded.tokenizer, eos_ids(loaded), make_drafter(args.draft, loaded), loaded.name


def _random_8b(args):
    import torch
    from transformers import AutoTokenizer

    from specdec.drafters import LookupDrafter
    from specdec.models import default as default_model
    from specdec.models.native_llama import NativeLlama

    if not torch.cuda.is_available():
        from specdec.errors import UnsupportedHereError

        raise UnsupportedHereError("--random-8b needs a CUDA GPU")
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or str(default_model.prepared_dir()))
    target = NativeLlama.random("llama-3.1-8b", max_length=1024)
    return target, tokenizer, {tokenizer.eos_token_id}, LookupDrafter(target.device), target.name


def _spread(tasks: list, n: int) -> list:
    """n tasks taking each schema in turn (the workload lists four tasks a schema, schema by schema)."""
    by_schema: dict[str, list] = {}
    for t in tasks:
        by_schema.setdefault(t.schema_name, []).append(t)
    columns = list(by_schema.values())
    order = [col[i] for i in range(max(map(len, columns))) for col in columns if i < len(col)]
    return order[:n]


def _engines(target, tokenizer, eos, drafter, mask_check: bool = False) -> dict:
    """An Engine per mode over the one target (they share its cache; each generation starts it afresh)."""
    from specdec.constraints.grammar import GrammarCompiler
    from specdec.drafters import NoDrafter
    from specdec.engine import Engine

    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    drafting = GrammarCompiler(tokenizer, target.vocab_size)
    plain = GrammarCompiler(tokenizer, target.vocab_size, grammar_drafts=False)
    none = NoDrafter(target.device)
    return {"plain": Engine(target, none, eos, decode), "spec": Engine(target, drafter, eos, decode),
            "plain constrained": Engine(target, none, eos, decode, grammars=plain),
            "grammar drafts": Engine(target, NoDrafter(target.device), eos, decode, grammars=drafting),
            "spec constrained": Engine(target, drafter, eos, decode, grammars=drafting),
            **(_mask_check_engines(target, tokenizer, eos, decode, drafter, drafting) if mask_check else {})}


def _mask_check_engines(target, tokenizer, eos, decode, drafter, drafting) -> dict:
    from specdec.constraints.grammar import GrammarCompiler
    from specdec.engine import Engine

    inline = GrammarCompiler(tokenizer, target.vocab_size, overlap_masks=False)
    return {MASK_CHECK[0]: Engine(target, drafter, eos, decode, grammars=inline),
            MASK_CHECK[1]: Engine(target, drafter, eos, decode, grammars=drafting)}


# --prompts: what the user's message holds. "task": the task's instruction and text alone (the model is
# not told the answer's shape; unconstrained, the embedded model repeats the text). "schema": the same,
# then the JSON schema the answer must follow, as structured-output requests usually state it (the
# OpenAI and vLLM guides put the schema or the format in the prompt as well as in response_format).
PROMPT_STYLES = {"task": lambda task: task.prompt,
                 "schema": lambda task: (f"{task.prompt}\n\nAnswer with a JSON object only, following this JSON "
                                         f"schema:\n{json.dumps(task.schema, separators=(',', ':'))}")}


def _prompt_ids(tokenizer, task, style: str = "task") -> list[int]:
    content = PROMPT_STYLES[style](task)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                        tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _warm_up(engines: dict, tokenizer, task, style: str) -> None:
    """A few untimed tokens through every mode: CUDA graphs, the grammar's tokenizer tables."""
    from specdec.constraints import ConstraintSpec
    from specdec.generation import GenerationConfig

    for mode, engine in engines.items():
        spec = ConstraintSpec.json_schema(task.schema) if _constrained(mode) else None
        engine.generate(_prompt_ids(tokenizer, task, style), GenerationConfig(max_new_tokens=8, constraint=spec))


def _run_tasks(engines: dict, tokenizer, tasks: list, args) -> tuple[dict, dict]:
    """Every task through every mode (order alternating); totals by mode, and the constrained checks."""
    from specdec.bench.common import RunTotals, progress
    from specdec.constraints import ConstraintSpec
    from specdec.generation import GenerationConfig

    modes = tuple(engines)
    totals = {m: RunTotals() for m in modes}
    checks = {m: {"valid": 0, "identical": 0, "outputs": 0, "forced": 0, "grammar_drafted": 0,
                  "grammar_accepted": 0, "constraint_time": 0.0, "constraint_overlapped_time": 0.0, "rounds": 0,
                  "generated": 0}
              for m in modes if _constrained(m)}
    for i, task in enumerate(progress(tasks, desc="structured")):
        ids = _prompt_ids(tokenizer, task, args.prompts)
        spec = ConstraintSpec.json_schema(task.schema)
        order = modes if i % 2 == 0 else modes[::-1]
        outputs = {}
        for mode in order:
            constrained = mode in checks
            config = GenerationConfig(max_new_tokens=args.max_new_tokens, k=args.k,
                                      constraint=spec if constrained else None)
            gen = engines[mode].generate(ids, config)
            totals[mode].add(gen.stats)
            outputs[mode] = gen
        for mode in checks:
            _check(checks[mode], outputs[mode], outputs["plain constrained"], task.schema, tokenizer)
    return totals, checks


def _constrained(mode: str) -> bool:
    return mode not in ("plain", "spec")


def _check(row: dict, gen, reference, schema: dict, tokenizer) -> None:
    """Count a constrained output: valid under its schema, identical to plain constrained, its grammar stats."""
    import jsonschema

    row["outputs"] += 1
    row["identical"] += int(gen.token_ids == reference.token_ids)
    try:
        jsonschema.validate(json.loads(tokenizer.decode(gen.token_ids, skip_special_tokens=True)), schema)
        row["valid"] += 1
    except (json.JSONDecodeError, jsonschema.ValidationError):
        pass
    s = gen.stats
    for key in ("forced", "grammar_drafted", "grammar_accepted", "constraint_time", "constraint_overlapped_time",
                "rounds", "generated"):
        row[key] += getattr(s, key)


def report(args, target_name: str, draft_name: str, totals: dict, checks: dict) -> None:
    from specdec.bench.common import finish, print_table, speedup
    from specdec.bench.scoreboard import ScoreRow, machine_name

    plain_step = totals["plain"].decode_time / max(1, totals["plain"].generated)  # one token a step
    rows = []
    for mode in totals:
        t, c = totals[mode], checks.get(mode)
        base = totals["plain constrained" if c else "plain"]
        row = {"mode": mode, "tokens_per_second": t.tokens_per_second, "tau": t.tau, "alpha": t.alpha,
               "speedup_over_plain_of_its_kind": speedup(t, base), "totals": t.to_dict()}
        if c:
            per_step = c["constraint_time"] / max(1, c["rounds"])
            beside = c["constraint_overlapped_time"] / max(1, c["rounds"])
            row.update(masks_beside_pass_ms_per_step=beside * 1e3,
                       masks_beside_pass_fraction_of_plain_step=beside / plain_step,
                       valid=c["valid"] / c["outputs"], identical_to_plain_constrained=c["identical"] / c["outputs"],
                       forced_share=c["forced"] / max(1, c["generated"]),
                       grammar_draft_share=c["grammar_accepted"] / max(1, c["generated"]),
                       grammar_drafts_kept=c["grammar_accepted"] / max(1, c["grammar_drafted"]),
                       mask_ms_per_step=per_step * 1e3, mask_fraction_of_plain_step=per_step / plain_step)
        rows.append(row)
    title = (f"structured output: {target_name} + {draft_name}, K={args.k}, {args.tasks} tasks ({args.prompts} prompts), "
             f"{args.max_new_tokens} new tokens max, {machine_name()}")
    print_table(title, ["mode", "tok/s", "tau", "gain", "valid", "same as plain c.", "forced", "grammar drafts",
                        "grammar ms/step", "of a plain step", "masks beside ms/step", "of a plain step"],
                [[r["mode"], r["tokens_per_second"], r["tau"], r["speedup_over_plain_of_its_kind"],
                  r.get("valid", "-"), r.get("identical_to_plain_constrained", "-"), r.get("forced_share", "-"),
                  r.get("grammar_draft_share", "-"), r.get("mask_ms_per_step", "-"),
                  r.get("mask_fraction_of_plain_step", "-"), r.get("masks_beside_pass_ms_per_step", "-"),
                  r.get("masks_beside_pass_fraction_of_plain_step", "-")] for r in rows],
                note=f"gain: tokens/s over plain (unconstrained modes) or plain constrained (constrained modes). "
                     f"A plain step: {plain_step * 1e3:.2f} ms. grammar: the host's grammar work in the step's "
                     f"critical path (draft walk, wait for the masks, unpacking, rollback); masks beside: the verify "
                     f"masks computed while the target's pass runs (not in the critical path)")
    spec_c = rows[MODES.index("spec constrained")]
    data = {"command": "structured", "target": target_name, "draft": draft_name, "k": args.k, "tasks": args.tasks,
            "max_new_tokens": args.max_new_tokens, "random_8b": args.random_8b, "mask_check": args.mask_check,
            "prompts": args.prompts,
            "modes": rows,
            "plain_step_ms": plain_step * 1e3, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    finish(args, "structured", data, ScoreRow(
        target=target_name, draft=f"{draft_name} + json schema", k=str(args.k), precision="-",
        tokens_per_second=spec_c["tokens_per_second"], speedup=spec_c["speedup_over_plain_of_its_kind"],
        tau=spec_c["tau"], alpha=spec_c["alpha"]))
