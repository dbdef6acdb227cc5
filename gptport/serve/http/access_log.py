"""`serve --access-log`: one line per request, written when its response is over (a stream's when it ends):
the client, method, path, status and duration. No torch here.

    127.0.0.1:50312 POST /v1/chat/completions 200 812.4 ms

An answer cut short (the client left mid-stream) ends in `incomplete`; a request that got no answer at all
shows `-` for its status. uvicorn's own access log says the status when the response starts, without a
duration, so a stream's line would come before its tokens: this layer is used instead."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

LOGGER = "gptport.serve.access"


class AccessLog:
    """ASGI middleware: each HTTP request's line to the `gptport.serve.access` logger at INFO, once the app is
    done with it."""

    def __init__(self, app: Any, log: logging.Logger | None = None) -> None:
        self.app, self.log = app, log or logging.getLogger(LOGGER)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status: list[int] = []
        done = [False]

        async def watched(message: Any) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                done[0] = True
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            ms = (time.perf_counter() - start) * 1000
            client = scope.get("client")
            who = f"{client[0]}:{client[1]}" if client else "-"
            self.log.info("%s %s %s %s %.1f ms%s", who, scope["method"], _path(scope),
                          status[0] if status else "-", ms, "" if done[0] or not status else " incomplete")


def _path(scope: Any) -> str:
    """The path as it was sent (percent-encoded, no query), control characters and the like escaped: one line."""
    raw = scope.get("raw_path")
    return (raw.decode("latin-1") if raw else scope["path"]).encode("unicode_escape").decode("ascii")


def to_stderr() -> None:
    """Send the access log's lines, bare, to stderr (once, however often called)."""
    log = logging.getLogger(LOGGER)
    if not any(getattr(h, "gptport_access", False) for h in log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.gptport_access = True  # type: ignore[attr-defined]
        log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False
