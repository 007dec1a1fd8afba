"""Shape and numerics of a Llama-family model (Llama 2/3.x, Mistral, Qwen2, SmolLM), read from a
Hugging Face config or picked by name at a real size (random weights, for benchmarks).

The native backend supports exactly what this config can describe; `unsupported_reason` says
why any other model stays on the generic backend.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

SUPPORTED_TYPES = ("llama", "mistral", "qwen2")


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1's frequency-dependent stretch of RoPE (long wavelengths slowed by `factor`)."""

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


@dataclass(frozen=True)
class LlamaArch:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    intermediate: int
    head_dim: int = 0  # 0: dim // n_heads
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: Llama3RopeScaling | None = None
    tie_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 (and Llama with attention_bias) add a bias to q, k and v
    out_bias: bool = False  # Llama with attention_bias also biases the output projection
    max_position: int = 8192

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{self.n_heads} query heads do not split into {self.n_kv_heads} KV groups")

    @property
    def group(self) -> int:
        """Query heads per KV head (grouped-query attention)."""
        return self.n_heads // self.n_kv_heads

    def num_params(self) -> int:
        hd, d = self.head_dim, self.dim
        attn = d * hd * (self.n_heads * 2 + self.n_kv_heads * 2)
        layer = attn + 3 * d * self.intermediate + 2 * d
        embed = self.vocab_size * d * (1 if self.tie_embeddings else 2)
        return self.n_layers * layer + embed + d

    def rope_inv_freq(self) -> torch.Tensor:
        """[head_dim // 2] fp32 angular frequencies, with Llama-3 scaling when configured."""
        exponents = torch.arange(0, self.head_dim, 2, dtype=torch.int64).float() / self.head_dim
        inv_freq = 1.0 / (self.rope_theta ** exponents)
        s = self.rope_scaling
        if s is None:
            return inv_freq
        wavelen = 2 * math.pi / inv_freq
        low_wavelen = s.original_max_position / s.low_freq_factor
        high_wavelen = s.original_max_position / s.high_freq_factor
        # Long wavelengths are divided by factor, short ones kept, the band between blended smoothly.
        scaled = torch.where(wavelen > low_wavelen, inv_freq / s.factor, inv_freq)
        smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
        blended = (1 - smooth) * scaled / s.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, blended, scaled)

    def to_hf(self):
        """The equivalent transformers LlamaConfig (for comparing against the generic backend)."""
        from transformers import LlamaConfig

        rope = {"rope_type": "default", "rope_theta": self.rope_theta}
        if self.rope_scaling is not None:
            s = self.rope_scaling
            rope = {"rope_type": "llama3", "rope_theta": self.rope_theta, "factor": s.factor,
                    "low_freq_factor": s.low_freq_factor, "high_freq_factor": s.high_freq_factor,
                    "original_max_position_embeddings": s.original_max_position}
        return LlamaConfig(
            vocab_size=self.vocab_size, hidden_size=self.dim, num_hidden_layers=self.n_layers,
            num_attention_heads=self.n_heads, num_key_value_heads=self.n_kv_heads,
            intermediate_size=self.intermediate, head_dim=self.head_dim, rms_norm_eps=self.norm_eps,
            rope_parameters=rope, rope_scaling=rope, rope_theta=self.rope_theta,
            tie_word_embeddings=self.tie_embeddings, attention_bias=self.qkv_bias,
            max_position_embeddings=self.max_position,
        )


_LLAMA3_ROPE = Llama3RopeScaling(factor=32.0)  # Llama 3.2's values (3.1 uses factor 8)
NAMED_SIZES: dict[str, LlamaArch] = {
    "llama-3.1-8b": LlamaArch(vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                              intermediate=14336, rope_theta=500000.0,
                              rope_scaling=Llama3RopeScaling(factor=8.0), max_position=131072),
    "llama-3.2-1b": LlamaArch(vocab_size=128256, dim=2048, n_layers=16, n_heads=32, n_kv_heads=8,
                              intermediate=8192, rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE,
                              tie_embeddings=True, max_position=131072),
    "llama-2-7b": LlamaArch(vocab_size=32000, dim=4096, n_layers=32, n_heads=32, n_kv_heads=32,
                            intermediate=11008, max_position=4096),
    "smollm2-135m": LlamaArch(vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3,
                              intermediate=1536, rope_theta=100000.0, tie_embeddings=True),
    # Not a real model: a Llama small enough for tests and smoke runs on a CPU (`random:llama-tiny`).
    "llama-tiny": LlamaArch(vocab_size=384, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, intermediate=128,
                            max_position=1024),
}


def named_arch(name: str, **overrides) -> LlamaArch:
    try:
        return replace(NAMED_SIZES[name], **overrides)
    except KeyError:
        raise ValueError(f"unknown model size {name!r}; known: {', '.join(NAMED_SIZES)}") from None


def _rope_params(config) -> dict:
    # transformers 5 keeps rope settings in `rope_parameters`; 4.x in `rope_scaling` + `rope_theta`.
    params = dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})
    params.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    params.setdefault("rope_type", params.get("type", "default"))
    return params


def unsupported_reason(config) -> str | None:
    """None if the native backend computes exactly what transformers does for this config."""
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED_TYPES:
        return f"model type {kind!r} is not one of {', '.join(SUPPORTED_TYPES)}"
    rope_type = _rope_params(config)["rope_type"]
    if rope_type not in ("default", "llama3"):
        return f"RoPE type {rope_type!r} is not supported"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} is not SwiGLU"
    if getattr(config, "mlp_bias", False):
        return "MLP biases are not supported"
    window = getattr(config, "sliding_window", None)
    if kind == "mistral" and window and window < config.max_position_embeddings:
        return f"sliding-window attention ({window}) is not supported"
    if kind == "qwen2" and getattr(config, "use_sliding_window", False):
        return "sliding-window attention is not supported"
    return None


def arch_from_hf(config) -> LlamaArch:
    """Read a transformers config of a supported model (check unsupported_reason first)."""
    reason = unsupported_reason(config)
    if reason:
        raise ValueError(reason)
    rope = _rope_params(config)
    scaling = None
    if rope["rope_type"] == "llama3":
        scaling = Llama3RopeScaling(float(rope["factor"]), float(rope["low_freq_factor"]),
                                    float(rope["high_freq_factor"]), int(rope["original_max_position_embeddings"]))
    heads = config.num_attention_heads
    return LlamaArch(
        vocab_size=config.vocab_size, dim=config.hidden_size, n_layers=config.num_hidden_layers,
        n_heads=heads, n_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
        intermediate=config.intermediate_size,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
        norm_eps=config.rms_norm_eps, rope_theta=float(rope["rope_theta"]), rope_scaling=scaling,
        tie_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        qkv_bias=config.model_type == "qwen2" or bool(getattr(config, "attention_bias", False)),
        out_bias=config.model_type != "qwen2" and bool(getattr(config, "attention_bias", False)),
        max_position=config.max_position_embeddings,
    )
