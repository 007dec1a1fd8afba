"""The whole `train-draft` recipe: the target answers prompts, then a head is distilled and saved."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import torch

from specdec.drafters.head import config_for_target, target_identity, target_parts
from specdec.drafters.head_policy import HeadCard, HeadPolicy
from specdec.errors import InvalidRequestError
from specdec.models.loader import LoadedModel
from specdec.train.data import DataConfig, build_dataset
from specdec.train.trainer import TrainConfig, fit, load_examples


def default_data_dir(target_name: str, feature_layers: tuple[int, ...] = ()) -> Path:
    """One cache per target and choice of feature layers (their shards do not mix)."""
    slug = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in target_name)[:80]
    if feature_layers:
        slug += "-layers-" + "-".join(str(i) for i in feature_layers)
    return Path.home() / ".cache" / "specdec" / "draft-data" / slug


def train_draft(target: LoadedModel, out: Path, data_dir: Path, data_config: DataConfig,
                train_config: TrainConfig, progress: bool = True, log=print,
                head_layers: tuple[int, ...] | None = None, arch: str = "eagle") -> dict:
    """Build (or resume) the data under data_dir, train (or resume) the head, save it to `out`.

    head_layers: the target layers the head reads (any of those the data keeps; None: all of them).
    arch: `eagle` (a specdec head file) or `eagle3` (an EAGLE-3 checkpoint directory, eagle3.py).

    The checkpoint for resuming lives next to `out` (`out` + ".ckpt"). Returns a summary dict.
    """
    hf_model = getattr(target.model, "model", None)
    if hf_model is None or not hasattr(hf_model, "generate"):
        raise InvalidRequestError("train-draft needs a Hugging Face target backend (it uses generate())")
    shards = build_dataset(hf_model, target.tokenizer, data_dir, data_config, progress=progress)
    examples = load_examples(shards, device=next(hf_model.parameters()).device)
    if len(examples) < 2:
        raise InvalidRequestError("the target gave too few usable answers to train on; raise --prompts")
    tokens = sum(int(e["ids"].shape[0]) - int(e["start"]) for e in examples)
    log(f"{len(examples)} answers, {tokens} answer tokens under {data_dir}")
    parts = target_parts(target.model)
    draft_vocab = min(train_config.draft_vocab, parts.lm_head.shape[0])
    layers = data_config.feature_layers if head_layers is None else head_layers
    head_config = config_for_target(target.model, draft_vocab, layers, arch)
    ckpt = Path(str(out) + ".ckpt")
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")  # TF32 for the head's training only; the data above is full fp32
    try:
        with torch.enable_grad():
            head, history = fit(parts, head_config, examples, train_config, ckpt, progress=progress, log=log)
    finally:
        torch.set_float32_matmul_precision(precision)
    summary = {"target": target.name, "answers": len(examples), "answer_tokens": tokens,
               "data": asdict(data_config), "train": asdict(train_config), "history": history}
    head.save(out, meta=summary, card=HeadCard(target_identity(target.model), HeadPolicy()))  # made for this target, default policy
    return summary
