"""One sequence at a time: the single-sequence face of the batched engine.

There is one round loop, batched.BatchedEngine's, for every drafter and every batch size; an
Engine is a batch of one over it: its target's own cache is the one slot (models.slots.
own_cache_slot), its one drafter is lent to each request in turn. So the invariant between rounds,
the rollback of rejected tokens and the pipelined plain steps are the batched engine's (batched.py).

Why the target's own cache rather than a one-slot NativeSlots: engines over one target share it, as
they always shared the target's cache (the plain baseline of `--compare` and of the benchmarks runs
on graphs the speculative run already captured), no second cache is allocated, and any CausalLM can
be a target (a tensor-parallel one holds its cache across its ranks' processes).
"""

from __future__ import annotations

from typing import Iterator

from specdec.engine.batched import BatchConfig, BatchedEngine, SequenceHandle
from specdec.drafters.base import Drafter
from specdec.errors import UnsupportedHereError
from specdec.generation import EmittedToken, Generation, GenerationConfig, Origin, SpecStats
from specdec.models.base import CausalLM
from specdec.models.slots import own_cache_slot

__all__ = ["EmittedToken", "Engine", "Generation", "GenerationConfig", "Origin", "SpecStats"]


class Engine:
    """Speculative decoding of one sequence at a time with a target and any drafter."""

    def __init__(self, target: CausalLM, drafter: Drafter, eos_token_ids=(), decode=None,
                 overlap: bool | None = None, grammars=None):
        """eos_token_ids: ids that end generation. decode: list[int] -> str, needed for stop strings.
        overlap: with a drafter that drafts nothing, queue each plain step before reading the token of
        the one before (BatchConfig.pipeline; default: on CUDA, where the GPU then stays busy while
        the host checks it). grammars: a constraints.grammar.GrammarCompiler for the target's
        tokenizer, to serve GenerationConfig.constraint (None: constrained requests are refused)."""
        if not target.verify_rows_match_steps:
            raise UnsupportedHereError(f"{target.name!r} cannot be a target: its single-token steps give other "
                                       "logits than its verify passes (e.g. the megakernel); use it as a draft only")
        self.target = target
        self.drafter = drafter
        self.eos_token_ids = frozenset(eos_token_ids)
        self.decode = decode
        # The whole prompt in one chunk: at batch 1 no other sequence waits behind it.
        config = BatchConfig(prefill_chunk=target.max_length, pipeline=overlap)
        self._batch = BatchedEngine(own_cache_slot(target), lambda: drafter, self.eos_token_ids, decode, config,
                                    grammars=grammars)
        self._current: SequenceHandle | None = None

    def generate(self, prompt: list[int], config: GenerationConfig) -> Generation:
        """Run to the end and return the finished Generation."""
        return self.stream(prompt, config).run()

    def stream(self, prompt: list[int], config: GenerationConfig) -> Generation:
        """Start a generation (a bad request raises InvalidRequestError here); iterate it for its
        tokens. A new stream ends one left unfinished: the engine holds one sequence at a time."""
        if self._current is not None and not self._current.done:
            self._current.cancel()
        handle = self._batch.submit(prompt, config, drafter=self.drafter)
        self._current = handle
        generation = Generation(iter(()), handle.stats)
        generation._tokens = self._tokens(handle, generation)
        return generation

    def _tokens(self, handle: SequenceHandle, generation: Generation) -> Iterator[EmittedToken]:
        """The handle's tokens (iterating it steps the engine; closing this cancels the sequence), then
        its finish reason on the generation. The slot is the target's own cache, which whatever ran
        on the target since the last generation (a reference decoding, a drafter's recording) may
        have filled: it is emptied first, as a slot starts empty."""
        self.target.reset()
        yield from handle
        generation.finish_reason = handle.finish_reason
