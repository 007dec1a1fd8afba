"""Distil a draft head from the target's recorded features and probabilities.

Loss, per unrolled step s = 1..S ("training-time test", as in EAGLE-3): cross-entropy of the head's
logits over its sub-vocabulary against the target's top-k probabilities, plus, for a head that predicts
the target's feature (DraftHead), a small smooth-L1 loss between its prediction and the target's. Step 1
reads true features; step s reads the head's own carried feature from step s-1, and its attention sees
exactly what it would see while drafting: the true pairs before the draft began and its own earlier
draft pairs. Both heads (head.DraftHead, eagle3.Eagle3Head) train through one contract.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.drafters.eagle3 import Eagle3Head
from specdec.drafters.head import DraftHead, HeadConfig, TargetParts
from specdec.models.llama_net import rope_tables
from specdec.errors import InvalidRequestError


HeadNet = DraftHead | Eagle3Head  # the two heads share one contract (layer_inputs, carry, readout, lm_rows, ...)


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 600
    batch_size: int = 8
    lr: float = 1e-3
    warmup: int = 30
    unroll: int = 2  # drafting steps simulated per position (1 = plain teacher forcing)
    feature_weight: float = 0.1
    draft_vocab: int = 8192  # rows of the target's LM head the head may draft
    val_examples: int = 24
    eval_every: int = 100
    ckpt_every: int = 50
    max_len: int = 512  # tokens per training text (longer ones are cut)
    seed: int = 0
    by_length: bool = True  # batches of neighbours in length order: little padding (long pasted prompts)


@dataclass
class Batch:
    """Right-padded pairs: pair i reads (f_i, t_{i+1}) and predicts f_{i+1} and t_{i+2}."""

    feats: torch.Tensor  # [B, T, W] target features f_i (W = (len(layers) + 1) * D)
    next_ids: torch.Tensor  # [B, T] t_{i+1}
    feat_targets: torch.Tensor  # [B, T, D] f_{i+1}
    top_sub: torch.Tensor  # [B, T, k] sub-vocabulary index of the target's top-k next tokens (-1: outside)
    top_p: torch.Tensor  # [B, T, k] their probabilities
    argmax_ids: torch.Tensor  # [B, T] the target's greedy next token t_{i+2}
    mask: torch.Tensor  # [B, T] bool: pairs inside the answer that have targets


def to_device(batch: Batch, device: torch.device) -> Batch:
    return Batch(*(getattr(batch, f).to(device) for f in batch.__dataclass_fields__))


def choose_vocab(examples: list[dict], size: int, vocab_size: int) -> torch.Tensor:
    """The `size` token ids the head may draft: the most frequent in the target's answers and its top-k
    predictions, then the lowest ids (BPE merges come roughly in order of frequency). Returns [size] sorted."""
    counts: Counter = Counter()
    for ex in examples:
        counts.update(ex["ids"][ex["start"]:].tolist())
        counts.update(ex["top_ids"][:, :4].flatten().tolist())
    chosen = [t for t, _ in counts.most_common(size)]
    taken = set(chosen)
    fill = (t for t in range(vocab_size) if t not in taken)
    chosen += [next(fill) for _ in range(min(size, vocab_size) - len(chosen))]
    return torch.tensor(sorted(chosen), dtype=torch.long)


def data_layers(example: dict) -> tuple[int, ...]:
    """The target layers whose outputs an example's features hold before the final-norm feature."""
    return tuple(int(i) for i in example.get("layers", torch.empty(0)).tolist())


def feature_columns(stored: tuple[int, ...], wanted: tuple[int, ...], d: int) -> torch.Tensor | None:
    """Columns of features stored for layers `stored` that a head reading layers `wanted` takes
    (None: all of them), or an error saying which data that head needs."""
    if stored == wanted:
        return None
    if not set(wanted) <= set(stored):
        raise InvalidRequestError(
            f"the training data keeps the outputs of target layers {list(stored)}; a head reading layers "
            f"{list(wanted)} needs data made with those layers (--feature-layers) in a new --data-dir")
    slots = [stored.index(i) for i in wanted] + [len(stored)]  # the final-norm feature is always last
    return torch.cat([torch.arange(s * d, (s + 1) * d) for s in slots])


def collate(examples: list[dict], sub_index: torch.Tensor, max_len: int, layers: tuple[int, ...] = ()) -> Batch:
    """Examples (see train.data) -> a Batch for a head reading target layers `layers`.
    sub_index [V]: target id -> sub-vocabulary index or -1."""
    lengths = [min(int(e["ids"].shape[0]), max_len) - 2 for e in examples]  # pairs with a target: n - 2
    t = max(lengths)
    stored = data_layers(examples[0])
    b, k = len(examples), examples[0]["top_ids"].shape[1]
    d = examples[0]["features"].shape[1] // (len(stored) + 1)
    dev = examples[0]["features"].device  # built where the examples live (on a GPU: no per-step host copies)
    columns = feature_columns(stored, tuple(layers), d)
    columns = columns.to(dev) if columns is not None else None
    sub_index = sub_index.to(dev)
    out = Batch(torch.zeros(b, t, (len(layers) + 1) * d, device=dev), torch.zeros(b, t, dtype=torch.long, device=dev),
                torch.zeros(b, t, d, device=dev), torch.full((b, t, k), -1, dtype=torch.long, device=dev),
                torch.zeros(b, t, k, device=dev), torch.zeros(b, t, dtype=torch.long, device=dev),
                torch.zeros(b, t, dtype=torch.bool, device=dev))
    for row, (ex, m) in enumerate(zip(examples, lengths)):
        ids, feats, start = ex["ids"].long(), ex["features"], ex["start"]
        out.feats[row, :m] = (feats[:m] if columns is None else feats[:m, columns]).float()
        out.next_ids[row, :m] = ids[1:m + 1]
        out.feat_targets[row, :m] = feats[1:m + 1, -d:].float()
        first = max(start - 2, 0)  # pair i predicts t_{i+2}; probabilities exist for t_start onwards
        if first >= m:  # the prompt alone fills max_len: context only, nothing to learn
            continue
        rows = ex["top_ids"][first + 2 - start:m + 2 - start].long()  # top-k row r predicts t_{start+r}
        out.top_sub[row, first:m] = sub_index[rows]
        out.top_p[row, first:m] = ex["top_p"][first + 2 - start:m + 2 - start].float()
        out.argmax_ids[row, first:m] = rows[:, 0]
        out.mask[row, first:m] = True
    return out


def unrolled_features(head: HeadNet, parts: TargetParts, batch: Batch, steps: int) -> list[torch.Tensor]:
    """The carried features [B, T, D] of each of `steps` drafting steps (see module doc)."""
    c = head.config
    b, t, _ = batch.feats.shape
    idx = torch.arange(t, device=batch.feats.device)
    cos, sin = rope_tables(idx, c.head_dim, c.rope_theta)
    embeds = head.embedding(parts)[batch.next_ids].float()
    keys, values, outputs = [], [], []
    feats = batch.feats
    for s in range(1, steps + 1):
        x, a = head.layer_inputs(feats, embeds)
        q, k, v = head.layer.project(a, cos, sin)
        keys.append(k)
        values.append(v)
        # Query i of step s sees true pairs j <= i - s + 1 and its own draft pairs at j = i - s + r (r = 2..s).
        blocks = [idx[None, :] <= idx[:, None] - s + 1]
        blocks += [idx[None, :] == idx[:, None] - s + r for r in range(2, s + 1)]
        mask = torch.cat(blocks, dim=1)
        mask[:, 0] |= ~mask.any(dim=1)  # rows with nothing visible (their loss is masked) must not give NaN
        out = head.layer.finish(x, q, torch.cat(keys, 2), torch.cat(values, 2), mask)
        h = head.carry(out, parts)
        outputs.append(h)
        feats = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], dim=1)  # step s+1 at i reads h at i-1
    return outputs


def head_loss(head: HeadNet, parts: TargetParts, batch: Batch, config: TrainConfig):
    """Total loss and per-step greedy accuracy (head argmax == target argmax) over the batch."""
    total, accs = 0.0, []
    lm_rows = head.lm_rows(parts).float()  # [N, D]: the target's (frozen) or the head's own (trained)
    for s, h in enumerate(unrolled_features(head, parts, batch, config.unroll), start=1):
        mask = batch.mask.clone()
        mask[:, : s - 1] = False  # the first s-1 positions have no step-s input
        logq = torch.log_softmax(head.readout(h[mask]) @ lm_rows.T, dim=-1)  # [M, N]
        top, p = batch.top_sub[mask], batch.top_p[mask]  # [M, k]
        ce = -(p * logq.gather(1, top.clamp(min=0)) * (top >= 0)).sum(-1).mean()
        total = total + ce
        if head.predicts_features:
            total = total + config.feature_weight * F.smooth_l1_loss(h[mask], batch.feat_targets[mask])
        pred = head.vocab_ids[logq.argmax(-1)]
        accs.append(float((pred == batch.argmax_ids[mask]).float().mean()))
    return total / config.unroll, accs


def draw_batch(train_set: list[dict], step: int, config: TrainConfig) -> list[dict]:
    """The examples of training step `step`, drawn from a generator seeded by (seed, step).

    by_length: `train_set` is sorted by length (fit does it) and the batch is a run of neighbours
    starting at a random place, so a batch pads to about its own length, not to the longest text."""
    rng = random.Random(config.seed * 1_000_003 + step)
    size = min(config.batch_size, len(train_set))
    if not config.by_length:
        return rng.sample(train_set, size)
    start = rng.randrange(len(train_set) - size + 1)
    return train_set[start:start + size]


def lr_at(step: int, config: TrainConfig) -> float:
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    return config.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def evaluate(head: HeadNet, parts: TargetParts, examples: list[dict], sub_index: torch.Tensor,
             config: TrainConfig) -> list[float]:
    """Held-out greedy agreement per drafting step (an estimate of per-position acceptance)."""
    head.eval()
    sums = [0.0] * config.unroll
    for i in range(0, len(examples), config.batch_size):
        chunk = examples[i:i + config.batch_size]
        batch = to_device(collate(chunk, sub_index, config.max_len, head.config.feature_layers), parts.embed.device)
        _, accs = head_loss(head, parts, batch, config)
        sums = [a + b * len(chunk) for a, b in zip(sums, accs)]
    head.train()
    return [s / max(1, len(examples)) for s in sums]


def split(examples: list[dict], config: TrainConfig) -> tuple[list[dict], list[dict]]:
    order = list(range(len(examples)))
    random.Random(config.seed).shuffle(order)
    n_val = min(config.val_examples, len(examples) // 5)
    return [examples[i] for i in order[n_val:]], [examples[i] for i in order[:n_val]]


def new_head(head_config: HeadConfig, vocab_ids: torch.Tensor, seed: int, parts: TargetParts) -> HeadNet:
    """A fresh head of head_config.arch: `eagle` (DraftHead) or `eagle3` (Eagle3Head, started from the
    target's final norm and LM-head rows), on the target's device."""
    torch.manual_seed(seed)
    if head_config.arch == "eagle3":
        return Eagle3Head(head_config, vocab_ids).to(parts.embed.device).initialise_from(parts)
    return DraftHead(head_config, vocab_ids).to(parts.embed.device)


def config_dict(config: TrainConfig) -> dict:
    return asdict(config)


def checkpoint_state(head: HeadNet, optimizer, step: int, config: TrainConfig, history: list) -> dict:
    return {"head": head.state_dict(), "head_config": asdict(head.config), "optimizer": optimizer.state_dict(),
            "step": step, "train_config": asdict(config), "history": history}


def save_checkpoint(path: Path, state: dict) -> None:
    tmp = Path(str(path) + ".tmp")
    torch.save(state, tmp)
    tmp.replace(path)  # atomic: an interrupted save leaves the previous checkpoint intact


def usable(example: dict) -> bool:
    """An answer long enough to train or measure on (a pair needs two answer tokens ahead of it)."""
    return int(example["ids"].shape[0]) - int(example["start"]) >= 4


def sub_vocab_index(vocab_ids: torch.Tensor, vocab_size: int, device: torch.device | str) -> torch.Tensor:
    """[vocab_size]: a target id's position in the head's sub-vocabulary `vocab_ids`, or -1 outside it."""
    index = torch.full((vocab_size,), -1, dtype=torch.long, device=device)
    index[vocab_ids.to(device)] = torch.arange(len(vocab_ids), device=device)
    return index


def load_examples(paths: list[Path], device: torch.device | str = "cpu") -> list[dict]:
    """The usable examples of every shard, their tensors on `device` (a GPU holds a million tokens' features)."""
    examples = []
    for path in paths:
        examples += torch.load(path, weights_only=True, map_location=device)
    kinds = {data_layers(e) for e in examples}
    if len(kinds) > 1:
        raise InvalidRequestError(f"the data shards mix features of different target layers {sorted(kinds)}: "
                                  "keep each --feature-layers choice in its own --data-dir")
    return [e for e in examples if usable(e)]


def fit(parts: TargetParts, head_config: HeadConfig, examples: list[dict], config: TrainConfig,
        ckpt_path: Path, progress: bool = True, log=print, stop_at: int | None = None) -> tuple[HeadNet, list[dict]]:
    """Train (or resume from ckpt_path) a head; returns it and the validation history.

    Batches are drawn from a generator seeded by (seed, step), so a resumed run sees the same data
    and ends with the same weights. stop_at: checkpoint and return after that step (time-boxed runs).
    """
    from tqdm import tqdm

    train_set, val_set = split(examples, config)
    if config.by_length:
        train_set.sort(key=lambda e: min(int(e["ids"].shape[0]), config.max_len))
    vocab_ids = choose_vocab(train_set, head_config.draft_vocab, head_config.vocab_size)
    device = parts.embed.device
    head = new_head(head_config, vocab_ids, config.seed, parts)
    optimizer = torch.optim.AdamW(head.parameters(), lr=config.lr, weight_decay=0.0, betas=(0.9, 0.95))
    step, history = 0, []
    if ckpt_path.exists():
        state = torch.load(ckpt_path, weights_only=False, map_location=device)
        saved = HeadConfig(**state["head_config"])
        if saved != head_config:  # e.g. other feature layers: its weights would not fit (or, worse, would)
            raise InvalidRequestError(
                f"the checkpoint {ckpt_path} is of a different head ({saved.arch}, feature layers "
                f"{list(saved.feature_layers)}, draft vocabulary {saved.draft_vocab}) than this run asks for "
                f"({head_config.arch}, feature layers {list(head_config.feature_layers)}, draft vocabulary "
                f"{head_config.draft_vocab}): delete it "
                "to start over, or pass another --out")
        head.load_state_dict(state["head"])
        optimizer.load_state_dict(state["optimizer"])
        step, history = state["step"], state["history"]
        log(f"resuming from {ckpt_path} at step {step}")
    sub_index = sub_vocab_index(head.vocab_ids, head_config.vocab_size, examples[0]["ids"].device)
    bar = tqdm(total=config.steps, initial=step, desc="train head", unit="step", disable=not progress)
    while step < min(config.steps, stop_at or config.steps):
        batch = collate(draw_batch(train_set, step, config), sub_index, config.max_len, head_config.feature_layers)
        batch = to_device(batch, device)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, config)
        loss, accs = head_loss(head, parts, batch, config)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        optimizer.step()
        step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.3f}", acc=" ".join(f"{a:.2f}" for a in accs))
        if step % config.eval_every == 0 or step == config.steps:
            val = evaluate(head, parts, val_set, sub_index, config) if val_set else []
            history.append({"step": step, "loss": loss.item(), "val_greedy_agreement": val})
            bar.write(f"step {step}: held-out greedy agreement per draft step {[round(v, 3) for v in val]}")
        if step % config.ckpt_every == 0 or step in (config.steps, stop_at):
            save_checkpoint(ckpt_path, checkpoint_state(head, optimizer, step, config, history))
    bar.close()
    return head.eval(), history
