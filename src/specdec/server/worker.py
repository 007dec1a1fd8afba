"""One engine, one thread, a bounded queue: the server's scheduler.

The engine is synchronous and keeps one sequence's KV cache, so requests run one at a time on a
single worker thread (a one-thread executor is both the lock and the FIFO queue). Each job sends
events back to the asyncio loop through an asyncio.Queue. A job whose client went away sets
`cancelled`; the thread sees it after the current round and closes the generation. On shutdown
the server stops admitting (`stop_accepting`) and, at its deadline, `abort_all` answers every job
still in the system with an error.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from specdec.engine import GenerationConfig, SpecStats
from specdec.errors import SpecdecError
from specdec.runtime import Runtime, cut_at_stop
from specdec.server.metrics import ServerMetrics
from specdec.server.protocol import APIError


@dataclass
class Job:
    runtime: Runtime
    prompt_ids: list[int]
    config: GenerationConfig
    arrived: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)
    started: bool = False  # the engine thread took it (set under the worker's lock)


@dataclass(frozen=True)
class TokenEvent:
    text: str  # new text (may hold several tokens' worth when a piece was held back)
    tokens: list[dict]  # [{"id", "origin", "round"}] for the tokens this text came from
    stats: dict  # running counts: rounds, drafted, accepted, generated


@dataclass(frozen=True)
class DoneEvent:
    finish_reason: str  # "stop", "length" or "abort"
    text: str  # the whole answer (stop strings cut)
    tokens: list[dict]  # tokens not yet sent with any text
    stats: SpecStats


@dataclass(frozen=True)
class ErrorEvent:
    error: APIError


class TextStream:
    """Incremental detokenization that never shows text it may have to take back.

    Held back: an incomplete UTF-8 character (decoded as U+FFFD) and any tail that could be the start
    of a stop string. Everything shown concatenates to the final text.
    """

    def __init__(self, decode: Callable[[list[int]], str], stop: tuple[str, ...]):
        self.decode, self.stop, self.shown = decode, stop, ""

    def update(self, token_ids: list[int], final: bool) -> str:
        text = cut_at_stop(self.decode(token_ids), self.stop) if self.stop else self.decode(token_ids)
        if not final:
            text = text.rstrip("\ufffd")
            text = text[: len(text) - _stop_prefix_len(text, self.stop)]
        if len(text) <= len(self.shown):
            return ""
        delta, self.shown = text[len(self.shown):], text
        return delta


def _stop_prefix_len(text: str, stop: tuple[str, ...]) -> int:
    """Length of the longest tail of text that is a proper prefix of a stop string."""
    best = 0
    for s in stop:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best


def _run_job(job: Job, emit: Callable[[object], None], metrics: ServerMetrics) -> None:
    """On the engine thread: generate, sending a TokenEvent whenever new text can be shown."""
    generation = job.runtime.engine.stream(job.prompt_ids, job.config)
    stream = TextStream(job.runtime.decode, job.config.stop)
    pending: list[dict] = []
    last = job.arrived
    for emitted in generation:
        now = time.perf_counter()
        metrics.token_latency(first=len(generation.token_ids) == 1, seconds=now - last)
        last = now
        pending.append({"id": emitted.token_id, "origin": emitted.origin.value, "round": emitted.round_index})
        delta = stream.update(generation.token_ids, final=False)
        if delta:
            s = generation.stats
            emit(TokenEvent(delta, pending, {"rounds": s.rounds, "drafted": s.drafted, "accepted": s.accepted,
                                             "generated": s.generated}))
            pending = []
        if job.cancelled.is_set():
            generation.close()  # no further round runs
            break
    reason = "abort" if job.cancelled.is_set() else (generation.finish_reason or "length")
    stream.update(generation.token_ids, final=True)
    metrics.finish(reason, len(job.prompt_ids), generation.stats, time.perf_counter() - job.arrived)
    emit(DoneEvent(reason, stream.shown, pending, generation.stats))


class EngineWorker:
    """Admits at most one running job plus `max_queue` waiting ones; 503 beyond that."""

    def __init__(self, max_queue: int, metrics: ServerMetrics):
        self.max_queue = max_queue
        self.metrics = metrics
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specdec-engine")
        self._lock = threading.Lock()
        self._in_system = 0  # running + waiting
        self._live: dict[int, tuple[Job, Callable[[object], None]]] = {}  # id(job) -> (job, emit)
        self.accepting = True
        metrics.set_queue(0, 0)

    @property
    def in_system(self) -> int:
        return self._in_system

    def submit(self, job: Job) -> AsyncIterator[object]:
        """Queue a job (or raise a 503 APIError); iterate the result for its events."""
        with self._lock:
            if not self.accepting:
                raise APIError(503, "the server is shutting down", None, "shutting_down")
            if self._in_system >= 1 + self.max_queue:
                raise APIError(503, f"the queue is full ({self.max_queue} waiting); retry later",
                               None, "queue_full")
            self._change(+1)
            loop = asyncio.get_running_loop()
            events: asyncio.Queue = asyncio.Queue()
            emit = lambda event: loop.call_soon_threadsafe(events.put_nowait, event)  # noqa: E731
            self._live[id(job)] = (job, emit)
        self._executor.submit(self._guarded, job, emit)
        return _drain(events, job, self.leave)

    def leave(self, job: Job) -> None:
        """The client is gone (or done): stop the job; one that never started counts as abandoned."""
        with self._lock:
            if not job.started and not job.cancelled.is_set():
                self.metrics.abandon()
            job.cancelled.set()  # the engine thread stops after this round, or skips the job

    def _guarded(self, job: Job, emit) -> None:
        try:
            with self._lock:
                job.started = not job.cancelled.is_set()
            if not job.started:  # the client left while waiting (or the server is shutting down): skip it
                emit(DoneEvent("abort", "", [], SpecStats()))
                return
            _run_job(job, emit, self.metrics)
        except SpecdecError as exc:
            emit(ErrorEvent(APIError(400, str(exc), None, "invalid_value")))
        except Exception as exc:  # noqa: BLE001 - a bug must reach the client as an error, not a hang
            emit(ErrorEvent(APIError(500, f"internal error: {type(exc).__name__}: {exc}", None, "internal")))
        finally:
            with self._lock:
                self._live.pop(id(job), None)
                self._change(-1)

    def _change(self, delta: int) -> None:
        self._in_system += delta
        self.metrics.set_queue(min(1, self._in_system), max(0, self._in_system - 1))

    def stop_accepting(self) -> None:
        """From now on submit answers 503 (and /health too): the start of a drain."""
        with self._lock:
            self.accepting = False

    def abort_all(self, error: APIError) -> None:
        """End every job still running or waiting: its client gets `error` now, the engine stops soon."""
        with self._lock:
            live = list(self._live.values())
            for job, _ in live:
                job.cancelled.set()
        for _, emit in live:
            emit(ErrorEvent(error))

    def shutdown(self) -> None:
        """Stop taking jobs and wait for the engine thread (after a drain, only a round's worth of work)."""
        self.stop_accepting()
        self._executor.shutdown(wait=True, cancel_futures=False)


async def _drain(events: asyncio.Queue, job: Job, leave: Callable[[Job], None]) -> AsyncIterator[object]:
    try:
        while True:
            event = await events.get()
            yield event
            if isinstance(event, (DoneEvent, ErrorEvent)):
                return
    finally:
        leave(job)  # client gone (or done): the engine thread stops after this round
