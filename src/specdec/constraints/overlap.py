"""The verify masks of a step's constrained sequences, computed while the target's pass runs.

A verify's masks (row j: the grammar's allowed tokens after the round's first j drafts) decide
nothing before the pass: the draft is fixed (SequenceConstraint.fit_draft computed only the masks
that choose it), and the masks are first read by the rule, after the pass. So MaskJob.start hands
them to a worker thread before the engine queues the forward, and result() waits for them after
it. On a GPU the forward is queued asynchronously and the host is idle until the rule; on a CPU
the forward runs in the calling thread, and llguidance's mask calls release the GIL, so the masks
take the other core. The masks are the same bits whoever computes them (llguidance's masks along
the draft, from the matcher rewound to the round's start), so the draws are the same (rule 8).

While a job runs, its sequences' matchers belong to the worker: the engine touches none of them
until result() returns.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from specdec.constraints import masking
from specdec.constraints.sequence import SequenceConstraint

_worker: ThreadPoolExecutor | None = None  # one thread for every engine: a step's masks are one llguidance call
_executor = None  # llguidance.LLExecutor: its threads fill the masks of many sequences in parallel


def _pools() -> tuple[ThreadPoolExecutor, object]:
    global _worker, _executor
    if _worker is None:
        import llguidance

        _executor = llguidance.LLExecutor()
        _worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specdec-masks")
    return _worker, _executor


def verify_bits(constraints: Sequence[SequenceConstraint]) -> list[torch.Tensor]:
    """Each constraint's verify masks, int32 [K_i + 1, W] on the host, in one llguidance call over all
    of them (parallel across sequences); each matcher ends where it started (after its drafts)."""
    _, executor = _pools()
    import llguidance.torch

    drafts = [c.rewind() for c in constraints]
    offsets = [0]
    for d in drafts:
        offsets.append(offsets[-1] + len(d) + 1)
    bits = torch.zeros(offsets[-1], constraints[0].mask_words, dtype=torch.int32)  # [sum(K_i + 1), W]
    along = [(c.matcher, lo, d) for c, lo, d in zip(constraints, offsets, drafts) if d]
    alone = [(c.matcher, lo) for c, lo, d in zip(constraints, offsets, drafts) if not d]  # llguidance wants drafts
    if along:
        llguidance.torch.fill_next_token_bitmask_par_with_draft_tokens(executor, along, bits)
    if alone:
        llguidance.torch.fill_next_token_bitmask_par(executor, alone, bits)
    rows = [bits[lo:hi] for lo, hi in zip(offsets[:-1], offsets[1:])]
    for c, r in zip(constraints, rows):
        c.restore(r)
    return rows


class MaskJob:
    """The verify masks of a step's units, on their way. constraints: [B], a decoding unit's constraint
    or None (unconstrained, or a prefill chunk). overlap: compute them in the worker thread (False:
    here and now, in the step's critical path; a benchmark's baseline)."""

    def __init__(self, constraints: Sequence[SequenceConstraint | None], overlap: bool = True):
        self._constraints = list(constraints)
        self._active = [c for c in self._constraints if c is not None]
        self._future: Future | None = None
        self._masks: list[torch.Tensor] | None = None  # bool [K_i + 1, V], or int32 [K_i + 1, W] for a device
        if not self._active:
            return
        if overlap:
            start = time.perf_counter()
            self._future = _pools()[0].submit(self._compute)
            self._charge(time.perf_counter() - start, 0.0)  # handing the work over is the critical path's
        else:
            self._masks, seconds = self._compute()
            self._charge(seconds, 0.0)

    def _compute(self) -> tuple[list[torch.Tensor], float]:
        """The masks: unpacked here to bool [K_i + 1, V] for a host target (the unpacking then runs
        beside the pass, not in the step's critical path), left packed int32 [K_i + 1, W] for a device one
        (the rule applies them as they are: masking.apply_bitmask)."""
        start = time.perf_counter()
        bits = verify_bits(self._active)
        masks = [masking.unpack_bitmask(b, c.vocab) if c.device.type == "cpu" else b
                 for c, b in zip(self._active, bits)]
        return masks, time.perf_counter() - start

    def result(self) -> list[torch.Tensor | None]:
        """[B]: each constrained unit's masks on its constraint's device (int32 [K_i + 1, W] sent without
        a wait to a device, bool [K_i + 1, V] on the host), else None. Waits for the worker; the wait counts as the grammar's critical-path
        time, unless a device target's pass was still running when it ended (the wait then delayed
        nothing: the rule's work queues behind the pass), when it counts as beside the pass."""
        if not self._active:
            return [None] * len(self._constraints)
        start = time.perf_counter()
        passing = _pass_marker(self._active[0].device)
        if self._future is not None:
            self._masks, seconds = self._future.result()
            self._future = None
            self._charge(0.0, seconds)
        waited = time.perf_counter() - start
        hidden = passing is not None and not passing.query()
        start = time.perf_counter()
        masks = iter([m.to(c.device, non_blocking=True) for c, m in zip(self._active, self._masks)])
        out = [None if c is None else next(masks) for c in self._constraints]
        self._charge(time.perf_counter() - start + (0.0 if hidden else waited), waited if hidden else 0.0)
        return out

    def _charge(self, seconds: float, overlapped: float) -> None:
        """Each sequence is charged the whole job's time (it waited for the batch's masks)."""
        for c in self._active:
            c.seconds += seconds
            c.overlapped_seconds += overlapped


def _pass_marker(device: torch.device):
    """A CUDA event after the work queued so far on device's current stream (the target's pass), or
    None on the host (there the pass ran in this thread: a wait after it is all critical path)."""
    if device.type != "cuda":
        return None
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event
