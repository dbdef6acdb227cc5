"""The server's GET routes about itself: the page at /, /health, /metrics, /v1/models and /v1/models/{name}.
No torch here."""

from __future__ import annotations

from importlib import resources
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from gptport.page_style import styled
from gptport.serve.api.api_error import ApiError
from gptport.serve.http.request_path import RequestPath


def routes(path: RequestPath) -> list[Route]:
    state = path.state

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [_model_card(name, state.created) for name in path.names]})

    async def model(request: Request) -> Response:
        return JSONResponse(_model_card(path.model({"model": request.path_params["name"]}), state.created))

    async def health(request: Request) -> Response:
        try:
            state.ready()
        except ApiError as e:
            return JSONResponse({"status": "loading" if e.code == "not_ready" and state.error is None else "error",
                                 "message": e.message}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def metrics(request: Request) -> Response:
        return Response(state.metrics.render(state.scheduler), media_type="text/plain; version=0.0.4")

    async def page(request: Request) -> Response:
        return HTMLResponse(styled(resources.files("gptport.serve.http").joinpath("page.html")
                                   .read_text(encoding="utf-8")))

    return [Route("/", page), Route("/health", health), Route("/metrics", metrics),
            Route("/v1/models", models), Route("/v1/models/{name:path}", model)]


def _model_card(name: str, created: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": "gptport"}
