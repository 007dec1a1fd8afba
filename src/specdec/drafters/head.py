"""A draft head on the target's own features (EAGLE-1 style), and the drafter that runs it.

The head is one Llama decoder layer that reads, at position i, the pair (f_i, e(t_{i+1})): the
target's feature at i (the input of its LM head, i.e. after its final norm) and the embedding of
the token that followed. It predicts f_{i+1}; the target's own final norm and LM head turn that
into next-token logits, so the head stores neither embedding nor LM head (only which rows of the
LM head it may draft: a frequent-token sub-vocabulary, which makes a draft step cheap).

Drafting K tokens: after a round the target's features of the kept text are known, so the head
first runs over the new (true feature, token) pairs; then it feeds its own predicted feature
forward with the embedding of the token it just drafted. Its KV cache keeps only pairs built from
true features; pairs built from its own guesses are cut at the next round (rollback).

Greedy drafts are argmax over the sub-vocabulary (q one-hot: None). Sampled drafts draw from the
warped distribution over the sub-vocabulary (zero probability elsewhere), and that distribution,
spread over the full vocabulary, is the q handed to the rejection rule (rule 1 of the design), so output stays exact.

HeadDrafter runs either head through one contract (layer_inputs, carry, readout, lm_rows, embedding,
vocab_ids, config): DraftHead here, or an EAGLE-3 head in the ecosystem's checkpoint layout (eagle3.py).
"""

from __future__ import annotations

import copy
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from specdec.drafters.base import Draft, Drafter
from specdec.drafters.head_policy import HeadCard, HeadPolicy, TargetIdentity, card_from_metadata, card_metadata
from specdec.drafters.tree_shape import TreeShape
from specdec.errors import InvalidRequestError, ModelLoadError
from specdec.models.base import check_feature_layers
from specdec.models.cpu_matrix import CpuLayout, CpuMatrix, can_pack
from specdec.models.llama_net import rms_norm, rotate
from specdec.sampling import SamplingParams


@dataclass(frozen=True)
class HeadConfig:
    hidden: int  # D, the target's hidden size
    num_heads: int
    num_kv_heads: int
    intermediate: int
    vocab_size: int  # the target's vocabulary (logit width)
    draft_vocab: int  # N rows of the target's LM head the head may draft
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    # EAGLE-3's fused features: the outputs of these target layers come before the final-norm
    # feature in what the head reads (); empty: the final-norm feature alone (EAGLE-1).
    feature_layers: tuple[int, ...] = ()
    arch: str = "eagle"  # "eagle": DraftHead, on the target's norm and LM head; "eagle3": eagle3.Eagle3Head

    def __post_init__(self):
        object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))  # from JSON lists

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads

    @property
    def feature_width(self) -> int:
        """Width of the target features the head reads: (len(feature_layers) + 1) * hidden."""
        return (len(self.feature_layers) + 1) * self.hidden


@dataclass(frozen=True)
class TargetParts:
    """What the head borrows from the (frozen) target: embeddings, final norm, LM head."""

    embed: torch.Tensor  # [V, D]
    norm_weight: torch.Tensor  # [D]
    norm_eps: float
    lm_head: torch.Tensor  # [V, D]


def target_parts(model) -> TargetParts:
    """The frozen pieces of a target backend: the native Llama, or a Hugging Face Llama-like model."""
    net = getattr(model, "net", None)
    if net is not None and hasattr(net, "lm_weight"):  # models.native_llama.NativeLlama
        return TargetParts(net.embed.weight.detach(), net.norm.detach(), float(net.arch.norm_eps),
                           net.lm_weight().detach())
    hf = getattr(model, "model", model)
    try:
        norm = hf.model.norm
        return TargetParts(hf.get_input_embeddings().weight.detach(), norm.weight.detach(),
                           float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-5))),
                           hf.get_output_embeddings().weight.detach())
    except AttributeError:
        raise ModelLoadError(
            f"a draft head needs a Llama-like target (embeddings, final norm, LM head); {type(hf).__name__} "
            "does not expose them") from None


ARCHS = ("eagle", "eagle3")  # DraftHead; eagle3.Eagle3Head


def config_for_target(model, draft_vocab: int, feature_layers: tuple[int, ...] | str = (),
                      arch: str = "eagle") -> HeadConfig:
    """A head of `arch` shaped like one decoder layer of the target. feature_layers: layer indices,
    or a choice as --feature-layers takes it (parse_feature_layers)."""
    if arch not in ARCHS:
        raise InvalidRequestError(f"unknown head architecture {arch!r}: use one of {', '.join(ARCHS)}")
    c = getattr(model, "model", model).config
    rope = getattr(c, "rope_parameters", None) or {}
    if isinstance(feature_layers, str):
        feature_layers = parse_feature_layers(feature_layers, c.num_hidden_layers)
    config = HeadConfig(hidden=c.hidden_size, num_heads=c.num_attention_heads,
                      num_kv_heads=getattr(c, "num_key_value_heads", c.num_attention_heads),
                      intermediate=c.intermediate_size, vocab_size=c.vocab_size, draft_vocab=draft_vocab,
                      rope_theta=float(rope.get("rope_theta", getattr(c, "rope_theta", 10000.0))),
                      norm_eps=float(c.rms_norm_eps),
                      feature_layers=check_feature_layers(tuple(feature_layers), c.num_hidden_layers), arch=arch)
    if arch == "eagle3" and not config.feature_layers:
        raise InvalidRequestError("an EAGLE-3 head reads lower target layers: give --feature-layers auto or indices, "
                                  "not none")
    return config


def auto_feature_layers(n_layers: int) -> tuple[int, ...]:
    """A low, a middle and a high layer (the last layer's features always come too)."""
    return tuple(sorted({min(2, n_layers - 2), n_layers // 2, n_layers - 3} & set(range(n_layers - 1))))


def parse_feature_layers(spec: str, n_layers: int) -> tuple[int, ...]:
    """--feature-layers: `auto`, `none` or comma-separated layer indices -> checked indices."""
    if spec == "none":
        return ()
    if spec == "auto":
        return auto_feature_layers(n_layers)
    try:
        layers = tuple(int(part) for part in spec.split(","))
        return check_feature_layers(layers, n_layers)
    except ValueError as exc:
        raise InvalidRequestError(f"--feature-layers takes `auto`, `none` or comma-separated layer indices in "
                                  f"0..{n_layers - 2}, not {spec!r} ({exc})") from None


class HeadLayer(nn.Module):
    """One Llama decoder layer, split so that training can choose which keys each query sees.
    in_width: the width of the attention's input (EAGLE-3 reads the embedding beside the feature: 2D)."""

    def __init__(self, c: HeadConfig, in_width: int | None = None):
        super().__init__()
        self.c = c
        d, hd = c.hidden, c.head_dim
        width = in_width or d
        self.attn_norm = nn.Parameter(torch.ones(d))
        self.q = nn.Linear(width, c.num_heads * hd, bias=False)
        self.k = nn.Linear(width, c.num_kv_heads * hd, bias=False)
        self.v = nn.Linear(width, c.num_kv_heads * hd, bias=False)
        self.o = nn.Linear(c.num_heads * hd, d, bias=False)
        self.mlp_norm = nn.Parameter(torch.ones(d))
        self.gate = nn.Linear(d, c.intermediate, bias=False)
        self.up = nn.Linear(d, c.intermediate, bias=False)
        self.down = nn.Linear(c.intermediate, d, bias=False)

    def project(self, a: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """The attention's normalised input a [B, T, in_width] -> q [B, H, T, hd], k and v [B, Hkv, T, hd]
        (rotary applied)."""
        b, t, _ = a.shape
        q = self.q(a).view(b, t, self.c.num_heads, -1).transpose(1, 2)
        k = self.k(a).view(b, t, self.c.num_kv_heads, -1).transpose(1, 2)
        v = self.v(a).view(b, t, self.c.num_kv_heads, -1).transpose(1, 2)
        return rotate(q, cos, sin), rotate(k, cos, sin), v  # cos, sin [T, hd] broadcast over [B, H, T, hd]

    def finish(self, x: torch.Tensor, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               mask: torch.Tensor | None) -> torch.Tensor:
        """Attention of q over keys/values [B, Hkv, S, hd] (mask [T, S] bool, True = may attend), then the MLP."""
        return self.after_attention(x, self.attend(q, keys, values, mask))

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
               mask: torch.Tensor | None) -> torch.Tensor:
        """Attention of q [B, H, T, hd] over keys/values [B, Hkv, S, hd] -> [B, H, T, hd]."""
        groups = self.c.num_heads // self.c.num_kv_heads
        keys, values = keys.repeat_interleave(groups, 1), values.repeat_interleave(groups, 1)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)

    def after_attention(self, x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        """The layer's output projection and MLP, for x [B, T, D] and its attention att [B, H, T, hd]."""
        x = x + self.o(att.transpose(1, 2).flatten(2))
        h = rms_norm(x, self.mlp_norm, self.c.norm_eps)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class DraftHead(nn.Module):
    """fc(concat(f_i, e(t_{i+1}))) -> decoder layer -> target's final norm = predicted f_{i+1}.

    With feature_layers (EAGLE-3), f_i is first fused from several layers of the target:
    fuse(concat(rms(l_a), rms(l_b), ..., final-norm feature)), each layer's output scaled to unit RMS
    (the residual stream grows with depth). Pairs built from the head's own predicted feature h have
    no lower layers: they read fuse's final-feature columns alone, fuse(concat(0, ..., 0, h)).
    fuse starts as the identity on the final feature, i.e. as the EAGLE-1 head."""

    def __init__(self, config: HeadConfig, vocab_ids: torch.Tensor | None = None):
        super().__init__()
        self.config = config
        d = config.hidden
        self.fc = nn.Linear(2 * d, d, bias=True)
        self.fuse = None
        if config.feature_layers:
            self.fuse = nn.Linear(config.feature_width, d, bias=False)
            with torch.no_grad():
                self.fuse.weight.zero_()
                self.fuse.weight[:, -d:] = torch.eye(d)
        self.layer = HeadLayer(config)
        ids = vocab_ids if vocab_ids is not None else torch.arange(config.draft_vocab)
        self.register_buffer("vocab_ids", ids.long().clone())  # [N]: target ids the head may draft

    predicts_features = True  # training regresses carry() on the target's next feature

    def layer_inputs(self, feats: torch.Tensor, embeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """feats [B, T, feature_width] (the target's) or [B, T, D] (the head's own), embeds [B, T, D]
        -> (the layer's residual input x [B, T, D], its attention's normalised input [B, T, D])."""
        x = self._fused(feats, embeds)
        return x, rms_norm(x, self.layer.attn_norm, self.config.norm_eps)

    def carry(self, out: torch.Tensor, parts: TargetParts) -> torch.Tensor:
        """The layer's output [.., D] -> the feature a draft step hands on: the predicted final-norm feature."""
        return rms_norm(out, parts.norm_weight.float(), parts.norm_eps)

    def readout(self, h: torch.Tensor) -> torch.Tensor:
        """A carried feature [.., D] -> what the LM rows multiply (the target's LM head reads it as is)."""
        return h

    def lm_rows(self, parts: TargetParts) -> torch.Tensor:
        """[N, D]: the LM-head rows of the drafted ids (the target's, frozen)."""
        return parts.lm_head[self.vocab_ids]

    def embedding(self, parts: TargetParts) -> torch.Tensor:
        """[V, D]: the token embeddings the head reads (the target's)."""
        return parts.embed

    def _fused(self, feats: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        d = self.config.hidden
        if self.fuse is not None:
            if feats.shape[-1] == d:
                feats = F.linear(feats, self.fuse.weight[:, -d:])
            else:
                lower = feats[..., :-d].unflatten(-1, (-1, d))
                lower = lower * torch.rsqrt(lower.pow(2).mean(-1, keepdim=True) + self.config.norm_eps)
                feats = self.fuse(torch.cat([lower.flatten(-2), feats[..., -d:]], dim=-1))
        return self.fc(torch.cat([feats, embeds], dim=-1))

    def save(self, path: str | Path, meta: dict | None = None, card: HeadCard | None = None) -> None:
        """Weights in bf16 (safetensors) with the config, and the card (target identity, draft
        policy; default: no target, the default policy); never the target's embeddings or LM head."""
        tensors = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v).contiguous()
                   for k, v in self.state_dict().items()}
        info = {"config": json.dumps(asdict(self.config)), "format": "specdec-draft-head-1",
                "meta": json.dumps(meta or {}), **card_metadata(card or HeadCard(None, HeadPolicy()))}
        write_weights(path, tensors, info)

    @classmethod
    def load(cls, path: str | Path, device: torch.device | str = "cpu") -> "DraftHead":
        from safetensors import safe_open

        path = Path(path).expanduser()
        if path.is_dir():
            raise ModelLoadError(f"{path} is a directory but not an EAGLE-3 head (its config.json must name "
                                 "LlamaForCausalLMEagle3): pass a head file or an EAGLE-3 checkpoint directory")
        if not path.is_file():
            raise ModelLoadError(f"draft head not found: {path} (train one with `specdec train-draft`)")
        try:
            with safe_open(str(path), framework="pt") as f:
                info = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
            config = HeadConfig(**json.loads(info["config"]))
        except Exception as exc:  # corrupt file, not safetensors, missing config
            raise ModelLoadError(f"{path} is not a specdec draft head: {exc}") from None
        head = cls(config, tensors["vocab_ids"])
        head.load_state_dict({k: v.float() if v.is_floating_point() else v for k, v in tensors.items()})
        return head.to(device).eval()


def write_weights(path: str | Path, tensors: dict[str, torch.Tensor], info: dict[str, str]) -> None:
    from safetensors.torch import save_file

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=info)


def card_file(path: str | Path) -> Path | None:
    """The safetensors file that holds a head's card: the file itself, or an EAGLE-3 directory's
    weights (None: a directory of pytorch_model.bin, which has no metadata)."""
    path = Path(path).expanduser()
    if not path.is_dir():
        return path
    return next(iter(sorted(path.glob("*.safetensors"))), None)


def read_head_card(path: str | Path) -> HeadCard:
    """A head's card (the target it was made for, its draft policy) without reading its weights; a
    head from elsewhere (no card) gets no target and the default policy."""
    from safetensors import safe_open

    file = card_file(path)
    if file is None:
        return HeadCard(None, HeadPolicy())
    try:
        with safe_open(str(file), framework="pt") as f:
            return card_from_metadata(f.metadata() or {})
    except Exception as exc:  # not safetensors, or a card that does not parse
        raise ModelLoadError(f"{path} is not a specdec draft head with a readable card: {exc}") from None


def write_head_card(path: str | Path, card: HeadCard) -> None:
    """Record `card` in an existing head file; its weights and other metadata stay as they are."""
    from safetensors import safe_open

    file = card_file(path)
    with safe_open(str(file), framework="pt") as f:
        info = dict(f.metadata() or {})
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    write_weights(file, tensors, {**info, **card_metadata(card)})


def target_identity(model) -> TargetIdentity:
    """The identity of a target backend (CausalLM) that a head's card records; ModelLoadError when
    the target is not Llama-like (no head can read it)."""
    return TargetIdentity.of(target_parts(model).embed, num_layers(model) or 0)


class HeadDrafter(Drafter):
    """Runs a DraftHead next to the target; reads the target's features through observe()."""

    name = "head"
    needs_target_features = True

    def __init__(self, head: DraftHead, parts: TargetParts, max_length: int = 8192, name: str | None = None,
                 min_confidence: float = 0.0, policy: HeadPolicy | None = None):
        c = head.config
        if parts.embed.shape != (c.vocab_size, c.hidden) or parts.lm_head.shape[0] != c.vocab_size:
            raise ModelLoadError(
                f"this draft head was trained for a target with vocabulary {c.vocab_size} and hidden size "
                f"{c.hidden}; the target has {tuple(parts.embed.shape)}: train a head for this target")
        self.embed = head.embedding(parts)  # [V, D]: the embeddings the head reads
        self.head, self.parts, self.c = head, parts, c
        self.feature_layers = c.feature_layers
        # End a round once the head's own estimate that every draft so far is kept (the product of
        # its probabilities of the tokens it drafted) falls below this: a draft unlikely to be reached
        # costs a verify slot and a draft step for nothing. The first token is always drafted.
        if not 0.0 <= min_confidence < 1.0:
            raise ValueError(f"min_confidence must be in [0, 1), got {min_confidence}")
        self.min_confidence = min_confidence
        self.policy = policy or HeadPolicy()  # how it drafts beside lookup (LookupThenHead reads it)
        self.tree: TreeShape | None = None  # None: chains; else EAGLE-2 trees of this shape (head_tree.py)
        self.vocab_list = head.vocab_ids.tolist()  # the drafted ids on the host, for trees' host-side growth
        self.device = parts.embed.device
        self.lm_sub = head.lm_rows(parts).float()  # [N, D] runtime copy of the drafted rows
        # On a CPU the drafted rows are held transposed, the faster single-row layout (CpuMatrix).
        if self.device.type == "cpu" and can_pack():
            self.lm_sub = CpuMatrix(self.lm_sub, CpuLayout(one_row="plain", pack_rows=0))
        shape = (1, c.num_kv_heads, max_length, c.head_dim)
        self._k = torch.zeros(shape, device=self.device)
        self._v = torch.zeros(shape, device=self.device)
        self.name = name or self.name
        self.begin([])

    def begin(self, prompt: list[int]) -> None:
        self._feats: list[torch.Tensor] = []  # target features of the text, one [m, D] chunk per observe()
        self._num_feats = 0
        self._true_pairs = 0  # cache entries built from true features (pairs 0.._true_pairs-1)

    def observe(self, features: torch.Tensor) -> None:
        if features.shape[-1] != self.c.feature_width:  # e.g. a fused head handed the last feature alone
            raise ValueError(f"this draft head reads {self.c.feature_width} feature columns (target layers "
                             f"{list(self.c.feature_layers)} and the last); got {features.shape[-1]}")
        self._feats.append(features.detach().float())
        self._num_feats += int(features.shape[0])

    def commit(self, num_valid: int) -> None:
        if self._num_feats > num_valid:  # only when a caller rolls back past what it observed
            all_feats = torch.cat(self._feats)[:num_valid]
            self._feats, self._num_feats = [all_feats], num_valid
        self._true_pairs = min(self._true_pairs, self._num_feats)

    def fork(self) -> "HeadDrafter":
        """Another sequence's drafter over the same head and target parts, with a cache of its own."""
        clone = copy.copy(self)
        clone._k, clone._v = torch.zeros_like(self._k), torch.zeros_like(self._v)
        clone.begin([])
        return clone

    def with_tree(self, shape: TreeShape) -> "HeadDrafter":
        """This head drafting EAGLE-2 dynamic trees of `shape` (head_tree.py), with a cache of its own."""
        clone = self.fork()
        clone.tree = shape
        clone.name = f"tree:{shape}:{self.name}"
        return clone

    def target_q(self, q_sub: torch.Tensor) -> torch.Tensor:
        """The head's distribution over its drafted ids, q_sub [..., N], as a q over the target's
        vocabulary [..., V] (zero outside the drafted ids): the q the rule reads."""
        q = q_sub.new_zeros(*q_sub.shape[:-1], self.c.vocab_size)
        return q.index_copy_(q.dim() - 1, self.head.vocab_ids, q_sub)

    def ready_for(self, context: list[int], k: int) -> bool:
        """Whether it can draft after context: it has the target's features of this very text."""
        n = self._num_feats
        return k >= 1 and n > 0 and n == len(context) - 1

    def propose(self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator) -> Draft:
        return self.propose_batch([self], [context], [k], [params], [generator])[0]

    @classmethod
    def propose_batch(cls, drafters, contexts, ks, params, generators) -> list[Draft]:
        """Every sequence's draft in one pass of the head a draft step (head_batch.py)."""
        from specdec.drafters.head_batch import draft_heads

        return draft_heads(drafters, contexts, ks, params, generators)


def num_layers(target_model) -> int | None:
    """The target's decoder-layer count (native or Hugging Face backend), None when unknown."""
    net = getattr(target_model, "net", None)
    if net is not None and hasattr(net, "layers"):
        return len(net.layers)
    config = getattr(getattr(target_model, "model", target_model), "config", None)
    return getattr(config, "num_hidden_layers", None)
