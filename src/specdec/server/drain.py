"""Shutdown: on SIGTERM (or Ctrl-C), drain, then let uvicorn close the connections; exit 0.

uvicorn alone closes the listening socket at once (so /health cannot say 503), then, at its
graceful timeout, cancels the tasks still running: streams cut without an error or `[DONE]`,
CancelledError tracebacks, and the signal raised again so the process dies by it. Here the drain
comes first, with the socket still open: the worker stops admitting (/health and new requests get
503), the requests in flight run on for `grace_s`, and at that deadline every one still in the
system gets a 503 error (a stream: an error event then `[DONE]`). Only then does uvicorn shut down,
with nothing left to cancel.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import signal
import threading

import uvicorn

from specdec.server.connection import MAX_HEADER_BYTES, TimedH11Protocol
from specdec.server.protocol import APIError

FLUSH_S = 5.0  # after the drain: time for the last bytes (an error event, [DONE]) to reach clients
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, worker, grace_s: float):
        super().__init__(config)
        self.worker, self.grace_s = worker, grace_s

    async def main_loop(self) -> None:
        await super().main_loop()  # returns once a signal has set should_exit
        await self.drain()

    async def drain(self) -> None:
        self.worker.stop_accepting()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace_s
        while self.worker.in_system and loop.time() < deadline and not self.force_exit:
            await asyncio.sleep(0.05)
        if self.worker.in_system:
            self.worker.abort_all(APIError(503, f"the server shut down before this request finished "
                                                f"(--graceful-timeout {self.grace_s:g} s)", None, "shutting_down"))
        await asyncio.sleep(0)  # let the handlers take their error events before uvicorn closes connections

    @contextlib.contextmanager
    def capture_signals(self):
        """As uvicorn's, without raising the signal again at the end: a server that drained exits 0."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def make_server(app, worker, host: str, port: int, log_level: str, limits, grace_s: float) -> DrainingServer:
    """uvicorn behind our protocol (header and idle timers) with its own timeouts set from `limits`."""
    # loop="asyncio": the loop the tests run (uvicorn's "auto" would take uvloop where it is installed,
    # as on the GPU machines, and serve there with a loop no test has seen).
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, loop="asyncio",
                            http=functools.partial(TimedH11Protocol, limits=limits),
                            timeout_keep_alive=limits.keep_alive_s, h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                            timeout_graceful_shutdown=FLUSH_S)
    return DrainingServer(config, worker, grace_s)
