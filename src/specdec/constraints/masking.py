"""Pure tensor code for constraints: bitmasks to boolean masks, masked logits, masked q.

A bitmask is llguidance's layout: int32 [n, W], W = ceil(V_tok / 32), bit b of word w allows token
32 w + b. Rows of the target's logits [n, V] take it as a boolean mask [n, V] (tokens past the
bitmask never allowed).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from specdec.sampling import sample


def unpack_bitmask(bits: torch.Tensor, vocab: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """bits: int32 [n, W] on the host -> bool [n, vocab] on device (columns past 32 W never allowed).
    A row that allows nothing (it follows the grammar's end, so nothing drawn from it is ever emitted)
    allows everything instead, so that the rule's softmax stays defined. On a GPU the bits travel
    (4 bytes a 32 tokens) and are unpacked there, without a wait; on the host numpy unpacks them."""
    if torch.device(device).type != "cpu":
        return unpack_on_device(bits.to(device, non_blocking=True), vocab)
    allowed = _padded(bit_columns(bits, min(32 * bits.shape[1], vocab), host=True), vocab)
    empty = (bits == 0).all(dim=1)  # [n]
    if bool(empty.any()):
        allowed = allowed.clone()
        allowed[empty] = True
    return allowed.to(device, non_blocking=True)


def unpack_on_device(bits: torch.Tensor, vocab: int) -> torch.Tensor:
    """unpack_bitmask in tensor ops on bits' own device (no host read): int32 [n, W] -> bool [n, vocab]."""
    allowed = _padded(bit_columns(bits, min(32 * bits.shape[1], vocab), host=False), vocab)
    return allowed | (bits == 0).all(dim=1, keepdim=True)


def _padded(allowed: torch.Tensor, vocab: int) -> torch.Tensor:
    """bool [n, <= vocab] -> [n, vocab], the columns past the bitmask never allowed."""
    if allowed.shape[1] < vocab:
        allowed = torch.cat([allowed, allowed.new_zeros(allowed.shape[0], vocab - allowed.shape[1])], dim=1)
    return allowed


def token_allowed(bits_row: torch.Tensor, token: int) -> bool:
    """Whether a host bitmask row (int32 [W]) allows token."""
    word = token >> 5
    return word < bits_row.shape[0] and bool((int(bits_row[word]) >> (token & 31)) & 1)


def mask_logits(logits: torch.Tensor, offsets: Sequence[int], masks: Sequence[torch.Tensor | None]) -> torch.Tensor:
    """The target's logits with each constrained sequence's disallowed tokens at -inf (rule 8), before
    any warp (temperature, top-k, top-p, min-p then act on the allowed tokens: p masked and renormalised).
    logits: [T, V]; offsets: [B + 1] host ints (sequence i owns rows offsets[i]:offsets[i + 1]);
    masks: [B], each None (unconstrained), a packed bitmask int32 [offsets[i + 1] - offsets[i], W]
    (llguidance's layout, on logits' device or the host) or bool [offsets[i + 1] - offsets[i], V] on
    logits' device. Packed masks are applied as they are (apply_bitmask: no [T, V] bool unpacked).
    Returns logits itself when no sequence is constrained, else a new tensor."""
    if all(m is None for m in masks):
        return logits
    given = [m for m in masks if m is not None]
    if all(m.dtype == torch.int32 for m in given) and len({m.shape[1] for m in given}) == 1:
        return apply_bitmask(logits, _packed_rows(logits, offsets, masks, given[0].shape[1]))
    rows = []
    for lo, hi, mask in zip(offsets[:-1], offsets[1:], masks):
        if mask is None:
            mask = torch.ones(hi - lo, logits.shape[1], dtype=torch.bool, device=logits.device)
        elif mask.dtype == torch.int32:
            mask = unpack_bitmask(mask.cpu(), logits.shape[1], logits.device)
        if mask.shape != (hi - lo, logits.shape[1]):
            raise ValueError(f"a mask of {list(mask.shape)} for {hi - lo} rows of {logits.shape[1]} logits")
        rows.append(mask)
    allowed = rows[0] if len(rows) == 1 else torch.cat(rows)  # [T, V]
    return torch.where(allowed, logits, float("-inf"))


def _packed_rows(logits: torch.Tensor, offsets: Sequence[int], masks: Sequence[torch.Tensor | None],
                 words: int) -> torch.Tensor:
    """The step's packed masks int32 [T, W] on logits' device; an unconstrained sequence's rows are all
    zero words, which allow everything (the empty-row rule of unpack_bitmask)."""
    rows = []
    for lo, hi, mask in zip(offsets[:-1], offsets[1:], masks):
        if mask is None:
            mask = torch.zeros(hi - lo, words, dtype=torch.int32)
        elif mask.shape[0] != hi - lo:
            raise ValueError(f"a bitmask of {list(mask.shape)} for {hi - lo} rows of logits")
        rows.append(mask.to(logits.device, non_blocking=True))
    return rows[0] if len(rows) == 1 else torch.cat(rows)


def apply_bitmask(logits: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """logits [n, V] with the tokens that the packed bitmask bits (int32 [n, W], on logits' device)
    refuses at -inf: the values where(unpack_bitmask(bits, V), logits, -inf) gives, bit for bit, without
    a bool [n, V]. Only the first min(32 W, V) columns are read from bits (on the host numpy's
    unpackbits reads them as bytes; on a device shifts do); the columns past them are -inf, and a row
    of zero words allows everything."""
    if bits.shape[0] != logits.shape[0]:
        raise ValueError(f"a bitmask of {bits.shape[0]} rows for {logits.shape[0]} rows of logits")
    width = min(32 * bits.shape[1], logits.shape[1])
    out = torch.empty_like(logits)  # [n, V]: one write of each column (faster than where's and a cat)
    out[:, width:].fill_(float("-inf"))
    out[:, :width].copy_(logits[:, :width]).masked_fill_(bit_columns(bits, width).logical_not(), float("-inf"))
    empty = (bits == 0).all(dim=1)  # [n]
    if bits.device.type != "cpu":  # no host read on a device
        return torch.where(empty[:, None], logits, out)
    if bool(empty.any()):
        out[empty] = logits[empty]
    return out


def bit_columns(bits: torch.Tensor, width: int, host: bool | None = None) -> torch.Tensor:
    """The bits' first width tokens as bool [n, width] (width <= 32 W) on bits' device, no padding and
    no empty-row rule. host (default: bits on the CPU): numpy reads the bytes; else tensor shifts."""
    if bits.device.type == "cpu" if host is None else host:
        unpacked = np.unpackbits(bits.numpy().view(np.uint8), axis=1, bitorder="little")  # [n, 32 W], 0/1
        return torch.from_numpy(unpacked).view(torch.bool)[:, :width]
    return ((bits.unsqueeze(-1) >> _shifts(bits.device)) & 1).bool().reshape(bits.shape[0], -1)[:, :width]


_SHIFTS: dict = {}


def _shifts(device: torch.device) -> torch.Tensor:
    """int32 [32] 0..31 on device (made once: no host-to-device copy a step)."""
    if device not in _SHIFTS:
        _SHIFTS[device] = torch.arange(32, dtype=torch.int32, device=device)
    return _SHIFTS[device]


def single_rows(bits: torch.Tensor) -> list[bool]:
    """By row of a host bitmask (int32 [n, W]): whether it allows exactly one token, in a few tensor ops."""
    one_word = (bits != 0).sum(dim=1) == 1  # [n]
    word = bits.to(torch.int64).sum(dim=1) & 0xFFFFFFFF  # [n]: the one nonzero word where one_word
    return (one_word & ((word & (word - 1)) == 0)).tolist()


def masked_q(q: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor | None:
    """The draft's q [V] restricted to the allowed tokens (bool [V]) and renormalised, or None where q
    gives them no mass (then nothing can be drafted there)."""
    kept = torch.where(allowed, q, torch.zeros_like(q))
    mass = float(kept.sum())
    return kept / mass if mass > 0 else None


def settle_draft_row(token: int, token_ok: bool, q: torch.Tensor | None, allowed: torch.Tensor | None,
                     generator: torch.Generator) -> tuple[int | None, torch.Tensor | None, bool]:
    """One drafted token under the grammar: (the token to verify or None to cut the draft here, its q
    row [V] or None for a one-hot draft, whether the draft may go on after it).

    token_ok: the grammar allows token here. q: [V] what the drafter sampled it from (None: it chose
    deterministically); allowed: bool [V] the grammar's mask here (None with q None).
    - one-hot draft: kept if allowed, else the draft is cut (a deterministic choice made before the
      verify: the position becomes the bonus, drawn from the masked p, as the rule would have drawn
      from the residual max(0, p_m - onehot) = p_m).
    - sampled draft: the token must follow the masked q_m = q restricted and renormalised (rule 8):
      an allowed token sampled from q is a sample from q_m; a disallowed one is replaced by a draw
      from q_m (together: exactly q_m), and the drafts after it, which followed the old token, are cut.
    """
    if q is None:
        return (token, None, True) if token_ok else (None, None, False)
    q_m = masked_q(q, allowed)
    if q_m is None:
        return None, None, False
    if token_ok:
        return token, q_m, True
    return int(sample(q_m, generator)), q_m, False


def one_hot_rows(tokens: list[int], vocab: int, device: torch.device | str) -> torch.Tensor:
    """[n, vocab] fp32 one-hot rows on tokens (the q of drafts chosen deterministically)."""
    rows = torch.zeros(len(tokens), vocab, device=device)
    if tokens:
        rows[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
    return rows
