"""The server's scheduler: one engine thread steps a BatchedEngine; a bounded queue in front of it.

Up to `max_slots` sequences (the slot model's, `--max-num-seqs`) decode together; a request with
n > 1 brings n sequences. Further sequences wait here in FIFO order, and join the batch as slots
free up; once `max_slots + max_queue` sequences are in the system a new request gets 503. Each
sequence gets a drafter of its own (a fork from the DraftMenu, sharing its kind's loaded weights),
and a ChoiceStream listener that sends its events back to the asyncio loop (call_soon_threadsafe). A request whose client went away
sets `cancelled`: its waiting sequences are dropped and its running ones leave the batch at the next
step. On shutdown the server stops admitting (`stop_accepting`) and, at its deadline, `abort_all`
answers every request still in the system with an error.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable

from specdec.engine.batched import BatchedEngine, SequenceHandle
from specdec.drafters.registry import DraftMenu
from specdec.generation import GenerationConfig, SpecStats
from specdec.errors import SpecdecError
from specdec.server.metrics import ServerMetrics
from specdec.server.protocol import APIError
from specdec.server.streams import ChoiceStream, DoneEvent, ErrorEvent, TokenEvent  # noqa: F401 (re-exported)


@dataclass(eq=False)
class Job:
    """One request: n choices of one prompt, choice i with configs[i] (its own seed)."""

    draft: str  # the kind its sequences draft with (a DraftMenu name)
    prompt_ids: list[int]
    configs: tuple[GenerationConfig, ...]
    arrived: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)
    started: bool = False  # a sequence of it joined the engine (set under the worker's lock)
    handles: list[SequenceHandle] = field(default_factory=list)
    unfinished: int = 0  # choices not done yet

    @property
    def n(self) -> int:
        return len(self.configs)


class EngineWorker:
    def __init__(self, engine: BatchedEngine, drafters: DraftMenu, max_queue: int, metrics: ServerMetrics):
        self.engine, self.drafters = engine, drafters
        self.max_slots, self.max_queue = engine.target.max_slots, max_queue
        self.metrics = metrics
        self.accepting = True
        self._wake = threading.Condition()
        self._waiting: deque[tuple[Job, int]] = deque()  # (job, choice) not yet in the engine
        self._live: dict[int, tuple[Job, Callable[[object], None]]] = {}  # id(job) -> (job, emit)
        self._sequences = 0  # sequences in the system: waiting here, or in the engine
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="specdec-engine", daemon=True)
        self._thread.start()
        metrics.set_queue(0, 0)

    @property
    def in_system(self) -> int:
        """Requests running or waiting."""
        return len(self._live)

    def submit(self, job: Job) -> AsyncIterator[object]:
        """Queue a request's sequences (or raise a 503 APIError); iterate the result for its events."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        with self._wake:
            if not self.accepting:
                raise APIError(503, "the server is shutting down", None, "shutting_down")
            if self._sequences + job.n > self.max_slots + self.max_queue:
                raise APIError(503, f"the queue is full ({self.max_slots} sequences running, {self.max_queue} "
                                    "may wait); retry later", None, "queue_full")
            self._sequences += job.n
            job.unfinished = job.n
            self._live[id(job)] = (job, _emitter(loop, events))
            self._waiting.extend((job, i) for i in range(job.n))
            self._publish_queue()
            self._wake.notify()
        return _drain(events, job, self.leave)

    def leave(self, job: Job) -> None:
        """The client is gone (or done): stop the job; one that never started counts as abandoned."""
        with self._wake:
            if not job.started and not job.cancelled.is_set() and id(job) in self._live:
                self.metrics.abandon()
            job.cancelled.set()  # the engine thread drops it before its next step
            self._wake.notify()

    def stop_accepting(self) -> None:
        """From now on submit answers 503 (and /health too): the start of a drain."""
        with self._wake:
            self.accepting = False

    def abort_all(self, error: APIError) -> None:
        """End every request still running or waiting: its client gets `error` now, the engine drops it soon.
        The errors are queued under the lock, before the engine thread can see a cancellation (it looks
        under the lock): else a running choice's "abort" finish could reach its client first and end
        the response as if it had finished."""
        with self._wake:
            for job, emit in self._live.values():
                job.cancelled.set()
                emit(ErrorEvent(error))
            self._wake.notify()

    def shutdown(self) -> None:
        """Stop taking requests; the engine thread ends once nothing is left (after a drain, a step's worth)."""
        with self._wake:
            self.accepting = False
            self._stopping = True
            self._wake.notify()
        self._thread.join()

    # ---- the engine thread ---------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not (self._waiting or self.engine.busy or self._stopping):
                    self._wake.wait()
                if self._stopping and not self._waiting and not self.engine.busy:
                    return
                self._cancel_left()
                starting = self._take_starting()
            for job, index in starting:
                self._start(job, index)
            self.metrics.step(self.engine.num_running + self.engine.num_waiting)
            try:
                self.engine.step()
            except Exception as exc:  # noqa: BLE001 - a bug must reach the clients as an error, not a hang
                self._fail_running(APIError(500, f"internal error: {type(exc).__name__}: {exc}", None, "internal"))
            self.metrics.decided(self.engine.last_step)
            self._publish_queue()

    def _cancel_left(self) -> None:
        """Under the lock: requests whose client left lose their waiting sequences and stop their running ones."""
        for job, index in [w for w in self._waiting if w[0].cancelled.is_set()]:
            self._waiting.remove((job, index))
            self._choice_done(job, DoneEvent(index, "abort", "", [], SpecStats()))
        for job, _ in self._live.values():
            if job.cancelled.is_set():
                for handle in job.handles:
                    handle.cancel()  # it leaves the batch at the next step; its listener ends the choice

    def _take_starting(self) -> list[tuple[Job, int]]:
        """Under the lock: the waiting sequences that fit the free slots, first come first served."""
        free = self.max_slots - self.engine.num_running - self.engine.num_waiting
        starting = [self._waiting.popleft() for _ in range(min(free, len(self._waiting)))]
        for job, _ in starting:
            job.started = True
        return starting

    def _start(self, job: Job, index: int) -> None:
        """Submit one sequence with a drafter of its own; a failure ends the request with an error."""
        live = self._live.get(id(job))
        if live is None:  # the request failed already
            return self._choice_done(job, None)
        try:
            drafter = self.drafters.fresh(job.draft)  # a fork: it holds nothing until the engine begins it
        except Exception as exc:  # noqa: BLE001 - a bug here must reach the client, not stop the engine thread
            self._choice_done(job, None)
            return self._fail(job, APIError(500, f"could not fork a drafter: {exc}", None, "internal"))
        config = job.configs[index]
        stream = ChoiceStream(index, job.arrived, len(job.prompt_ids) if index == 0 else 0,
                              config.logprobs is not None, live[1], self.metrics, lambda _: self._choice_done(job, None))
        try:
            job.handles.append(self.engine.submit(job.prompt_ids, config, drafter, stream))
        except SpecdecError as exc:
            self._choice_done(job, None)
            self._fail(job, APIError(400, str(exc), None, "invalid_value"))

    def _choice_done(self, job: Job, event: DoneEvent | None) -> None:
        """A choice left the system (event: one to send for it); the request ends with its last."""
        with self._wake:
            self._sequences -= 1
            job.unfinished -= 1
            live = self._live.get(id(job))
            if job.unfinished == 0:
                self._live.pop(id(job), None)
        if live is not None and event is not None:
            live[1](event)

    def _fail(self, job: Job, error: APIError) -> None:
        """End a request with an error: its waiting sequences go, its running ones stop, the client gets `error`."""
        with self._wake:
            live = self._live.pop(id(job), None)
            job.cancelled.set()
            for waiting in [w for w in self._waiting if w[0] is job]:
                self._waiting.remove(waiting)
                self._choice_done(job, None)
        for handle in job.handles:
            handle.cancel()  # each one's listener counts it out (the engine ends its drafter)
        if live is not None:
            live[1](ErrorEvent(error))

    def _fail_running(self, error: APIError) -> None:
        for job, _ in list(self._live.values()):
            if job.handles:
                self._fail(job, error)

    def _publish_queue(self) -> None:
        jobs = list(self._live.values())
        running = sum(1 for job, _ in jobs if job.started)
        waiting_seqs = len(self._waiting) + self.engine.num_waiting
        self.metrics.set_queue(running, len(jobs) - running, self.engine.num_running, waiting_seqs)


def _emitter(loop: asyncio.AbstractEventLoop, events: asyncio.Queue) -> Callable[[object], None]:
    def emit(event: object) -> None:
        try:
            loop.call_soon_threadsafe(events.put_nowait, event)
        except RuntimeError:  # the loop has closed: nobody is listening any more
            pass

    return emit


async def _drain(events: asyncio.Queue, job: Job, leave: Callable[[Job], None]) -> AsyncIterator[object]:
    """The request's events until all of its n choices are done, or an error."""
    try:
        remaining = job.n
        while remaining:
            event = await events.get()
            yield event
            if isinstance(event, ErrorEvent):
                return
            remaining -= isinstance(event, DoneEvent)
    finally:
        leave(job)  # client gone (or done): the engine thread drops it before its next step
