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

With `question_lists` > 0 a second self-instruct follows: the target writes that many numbered lists
of questions people ask about a topic (shards `shard_ask_*`, greedy), then answers every question it
wrote, some with a wish about the answer (shards `shard_ans_*`; train.prompts.make_question_prompts).

One example (a dict of tensors) for a text of n tokens whose answer starts at `start`:
  ids      [n]        int32  prompt + answer (answer cut after the first end-of-sequence token)
  features [n-1, W]   bf16   target features at position i (the last token is never fed): the outputs
                             of `layers`, then the final-norm feature f_i; W = (len(layers) + 1) * D
  layers   [L]        int32  DataConfig.feature_layers (empty: the final-norm feature alone)
  top_ids  [n-start, k] int32 ids of the target's k most likely next tokens at positions start-1..n-2
  top_p    [n-start, k] fp16  their probabilities (temperature 1, unwarped)
"""

from __future__ import annotations

import inspect
import logging
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from specdec.train.prompts import (
    make_followup_prompts,
    make_prompts,
    make_question_list_prompts,
    make_question_prompts,
    make_source_prompts,
)

log = logging.getLogger(__name__)


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
    feature_layers: tuple[int, ...] = ()  # target layers whose outputs are kept too (EAGLE-3 heads)
    question_lists: int = 0  # self-instruct questions: lists of questions the target writes, then answers (0: off)
    list_max_new_tokens: int = 128  # length cap of one list of questions


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
    if config.question_lists:
        lists = _answer_all(hf_model, tokenizer, make_question_list_prompts(config.question_lists, seed=config.seed),
                            data_dir, "shard_ask", replace(config, max_new_tokens=config.list_max_new_tokens,
                                                           sample_every=0), progress)
        questions = make_question_prompts(source_texts(lists, tokenizer), seed=config.seed)
        _answer_all(hf_model, tokenizer, questions, data_dir, "shard_ans", config, progress)
    _answer_all(hf_model, tokenizer, make_prompts(config.num_prompts, seed=config.seed), data_dir, "shard",
                config, progress)
    return shard_paths(data_dir)


def source_texts(shards: list[Path], tokenizer) -> list[str]:
    """The answers stored in `shards` (in order) as text: the stage-1 texts that stage 2 pastes or
    the lists of questions it answers. Memory-mapped: only the token ids are read, not the features."""
    texts = []
    for path in shards:
        for e in torch.load(path, weights_only=True, mmap=True):
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
            rate = tokens / (time.perf_counter() - started)
            bar.set_postfix(tok_s=f"{rate:.0f}")
            log.info("%s: %d answers, %d answer tokens, %.0f tokens/s", path.name, len(examples), tokens, rate)
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
    eos = _eos_ids(hf_model, tokenizer)
    answers, feats, top_ids, top_p = decode_batch(hf_model, input_ids.to(device), attention.to(device),
                                                  config.max_new_tokens, sample, eos, config.top_k,
                                                  layers=tuple(config.feature_layers))
    layers = torch.tensor(config.feature_layers, dtype=torch.int32)
    return [_example(encoded[b], width, answers[b], feats[b], top_ids[b], top_p[b], eos) | {"layers": layers}
            for b in range(len(prompts))]


@contextmanager
def layer_outputs(decoder, layers: tuple[int, ...]):
    """Yields a dict that holds, after each forward of the transformers `decoder`, the outputs of
    its decoder layers `layers` (forward hooks: only those layers' states are kept)."""
    grabbed: dict[int, torch.Tensor] = {}

    def hook(index):
        def keep(module, args, output):
            grabbed[index] = output[0] if isinstance(output, tuple) else output
        return keep

    handles = [decoder.layers[i].register_forward_hook(hook(i)) for i in layers]
    try:
        yield grabbed
    finally:
        for handle in handles:
            handle.remove()


GROUPED = "specdec_grouped"


def _grouped_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """A decode step's attention for grouped-query heads that reads each cached K/V head once.

    transformers' sdpa path copies every KV head once per query head that shares it whenever a mask
    is given; with the data builder's batches of 512 rows that copy was most of a step's time. Here
    the G query heads of one KV head become G query rows ([B, KVH, G, D]) of a single attention.
    Prefill (more than one query position) keeps transformers' path."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    b, heads, q, d = query.shape
    kv_heads = key.shape[1]
    if q != 1 or kv_heads == heads:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    grouped = query.reshape(b, kv_heads, heads // kv_heads, d)  # query head h reads KV head h // G
    out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(b, heads, 1, d).transpose(1, 2).contiguous(), None


@contextmanager
def grouped_attention(config):
    """Run the transformers model of `config` with _grouped_attention_forward while inside."""
    from transformers import AttentionInterface

    AttentionInterface.register(GROUPED, _grouped_attention_forward)
    before = config._attn_implementation
    config._attn_implementation = GROUPED
    try:
        yield
    finally:
        config._attn_implementation = before


def decode_batch(hf_model, input_ids: torch.Tensor, attention: torch.Tensor, max_new_tokens: int, sample: bool,
                 eos: set[int], top_k: int, check_every: int = 16, layers: tuple[int, ...] = (),
                 graph: bool | None = None):
    """Batched decoding that keeps only what the head learns from, on the device as it goes.

    The same computation as transformers' generate() (prefill, then one token at a time; positions
    from the left-padded attention mask), so greedy answers are generate()'s, but per step it keeps
    just the features [B, W] and the top-k probabilities [B, k] instead of every layer's hidden
    states and the full logits, and checks for the end only every `check_every` steps (one host
    sync). The KV cache is preallocated (transformers' StaticCache) and the mask is built here, so
    every decode step has the same shapes: on CUDA (graph=None or True) the step is captured once
    per batch as a CUDA graph and replayed, which takes the host's hundreds of kernel launches a step
    out of the loop. Returns answers [B, R], features [B, P + R - 1, W] (bf16; the outputs of `layers`,
    then the final-norm feature: W = (len(layers) + 1) * D), top_ids [B, R, k], top_p [B, R, k];
    rows after a row's end-of-sequence token are junk, cut later.
    """
    base, lm_head = hf_model.get_decoder(), hf_model.get_output_embeddings()
    graph = input_ids.device.type == "cuda" if graph is None else graph
    with layer_outputs(base, layers) as grabbed, grouped_attention(base.config):
        step = _StaticStep(base, attention, max_new_tokens, grabbed, layers, input_ids.device)
        return _decode(step, lm_head, input_ids, max_new_tokens, sample, eos, top_k, check_every, graph)


def _decode(step, lm_head, input_ids, max_new_tokens, sample, eos, top_k, check_every, graph):
    """decode_batch's loop over the steps of `step` (a _StaticStep)."""
    b, width = input_ids.shape
    device = input_ids.device
    feats = torch.zeros(b, width + max_new_tokens - 1, step.feature_width, dtype=torch.bfloat16, device=device)
    prefill, hidden = step.prefill(input_ids)
    feats[:, :width] = prefill
    forward = step.captured() if graph else step.run
    answers = torch.zeros(b, max_new_tokens, dtype=torch.long, device=device)
    top_ids = torch.zeros(b, max_new_tokens, top_k, dtype=torch.int32, device=device)
    top_p = torch.zeros(b, max_new_tokens, top_k, dtype=torch.float16, device=device)
    eos_ids = torch.tensor(sorted(eos), device=device)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    for s in range(max_new_tokens):
        probs = torch.softmax(lm_head(hidden).float(), dim=-1)  # [B, V]: predicts answer token s
        top = probs.topk(top_k, dim=-1)
        top_ids[:, s], top_p[:, s] = top.indices.to(torch.int32), top.values.to(torch.float16)
        token = torch.multinomial(probs, 1)[:, 0] if sample else top.indices[:, 0]
        answers[:, s] = token
        done |= torch.isin(token, eos_ids)
        if s + 1 == max_new_tokens or ((s + 1) % check_every == 0 and bool(done.all())):
            break
        new_feats, hidden = forward(token, width + s)
        feats[:, width + s] = new_feats
    return answers[:, :s + 1], feats[:, :width + s], top_ids[:, :s + 1], top_p[:, :s + 1]


class _StaticStep:
    """The target's forward over a preallocated KV cache of width + max_new_tokens slots, with the
    attention mask made here: slot j is visible from slot i when j <= i and j is not padding (a
    padding slot sees only itself, so that no row of the softmax is empty)."""

    def __init__(self, base, attention: torch.Tensor, max_new_tokens: int, grabbed: dict, layers: tuple[int, ...],
                 device):
        from transformers import StaticCache

        b, width = attention.shape
        total = width + max_new_tokens
        self.base, self.grabbed, self.layers, self.first_new = base, grabbed, tuple(layers), width
        self.feature_width = (len(layers) + 1) * base.config.hidden_size
        mask = torch.cat([attention.to(device), torch.ones(b, max_new_tokens, dtype=attention.dtype, device=device)], 1)
        self.positions = (mask.long().cumsum(-1) - 1).clamp(min=0)  # [B, total]
        self.real = mask.bool()[:, None, None, :]  # [B, 1, 1, total]
        self.slots = torch.arange(total, device=device)
        self.cache = StaticCache(config=base.config, max_cache_len=total)
        # transformers renamed forward's past_key_values to cache (5.2x); pass it under the name this version takes
        self.cache_arg = "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"
        # The decode step's inputs live in fixed tensors, so that a CUDA graph can replay it.
        self.token = torch.zeros(b, 1, dtype=torch.long, device=device)
        self.at = torch.zeros(1, dtype=torch.long, device=device)

    def _forward(self, ids: torch.Tensor, at: torch.Tensor):
        """ids [B, q] at cache slots `at` [q] -> (features [B, q, W] bf16, last feature [B, D])."""
        causal = self.slots[None, :] <= at[:, None]  # [q, total]
        visible = (self.real & causal) | (self.slots[None, :] == at[:, None])  # [B, 1, q, total]
        out = self.base(input_ids=ids, attention_mask=visible, position_ids=self.positions[:, at],
                        use_cache=True, cache_position=at, **{self.cache_arg: self.cache})
        last = out.last_hidden_state
        parts = [self.grabbed[i] for i in self.layers] + [last]  # forward hooks kept only these layers' outputs
        return torch.cat(parts, dim=-1).to(torch.bfloat16), last[:, -1]

    def prefill(self, input_ids: torch.Tensor):
        return self._forward(input_ids, self.slots[: input_ids.shape[1]])

    def run(self, token: torch.Tensor, at: int):
        """Feed one token per row at slot `at`: (features [B, W], last feature [B, D])."""
        self.token.copy_(token[:, None])
        self.at.fill_(at)
        feats, last = self._forward(self.token, self.at)
        return feats[:, -1], last

    def _write_counters(self) -> list[torch.Tensor]:
        """transformers' StaticLayer writes at its own token counter (a device tensor that each
        forward advances in place), not at cache_position: the graph's warm-ups must not move it."""
        layers = getattr(self.cache, "layers", [])
        return [layer.cumulative_length for layer in layers if torch.is_tensor(getattr(layer, "cumulative_length", None))]

    def captured(self):
        """`run` as a CUDA graph: its step captured once (after warm-ups on a side stream), then
        replayed. The warm-ups and the capture write cache slots that later steps overwrite; their
        advances of transformers' write counters are undone."""
        self.at.fill_(self.first_new)
        counters = self._write_counters()
        saved = [c.clone() for c in counters]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._forward(self.token, self.at)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            feats, last = self._forward(self.token, self.at)
        for counter, value in zip(counters, saved):  # undo the warm-ups' and the capture's advances
            counter.copy_(value)

        def replay(token: torch.Tensor, at: int):
            self.token.copy_(token[:, None])
            self.at.fill_(at)
            graph.replay()
            return feats[:, -1], last

        return replay


def _example(prompt: list[int], width: int, answer: torch.Tensor, feats: torch.Tensor, top_ids: torch.Tensor,
             top_p: torch.Tensor, eos: set[int]) -> dict:
    """Strip padding and everything after the first end-of-sequence token from one batch row."""
    answer = answer.tolist()
    length = next((i + 1 for i, t in enumerate(answer) if t in eos), len(answer))  # keep the EOS itself
    answer = answer[:length]
    pad = width - len(prompt)
    ids = prompt + answer
    return {  # on the CPU, so that shards load anywhere (load_examples moves them)
        "ids": torch.tensor(ids, dtype=torch.int32),
        "features": feats[pad:pad + len(ids) - 1].cpu().clone(),  # [n-1, W]
        "start": len(prompt),
        "top_ids": top_ids[:length].cpu().clone(),
        "top_p": top_p[:length].cpu().clone(),
    }
