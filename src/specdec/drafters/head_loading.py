"""Load a draft head of either format for a target: a specdec head file (head.DraftHead) or an EAGLE-3
checkpoint directory or hub id (eagle3.Eagle3Head), as the drafter that runs it (head.HeadDrafter)."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from specdec.drafters.eagle3 import is_eagle3_dir, load_eagle3, resolve_head_path
from specdec.drafters.head import DraftHead, HeadDrafter, num_layers, read_head_card, target_parts
from specdec.errors import ModelLoadError
from specdec.models.base import check_feature_layers


def load_head_drafter(path: str, target_model, name: str | None = None,
                      min_confidence: float | None = None) -> HeadDrafter:
    """A HeadDrafter for `path` on a target backend (CausalLM), with the policy its file records
    (min_confidence None: the policy's)."""
    where = resolve_head_path(path)
    head = load_head(where, target_model)
    policy = read_head_card(where).policy
    layers, n_layers = head.config.feature_layers, num_layers(target_model)
    if layers and n_layers is not None:
        try:
            check_feature_layers(layers, n_layers)
        except ValueError:
            raise ModelLoadError(f"the draft head {path} reads target layers {list(layers)}, but the target has "
                                 f"{n_layers} layers: train a head for this target") from None
    return HeadDrafter(head, target_parts(target_model), max_length=min(target_model.max_length, 1 << 15),
                       name=name or f"head:{path}", policy=policy,
                       min_confidence=policy.min_confidence if min_confidence is None else min_confidence)


def load_head(path: str | Path, target_model) -> nn.Module:
    """The head at `path` on the target's device: an EAGLE-3 directory (eagle3.py) or a specdec head file."""
    if is_eagle3_dir(path):
        return load_eagle3(path, device=target_model.device, target_layers=num_layers(target_model))
    return DraftHead.load(path, device=target_model.device)
