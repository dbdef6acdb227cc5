"""GET /openapi.json: an OpenAPI 3.1 document of the server as it runs. Its paths are the app's own
routes (each must have an entry in OPERATIONS), its request schemas made from the definitions the parser
reads each field by (fields.py, through openapi_schemas.py), its limits this server's (slots,
vocabulary, body limit, model name). tests/serve/http/test_openapi.py and tests/serve/test_fuzz.py check it
against the implementation. No torch here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from gptport import __version__
from gptport.serve.api import responses_schemas
from gptport.serve.api.openapi_schemas import (
    CODES_400,
    REQUESTS,
    Limits,
    Schema,
    components,
    error_schema,
    ref,
    request_body,
)

JSON, SSE, HTML = "application/json", "text/event-stream", "text/html"
PROMETHEUS = "text/plain; version=0.0.4"
ERRORS = {  # status: (when, the codes its error object carries)
    400: ("The request is refused: `param` names the field at fault", CODES_400),
    401: ("The server has an API key and the request did not send it as 'Authorization: Bearer KEY'",
          ["invalid_api_key"]),
    404: ("`model` is not this server's model", ["model_not_found"]),
    408: ("The body did not all arrive within the server's time for it (the connection closes)", ["body_timeout"]),
    413: ("The body is over the server's limit", ["body_too_large"]),
    429: ("The queue is full: retry after Retry-After seconds", ["queue_full"]),
    500: ("Generation failed (a stream reports it as an error event instead)", ["generation_failed"]),
    503: ("The model is still loading, failed to load, or the server is shutting down",
          ["not_ready", "generation_failed"]),
}
RETRY_AFTER = {"Retry-After": {"description": "seconds to wait", "required": True,
                               "schema": {"type": "integer", "minimum": 0}}}


@dataclass(frozen=True)
class Operation:
    """One route and method: what it does, its request schema (a REQUESTS name), its answers."""

    summary: str
    ok: dict[str, Schema]  # the 200's media types and their schemas
    request: str | None = None
    errors: tuple[int, ...] = ()
    ok_description: str = "OK"


def _events(payload: str) -> Schema:
    """One server-sent event of a stream: `data: <JSON payload or an error object>`, and last `data: [DONE]`."""
    return {"type": "object", "required": ["data"], "description": "one event (a `data:` line); the last is "
            "[DONE], and a generation that fails mid-stream sends an error object before it",
            "properties": {"event": {"const": "message"}, "data": {"anyOf": [
                {"const": "[DONE]"},
                {"type": "string", "contentMediaType": JSON,
                 "contentSchema": {"anyOf": [ref(payload), ref("Error500")]}}]}}}


POST = (400, 401, 404, 408, 413, 503)
GENERATE = (*POST[:5], 429, 500, 503)
OPERATIONS: dict[tuple[str, str], Operation] = {
    ("/", "get"): Operation("The chat page (HTML)", {HTML: {"type": "string"}}),
    ("/health", "get"): Operation("Ready (200) or loading / failed (503)", {JSON: ref("Health")}, errors=(503,)),
    ("/openapi.json", "get"): Operation("This document", {JSON: {"type": "object"}}),
    ("/metrics", "get"): Operation("Prometheus metrics (text exposition format 0.0.4)",
                                   {PROMETHEUS: {"type": "string"}}, errors=(401,)),
    ("/v1/models", "get"): Operation("The model this server runs, once per name it answers to",
                                     {JSON: ref("ModelList")}, errors=(401,)),
    ("/v1/models/{name}", "get"): Operation("A model by name", {JSON: ref("Model")}, errors=(401, 404)),
    ("/v1/completions", "post"): Operation(
        "Text completions (OpenAI's legacy API)", {JSON: ref("Completion"), SSE: _events("CompletionChunk")},
        "CompletionRequest", GENERATE, "The completion; with stream true, server-sent events of chunks"),
    ("/v1/chat/completions", "post"): Operation(
        "Chat completions, with tools and structured outputs",
        {JSON: ref("ChatCompletion"), SSE: _events("ChatCompletionChunk")}, "ChatRequest", GENERATE,
        "The completion; with stream true, server-sent events of chunks"),
    ("/v1/responses", "post"): Operation(
        "Responses (OpenAI's Responses API, stateless: nothing is stored), served on the chat path",
        {JSON: ref("Response"), SSE: responses_schemas.stream_schema()}, "ResponsesRequest", GENERATE,
        "The response; with stream true, server-sent events from response.created to response.completed"),
    ("/tokenize", "post"): Operation("Text or a chat to token ids (vLLM's and llama-server's shapes)",
                                     {JSON: ref("Tokens")}, "TokenizeRequest", POST),
    ("/detokenize", "post"): Operation("Token ids to text", {JSON: ref("Text")}, "DetokenizeRequest", POST),
    ("/tokenizer_info", "get"): Operation("The tokenizer's configuration (vLLM's shape): tokenizer_config.json "
                                          "with its special tokens, chat template and the served context",
                                          {JSON: ref("TokenizerInfo")}, errors=(401, 503)),
}


def api_path(route: str) -> str:
    """A Starlette route path as an OpenAPI path: `{name:path}` -> `{name}`."""
    return re.sub(r"\{(\w+)(:\w+)?\}", r"{\1}", route)


def route_methods(routes: Iterable[BaseRoute]) -> set[tuple[str, str]]:
    """(OpenAPI path, lower-case method) of every route; HEAD, which Starlette adds beside GET, is left out."""
    out = set()
    for r in routes:
        if isinstance(r, Route):
            out |= {(api_path(r.path), m.lower()) for m in r.methods or () if m != "HEAD"}
    return out


def _operation(path: str, method: str, op: Operation, limits: Limits, public: bool) -> Schema:
    ok = {"description": op.ok_description, "content": {media: {"schema": s} for media, s in op.ok.items()}}
    responses: Schema = {"200": ok}
    for status in op.errors:
        if status == 503 and path == "/health":
            responses["503"] = {"description": ERRORS[503][0], "content": {JSON: {"schema": ref("Health")}}}
            continue
        error = {"schema": ref(f"Error{status}")}
        responses[str(status)] = {"description": ERRORS[status][0], "content": {JSON: error}}
        if status == 429:
            responses["429"]["headers"] = RETRY_AFTER
    if not public:
        responses.setdefault("401", {"description": ERRORS[401][0], "content": {JSON: {"schema": ref("Error401")}}})
    out: Schema = {"summary": op.summary, "operationId": f"{method}{re.sub(r'[^A-Za-z0-9]+', '_', path)}".rstrip("_"),
                   "responses": dict(sorted(responses.items()))}
    if public:
        out["security"] = []
    if op.request is not None:
        out["requestBody"] = {"required": True, "content": {JSON: {"schema": ref(op.request)}}}
    params = re.findall(r"\{(\w+)\}", path)
    if params:
        out["parameters"] = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"},
                              "example": limits.model} for p in params]
    return out


def document(routes: Iterable[BaseRoute], limits: Limits, public: Iterable[str], auth: bool) -> Schema:
    """The OpenAPI 3.1 document of these routes (KeyError for a route OPERATIONS does not describe)."""
    public = set(public)
    paths: dict[str, Schema] = {}
    for path, method in sorted(route_methods(routes)):
        paths.setdefault(path, {})[method] = _operation(path, method, OPERATIONS[(path, method)], limits,
                                                         path in public)
    schemas = {**components(), **{name: request_body(name, limits) for name in REQUESTS}}
    schemas |= {f"Error{status}": {**error_schema(status, codes), "description": when}
                for status, (when, codes) in ERRORS.items()}
    doc: Schema = {
        "openapi": "3.1.0",
        "info": {"title": "gptport", "version": __version__,
                 "description": f"OpenAI-compatible API of a gptport server running {limits.model!r} with "
                                f"{limits.slots} slots; request bodies up to {limits.max_body} bytes. Every "
                                "response carries x-gptport-replica. HEAD is answered wherever GET is."},
        "paths": paths,
        "components": {"schemas": dict(sorted(schemas.items())),
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
    if auth:
        doc["security"] = [{"bearer": []}]
    return doc


def route(state: Any, public: Iterable[str]) -> Route:
    """GET /openapi.json for the app whose State is `state` (its limits as of the request: the vocabulary
    once the model has loaded)."""
    public = set(public)

    async def openapi_json(request: Request) -> Response:
        s = state.settings
        vocab = state.tok.vocab_size if state.tok is not None else None
        limits = Limits(s.model_name, s.slots, vocab, s.max_body)
        return JSONResponse(document(request.app.routes, limits, public, bool(s.api_key)))

    return Route("/openapi.json", openapi_json, methods=["GET"])
