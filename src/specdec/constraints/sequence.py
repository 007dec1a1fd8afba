"""One sequence's constraint through the rounds of the engine: grammar drafts, masks along the draft,
rollback with the caches.

Between rounds the matcher has consumed exactly the sequence's generated text (the prompt is not
constrained). A round:
1. grammar_draft(limit, extra, room): the tokens the grammar dictates from here (llguidance's
   fast-forward tokens, then the rest of the forced text tokenized), drafted with one-hot q at no
   draft cost; the matcher advances along them. The round may verify `extra` drafts more (the
   drafter's budget, within the sequence's room).
2. fit_draft(draft, generator): the drafter's proposal after them, walked under the grammar
   (masks.settle_draft_row: a one-hot draft is cut where it leaves the grammar, a sampled one
   follows the masked q), then again what the grammar dictates after it, up to the round's limit
   (a closing quote and the next key after a drafted value). Each grammar draft is a function of
   the draft before it, so its one-hot q is what it was drawn from, given that prefix (rule 1).
   Returns the round's whole draft. The matcher is left advanced along all K drafts, as the slot's
   cache holds them after the verify.
   The verify's masks, bool [K + 1, V] (row j: the matcher advanced along the first j drafts; row
   K: the bonus's), are computed apart (constraints.overlap: rewind, llguidance's masks along the
   draft, restore), while the target's pass runs.
3. settle(num_drafted, num_accepted, tokens): roll the matcher back to the kept drafts (as the cache
   is rolled back) and consume the recovered/bonus token; returns the round's tokens to emit, cut
   after the token that ends the grammar.
"""

from __future__ import annotations

import functools
import time

import torch

from specdec.constraints import masking
from specdec.drafters.base import Draft
from specdec.errors import SpecdecError


class ConstraintBroken(SpecdecError):
    """The matcher refused a token the engine emitted: a bug (a mask not applied, a rollback missed)."""


def _timed(method):
    """Add the method's seconds to the constraint's `seconds` (the host's grammar work, reported as
    SpecStats.constraint_time)."""
    @functools.wraps(method)
    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start
    return timed


class SequenceConstraint:
    """A matcher (llguidance.LLMatcher, started on the sequence's grammar) and a round's state.
    vocab: the width of the target's logits; device: the target's. grammar_drafts: False drafts
    nothing from the grammar (plain constrained decoding, a benchmark's baseline). mask_width: the
    tokens the matcher's masks cover (the tokenizer's; None: vocab); those past it are never allowed.
    overlap_masks: the verify's masks are computed beside the target's pass (constraints.overlap).
    ll_tokenizer: the matcher's llguidance tokenizer, to draft the forced text that the fast-forward
    tokens leave (None: the fast-forward tokens only)."""

    def __init__(self, matcher, vocab: int, device: torch.device, grammar_drafts: bool = True,
                 mask_width: int | None = None, overlap_masks: bool = True, ll_tokenizer=None):
        self._matcher = matcher
        self._ll_tokenizer = ll_tokenizer
        self.grammar_drafts = grammar_drafts
        self.overlap_masks = overlap_masks
        self.seconds = 0.0  # host seconds of grammar work in the step's critical path so far
        self.overlapped_seconds = 0.0  # host seconds of verify masks computed beside the target's pass
        self.vocab = vocab
        self.device = device
        self._width = ((mask_width or vocab) + 31) // 32
        self._drafted: list[int] = []  # the round's whole draft (fit_draft's)
        self._head: list[int] = []  # the round's grammar drafts ahead of the drafter's
        self._limit = 0  # the most drafts the round may verify
        self.grammar_positions: list[int] = []  # the round's draft positions that the grammar drafted
        self.single_rows: list[bool] = []  # by verified position: the mask allowed one token only

    @property
    def stopped(self) -> bool:
        """The grammar is complete and admits nothing more (but the end-of-sequence token)."""
        return self._matcher.is_stopped()

    @_timed
    def grammar_draft(self, limit: int, extra: int = 0, room: int = 0) -> list[int]:
        """Up to limit tokens the grammar alone dictates from here; the matcher advances along them.
        The round verifies at most those and `extra` more, `room` in all at most (fit_draft's limit)."""
        self._head = self._forced_run(limit)
        self._limit = len(self._head) + max(0, min(extra, room - len(self._head)))
        self.grammar_positions = list(range(len(self._head)))
        return self._head

    @property
    def drafter_budget(self) -> int:
        """How many drafts the drafter may propose after the round's grammar drafts (grammar_draft's
        `extra`, within its room)."""
        return self._limit - len(self._head)

    def grammar_counts(self, num_accepted: int) -> tuple[int, int]:
        """The round's grammar drafts, and how many of them the verdict kept."""
        return len(self.grammar_positions), sum(j < num_accepted for j in self.grammar_positions)

    def _forced_run(self, limit: int) -> list[int]:
        """Up to limit tokens the grammar dictates from the matcher's state (none without grammar
        drafts), consumed: llguidance's fast-forward tokens (the forced text, tokenized), then the
        rest of the forced text that they leave (_forced_guess). No mask is computed: at every prefix
        of the workload's 32 documents, no position after the fast-forward tokens allowed a single
        token (925 states; docs/structured.md), so a mask there (in the critical path) bought nothing."""
        tokens = []
        if limit <= 0 or not self.grammar_drafts or self.stopped:
            return tokens
        forced = self._matcher.compute_ff_bytes() if self._ll_tokenizer is not None else b""
        for token in self._matcher.compute_ff_tokens()[:limit]:
            self._consume(token)
            tokens.append(token)
        if forced and len(tokens) < limit and not self.stopped:
            tokens += self._forced_guess(forced, tokens, limit - len(tokens))
        return tokens

    def _forced_guess(self, forced: bytes, ff: list[int], limit: int) -> list[int]:
        """The forced text past the fast-forward tokens ff (llguidance holds back a last token that the
        free text after it could merge into: `":"` before a string value, the opening quote), tokenized
        canonically, consumed: up to limit tokens. A guess at the target's tokenization (it may write
        `":` then `"`), and a function of the text before it, so its one-hot q is what it was drawn
        from (rule 1); cut where the grammar refuses a token."""
        done = self._ll_tokenizer.decode_bytes(ff)
        if len(forced) <= len(done) or not forced.startswith(done):
            return []
        guessed = []
        for token in self._ll_tokenizer.tokenize_bytes(forced[len(done):])[:limit]:
            if self._matcher.validate_tokens([token]) != 1:
                break
            self._consume(token)
            guessed.append(token)
            if self.stopped:
                break
        return guessed

    @_timed
    def fit_draft(self, draft: Draft | None, generator: torch.Generator) -> Draft:
        """The round's draft: grammar_draft's tokens, then the drafter's (draft: proposed after them,
        None for none) walked under the grammar, then what the grammar dictates after them. Returns
        Draft [K] with q [K, V] or None. Only the masks that decide the draft are computed here (a
        sampled token's, to mask its q); the verify's masks come from verify_bits, which can run
        while the target's pass does (constraints.overlap)."""
        tokens, q_rows = list(self._head), [None] * len(self._head)
        proposed = [] if draft is None or self.stopped else draft.tokens.tolist()
        for i, token in enumerate(proposed):
            q = None if draft.q is None else draft.q[i]
            token_ok, allowed = self._check(token, q)
            token, q, go_on = masking.settle_draft_row(token, token_ok, q, allowed, generator)
            if token is None:
                break
            self._consume(token)
            tokens.append(token)
            q_rows.append(q)
            if not go_on or self.stopped:
                break
        tail = self._forced_run(self._limit - len(tokens))
        self.grammar_positions += range(len(tokens), len(tokens) + len(tail))
        tokens += tail
        q_rows += [None] * len(tail)
        self._drafted = tokens
        return self._draft(tokens, q_rows)

    def _check(self, token: int, q: torch.Tensor | None) -> tuple[bool, torch.Tensor | None]:
        """Whether the grammar allows a drafted token here, and (a sampled one's, q [V] given) the
        mask bool [V] on q's device that its q is restricted to. A deterministic draft needs no mask."""
        if q is None:
            return self._matcher.validate_tokens([token]) == 1, None
        bits = self._mask_row()
        return masking.token_allowed(bits, token), masking.unpack_bitmask(bits[None], self.vocab, q.device)[0]

    @property
    def matcher(self):
        """The llguidance matcher (constraints.overlap computes a batch's masks from it)."""
        return self._matcher

    def rewind(self) -> list[int]:
        """Roll the matcher back to the round's start (before its drafts) and return the drafts
        (fit_draft's tokens): the verify's masks are computed from there along them."""
        # The matcher's own rollback: this is no round's verdict (a fault that skips rollback() skips the verdict's).
        if self._drafted and not self._matcher.rollback(len(self._drafted)):
            raise ConstraintBroken(f"the grammar matcher could not rewind the round: {self._matcher.get_error()}")
        return self._drafted

    def restore(self, bits: torch.Tensor) -> None:
        """After rewind and the masks: the matcher takes the drafts again (as the slot's cache holds
        them after the verify). bits: int32 [K + 1, W] the verify's masks (row j: after j drafts),
        read for the positions where one token alone was allowed."""
        if self._drafted and not self._matcher.consume_tokens(self._drafted):
            raise ConstraintBroken(f"the grammar refused the round's drafts again: {self._matcher.get_error()}")
        self.single_rows = masking.single_rows(bits)

    @property
    def mask_words(self) -> int:
        """W: int32 words of one bitmask row."""
        return self._width

    @_timed
    def settle(self, num_drafted: int, num_accepted: int, tokens: list[int]) -> list[int]:
        """After the verify: keep num_accepted of the num_drafted drafts in the matcher, then consume
        the recovered or bonus token. tokens: the round's kept drafts and that token. Returns the
        tokens to emit: all, or those up to the one that completed the grammar."""
        self.rollback(num_drafted - num_accepted)
        if self.stopped:  # the last kept draft completed the grammar: the bonus token is not text
            return tokens[:num_accepted]
        self._consume(tokens[-1])
        return tokens

    def take_seconds(self) -> tuple[float, float]:
        """The grammar's host seconds since the last call: in the critical path, and overlapped."""
        seconds, self.seconds = self.seconds, 0.0
        overlapped, self.overlapped_seconds = self.overlapped_seconds, 0.0
        return seconds, overlapped

    def rollback(self, n: int) -> None:
        """Forget the newest n consumed tokens (as a cache rollback forgets rejected drafts)."""
        if n and not self._matcher.rollback(n):
            raise ConstraintBroken(f"the grammar matcher could not roll back {n} tokens: "
                                   f"{self._matcher.get_error()}")

    def _mask_row(self) -> torch.Tensor:
        """The mask at the matcher's state, int32 [W] on the host."""
        import llguidance.torch

        bits = torch.empty(1, self._width, dtype=torch.int32)
        llguidance.torch.fill_next_token_bitmask(self._matcher, bits, 0)
        return bits[0]

    def _consume(self, token: int) -> None:
        if not self._matcher.consume_token(token):
            raise ConstraintBroken(f"the grammar refused token {token}: {self._matcher.get_error()}")

    def _draft(self, tokens: list[int], q_rows: list[torch.Tensor | None]) -> Draft:
        """Draft [K]: q None when every token was chosen deterministically (q_rows all None), else
        [K, V]: a sampled token's masked q, one-hot rows for the others (grammar drafts)."""
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)
        if all(q is None for q in q_rows):
            return Draft(ids)
        one_hot = masking.one_hot_rows(tokens, self.vocab, self.device)  # [K, V]
        return Draft(ids, torch.stack([one_hot[j] if q is None else q for j, q in enumerate(q_rows)]))
