"""Tiny random models saved as directories, so that commands taking `--target DIR` run in tests.

`tiny_model_dir(path, seed)` writes a LlamaForCausalLM with a few thousand weights and a word-level
tokenizer (with a chat template) that `specdec.models.loader.load_model(str(path))` loads like any
local model. Two directories made with the same `words` share a vocabulary: a target/draft pair.
"""

from __future__ import annotations

from pathlib import Path

import torch

SPECIAL = ["<unk>", "<s>", "</s>", "<user>", "<assistant>"]
WORDS = (
    "the a an of to and in is it that for on with as was at by be this from or are which "
    "you your we our they he she his her i me my what how why when where who can will do "
    "write short story about cat dog sun moon sea tree house city code function variable "
    "rename edit text answer question summary translate please one two three four five "
    ". , ? ! : ; ( ) = + - * / \" '"
).split()
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<assistant> {% endif %}"
)


def tiny_tokenizer(words: list[str] = WORDS):
    """A word-level fast tokenizer: whitespace/punctuation split, unknown words map to <unk>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(SPECIAL + [w for w in words if w not in SPECIAL])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(SPECIAL)  # matched before the split, so the chat markers stay whole
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_model_dir(path: str | Path, seed: int = 0, layers: int = 2, hidden: int = 32,
                   scale: float = 8.0, words: list[str] = WORDS, tokenizer=None) -> Path:
    """Save a tiny random Llama and its tokenizer (tiny_tokenizer(words) unless given) under `path`;
    returns the directory."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    tokenizer = tokenizer or tiny_tokenizer(words)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, tie_word_embeddings=False,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # sharper logits than the default init, so that tokens differ in probability
        model.lm_head.weight.mul_(scale)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def run_bench(argv: list[str], out_dir: Path) -> tuple[int, dict]:
    """Run `specdec bench ...` through the CLI entry point; returns (exit code, the JSON it saved)."""
    import json

    from specdec.cli import main

    # One thread: tiny matmuls gain nothing from more, and a busy CPU makes OpenMP barriers very slow.
    code = main(["bench", *argv, "--threads", "1", "--out-dir", str(out_dir),
                 "--scoreboard", str(out_dir / "SCOREBOARD.md")])
    saved = sorted(Path(out_dir).glob(f"{argv[0]}-*.json"))
    return code, (json.loads(saved[-1].read_text()) if saved else {})


def assert_png(path: str | Path) -> None:
    data = Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"


def scoreboard_rows(out_dir: Path) -> list[str]:
    board = Path(out_dir) / "SCOREBOARD.md"
    return [line for line in board.read_text().splitlines() if line.startswith("| 20")] if board.exists() else []


def default_tokenizer_random_llama():
    """The embedded model's tokenizer and a tiny random Llama over its vocabulary (seed 0): a fast
    stand-in target for the draft-head data pipeline, which needs a real chat template."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from specdec.models import default as default_model

    tokenizer = AutoTokenizer.from_pretrained(str(default_model.prepared_dir()))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    return tokenizer, LlamaForCausalLM(config).eval()


def spec_bench_questions() -> set[str]:
    """Every turn of the bundled Spec-Bench questions (the test set that training data must avoid)."""
    import json

    from specdec.bench.specbench import QUESTIONS

    return {turn for line in QUESTIONS.read_text().splitlines() if line.strip()
            for turn in json.loads(line)["turns"]}
