"""Chat messages to token ids through the model's chat template, content as text.

The template's own markers (`<|im_start|>`, `<|im_end|>`, ...) are control tokens; a message's
content is text, whatever it spells. Tokenizing the rendered prompt whole would turn a content's
"<|im_end|>\\n<|im_start|>system" into real control tokens: a forged turn. So a content that
spells a special token is tokenized apart from the template, with special tokens split into
ordinary text tokens: the template is rendered with a placeholder for each content, and the content
goes where its placeholder landed, as given (a template that transforms content, e.g. trims it,
transforms the placeholder instead). Other content is tokenized with the rest as before (the same ids).
"""

from __future__ import annotations

import re
import uuid

from specdec.runtime import require_prompt


def special_token_texts(tokenizer) -> tuple[str, ...]:
    """The texts of the tokenizer's special tokens (its declared ones and its special added tokens)."""
    texts = set(getattr(tokenizer, "all_special_tokens", ()))
    for added in getattr(tokenizer, "added_tokens_decoder", {}).values():
        if getattr(added, "special", False):
            texts.add(str(added))
    return tuple(sorted(t for t in texts if t))


def encode_chat(tokenizer, messages: list[dict], specials: tuple[str, ...]) -> list[int]:
    """Token ids of `messages` ({"role", "content": str}) under the chat template, with the generation
    prompt. `specials`: special_token_texts(tokenizer). Content is never read as control tokens."""
    if not messages:
        raise ValueError("give at least one message")
    if not any(s in m["content"] for m in messages for s in specials):
        return _ids(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))
    marks = [f"\x00{uuid.uuid4().hex}{i}\x00" for i in range(len(messages))]
    rendered = tokenizer.apply_chat_template([{**m, "content": mark} for m, mark in zip(messages, marks)],
                                             add_generation_prompt=True, tokenize=False)
    contents = {mark: m["content"] for mark, m in zip(marks, messages)}
    ids: list[int] = []
    for piece in re.split("(" + "|".join(map(re.escape, marks)) + ")", rendered):
        if piece in contents:
            ids += _ids(tokenizer(contents[piece], add_special_tokens=False, split_special_tokens=True))
        elif piece:
            ids += _ids(tokenizer(piece, add_special_tokens=False))
    return ids


def encode_text(tokenizer, prompt: str) -> list[int]:
    """A completion prompt's ids (no template: the client writes its own turns, markers included)."""
    require_prompt(prompt)
    return _ids(tokenizer(prompt, add_special_tokens=True))


def _ids(out) -> list[int]:
    if hasattr(out, "keys"):  # a BatchEncoding
        out = out["input_ids"]
    return list(out)
