"""Random-weight models at real sizes, loadable by name (`random:llama-3.1-8b`), for engine benchmarks.

Random weights give honest timings of the engine, the server and the kernels at a real shape, and
nothing else: their text is noise, and a real draft would agree with them by chance only (the
oracle drafter, drafters/oracle.py, sets acceptance instead). Every name they carry says "random
weights", so that no number taken on them passes for a real model's.

They need a tokenizer to serve text. The machines that run them hold no model files, so the
stand-in is built in code: byte-level (every byte of a prompt is one token, as in a byte-level BPE
with no merges), three ChatML special tokens and a ChatML chat template, and filler tokens up to
the model's vocabulary (id i decodes to " w{i}"), so that every id the model can emit decodes to
text. Prompt token counts are therefore about one per character, more than a real tokenizer's.
"""

from __future__ import annotations

import functools

import torch

from specdec.errors import ModelLoadError, UnsupportedHereError

PREFIX = "random:"
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2; the last ends a turn (EOS)
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LONGEST_CONTEXT = 4096  # positions the model's own cache holds (as loader.wrap_backend's native models)


def is_random(name: str) -> bool:
    return name.startswith(PREFIX)


def size_of(name: str) -> str:
    """`random:SIZE` -> SIZE, refused with the known sizes when there is no such size."""
    from specdec.models.llama_config import NAMED_SIZES

    size = name[len(PREFIX):]
    if size not in NAMED_SIZES:
        raise ModelLoadError(f"unknown random-weight size {size!r} in {name!r}; known: "
                             f"{', '.join(PREFIX + s for s in NAMED_SIZES)}")
    return size


def display_name(size: str) -> str:
    return f"{size} (random weights)"


def load_random(name: str, device: torch.device, dtype: torch.dtype, backend: str = "auto",
                megakernel: bool = False, seed: int = 0):
    """A LoadedModel: NativeLlama.random at `random:SIZE` with the stand-in tokenizer. seed: the
    weights' (the same seed, the same weights, as bench gpu's)."""
    from specdec.models.llama_config import named_arch
    from specdec.models.loader import LoadedModel
    from specdec.models.native_llama import NativeLlama

    size = size_of(name)
    if backend == "hf":
        raise UnsupportedHereError(f"{name} runs on the native backend only; drop --backend hf")
    arch = named_arch(size)
    try:
        model = NativeLlama.random(size, device=device, dtype=dtype, seed=seed, megakernel=megakernel,
                                   max_length=min(LONGEST_CONTEXT, arch.max_position))
    except ValueError as exc:  # what the megakernel cannot run here
        raise UnsupportedHereError(f"{name}: {exc}") from None
    model.name = display_name(size)
    return LoadedModel(model, standin_tokenizer(arch.vocab_size), model.name)


@functools.lru_cache(maxsize=4)
def standin_tokenizer(vocab_size: int):
    """The byte-level stand-in tokenizer of vocab_size ids (see the module docstring). Cached: a
    target and its draft of one vocabulary share one (and same_vocabulary agrees)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())  # the 256 characters that stand for bytes
    if vocab_size < len(SPECIALS) + len(alphabet):
        raise ModelLoadError(f"a vocabulary of {vocab_size} cannot hold the stand-in tokenizer's "
                             f"{len(SPECIALS) + len(alphabet)} special and byte tokens")
    vocab = {token: i for i, token in enumerate((*SPECIALS, *alphabet))}
    vocab.update({f"\u0120w{i}": i for i in range(len(vocab), vocab_size)})  # \u0120: a space, byte-level
    inner = Tokenizer(models.BPE(vocab, []))  # no merges: one token a byte
    inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    inner.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=inner, eos_token=SPECIALS[2], pad_token=SPECIALS[0],
                                        additional_special_tokens=list(SPECIALS))
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
