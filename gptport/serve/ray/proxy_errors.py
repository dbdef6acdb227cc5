"""ASGI middleware for the proxy in front of the replicas (Ray Serve's): what the proxy answers itself
becomes OpenAI's error object, like every error a replica answers.

A replica that dies mid-request cannot answer; the proxy then either answers nothing (a plain 500 from
its HTTP server), answers in text (a timeout, back-pressure), or, when the response had started, cuts
it off. Here: a response that never started is a 502 `replica_failed`; a text error keeps its status
with OpenAI's shape; a stream of server-sent events that stops before its end gets an error event and
`data: [DONE]`, as a stream whose generation fails on a live replica does. No Ray and no torch here.
"""

from __future__ import annotations

import json
from typing import Any

from gptport.serve.api.protocol import ApiError

Message = dict[str, Any]


def _error(status: int, message: str, code: str) -> tuple[Message, Message]:
    """The start and body messages of an OpenAI error response."""
    body = json.dumps(ApiError(status, message, None, code).body()).encode()
    start = {"type": "http.response.start", "status": status,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}
    return start, {"type": "http.response.body", "body": body, "more_body": False}


class OpenAIErrors:
    """Wraps the proxy's ASGI app (see the module's docstring)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Message, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: Message | None = None  # a text error's start, held until its body arrives
        held_body = bytearray()
        started = ended = sse = False

        async def relay(message: Message) -> None:
            nonlocal held, started, ended, sse
            kind = message["type"]
            if kind == "http.response.start":
                headers = {bytes(k).lower(): bytes(v) for k, v in message.get("headers", ())}
                ctype = headers.get(b"content-type", b"")
                if message["status"] >= 400 and not ctype.startswith((b"application/json", b"text/event-stream")):
                    held = message
                    return
                started, sse = True, ctype.startswith(b"text/event-stream")
            elif kind == "http.response.body" and held is not None:
                held_body.extend(message.get("body", b""))
                if not message.get("more_body", False):
                    text = held_body.decode("utf-8", "replace").strip() or "the proxy could not serve the request"
                    for m in _error(held["status"], text, "proxy_error"):
                        await send(m)
                    started = ended = True
                return
            elif kind == "http.response.body":
                ended = not message.get("more_body", False)
            await send(message)

        failure = "the replica serving this request failed before it answered"
        try:
            await self.app(scope, receive, relay)
        except Exception as e:  # noqa: BLE001 - the client gets an error object, not a dropped connection
            failure = f"{failure} ({type(e).__name__}: {e})"
        if not started:
            for m in _error(502, failure, "replica_failed"):
                await send(m)
        elif sse and not ended:
            event = json.dumps(ApiError(502, "the replica serving this stream failed", None, "replica_failed").body())
            await send({"type": "http.response.body", "body": f"data: {event}\n\ndata: [DONE]\n\n".encode(),
                        "more_body": False})


def proxy_middlewares() -> list[Any]:
    """For RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=gptport.serve.ray.proxy_errors:proxy_middlewares."""
    from starlette.middleware import Middleware

    return [Middleware(OpenAIErrors)]
