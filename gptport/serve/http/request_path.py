"""The one path every POST request takes before its route's own work (`RequestPath.take`): admitted (a 429
before the body is read when not one more choice fits), its body read within the limits, its model named,
the model loaded, the body checked against its route's schema, parsed once by the route's parser into a
typed value (a frozen `Job`, or /tokenize's answer), and every field it left unread refused. No torch here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from starlette.requests import ClientDisconnect, Request

from gptport.serve.api import body_check, protocol
from gptport.serve.api.api_error import ApiError
from gptport.serve.model_host import State

T = TypeVar("T")


class RequestPath:
    """A server's checks of a request, shared by its routes: the names it answers to, its queue's bound,
    every route's body check."""

    def __init__(self, state: State) -> None:
        s = state.settings
        self.state, self.settings = state, s
        self.checks = body_check.for_server(s.model_name, s.slots, s.max_body)
        self.names = (s.model_name, *s.aliases)

    def model(self, body: Any) -> str:
        """The name the request gave (a 404 for one the server does not answer to), or the primary name.
        Responses echo it, as vLLM's do."""
        s = self.settings
        name = body.get("model") if isinstance(body, dict) else None
        if name is None:
            return s.model_name
        if name not in self.names:
            also = f" (also {', '.join(map(repr, s.aliases))})" if s.aliases else ""
            raise ApiError(404, f"The model '{name}' does not exist; this server runs '{s.model_name}'{also}",
                           "model", "model_not_found")
        return str(name)

    def queue_full(self) -> ApiError:
        return ApiError(429, f"the queue is full ({self.settings.max_queue} choices wait for a slot); retry shortly",
                        None, "queue_full")

    def admit(self) -> None:
        """429 at once when not even one more choice fits, before the body is read, parsed and tokenized:
        under a flood, refusals must cost the event loop little."""
        scheduler = self.state.scheduler
        if scheduler is not None and scheduler.full:
            raise self.queue_full()

    async def take(self, request: Request, route: str, parse: Callable[[Any], T], *,
                   queued: bool = True) -> tuple[T, str]:
        """admit (a route whose work is `queued` on the scheduler) -> body -> model -> ready -> the body's
        check against `route`'s schema -> `parse(body)` -> its unread fields refused; the parsed value and
        the model name the request gave."""
        if queued:
            self.admit()
        body = await read_body(request, self.settings.max_body, self.settings.body_timeout)
        name = self.model(body)
        self.state.ready()
        found = self.checks.before(route, body)
        parsed = parse(body)
        self.checks.leftover(route, body, found)
        return parsed, name


async def read_body(request: Request, limit: int, timeout: float) -> Any:
    """The request's JSON, refused past `limit` bytes (413), when it has not all arrived within `timeout`
    seconds (408, and the connection closes), or when it does not parse (400)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise ApiError(413, f"the request body is {length} bytes; the limit is {limit}", None, "body_too_large")
    data = bytearray()

    async def read() -> None:
        async for part in request.stream():
            data.extend(part)
            if len(data) > limit:
                raise ApiError(413, f"the request body is over the limit of {limit} bytes", None, "body_too_large")

    try:
        await asyncio.wait_for(read(), timeout)
    except asyncio.TimeoutError as e:  # a slow (or stalled) sender: uvicorn has no bound of its own on a body
        raise ApiError(408, f"the request body did not arrive within {timeout:g} s", None, "body_timeout") from e
    except ClientDisconnect as e:  # the client left mid-body: nobody reads the answer, and it is no server error
        raise ApiError(499, "the client closed the connection before the whole body arrived", None,
                       "client_closed") from e
    return protocol.parse_body(data)
