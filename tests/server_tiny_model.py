"""A tiny random Llama target and draft saved as model directories, with a small word-level tokenizer.

The server loads models by directory (like a user would), so its tests need real directories with a
tokenizer and a chat template; random weights keep every request a few milliseconds long. Sharp
logits (a scaled lm_head) and a draft that is a copy of the target with noise give acceptance rates
well between 0 and 1, so every token origin shows up.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, decoders
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

WORDS = (
    "the a draft target token round accepted recovered bonus model fast slow cat dog runs jumps over "
    "under and or not is was to of in on with for speculative decoding exact guess check keep replace "
    "hello world what why how one two three four five six seven eight nine ten yes no maybe"
).split()
SPECIALS = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)
CONTEXT = 160  # small on purpose: "prompt longer than the context" is easy to hit in tests


def build_tokenizer() -> PreTrainedTokenizerFast:
    """Whitespace word-level tokenizer: every word above is one token, anything else is <unk>."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + WORDS + list(".,?!"))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.Punctuation()])
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces, like text
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", additional_special_tokens=SPECIALS[3:])
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _llama(seed: int, vocab: int, layers: int, scale: float) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=CONTEXT,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(config).float()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return model


def build_tiny_models(root: str | Path) -> tuple[Path, Path]:
    """Write target/ and draft/ under root (once; later calls reuse them). Returns (target, draft)."""
    root = Path(root)
    target_dir, draft_dir = root / "target", root / "draft"
    if (draft_dir / "config.json").exists():
        return target_dir, draft_dir
    tokenizer = build_tokenizer()
    vocab = len(tokenizer)
    target = _llama(0, vocab, layers=2, scale=6.0)
    draft = _llama(0, vocab, layers=2, scale=6.0)
    with torch.no_grad():  # the draft: the target plus noise, so it agrees often but not always
        for p in draft.parameters():
            p.add_(0.004 * torch.randn_like(p))
    for model, path in ((target, target_dir), (draft, draft_dir)):
        model.generation_config.eos_token_id = 2
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return target_dir, draft_dir


if __name__ == "__main__":
    import sys

    print(build_tiny_models(sys.argv[1] if len(sys.argv) > 1 else "/tmp/specdec-tiny"))


# ---- a real `specdec serve` process, shared by every server test of one pytest run ---------------

_SERVERS: dict[tuple, "ServerProcess"] = {}


class ServerProcess:
    """`specdec serve` on 127.0.0.1 at a free port; `url` is its base URL."""

    def __init__(self, args: list[str], log_path: Path, launcher: tuple[str, ...] = ("-m", "specdec.cli")):
        import socket
        import subprocess
        import sys

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        cmd = [sys.executable, *launcher, "serve", "--host", "127.0.0.1", "--port", str(self.port),
               "--log-level", "warning", *args]
        # One thread: tiny models gain nothing from more, and on a busy 2-core machine OpenMP threads
        # that spin against each other make every forward pass 20x slower.
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(cmd, stdout=log_path.open("w"), stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout: float = 180.0) -> "ServerProcess":
        import time

        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited early:\n{self.log_path.read_text()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"server not ready in {timeout}s:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except Exception:  # noqa: BLE001
                self.proc.kill()


def tiny_root() -> Path:
    import tempfile

    return Path(tempfile.gettempdir()) / "specdec-server-tiny-v1"


def shared_server(*extra: str) -> ServerProcess:
    """The tiny target + draft served once per pytest process (stopped at exit)."""
    import atexit

    key = tuple(extra)
    if key not in _SERVERS:
        target, draft = build_tiny_models(tiny_root())
        args = ["--target", str(target), "--draft", str(draft), "-k", "4", "--served-model-name", "tiny", *extra]
        log = tiny_root() / f"server-{len(_SERVERS)}.log"
        _SERVERS[key] = ServerProcess(args, log).wait_ready()
        atexit.register(_SERVERS[key].stop)
    return _SERVERS[key]


@contextmanager
def torch_threads(n: int):
    """Run a block with n torch threads (then restore): in-process generation beside the server."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


TREE_SHAPE = "3x2"  # depth 3, two children a node: small trees with siblings to settle


def tree_server() -> ServerProcess:
    """The tiny pair served with the draft model drafting trees of TREE_SHAPE, 6 nodes every round
    (a fixed K: every round is a tree round, and a seed draws the same sample again)."""
    _, draft = build_tiny_models(tiny_root())
    return shared_server("--draft", f"tree:{TREE_SHAPE}:{draft}", "--speculation", "6")
