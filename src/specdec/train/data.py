"""Training data for a draft head, made by the target itself.

The target answers synthetic instructions (batched Hugging Face `generate`); while it decodes we
keep, for free, what the head must imitate: the target's features (the input of its LM head) at
every position and the top-k of its next-token probabilities over the answer. Each batch becomes
one shard file, so an interrupted run resumes where it stopped.

With `source_texts` > 0 a two-stage self-instruct comes first (train.prompts): the target writes
source texts (articles, reports, stories, emails, code, dialogues; shards `shard_src_*`, greedy),
then answers `followups` requests to summarise, extract from, question or rewrite those texts,
pasted into the prompt (shards `shard_use_*`): long inputs like real summarisation and RAG prompts.
Both stages are training data; the texts of stage 1 are read back from its shards, so a resumed
run rebuilds exactly the same stage-2 prompts.

One example (a dict of tensors) for a text of n tokens whose answer starts at `start`:
  ids      [n]        int32  prompt + answer (answer cut after the first end-of-sequence token)
  features [n-1, D]   bf16   target feature f_i at position i (the last token is never fed)
  top_ids  [n-start, k] int32 ids of the target's k most likely next tokens at positions start-1..n-2
  top_p    [n-start, k] fp16  their probabilities (temperature 1, unwarped)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from specdec.train.prompts import make_followup_prompts, make_prompts, make_source_prompts


@dataclass(frozen=True)
class DataConfig:
    num_prompts: int = 512
    max_new_tokens: int = 192
    batch_size: int = 16
    top_k: int = 32  # probabilities kept per position (the rest of the mass is dropped)
    sample_every: int = 3  # every n-th batch samples at temperature 1 (others are greedy): both modes are served
    seed: int = 0
    source_texts: int = 0  # two-stage self-instruct: stage-1 texts the target writes (0: off)
    followups: int = 0  # stage-2 requests about those texts
    source_max_new_tokens: int = 384  # length cap of a stage-1 text


def shard_paths(data_dir: Path) -> list[Path]:
    return sorted(Path(data_dir).glob("shard_*.pt"))


def build_dataset(hf_model, tokenizer, data_dir: Path, config: DataConfig, progress: bool = True) -> list[Path]:
    """Generate (or resume) every shard under data_dir; returns the shard paths.

    hf_model: a transformers causal LM (the target's weights); tokenizer: its tokenizer.
    """
    data_dir = Path(data_dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    if config.source_texts:
        sources = make_source_prompts(config.source_texts, seed=config.seed)
        stage1 = _answer_all(hf_model, tokenizer, [s.prompt for s in sources], data_dir, "shard_src",
                             replace(config, max_new_tokens=config.source_max_new_tokens, sample_every=0), progress)
        texts = source_texts(stage1, tokenizer)
        followups = make_followup_prompts(sources, texts, config.followups, seed=config.seed)
        half = replace(config, batch_size=max(1, config.batch_size // 2))  # long prompts: half the batch
        _answer_all(hf_model, tokenizer, followups, data_dir, "shard_use", half, progress)
    _answer_all(hf_model, tokenizer, make_prompts(config.num_prompts, seed=config.seed), data_dir, "shard",
                config, progress)
    return shard_paths(data_dir)


def source_texts(shards: list[Path], tokenizer) -> list[str]:
    """The answers stored in `shards` (in order) as text: the stage-1 texts that stage 2 pastes."""
    texts = []
    for path in shards:
        for e in torch.load(path, weights_only=True):
            texts.append(tokenizer.decode(e["ids"][e["start"]:].tolist(), skip_special_tokens=True))
    return texts


def _answer_all(hf_model, tokenizer, prompts: list[str], data_dir: Path, stem: str, config: DataConfig,
                progress: bool) -> list[Path]:
    """Answer `prompts` a batch at a time into `stem`_NNNNN.pt shards (finished ones are kept)."""
    from tqdm import tqdm

    batches = [prompts[i:i + config.batch_size] for i in range(0, len(prompts), config.batch_size)]
    paths = [data_dir / f"{stem}_{index:05d}.pt" for index in range(len(batches))]
    bar = tqdm(total=len(batches), desc=f"target answers ({stem})", unit="batch", disable=not progress)
    for index, (batch, path) in enumerate(zip(batches, paths)):
        if not path.exists():
            started = time.perf_counter()
            sample = bool(config.sample_every) and index % config.sample_every == 1
            examples = _answer_batch(hf_model, tokenizer, batch, config, sample=sample)
            tmp = path.with_suffix(".tmp")
            torch.save(examples, tmp)
            tmp.rename(path)  # atomic: a half-written shard is never mistaken for a finished one
            tokens = sum(int(e["top_ids"].shape[0]) for e in examples)
            bar.set_postfix(tok_s=f"{tokens / (time.perf_counter() - started):.0f}")
        bar.update(1)
    bar.close()
    return paths


def _encode_chat(tokenizer, prompt: str) -> list[int]:
    out = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                        tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _eos_ids(hf_model, tokenizer) -> set[int]:
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(hf_model.generation_config, "eos_token_id", None)
    ids.update(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos])
    return {i for i in ids if i is not None}


@torch.inference_mode()
def _answer_batch(hf_model, tokenizer, prompts: list[str], config: DataConfig, sample: bool) -> list[dict]:
    """Let the target answer a batch of prompts; return one example dict per prompt (see module doc)."""
    encoded = [_encode_chat(tokenizer, p) for p in prompts]
    width = max(len(e) for e in encoded)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    input_ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded])  # left padding: [B, P]
    attention = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
    device = next(hf_model.parameters()).device
    out = hf_model.generate(
        input_ids=input_ids.to(device), attention_mask=attention.to(device), max_new_tokens=config.max_new_tokens,
        do_sample=sample, temperature=1.0 if sample else None, top_p=None, top_k=None, pad_token_id=pad,
        output_hidden_states=True, output_logits=True, return_dict_in_generate=True,
    )
    # hidden_states: per step, a tuple over layers; the last entry is the LM head's input.
    # Step 0 covers the prompt [B, P, D]; step s >= 1 covers the s-th answer token [B, 1, D].
    feats = torch.cat([step[-1] for step in out.hidden_states], dim=1).float()  # [B, P + R - 1, D]
    answers = out.sequences[:, width:]  # [B, R]
    eos = _eos_ids(hf_model, tokenizer)
    # out.logits: per step [B, V]; row s of one answer predicts its token s. Stacked per answer to save memory.
    return [_example(encoded[b], width, answers[b], feats[b], torch.stack([l[b] for l in out.logits]).float(),
                     eos, config.top_k) for b in range(len(prompts))]


def _example(prompt: list[int], width: int, answer: torch.Tensor, feats: torch.Tensor, logits: torch.Tensor,
             eos: set[int], top_k: int) -> dict:
    """Strip padding and everything after the first end-of-sequence token from one batch row."""
    answer = answer.tolist()
    length = next((i + 1 for i, t in enumerate(answer) if t in eos), len(answer))  # keep the EOS itself
    answer = answer[:length]
    pad = width - len(prompt)
    ids = prompt + answer
    features = feats[pad:pad + len(ids) - 1]  # [n-1, D]
    probs = torch.softmax(logits[:length], dim=-1)  # [R, V]
    top = probs.topk(top_k, dim=-1)
    return {  # on the CPU, so that shards load anywhere (load_examples moves them)
        "ids": torch.tensor(ids, dtype=torch.int32),
        "features": features.to(torch.bfloat16).cpu().clone(),
        "start": len(prompt),
        "top_ids": top.indices.to(torch.int32).cpu(),
        "top_p": top.values.to(torch.float16).cpu(),
    }
