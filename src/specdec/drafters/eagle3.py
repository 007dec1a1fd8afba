"""EAGLE-3 draft heads, in the checkpoint layout that SpecForge trains and SGLang and vLLM load.

An EAGLE-3 head reads, at position i, the outputs of three target layers (a low, a middle and a high
one) fused by `fc` into one feature g_i [D], and the embedding e of the token that followed. Its one
decoder layer attends over concat(input_layernorm(e), hidden_norm(g)) [2D] with g as its residual
stream; its own final norm and LM head over a reduced draft vocabulary give the next-token logits,
and the layer's output before that norm is the feature the next draft step reads in place of g (the
head feeds on its own predictions, and is trained so: training-time test).

The layout, a directory:
- config.json: `architectures: ["LlamaForCausalLMEagle3"]`, the Llama sizes of the one layer
  (`num_hidden_layers: 1`), `vocab_size` (the target's), `draft_vocab_size` N, and
  `eagle_config.eagle_aux_hidden_state_layer_ids`: the target layers read, each id naming the
  output of that 0-based layer, as SpecForge and SGLang count and as specdec's feature layers do
  (vLLM counts one higher: its id j is the input of layer j). Without ids, SGLang's default:
  the inputs of layers 2, L/2 and L-3, i.e. the outputs of layers 1, L/2-1 and L-4.
- model.safetensors (or pytorch_model.bin): `fc.weight` [D, 3D]; `midlayer.input_layernorm`,
  `midlayer.hidden_norm`, `midlayer.post_attention_layernorm` and `norm` (`.weight` [D]);
  `midlayer.self_attn.{q,k,v}_proj.weight` [*, 2D], `midlayer.self_attn.o_proj.weight`;
  `midlayer.mlp.{gate,up,down}_proj.weight`; `lm_head.weight` [N, D]; `d2t` [N] int64 (draft id j
  is target id j + d2t[j]); `t2d` [V] bool (whether a target id is drafted); optionally
  `embed_tokens.weight` [V, D], else the head reads the target's embeddings.

Exactness does not depend on any of this: the head's tokens are verified by the target like any draft.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from specdec.drafters.head import HeadConfig, HeadLayer, TargetParts, write_weights
from specdec.drafters.head_policy import HeadCard, HeadPolicy, card_metadata
from specdec.errors import ModelLoadError
from specdec.models.llama_net import rms_norm

ARCHITECTURE = "LlamaForCausalLMEagle3"
WEIGHTS = "model.safetensors"

# checkpoint name -> Eagle3Head parameter
NAMES = {
    "fc.weight": "fc.weight",
    "midlayer.input_layernorm.weight": "layer.attn_norm",
    "midlayer.hidden_norm.weight": "hidden_norm",
    "midlayer.self_attn.q_proj.weight": "layer.q.weight",
    "midlayer.self_attn.k_proj.weight": "layer.k.weight",
    "midlayer.self_attn.v_proj.weight": "layer.v.weight",
    "midlayer.self_attn.o_proj.weight": "layer.o.weight",
    "midlayer.post_attention_layernorm.weight": "layer.mlp_norm",
    "midlayer.mlp.gate_proj.weight": "layer.gate.weight",
    "midlayer.mlp.up_proj.weight": "layer.up.weight",
    "midlayer.mlp.down_proj.weight": "layer.down.weight",
    "norm.weight": "norm",
    "lm_head.weight": "lm_head.weight",
}


class Eagle3Head(nn.Module):
    """The EAGLE-3 head (module doc), with the same contract as head.DraftHead: layer_inputs, carry,
    readout, lm_rows, embedding, vocab_ids [N] (the target ids of the draft vocabulary, ascending)."""

    predicts_features = False  # its carried feature is its own (pre-norm), with no target to regress on

    def __init__(self, config: HeadConfig, vocab_ids: torch.Tensor | None = None,
                 embed: torch.Tensor | None = None):
        super().__init__()
        if len(config.feature_layers) < 1:
            raise ValueError("an EAGLE-3 head reads at least one target layer (feature_layers)")
        self.config = config
        d = config.hidden
        self.fc = nn.Linear(len(config.feature_layers) * d, d, bias=False)
        self.layer = HeadLayer(config, in_width=2 * d)
        self.hidden_norm = nn.Parameter(torch.ones(d))
        self.norm = nn.Parameter(torch.ones(d))
        self.lm_head = nn.Linear(d, config.draft_vocab, bias=False)
        ids = vocab_ids if vocab_ids is not None else torch.arange(config.draft_vocab)
        self.register_buffer("vocab_ids", ids.long().clone())  # [N]
        self.register_buffer("embed_tokens", embed, persistent=False)  # [V, D] or None: the target's

    def initialise_from(self, parts: TargetParts) -> "Eagle3Head":
        """A starting point for training: the target's final norm and LM-head rows, and fc passing the
        highest layer read through (EAGLE-3 trains all of them; the target's embeddings stay frozen)."""
        d = self.config.hidden
        with torch.no_grad():
            self.norm.copy_(parts.norm_weight.float())
            self.lm_head.weight.copy_(parts.lm_head[self.vocab_ids.to(parts.lm_head.device)].float())
            self.fc.weight.zero_()
            self.fc.weight[:, -d:] = torch.eye(d)
        return self

    def layer_inputs(self, feats: torch.Tensor, embeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """feats [B, T, feature_width] (the target's: the layers read, then the final-norm feature, which
        this head does not use) or [B, T, D] (its own carried feature), embeds [B, T, D] -> (the
        residual stream x [B, T, D], the attention's input [B, T, 2D])."""
        d, eps = self.config.hidden, self.config.norm_eps
        x = feats if feats.shape[-1] == d else self.fc(feats[..., :-d])
        return x, torch.cat([rms_norm(embeds, self.layer.attn_norm, eps), rms_norm(x, self.hidden_norm, eps)], -1)

    def carry(self, out: torch.Tensor, parts: TargetParts) -> torch.Tensor:
        """The layer's output [.., D] is the next step's feature as it is (before the final norm)."""
        return out

    def readout(self, h: torch.Tensor) -> torch.Tensor:
        """A carried feature [.., D] -> its own final norm, what its LM head reads."""
        return rms_norm(h, self.norm, self.config.norm_eps)

    def lm_rows(self, parts: TargetParts) -> torch.Tensor:
        return self.lm_head.weight  # [N, D], its own

    def embedding(self, parts: TargetParts) -> torch.Tensor:
        return parts.embed if self.embed_tokens is None else self.embed_tokens

    def save(self, path: str | Path, meta: dict | None = None, card: HeadCard | None = None,
             max_positions: int = 8192) -> None:
        """The directory `path` in the EAGLE-3 layout (bf16), the card (target identity, draft policy)
        and `meta` in the weights file's metadata, which other loaders ignore."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(checkpoint_config(self.config, max_positions), indent=2) + "\n")
        own = self.state_dict()
        tensors = {name: own[ours].to(torch.bfloat16).contiguous() for name, ours in NAMES.items()}
        ids = self.vocab_ids.cpu()
        tensors["d2t"] = (ids - torch.arange(len(ids))).contiguous()
        tensors["t2d"] = torch.zeros(self.config.vocab_size, dtype=torch.bool).index_fill_(0, ids, True)
        info = {"format": "pt", "meta": json.dumps(meta or {}), **card_metadata(card or HeadCard(None, HeadPolicy()))}
        write_weights(out / WEIGHTS, tensors, info)


def checkpoint_config(c: HeadConfig, max_positions: int = 8192) -> dict:
    """config.json of an EAGLE-3 head of config c (the module doc's fields)."""
    return {"architectures": [ARCHITECTURE], "model_type": "llama", "hidden_act": "silu",
            "hidden_size": c.hidden, "intermediate_size": c.intermediate, "num_attention_heads": c.num_heads,
            "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "num_hidden_layers": 1,
            "rms_norm_eps": c.norm_eps, "rope_theta": c.rope_theta, "max_position_embeddings": max_positions,
            "vocab_size": c.vocab_size, "draft_vocab_size": c.draft_vocab, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(c.feature_layers), "use_aux_hidden_state": True}}


def is_eagle3_dir(path: str | Path) -> bool:
    """Whether `path` is a directory holding an EAGLE-3 checkpoint (its config.json names one)."""
    config = Path(path).expanduser() / "config.json"
    if not config.is_file():
        return False
    try:
        architectures = json.loads(config.read_text()).get("architectures") or []
    except (OSError, ValueError):
        return False
    return any("eagle3" in str(a).lower() for a in architectures)


def weight_files(path: Path) -> list[Path]:
    """The files holding an EAGLE-3 directory's weights: its safetensors, else pytorch_model.bin."""
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("pytorch_model*.bin"))
    if not files:
        raise ModelLoadError(f"the EAGLE-3 head {path} has config.json but no *.safetensors or pytorch_model.bin")
    return files


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's weight files, by checkpoint name (a leading `model.` dropped)."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for file in weight_files(path):
        part = load_file(str(file)) if file.suffix == ".safetensors" else torch.load(file, map_location="cpu",
                                                                                     weights_only=True)
        tensors.update({name.removeprefix("model."): t for name, t in part.items()})
    return tensors


def aux_layers(config: dict, target_layers: int | None) -> tuple[int, ...]:
    """The target layers the head reads, as outputs of 0-based layers (module doc)."""
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if ids:
        return tuple(int(i) for i in ids)
    if config.get("eagle_aux_hidden_state_layer_ids"):  # vLLM's top-level key counts inputs of layers
        return tuple(int(i) - 1 for i in config["eagle_aux_hidden_state_layer_ids"])
    if target_layers is None:
        raise ModelLoadError("this EAGLE-3 head names no target layers (eagle_config.eagle_aux_hidden_state_"
                             "layer_ids) and the target's layer count is unknown")
    return (1, target_layers // 2 - 1, target_layers - 4)


def head_config_of(config: dict, target_layers: int | None = None) -> HeadConfig:
    """An EAGLE-3 config.json -> the HeadConfig of its head (ModelLoadError for one specdec cannot run)."""
    try:
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        vocab = int(config["vocab_size"])
        rope = config.get("rope_parameters") or {}
        c = HeadConfig(hidden=hidden, num_heads=heads, num_kv_heads=int(config.get("num_key_value_heads", heads)),
                       intermediate=int(config["intermediate_size"]), vocab_size=vocab,
                       draft_vocab=int(config.get("draft_vocab_size") or vocab),
                       rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
                       norm_eps=float(config.get("rms_norm_eps", 1e-5)),
                       feature_layers=aux_layers(config, target_layers), arch="eagle3")
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"an EAGLE-3 config.json without a usable {exc}") from None
    unsupported = [what for what, bad in (
        ("more than one decoder layer", int(config.get("num_hidden_layers", 1)) != 1),
        ("a target hidden size other than its own", int(config.get("target_hidden_size") or hidden) != hidden),
        ("a head_dim other than hidden_size / num_attention_heads", int(config.get("head_dim") or c.head_dim) != c.head_dim),
    ) if bad]
    if unsupported:
        raise ModelLoadError(f"this EAGLE-3 head has {', '.join(unsupported)}, which specdec does not run")
    return c


def load_eagle3(path: str | Path, device: torch.device | str = "cpu", target_layers: int | None = None) -> Eagle3Head:
    """The EAGLE-3 head of directory `path` (fp32 on `device`); target_layers: the target's layer count,
    for a head that names no layers. ModelLoadError says what is missing or wrong."""
    path = Path(path).expanduser()
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path} is not an EAGLE-3 head directory: {exc}") from None
    c = head_config_of(config, target_layers)
    tensors = read_tensors(path)
    missing = [name for name in NAMES if name not in tensors]
    if missing:
        raise ModelLoadError(f"the EAGLE-3 head {path} lacks {', '.join(missing)}")
    n = tensors["lm_head.weight"].shape[0]
    d2t = tensors.get("d2t", torch.zeros(n, dtype=torch.long))
    embed = tensors.get("embed_tokens.weight")
    head = Eagle3Head(c, torch.arange(n) + d2t.long(), None if embed is None else embed.float())
    try:
        head.load_state_dict({ours: tensors[name].float() for name, ours in NAMES.items()}, strict=False)
    except RuntimeError as exc:  # a weight of another shape than config.json says
        raise ModelLoadError(f"the EAGLE-3 head {path} does not match its config.json: {exc}") from None
    return head.to(device).eval()


def resolve_head_path(name: str) -> Path:
    """A head's local path: `name` itself when it exists, else a hub id's snapshot (the cache first;
    downloaded when the hub can be reached). ModelLoadError when it is neither."""
    path = Path(name).expanduser()
    if path.exists() or name.startswith(("/", ".", "~")) or name.count("/") != 1:
        return path
    from specdec.models.loader import _check_hub_id

    _check_hub_id(name)
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(name, allow_patterns=["config.json", "*.safetensors", "pytorch_model*.bin"]))
    except Exception as exc:  # offline, gated, no such repository
        raise ModelLoadError(f"draft head {name!r}: not a local path, and the hub gave no snapshot: {exc}") from None
