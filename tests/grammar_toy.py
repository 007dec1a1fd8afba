"""A toy tokenizer of 16 tokens that llguidance accepts, and the constrained references the structured
output tests compare the engine with: plain constrained decoding, and the exact distribution of every
complete output of a finite grammar.

Tokens: <unk> <s> </s>, the characters a b c 0 1 { } " : , and the merges ab ba {" ":
(a byte-level BPE tokenizer).
"""

from __future__ import annotations

import torch

from specdec.constraints import masking
from specdec.sampling import SamplingParams, warp_logits

SPECIAL = ["<unk>", "<s>", "</s>"]
CHARS = ["a", "b", "c", "0", "1", "{", "}", '"', ":", ","]
MERGES = [("a", "b"), ("b", "a"), ("{", '"'), ('"', ":")]
EOS = 2


def toy_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL + CHARS + ["".join(m) for m in MERGES])}
    tok = Tokenizer(models.BPE(vocab, MERGES, unk_token="<unk>"))
    # Byte-level, as GPT-2-style tokenizers are (these ASCII characters are their own byte symbols).
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = "<s>{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return fast


VOCAB = len(SPECIAL) + len(CHARS) + len(MERGES)


def allowed_row(matcher, vocab: int) -> torch.Tensor:
    """bool [vocab]: what the matcher allows next (an independent read of llguidance's mask)."""
    import llguidance.torch

    bits = llguidance.torch.allocate_token_bitmask(1, vocab)
    llguidance.torch.fill_next_token_bitmask(matcher, bits, 0)
    return masking.unpack_bitmask(bits, vocab)[0]


def constrained_p(logits: torch.Tensor, matcher, params: SamplingParams) -> torch.Tensor:
    """The reference's p [V]: the target's logits masked to the grammar, then warped."""
    allowed = allowed_row(matcher, logits.shape[-1])
    return warp_logits(logits.masked_fill(~allowed, float("-inf")), params)


def plain_constrained_greedy(next_logits, matcher, prompt: list[int], max_new: int) -> list[int]:
    """Plain decoding of the constrained target: argmax of the masked logits, one token a step, until
    the end-of-sequence token, the grammar's end or max_new tokens. next_logits(context) -> [V]."""
    out = []
    while len(out) < max_new and not matcher.is_stopped():
        token = int(constrained_p(next_logits(prompt + out), matcher, SamplingParams()).argmax())
        assert matcher.consume_token(token)
        out.append(token)
        if token == EOS:
            break
    return out


def exact_outputs(next_logits, matcher, prompt: list[int], max_new: int, params: SamplingParams,
                  prefix: tuple = (), prob: float = 1.0, out: dict | None = None) -> dict[tuple, float]:
    """P(each complete output) under plain constrained sampling, by enumerating every path (a finite grammar)."""
    out = {} if out is None else out
    if len(prefix) == max_new or matcher.is_stopped() or (prefix and prefix[-1] == EOS):
        out[prefix] = out.get(prefix, 0.0) + prob
        return out
    p = constrained_p(next_logits(prompt + list(prefix)), matcher, params)
    for token in torch.nonzero(p).flatten().tolist():
        assert matcher.consume_token(token)
        exact_outputs(next_logits, matcher, prompt, max_new, params, prefix + (token,), prob * float(p[token]), out)
        matcher.rollback(1)
    return out


def only_token(bits_row: torch.Tensor) -> int | None:
    """The one token a host bitmask row (int32 [W]) allows, or None when it allows none or several: the
    row-by-row reference that masking.single_rows must agree with."""
    nonzero = torch.nonzero(bits_row).flatten()
    if nonzero.numel() != 1:
        return None
    word = int(bits_row[nonzero[0]]) & 0xFFFFFFFF
    if word & (word - 1):
        return None
    return int(nonzero[0]) * 32 + word.bit_length() - 1
