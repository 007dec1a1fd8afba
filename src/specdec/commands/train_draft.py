"""`specdec train-draft`: distil an EAGLE-style draft head for a target from the target's own answers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdec.commands import positive_int


def register(sub) -> None:
    p = sub.add_parser(
        "train-draft", help="train a draft head (EAGLE-style) for a target",
        description="The target answers synthetic instructions (never Spec-Bench); its features and "
                    "probabilities are cached, and a one-layer head is distilled from them. Interrupted runs "
                    "resume: the data shards and OUT.ckpt are reused.")
    p.add_argument("--target", default="default", help="target model: `default`, a hub id, a directory or a .gguf")
    p.add_argument("--out", required=True,
                   help="where to write the head: a .safetensors file (--arch eagle), a directory (--arch eagle3)")
    p.add_argument("--arch", choices=("eagle", "eagle3"), default="eagle",
                   help="eagle: specdec's head on the target's LM head; eagle3: an EAGLE-3 head (own norm and LM "
                        "head, three target layers) in the checkpoint layout SpecForge, SGLang and vLLM use "
                        "(default: %(default)s)")
    p.add_argument("--data-dir", default=None, help="cache of the target's answers (default: ~/.cache/specdec/draft-data/TARGET)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", default=None, help="the target's dtype while answering: fp32, bf16, fp16")
    p.add_argument("--threads", type=positive_int, default=None, help="CPU threads for torch (default: torch's choice)")
    g = p.add_argument_group("data")
    g.add_argument("--prompts", type=positive_int, default=512, help="instructions the target answers (default: %(default)s)")
    g.add_argument("--max-new-tokens", type=positive_int, default=192, help="answer length cap (default: %(default)s)")
    g.add_argument("--gen-batch", type=positive_int, default=16, help="prompts per generate() call (default: %(default)s)")
    g.add_argument("--top-k-probs", type=positive_int, default=32, help="target probabilities kept per position")
    g.add_argument("--source-texts", type=int, default=0,
                   help="two-stage self-instruct: texts the target writes first (default: %(default)s, off)")
    g.add_argument("--followups", type=int, default=0,
                   help="then requests to summarise/extract/question/rewrite those texts, pasted in")
    g.add_argument("--question-lists", type=int, default=0,
                   help="self-instruct questions: lists of questions the target writes, then answers each one "
                        "(default: %(default)s, off)")
    g.add_argument("--feature-layers", default="auto",
                   help="target layers whose outputs the head reads besides the last layer's features, fused "
                        "as in EAGLE-3: `auto` (a low, a middle and a high layer), comma-separated indices, or "
                        "`none` (the last layer's features alone, EAGLE-1) (default: %(default)s)")
    t = p.add_argument_group("training")
    t.add_argument("--steps", type=positive_int, default=600)
    t.add_argument("--batch-size", type=positive_int, default=8)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--unroll", type=positive_int, default=2, help="drafting steps simulated in training (default: %(default)s)")
    t.add_argument("--draft-vocab", type=positive_int, default=8192, help="LM head rows the head may draft")
    t.add_argument("--eval-every", type=positive_int, default=100)
    t.add_argument("--max-len", type=positive_int, default=512, help="tokens per training text (longer ones are cut)")
    t.add_argument("--val-examples", type=positive_int, default=24, help="held-out answers (at most a fifth of them)")
    t.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from specdec.drafters.head import parse_feature_layers
    from specdec.errors import InvalidRequestError
    from specdec.models.loader import load_model
    from specdec.train.data import DataConfig
    from specdec.train.pipeline import default_data_dir, train_draft
    from specdec.train.trainer import TrainConfig

    if args.arch == "eagle3" and args.out.endswith(".safetensors"):
        raise InvalidRequestError(f"--arch eagle3 writes a checkpoint directory (config.json, model.safetensors): "
                                  f"pass --out DIR, not {args.out}")
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_model(args.target, device=args.device, dtype=args.dtype, backend="hf")  # needs HF generate()
    layers = parse_feature_layers(args.feature_layers, target.model.model.config.num_hidden_layers)
    data_config = DataConfig(num_prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                             batch_size=args.gen_batch, top_k=args.top_k_probs, seed=args.seed,
                             source_texts=args.source_texts, followups=args.followups, feature_layers=layers,
                             question_lists=args.question_lists)
    train_config = TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, unroll=args.unroll,
                               draft_vocab=args.draft_vocab, eval_every=args.eval_every,
                               val_examples=args.val_examples, max_len=args.max_len, seed=args.seed)
    data_dir = Path(args.data_dir) if args.data_dir else default_data_dir(args.target, layers)
    summary = train_draft(target, Path(args.out), data_dir, data_config, train_config,
                          progress=not args.no_progress, arch=args.arch)
    last = summary["history"][-1] if summary["history"] else {}
    print(json.dumps({"out": args.out, "answers": summary["answers"], "answer_tokens": summary["answer_tokens"],
                      "val_greedy_agreement": last.get("val_greedy_agreement")}))
    return 0

