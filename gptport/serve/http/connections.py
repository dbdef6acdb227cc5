"""Bounds on connections for `gptport serve`'s uvicorn: how many may be open, how long a request's head may
take and how large it may be, how long an idle keep-alive connection stays, and the open-file limit that
all of it needs.

uvicorn has no timeout for a request's headers (0.54 checked): a socket that connects and sends
nothing, or sends a header line now and then, stays open for ever and counts against `limit_concurrency`.
`protocol_class` wraps the HTTP protocol uvicorn would pick (httptools', else h11's) with a timer on each
request's head, from the moment the connection opens or, on a kept-alive connection, from the head's first
byte (idle between requests, uvicorn's keep-alive timeout applies), and a byte count of that head; one past
either bound is answered 408 or 431 (closed silently when nothing had arrived). Connections past
max_connections + SPARE are closed as they open, so that open files stay bounded. The body's own bound is
the app's (`Settings.body_timeout`). No torch here.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from gptport.errors import UsageError
from gptport.serve.api.api_error import ApiError

HEAD_BYTES = 64 * 1024  # a request line and its headers (h11's default is 16 KiB, nginx's 32 KiB)
SPARE = 64  # connections past max_connections that are still accepted, to be answered 503 by uvicorn
RESERVE_FDS = 128  # open files besides the connections: the model, the listening socket, pipes, imports


@dataclass
class Limits:
    """What a connection may hold: `gptport serve --max-connections --header-timeout --keep-alive`."""

    max_connections: int = 1024  # 0: no limit
    header_timeout: float = 10.0
    keep_alive: int = 5
    head_bytes: int = HEAD_BYTES

    def check(self) -> None:
        """Refuse values out of range, naming the option."""
        if self.max_connections < 0:
            raise UsageError(f"--max-connections must be >= 0 (0: no limit), not {self.max_connections}")
        if not 0 < self.header_timeout <= 3600:
            raise UsageError(f"--header-timeout must be > 0 and <= 3600 seconds, not {self.header_timeout:g}")
        if not 1 <= self.keep_alive <= 3600:
            raise UsageError(f"--keep-alive must be >= 1 and <= 3600 seconds, not {self.keep_alive}")

    def files_needed(self) -> int:
        """Open files for max_connections (and the spare ones) besides the rest; 0 when unlimited."""
        return self.max_connections + SPARE + RESERVE_FDS if self.max_connections else 0

    def uvicorn_options(self) -> dict[str, Any]:
        """uvicorn.Config's keyword arguments for these bounds."""
        return {"limit_concurrency": self.max_connections or None, "timeout_keep_alive": self.keep_alive,
                "h11_max_incomplete_event_size": self.head_bytes, "http": protocol_class(self)}


def refusal(status: int, reason: str, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 response with OpenAI's error object, that closes the connection."""
    body = json.dumps(ApiError(status, message, None, code).body()).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n")
    return head.encode("latin-1") + body


class _HeadBound(asyncio.Protocol):
    """A mixin before uvicorn's HTTP protocol class: bounds the time and size of each request's head, and
    the number of open connections. Relies on what both of uvicorn's protocols have: `cycle` (a new one
    once a head is parsed), `connections`, `loop`, `transport`, and `on_response_complete`."""

    limits: Limits
    cycle: Any
    connections: set[Any]
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._head_timer: asyncio.TimerHandle | None = None
        self._head_seen = 0
        super().connection_made(transport)
        cap = self.limits.max_connections
        if cap and len(self.connections) > cap + SPARE:  # over the spare: no fd for another 503
            self.transport.close()
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        before = self.cycle
        in_head = before is None or not before.more_body  # no body is on its way: these bytes start a head
        super().data_received(data)
        if self.cycle is not before:  # a head was parsed: its request runs, unbounded here
            self._disarm()
            self._head_seen = 0
        elif in_head and not self.transport.is_closing():
            self._head_seen += len(data)
            if self._head_seen > self.limits.head_bytes:
                self._refuse(refusal(431, "Request Header Fields Too Large",
                                     f"the request's line and headers are over {self.limits.head_bytes} bytes",
                                     "headers_too_large"))
            elif self._head_timer is None and self._between_requests():
                self._arm()  # a kept-alive connection's next head began: it has header_timeout from here

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]
        if self.transport.is_closing() or self._head_timer is not None:
            return
        if self.cycle is not None and self.cycle.more_body:
            self._arm()  # answered before its body was all read (413): the rest has header_timeout to come
        elif self._head_seen and self._between_requests():
            self._arm()  # the next head began while this response ran

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.limits.header_timeout, self._expired)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _expired(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if not self._head_seen:  # nothing of a request arrived: close, as an idle keep-alive connection is
            self.transport.close()
            return
        self._refuse(refusal(408, "Request Timeout", f"the request's headers did not arrive within "
                             f"{self.limits.header_timeout:g} s", "header_timeout"))

    def _refuse(self, response: bytes) -> None:
        self._disarm()
        self.transport.write(response)
        self.transport.close()


def protocol_class(limits: Limits) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (httptools' where installed, as uvicorn's "auto" picks, else h11's) with
    `limits` on each request's head and on open connections."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as base
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol as base  # type: ignore[assignment]
    return type(f"Bounded{base.__name__}", (_HeadBound, base), {"limits": limits})


def raise_open_files(need: int) -> int:
    """Raise this process's soft limit on open files towards `need` (up to the hard limit); the soft limit
    after. Where there is no such limit (Windows), `need`."""
    try:
        import resource
    except ImportError:
        return need
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return need
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft
    return target


def fit_open_files(limits: Limits) -> str | None:
    """Make room for max_connections under the open-file limit, lowering max_connections where the hard
    limit is too low; a line saying so, or None."""
    need = limits.files_needed()
    if not need:
        return None
    have = raise_open_files(need)
    if have >= need:
        return None
    fit = max(1, have - SPARE - RESERVE_FDS)
    line = (f"the open-file limit is {have} (ulimit -n): --max-connections {limits.max_connections} "
            f"lowered to {fit}")
    limits.max_connections = fit
    return line
