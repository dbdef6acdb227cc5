"""The server's outermost ASGI layer: API key, request counting, the replica's name, and the cheap 429 of
a full scheduler, held back for a connection that comes back before its last Retry-After. No torch here."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.applications import Starlette
from starlette.responses import JSONResponse

from gptport.serve.api.protocol import ApiError
from gptport.serve.metrics import Metrics

GENERATING = ("/v1/completions", "/v1/chat/completions", "/v1/responses")
COUNTED = frozenset(("/", "/health", "/metrics", "/v1/models", *GENERATING, "/tokenize", "/detokenize",
                     "/tokenizer_info"))  # the routes /metrics counts by name (any other path: "other")
RETRY_AFTER = 1  # s a 429 asks a client to wait
TOLD_MAX = 4096  # connections remembered before the stale ones are forgotten


class Guard:
    """ASGI middleware: the API key on every route but the public ones, requests counted by route and status, the
    replica's name on every response (x-gptport-replica), and the 429 of a full scheduler answered here,
    before routing: under a flood of clients that retry at once, a refusal is most of the event loop's work
    (the endpoint refuses too, for a request that got past this check as the last slot went). A connection
    that asks again before the Retry-After its last 429 gave has elapsed gets its next 429 only once it has:
    a client that ignores Retry-After cannot make refusals the server's main work, and one that honours it
    never waits."""

    def __init__(self, app: Starlette, api_key: str | None, metrics: Metrics, replica: str, full: ApiError,
                 public: set[str]) -> None:
        self.app, self.api_key, self.metrics, self.replica = app, api_key, metrics, replica
        self.public = public  # the paths that need no API key
        self.header = (b"x-gptport-replica", replica.encode("latin-1", "replace"))
        self.state = app.state
        self.full = JSONResponse(full.body(), status_code=429, headers={"Retry-After": str(RETRY_AFTER)})
        self._told: dict[Any, float] = {}  # a connection (client address) -> when its last 429 said to come back

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        route = path if path in COUNTED else "other"
        status = [500]

        async def counted(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message = {**message, "headers": [*message.get("headers", ()), self.header]}
            await send(message)

        try:
            if self.api_key and path not in self.public and not self._authorized(scope):
                err = ApiError(401, "Incorrect or missing API key: send 'Authorization: Bearer KEY'", None,
                               "invalid_api_key")
                await JSONResponse(err.body(), status_code=401)(scope, receive, counted)
                return
            scheduler = self.state.gptport.scheduler
            if route in GENERATING and scope["method"] == "POST" and scheduler is not None and scheduler.full:
                await self._refuse(scope, receive, counted)
                return
            await self.app(scope, receive, counted)
        finally:
            self.metrics.requests.labels(route, str(status[0]), self.replica).inc()

    async def _refuse(self, scope: Any, receive: Any, send: Any) -> None:
        """429 with Retry-After; to a connection back before its last one said, once that time has come."""
        client, now = scope.get("client"), time.monotonic()
        if client is None:  # no address to tell connections apart (a Unix socket): none is held
            await self.full(scope, receive, send)
            return
        early = self._told.get(client, now) - now
        if early > 0:
            await asyncio.sleep(early)
            now = time.monotonic()
        if len(self._told) >= TOLD_MAX:
            self._told = {c: t for c, t in self._told.items() if t > now}
        self._told[client] = now + RETRY_AFTER
        await self.full(scope, receive, send)

    def _authorized(self, scope: Any) -> bool:
        import hmac

        for name, value in scope.get("headers", []):
            if name == b"authorization":
                return hmac.compare_digest(value.decode("latin-1"), f"Bearer {self.api_key}")
        return False
