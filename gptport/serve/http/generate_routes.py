"""POST /v1/completions, /v1/chat/completions and /v1/responses: one request path (request_path.py) into a
frozen `Job`, parsed once by its API's parser and answered in its API's format (answer.py), as llama.cpp's
server parses each request into a task rendered per format (OAI_CMPL, OAI_CHAT, OAI_RESP). No torch here."""

from __future__ import annotations

from dataclasses import replace
from enum import Enum
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gptport.serve.api import protocol
from gptport.serve.api.protocol import Job
from gptport.serve.api.responses.from_chat import Reply
from gptport.serve.api.responses.to_chat import responses_job
from gptport.serve.http.answer import answer
from gptport.serve.http.request_path import RequestPath
from gptport.serve.model_host import State


class Api(Enum):
    """The OpenAI format a generation request comes in and is answered in; its value is the route's name
    in the body check (body_check.py) and the OpenAPI document."""

    COMPLETIONS = "completions"
    CHAT = "chat"
    RESPONSES = "responses"  # onto the chat path (api/responses/to_chat.py), its answer translated back


def parse(api: Api, body: Any, state: State) -> tuple[Job, dict[str, Any] | None]:
    """The body's Job, and for the Responses API the settings its response repeats."""
    s = state.settings
    if api is Api.COMPLETIONS:
        return protocol.completion_job(body, state.tok, state.n_ctx, s.slots, state.start), None
    if api is Api.CHAT:
        return protocol.chat_job(body, state.tok, state.n_ctx, s.slots, state.render), None  # chat_template.py
    return responses_job(body, state.tok, state.n_ctx, s.slots, state.render)


async def generate(path: RequestPath, request: Request, api: Api) -> Response:
    """One generation request: the request path into the API's Job (named for the model the request gave),
    then answered."""
    (job, echo), name = await path.take(request, api.value, lambda body: parse(api, body, path.state))
    job = replace(job, model=name)
    return await answer(path, request, job, None if echo is None else Reply(job, echo))


def routes(path: RequestPath) -> list[Route]:
    async def completions(request: Request) -> Response:
        return await generate(path, request, Api.COMPLETIONS)

    async def chat(request: Request) -> Response:
        return await generate(path, request, Api.CHAT)

    async def responses(request: Request) -> Response:
        return await generate(path, request, Api.RESPONSES)

    return [Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/responses", responses, methods=["POST"])]
