"""Where the grammar's time in a constrained step goes, piece by piece, on the CPU at the 8B vocabulary.

The target is a random one-layer Llama of the 8B shape's vocabulary (128256 logits, dim 64: a cheap
forward, the full-width logits), the embedded model's tokenizer constrains it (tokens past its 49152
never allowed), as `specdec bench structured --random-8b` does on the GPU. The constrained engine runs
the workload's schemas; every grammar piece is wrapped with a timer that records its seconds and the
thread it ran in (the engine's, or the mask worker's: off the critical path). Pieces nest: the table
gives each one's inclusive time a step, indented under the piece that calls it.

    PYTHONPATH=src python benchmarks/structured_profile.py --tasks 4 --max-new-tokens 48 [--json FILE]
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import threading
import time

import torch

# (label, module, attribute): the grammar's pieces, callers before callees (the table's order).
PIECES = (
    ("grammar_draft (the grammar's drafts ahead)", "specdec.constraints.sequence:SequenceConstraint", "grammar_draft"),
    ("fit_draft (the drafter's walk, the grammar's tail)", "specdec.constraints.sequence:SequenceConstraint", "fit_draft"),
    ("  _forced_run (ff tokens, the forced text)", "specdec.constraints.sequence:SequenceConstraint", "_forced_run"),
    ("  _check (a drafted token, a sampled one's mask)", "specdec.constraints.sequence:SequenceConstraint", "_check"),
    ("  _draft (the Draft's tensors)", "specdec.constraints.sequence:SequenceConstraint", "_draft"),
    ("MaskJob start (handing the masks over)", "specdec.constraints.overlap:MaskJob", "__init__"),
    ("verify_bits (the verify masks)", "specdec.constraints.overlap", "verify_bits"),
    ("  rewind (matcher rollback of the draft)", "specdec.constraints.sequence:SequenceConstraint", "rewind"),
    ("  restore (consume the draft again, single rows)", "specdec.constraints.sequence:SequenceConstraint", "restore"),
    ("MaskJob.result (wait, unpack)", "specdec.constraints.overlap:MaskJob", "result"),
    ("unpack_bitmask (bits -> bool [n, V])", "specdec.constraints.masking", "unpack_bitmask"),
    ("mask_logits (logits at -inf off the mask)", "specdec.batch_rule", "mask_logits"),
    ("apply_bitmask (packed bits on the logits)", "specdec.batch_rule", "apply_bitmask"),
    ("settle (rollback, the new token)", "specdec.constraints.sequence:SequenceConstraint", "settle"),
    ("matcher consume_token", "specdec.constraints.sequence:SequenceConstraint", "_consume"),
    ("matcher rollback", "specdec.constraints.sequence:SequenceConstraint", "rollback"),
)
VOCAB_8B = 128256
TINY = dict(dim=64, n_layers=1, n_heads=2, n_kv_heads=1, intermediate=128)  # the 8B shape's vocabulary only


class Timers:
    """Seconds and calls by (piece, thread): "engine" (the step's critical path) or "worker" (the masks' thread)."""

    def __init__(self):
        self.seconds = collections.defaultdict(float)
        self.calls = collections.defaultdict(int)

    def wrap(self, label: str, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                where = "worker" if threading.current_thread().name.startswith("specdec-masks") else "engine"
                self.seconds[label, where] += time.perf_counter() - start
                self.calls[label, where] += 1
        return timed

    def install(self) -> None:
        """Wrap every piece that exists in this checkout (a piece that is gone is left out of the table)."""
        import importlib

        for label, where, attr in PIECES:
            module, _, cls = where.partition(":")
            owner = importlib.import_module(module)
            owner = getattr(owner, cls) if cls else owner
            if hasattr(owner, attr):
                setattr(owner, attr, self.wrap(label, getattr(owner, attr)))

    def table(self, rounds: int) -> list[dict]:
        return [{"piece": label, "thread": where, "ms_per_step": self.seconds[label, where] / rounds * 1e3,
                 "calls_per_step": self.calls[label, where] / rounds}
                for label, _, _ in PIECES for where in ("engine", "worker") if self.calls[label, where]]


def _target():
    from specdec.models.native_llama import NativeLlama

    return NativeLlama.random("llama-3.1-8b", device="cpu", dtype=torch.float32, max_length=1024,
                              arch_overrides=TINY)


def _run(engine, prompts: list, specs: list, max_new: int, k: int):
    from specdec.generation import GenerationConfig

    rounds = generated = 0
    decode = 0.0
    for ids, spec in zip(prompts, specs):
        gen = engine.generate(ids, GenerationConfig(max_new_tokens=max_new, k=k, constraint=spec))
        rounds += gen.stats.rounds
        generated += gen.stats.generated
        decode += gen.stats.decode_time
    return rounds, generated, decode


def profile(args) -> dict:
    """Per mode: the step's time, the grammar's pieces a step (engine thread / worker)."""
    from transformers import AutoTokenizer

    from specdec.bench.structured import _prompt_ids, _spread
    from specdec.constraints import ConstraintSpec
    from specdec.constraints.grammar import GrammarCompiler
    from specdec.constraints.workload import load_tasks
    from specdec.drafters import LookupDrafter, NoDrafter
    from specdec.engine import Engine
    from specdec.models import default as default_model

    tokenizer = AutoTokenizer.from_pretrained(str(default_model.prepared_dir()))
    target = _target()
    tasks = _spread(load_tasks(), args.tasks)
    prompts = [_prompt_ids(tokenizer, t) for t in tasks]
    specs = [ConstraintSpec.json_schema(t.schema) for t in tasks]
    eos = [tokenizer.eos_token_id]
    modes = {"plain": (NoDrafter(target.device), None),
             "plain constrained": (NoDrafter(target.device), GrammarCompiler(tokenizer, VOCAB_8B, grammar_drafts=False)),
             "spec constrained": (LookupDrafter(target.device), GrammarCompiler(tokenizer, VOCAB_8B))}
    out = {"cpu": _cpu_name(), "torch_threads": torch.get_num_threads(),
           "vocab": VOCAB_8B, "tasks": args.tasks, "max_new_tokens": args.max_new_tokens, "k": args.k, "modes": {}}
    for mode, (drafter, grammars) in modes.items():
        engine = Engine(target, drafter, eos, grammars=grammars)
        mode_specs = specs if grammars else [None] * len(specs)
        _run(engine, prompts[:1], mode_specs[:1], 8, args.k)  # warm-up: the llguidance tokenizer, the caches
        timers = Timers()
        saved = _save_pieces()
        timers.install()
        try:
            rounds, generated, decode = _run(engine, prompts, mode_specs, args.max_new_tokens, args.k)
        finally:
            _restore_pieces(saved)
        out["modes"][mode] = {"rounds": rounds, "generated": generated, "step_ms": decode / rounds * 1e3,
                              "pieces": timers.table(rounds)}
    return out


def _save_pieces() -> list:
    import importlib

    saved = []
    for _, where, attr in PIECES:
        module, _, cls = where.partition(":")
        owner = importlib.import_module(module)
        owner = getattr(owner, cls) if cls else owner
        if hasattr(owner, attr):
            saved.append((owner, attr, owner.__dict__[attr] if cls else getattr(owner, attr)))
    return saved


def _restore_pieces(saved: list) -> None:
    for owner, attr, value in saved:
        setattr(owner, attr, value)


def _cpu_name() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None, help="write the table as JSON here too")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    out = profile(args)
    for mode, row in out["modes"].items():
        print(f"{mode}: {row['rounds']} steps, {row['step_ms']:.2f} ms a step ({out['cpu']}, vocab {out['vocab']})")
        for piece in row["pieces"]:
            print(f"  {piece['piece']:<52} {piece['thread']:<6} {piece['ms_per_step']:8.3f} ms/step "
                  f"{piece['calls_per_step']:6.2f} calls/step")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
