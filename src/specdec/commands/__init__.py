"""Subcommands of the `specdec` CLI and the flags they share."""

from __future__ import annotations

import argparse
import json


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def json_object(text: str) -> dict:
    """An argparse type: a JSON object given on the command line (extra request fields)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object like '{\"draft\": \"none\"}'")
    return value


def add_model_flags(parser: argparse.ArgumentParser, draft_default: str | None = None) -> None:
    """--target, --draft (default: DEFAULT_DRAFT, the same for generate and serve), --device, --dtype, --backend."""
    from specdec.drafters.registry import DEFAULT_DRAFT, draft_help

    parser.add_argument("--target", default="default",
                        help="target model: `default` (embedded SmolLM2-135M), a hub id, a directory, a .gguf, or "
                             "`random:SIZE` (random weights at a real size, e.g. random:llama-3.1-8b, with a "
                             "stand-in byte-level tokenizer: for engine and server benchmarks, not for text)")
    parser.add_argument("--draft", default=draft_default or DEFAULT_DRAFT,
                        help=f"draft: {draft_help()} (default: %(default)s)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--dtype", default=None, help="fp32, bf16 or fp16 (default: bf16 on cuda, fp32 on cpu; bf16 on a "
                        "CPU with bf16 units makes verify passes of up to 8 tokens cost little more than one step)")
    parser.add_argument("--backend", choices=("auto", "native", "hf"), default="auto",
                        help="model code: native (fast Llama family: static cache, CUDA graphs), hf (any "
                             "transformers model), auto (native for supported models on CUDA, and on a CPU in "
                             "fp32, or in bf16 where the CPU has bf16 units) (default: %(default)s)")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="CPU threads for torch (default: $OMP_NUM_THREADS if set, else the cores this process "
                             "may use less those other processes keep busy now, at least 1)")


def add_tensor_parallel_flag(parser: argparse.ArgumentParser) -> None:
    """--tensor-parallel-size: the target sharded over N ranks, started by the command (docs/parallel.md)."""
    parser.add_argument("--tensor-parallel-size", type=positive_int, default=1, dest="tensor_parallel_size",
                        help="shard the native target over N processes (one GPU each on CUDA; gloo on a CPU), "
                             "started and stopped by this command; N must divide its KV heads and FFN width "
                             "(default: %(default)s)")


def add_k_flag(parser: argparse.ArgumentParser, default: int = 4, note: str = "") -> None:
    """-k/--num-draft-tokens, the same flag in every command that drafts."""
    parser.add_argument("-k", "--num-draft-tokens", type=positive_int, default=default, dest="k",
                        help=f"K, draft tokens per round{note} (default: %(default)s)")


def add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    add_k_flag(parser)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0: off)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1: off)")
    parser.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p * max prob (0: off)")
    parser.add_argument("--seed", type=int, default=None, help="seed for reproducible sampling")


def sampling_params(args: argparse.Namespace):
    from specdec.sampling import SamplingParams

    return SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                          min_p=args.min_p, seed=args.seed)
