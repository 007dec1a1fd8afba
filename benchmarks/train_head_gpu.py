"""Train a draft head on one GPU inside a fixed time budget: `python benchmarks/train_head_gpu.py --target T`.

This is `specdec train-draft` (same data, same trainer, same file) with two choices made from the
clock, because the GPU machine that trained the shipped head ran one command of at most ten minutes:

1. data: the target answers `--gen-batch` prompts at a time (shards, as train-draft does) until
   `--prompts` are answered or `--gen-seconds` have passed. make_prompts(n) is a prefix of
   make_prompts(m) for n < m, so the shards are exactly those of `train-draft --prompts N`.
2. steps: `--steps N`, or else a short probe run times the training steps and the steps that fit
   in what is left of `--budget` (capped by `--max-steps`) are trained with the cosine schedule,
   from scratch. The probe is rough: on the 4.6M-token data it read 126 ms a step in one call and
   214 ms in the next (10 probe steps), where steps took 89 ms.

With `--source-texts N --followups M` the data starts with the two-stage self-instruct of
train.data (the target writes N texts, then answers M requests about them, pasted in); with
`--question-lists L` the target then writes L lists of questions and answers each question.

It prints the equivalent `specdec train-draft` command and writes the summary as JSON (`--summary`).
With `--check-per-category N` it then measures, on the target's greedy answers to the first N
Spec-Bench questions of each category (the test set: measured only, after training, never trained
on), how much of the answers the sub-vocabulary covers and the teacher-forced greedy agreement per
draft step, for the new head and for `--compare-head`.
specdec must be importable (`pip install --no-deps -e .`, or PYTHONPATH=src from the repository root);
benchmarks/train_head_gpu.sh is the wrapper that ran it on the sandbox's GPU machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from specdec.drafters.head import config_for_target, parse_feature_layers, target_parts
from specdec.models.loader import load_model
from specdec.train.data import DataConfig, build_dataset
from specdec.train.pipeline import train_draft
from specdec.train.trainer import TrainConfig, fit, load_examples


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="default")
    p.add_argument("--out", required=True)
    p.add_argument("--data-dir", required=True)
    p.add_argument("--summary", default=None, help="write the summary (with the validation history) here")
    p.add_argument("--device", default="cuda")
    p.add_argument("--budget", type=float, default=520, help="seconds for the whole script")
    p.add_argument("--gen-seconds", type=float, default=240, help="stop starting new data batches after this")
    p.add_argument("--prompts", type=int, default=12288)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--gen-batch", type=int, default=512)
    p.add_argument("--max-steps", type=int, default=12000)
    p.add_argument("--steps", type=int, default=0,
                   help="train exactly this many steps (no timing probe; the probe's estimate varies 2x between runs)")
    p.add_argument("--resume", action="store_true",
                   help="continue from OUT.ckpt (a run cut short by the call's limit) instead of starting over")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--unroll", type=int, default=3)
    p.add_argument("--draft-vocab", type=int, default=8192)
    p.add_argument("--val-examples", type=int, default=256)
    p.add_argument("--eval-every", type=int, default=250)
    p.add_argument("--probe-steps", type=int, default=40)
    p.add_argument("--source-texts", type=int, default=0, help="two-stage self-instruct: stage-1 texts")
    p.add_argument("--followups", type=int, default=0, help="two-stage self-instruct: stage-2 requests")
    p.add_argument("--question-lists", type=int, default=0,
                   help="self-instruct questions: lists of questions the target writes, then answers")
    p.add_argument("--max-len", type=int, default=512, help="tokens per training text")
    p.add_argument("--check-per-category", type=int, default=0, help="Spec-Bench questions per category to measure")
    p.add_argument("--compare-head", default=None, help="a head to measure beside the new one")
    p.add_argument("--data-only", action="store_true", help="stop after the data (a later run trains on it)")
    p.add_argument("--feature-layers", default="auto", help="target layers the data keeps (train-draft's flag)")
    p.add_argument("--head-layers", default=None, help="layers the head reads (default: --feature-layers)")
    p.add_argument("--arch", choices=("eagle", "eagle3"), default="eagle",
                   help="train-draft's --arch (eagle3: --out is a checkpoint directory)")
    p.add_argument("--ab-steps", type=int, default=0,
                   help="after the data: train a head on the last layer alone and one on --feature-layers for "
                        "this many steps each, print both agreements, write the better choice to DATA/winner.txt")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    started = time.perf_counter()
    clock = lambda: time.perf_counter() - started  # noqa: E731

    target = load_model(args.target, device=args.device, dtype="fp32", backend="hf")
    hf = target.model.model
    n_layers = hf.config.num_hidden_layers
    layers = parse_feature_layers(args.feature_layers, n_layers)
    head_layers = layers if args.head_layers is None else parse_feature_layers(args.head_layers, n_layers)
    print(f"[{clock():.0f}s] target loaded on {args.device}; data keeps layers {layers}, the head reads "
          f"{head_layers}", flush=True)

    # 1. Data, a batch of prompts at a time until the time for data is spent.
    data_dir = Path(args.data_dir)
    done = len(list(data_dir.glob("shard_[0-9]*.pt")))  # regular shards a previous run left: resume after them
    n = min(args.prompts, done * args.gen_batch)
    shards = sorted(data_dir.glob("shard_*.pt"))
    data_config = DataConfig(num_prompts=n, max_new_tokens=args.max_new_tokens, batch_size=args.gen_batch,
                             source_texts=args.source_texts, followups=args.followups, feature_layers=layers,
                             question_lists=args.question_lists)
    while n < args.prompts and clock() < args.gen_seconds:
        n = min(args.prompts, n + args.gen_batch)
        data_config = replace(data_config, num_prompts=n)
        shards = build_dataset(hf, target.tokenizer, data_dir, data_config, progress=False)
        print(f"[{clock():.0f}s] {n} prompts answered ({len(shards)} shards)", flush=True)
    train_config = TrainConfig(steps=args.max_steps, batch_size=args.batch_size, lr=args.lr, unroll=args.unroll,
                               draft_vocab=args.draft_vocab, eval_every=args.eval_every,
                               val_examples=args.val_examples, max_len=args.max_len)
    if args.ab_steps:
        compare_layers(target, shards, data_dir, layers, replace(train_config, steps=args.ab_steps,
                                                                  eval_every=args.ab_steps), clock)
    if args.data_only:  # each new shard's log line gave its answer tokens; a later run loads them all anyway
        print(f"[{clock():.0f}s] data only: {len(shards)} shards under {data_dir}", flush=True)
        return 0

    # 2. The steps: as given, or timed on a throwaway checkpoint and fitted into the budget.
    kinds = {k: sum(1 for path in shards if path.name.startswith(k + "_"))
             for k in ("shard_src", "shard_use", "shard_ask", "shard_ans")}
    print(f"[{clock():.0f}s] {len(shards)} shards; self-instruct shards {kinds}", flush=True)
    steps = args.steps or fit_steps(target, shards, train_config, head_layers, data_dir, args, clock)
    train_config = replace(train_config, steps=steps)
    print("equivalent: specdec train-draft --target TARGET --device cuda --dtype fp32 "
          f"--prompts {n} --source-texts {args.source_texts} --followups {args.followups} "
          f"--question-lists {args.question_lists} "
          f"--max-new-tokens {args.max_new_tokens} --gen-batch {args.gen_batch} "
          f"--steps {steps} --batch-size {args.batch_size} --lr {args.lr} --unroll {args.unroll} "
          f"--draft-vocab {args.draft_vocab} --max-len {args.max_len} "
          f"--feature-layers {','.join(map(str, head_layers)) or 'none'} "
          f"--val-examples {args.val_examples} --eval-every {args.eval_every} --arch {args.arch} "
          f"--data-dir {data_dir} --out {args.out}", flush=True)

    # 3. The run itself: exactly train-draft's pipeline.
    out = Path(args.out)
    ckpt = Path(str(out) + ".ckpt")
    first_step = 0
    if not args.resume:
        ckpt.unlink(missing_ok=True)
    elif ckpt.exists():
        first_step = torch.load(ckpt, weights_only=False, map_location="cpu")["step"]
    t0 = time.perf_counter()
    summary = train_draft(target, out, data_dir, data_config, train_config, progress=False, head_layers=head_layers,
                          arch=args.arch)
    seconds = time.perf_counter() - t0
    summary.update(train_seconds=round(seconds, 1), total_seconds=round(clock(), 1), resumed_at_step=first_step,
                   ms_per_step=round(seconds / max(1, steps - first_step) * 1000, 2),
                   device=torch.cuda.get_device_name() if args.device == "cuda" else args.device)
    if args.check_per_category:
        heads = {"new": out} | ({"compare": Path(args.compare_head)} if args.compare_head else {})
        summary["specbench_check"] = check_on_specbench(target, heads, args.check_per_category,
                                                        args.max_new_tokens, train_config, layers)
        print(json.dumps(summary["specbench_check"], indent=1), flush=True)
    if args.summary:
        Path(args.summary).write_text(json.dumps(summary, indent=1))
    print("step | loss | held-out greedy agreement per draft step")
    for h in summary["history"]:
        print(f"{h['step']:5d} | {h['loss']:.3f} | " + " ".join(f"{v:.3f}" for v in h["val_greedy_agreement"]))
    print(f"[{clock():.0f}s] {summary['answers']} answers, {summary['answer_tokens']} answer tokens, "
          f"{steps} steps in {summary['train_seconds']} s -> {out}", flush=True)
    return 0


def fit_steps(target, shards: list[Path], train_config, head_layers, data_dir: Path, args, clock) -> int:
    """The steps that fit in what is left of --budget, from a short timed run on a throwaway checkpoint.
    (train_draft loads the examples again and logs their count: these are freed on return.)"""
    examples = load_examples(shards, device=args.device)
    parts = target_parts(target.model)
    head_config = config_for_target(target.model, args.draft_vocab, head_layers, args.arch)
    probe_dir = data_dir / "probe"
    shutil.rmtree(probe_dir, ignore_errors=True)
    probe_dir.mkdir(parents=True)
    probe = replace(train_config, eval_every=10**9, ckpt_every=10**9)
    torch.set_float32_matmul_precision("high")  # as train_draft does while fitting
    marks = []
    for stop in (5, 5 + args.probe_steps):  # both legs pay the same set-up (vocabulary, checkpoint load)
        t0 = time.perf_counter()
        with torch.enable_grad():
            fit(parts, head_config, examples, probe, probe_dir / "ckpt", progress=False, log=lambda *a: None,
                stop_at=stop)
        torch.cuda.synchronize() if args.device == "cuda" else None
        marks.append(time.perf_counter() - t0)
    torch.set_float32_matmul_precision("highest")
    shutil.rmtree(probe_dir, ignore_errors=True)
    per_step = max(1e-3, (marks[1] - marks[0]) / (args.probe_steps - 5))
    per_step *= 1.33  # evaluation and checkpoints: the 2.3M-token run took 79 ms a step against a 59-ms probe
    left = args.budget - clock() - 25  # reload of the examples, saving
    steps = int(max(args.eval_every, min(args.max_steps, left / per_step)) // args.eval_every * args.eval_every)
    print(f"[{clock():.0f}s] {per_step * 1000:.1f} ms a step; training {steps} steps", flush=True)
    return steps


def compare_layers(target, shards: list[Path], data_dir: Path, layers: tuple[int, ...], config: TrainConfig,
                   clock) -> None:
    """Train a head on the last layer's features alone and one on `layers` for config.steps each, on
    the same data and batches; print their held-out agreement, write the better to DATA/winner.txt."""
    examples = load_examples(shards, device=target.model.device)
    parts = target_parts(target.model)
    torch.set_float32_matmul_precision("high")
    results = {}
    for choice in ((), layers):
        ckpt = data_dir / "ab.ckpt"
        ckpt.unlink(missing_ok=True)
        with torch.enable_grad():
            _, history = fit(parts, config_for_target(target.model, config.draft_vocab, choice), examples, config,
                             ckpt, progress=False, log=lambda *a: None)
        ckpt.unlink(missing_ok=True)
        name = ",".join(map(str, choice)) or "none"
        results[name] = history[-1]["val_greedy_agreement"]
        print(f"[{clock():.0f}s] A/B {config.steps} steps, layers {name}: held-out agreement "
              f"{[round(a, 3) for a in results[name]]}", flush=True)
    torch.set_float32_matmul_precision("highest")
    winner = max(results, key=lambda name: sum(results[name]))
    (data_dir / "ab.json").write_text(json.dumps({"steps": config.steps, "agreement": results, "winner": winner}))
    (data_dir / "winner.txt").write_text(winner)


def check_on_specbench(target, heads: dict, per_category: int, max_new_tokens: int, config,
                       layers: tuple[int, ...] = (), answer_batch: int = 16) -> dict:
    """Per Spec-Bench category: the share of the target's greedy answer tokens inside each head's
    sub-vocabulary and each head's teacher-forced greedy agreement per draft step (measured only).
    The target answers `answer_batch` questions at a time, sorted by length: one left-padded batch
    of every question pads the short ones to the longest RAG prompt, which a CPU cannot afford."""
    from specdec.bench.specbench import QUESTIONS, load_questions
    from specdec.drafters.head_loading import load_head
    from specdec.train.data import _answer_batch
    from specdec.train.trainer import evaluate, sub_vocab_index, usable

    rows = load_questions(str(QUESTIONS), per_category, None)
    answer_config = DataConfig(max_new_tokens=max_new_tokens, feature_layers=layers)
    prompts = [r["turns"][0] for r in rows]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    examples: list = [None] * len(prompts)
    for first in range(0, len(order), answer_batch):
        chunk = order[first:first + answer_batch]
        answers = _answer_batch(target.model.model, target.tokenizer, [prompts[i] for i in chunk], answer_config,
                                sample=False)
        for i, example in zip(chunk, answers):
            examples[i] = example
    device = next(target.model.model.parameters()).device
    examples = [{k: (v.to(device) if torch.is_tensor(v) else v) for k, v in e.items()} for e in examples]
    parts = target_parts(target.model)
    groups = {cat: [e for e, r in zip(examples, rows) if r["category"] == cat and usable(e)]
              for cat in dict.fromkeys(r["category"] for r in rows)}
    groups["all"] = [e for e in examples if usable(e)]
    cfg = replace(config, max_len=2048, batch_size=4)  # Spec-Bench inputs are long: small batches
    result: dict = {}
    for name, path in heads.items():
        head = load_head(path, target.model).to(device).eval()
        sub_index = sub_vocab_index(head.vocab_ids, head.config.vocab_size, device)
        for group, chosen in groups.items():
            answer = torch.cat([e["ids"][e["start"]:].long() for e in chosen])
            cov = float((sub_index[answer] >= 0).float().mean())
            agree = evaluate(head, parts, chosen, sub_index, cfg)
            result.setdefault(group, {})[name] = {"coverage": round(cov, 3), "agreement": [round(a, 3) for a in agree]}
    return result


if __name__ == "__main__":
    sys.exit(main())
