"""The limits of `limits.Limits` applied: uvicorn's h11 protocol with header and idle timers, and an
ASGI middleware that reads each body under its size and time limits."""

from __future__ import annotations

import asyncio
import json
from typing import Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from specdec.server.limits import Limits
from specdec.server.protocol import error_body

MAX_HEADER_BYTES = 16 * 1024  # request line + headers (h11's own default, made explicit); beyond: 400


class TimedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol plus a timer from a connection's (or request's) first byte to its headers.

    uvicorn arms its keep-alive timer only after a response; here a new connection gets it too, and
    once a request's first bytes arrive, its line and headers must follow within `header_timeout_s`.
    The timer stops when the headers are in: the body's time is `BodyLimit`'s.
    """

    def __init__(self, *args, limits: Limits, **kwargs):
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._timer: asyncio.TimerHandle | None = None
        self._timing_headers = False

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.limits.keep_alive_s, headers=False)  # a connection that never sends is idle

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            self._disarm()  # the headers are in (or the connection is ending)
        elif not self._timing_headers:
            self._arm(self.limits.header_timeout_s, headers=True)  # a request has begun

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, seconds: float, headers: bool) -> None:
        self._disarm()
        self._timer = self.loop.call_later(seconds, self._expire)
        self._timing_headers = headers

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timing_headers = None, False

    def _expire(self) -> None:
        # No request has been parsed, so h11 has no response to send: just close, as on keep-alive expiry.
        self._timer = None
        if not self.transport.is_closing():
            self.transport.close()


class BodyLimit:
    """ASGI middleware: read the whole body first, at most `max_bytes` within `timeout_s`, then replay it.

    Declared too big (Content-Length) is refused before reading a byte. `on_refuse(status)` counts each
    refusal. The app then gets the body in one message; later receives (a disconnect) pass through.
    """

    def __init__(self, app, max_bytes: int, timeout_s: float, on_refuse: Callable[[int], None]):
        self.app, self.max_bytes, self.timeout_s, self.on_refuse = app, max_bytes, timeout_s, on_refuse

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if _declared_length(scope) > self.max_bytes:
            return await self._refuse(send, 413, self._too_big())
        body = await self._read(receive, send)
        if body is None:
            return  # refused, or the client left mid-body
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _read(self, receive, send) -> bytes | None:
        chunks, size = [], 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except asyncio.TimeoutError:
                await self._refuse(send, 408, f"the request body did not arrive within {self.timeout_s:g} s",
                                   "request_timeout")
                return None
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(send, 413, self._too_big())
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _too_big(self) -> str:
        return (f"the request body is over the server's limit of {self.max_bytes} bytes "
                "(`specdec serve --max-body-bytes`)")

    async def _refuse(self, send, status: int, message: str, code: str = "request_too_large") -> None:
        self.on_refuse(status)
        payload = json.dumps(error_body(status, message, None, code)).encode()
        # Connection: close, since the rest of the body (if any) is never read.
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()),
                   (b"connection", b"close")]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload, "more_body": False})


def _declared_length(scope) -> int:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return 0  # h11 has already refused a malformed Content-Length
    return 0
