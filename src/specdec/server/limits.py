"""Limits on what a client may send and how slowly: the body's size and read time, header time, idle time.

uvicorn bounds the headers' size (h11) and the idle time between two requests on one connection
(keep-alive), but not a new connection that never sends a byte, nor headers or a body that trickle
in: a client could hold a connection forever. `connection.TimedH11Protocol` closes a connection that
sends nothing, or whose request line and headers take too long; `connection.BodyLimit` reads each
body before the app sees it, refusing one too big (413) or too slow (408), so no endpoint ever waits
on a client. This module imports no server library, so that the CLI reads the defaults cheaply.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 2 * 1024 * 1024  # a 128K-token prompt as text or as token ids fits; 16 MB does not
    keep_alive_s: float = 5.0  # an idle connection (no request under way) is closed after this
    header_timeout_s: float = 10.0  # from a request's first byte to the end of its headers
    body_timeout_s: float = 30.0  # from the end of the headers to the end of the body

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1:
            raise ValueError(f"the body limit must be >= 1 byte, got {self.max_body_bytes}")
        for name in ("keep_alive_s", "header_timeout_s", "body_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
