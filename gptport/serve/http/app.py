"""The OpenAI-compatible ASGI app (Starlette), wired: the route modules over one request path
(request_path.py), the loaded model (serve/model_host.py), the API key's guard, CORS and the access log.

The event loop never calls the model: a route checks the request into a Job, submits its choices to
the scheduler and awaits their events on an asyncio queue, which the scheduler's thread fills once
per iteration (`loop.call_soon_threadsafe`). A stream sends whatever has arrived since its last
chunk in one chunk per choice, so a stream that falls behind catches up in fewer, larger chunks.
No torch here.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from starlette.applications import Starlette

from gptport.serve.http import cors, errors, generate_routes, guard, info_routes, openapi, token_routes
from gptport.serve.http.access_log import AccessLog
from gptport.serve.http.request_path import RequestPath
from gptport.serve.model_host import State
from gptport.serve.settings import Settings

PUBLIC = {"/health", "/", "/openapi.json"}  # no API key: the page's own calls carry the key the user types


def create_app(settings: Settings) -> Starlette:
    """The app; it starts loading the model when the server starts."""
    state = State(settings)
    path = RequestPath(state)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if state.scheduler is None and state.error is None:  # not loaded beforehand (Ray's replicas do)
            threading.Thread(target=state.load, args=(asyncio.get_running_loop(),), name="gptport-load",
                             daemon=True).start()
        yield
        if state.scheduler is not None:
            state.scheduler.stop()

    routes = [*info_routes.routes(path), *generate_routes.routes(path), *token_routes.routes(path),
              openapi.route(state, PUBLIC)]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=errors.HANDLERS)
    app.state.gptport = state
    replica = settings.replica or f"{socket.gethostname()}:{os.getpid()}"
    guarded = guard.Guard(app, settings.api_key, state.metrics, replica, path.queue_full(), PUBLIC)
    served = cors.with_cors(guarded, settings.allowed_origins)  # outside the key: preflights carry none
    outer = AccessLog(served) if settings.access_log else served
    outer.state = app.state  # what callers read (the loaded model's State), whichever layer is outermost
    return outer  # type: ignore[no-any-return]
