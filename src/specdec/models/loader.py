"""Resolve a model name to weights and a tokenizer, and wrap it in a backend."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from specdec.errors import ModelLoadError, UnsupportedHereError
from specdec.models import default as default_model
from specdec.models import random_weights
from specdec.models.base import CausalLM
from specdec.models.hf import HFCausalLM

DEFAULT = "default"


@dataclass
class LoadedModel:
    model: CausalLM
    tokenizer: PreTrainedTokenizerBase
    name: str


def pick_device(device: str | None = None) -> torch.device:
    if device:
        return torch.device(device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def pick_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    if dtype:
        try:
            return {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
                    "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}[dtype]
        except KeyError:
            raise ModelLoadError(f"unknown dtype {dtype!r}; use fp32, bf16 or fp16") from None
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def resolve(name: str) -> tuple[str, dict]:
    """Map a user's model name to (from_pretrained location, extra kwargs)."""
    if name == DEFAULT:
        return str(default_model.prepared_dir()), {}
    path = Path(name).expanduser()
    if name.endswith(".gguf"):
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {name}")
        return str(path.parent), {"gguf_file": path.name}
    if path.exists() and not path.is_dir():
        raise ModelLoadError(f"{name} is a file but not a .gguf; give a model directory, a .gguf file or a hub id")
    if not path.exists():
        if name.startswith(("/", ".", "~")) or name.count("/") > 1:
            raise ModelLoadError(f"model path not found: {name}")
        _check_hub_id(name)
    return name, {}


def _check_hub_id(name: str) -> None:
    """Fail fast, with a plain message, when a hub id is neither cached nor downloadable.

    Without this, an unreachable hub costs a minute of retries before transformers gives up.
    """
    import os
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants, try_to_load_from_cache

    if isinstance(try_to_load_from_cache(name, "config.json"), str):
        return
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false"):
        raise ModelLoadError(f"unknown model {name!r}: not a local path, and not in the hub cache (offline mode)")
    host = urlparse(constants.ENDPOINT).hostname or ""
    try:
        socket.create_connection((host, 443), timeout=3).close()
    except OSError:
        raise ModelLoadError(f"unknown model {name!r}: not a local path, not in the hub cache, and the "
                             f"hub ({host}) cannot be reached to download it") from None


BACKENDS = ("auto", "native", "hf")


def load_model(name: str, device: str | None = None, dtype: str | None = None, backend: str = "auto",
               megakernel: bool = False) -> LoadedModel:
    """Load a target or draft: `default`, a hub id (from the local cache), a directory, a .gguf file,
    or `random:SIZE` (random weights at a real size, for engine benchmarks: random_weights.py).

    backend: `native` (the fast Llama-family model), `hf` (any transformers model) or `auto`
    (native for supported Llama-family architectures, hf otherwise). On a CPU native needs fp32 and
    oneDNN (its prepacked matrices are what make it faster there); auto falls back to hf without them.
    megakernel: a draft's single-token steps as one CUDA kernel (native backend, Hopper, bf16).
    """
    if backend not in BACKENDS:
        raise ModelLoadError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    dev = pick_device(device)
    if random_weights.is_random(name):
        return random_weights.load_random(name, dev, pick_dtype(dtype, dev), backend, megakernel)
    location, extra = resolve(name)
    hf_logging.disable_progress_bar()  # a bar per load would bury the command's own output
    try:
        tokenizer = AutoTokenizer.from_pretrained(location, **extra)
        hf = AutoModelForCausalLM.from_pretrained(location, dtype=pick_dtype(dtype, dev), **extra)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelLoadError(
            f"could not load model {name!r}: {str(exc).splitlines()[0]}. Give `default`, a local "
            "model directory, a .gguf file, or a hub id that is already in the local cache."
        ) from None
    display = default_model.DISPLAY_NAME if name == DEFAULT else name
    return LoadedModel(wrap_backend(hf.to(dev), display, backend, megakernel), tokenizer, display)


def wrap_backend(hf, name: str, backend: str = "auto", megakernel: bool = False) -> CausalLM:
    """The native backend for supported Llama-family models (unless `hf` is asked for), else HFCausalLM;
    with megakernel, the native backend whose single-token steps run as models/megakernel.py."""
    from specdec.models.llama_config import unsupported_reason
    from specdec.models.cpu_matrix import packs_on_cpu

    reason = unsupported_reason(hf.config)
    if backend == "auto":
        fast_here = hf.device.type == "cuda" or packs_on_cpu(hf.dtype)
        backend = "native" if fast_here and not reason else "hf"
    if megakernel and backend == "hf":
        raise UnsupportedHereError(f"the megakernel runs specdec's native Llama-family model, and {name!r} runs on "
                             f"transformers here ({reason or 'the hf backend'}); drop megakernel: from the draft")
    if backend == "hf":
        return HFCausalLM(hf, name)
    if reason:
        raise ModelLoadError(f"--backend native cannot run {name!r}: {reason}; use --backend hf or auto")
    from specdec.models.native_llama import NativeLlama

    try:
        return NativeLlama.from_hf(hf, name, megakernel=megakernel)  # a cache of min(4096, the model's context)
    except ValueError as exc:  # what the megakernel cannot run here (no Hopper GPU, bf16, shape)
        if not megakernel:
            raise
        raise UnsupportedHereError(f"draft {name!r}: {exc}; drop megakernel: from the draft") from None


def same_vocabulary(target: LoadedModel, draft: LoadedModel) -> bool:
    """Whether the draft's tokenizer maps text to the target's ids (else its ids must be mapped:
    specdec.drafters.cross_tokenizer)."""
    return target.tokenizer.get_vocab() == draft.tokenizer.get_vocab()
