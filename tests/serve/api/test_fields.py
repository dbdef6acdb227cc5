"""The request fields' one definition (gptport/serve/api/fields.py): each bound a field declares is the one the
parser enforces, with the refusal's wording, and the one GET /openapi.json states; each field is defined once
per route; the document marks gptport's extras and the HTTP reference says so."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from gptport import tokenizer as bpe
from gptport.serve.api import fields, protocol, tokenize
from gptport.serve.api.api_error import ApiError
from gptport.serve.api.chat_template import plain
from gptport.serve.api.field_spec import Field, Limits, schema_of
from gptport.serve.api.openapi_schemas import REQUESTS, request_body
from gptport.serve.api.responses import to_chat

LIMITS = Limits("m", 4, 512, 1 << 20)
BASE: dict[str, dict[str, Any]] = {"completions": {"prompt": "ka"},
                                   "chat": {"messages": [{"role": "user", "content": "hi"}]},
                                   "tokenize": {"prompt": "ka"}, "detokenize": {"tokens": [1]},
                                   "responses": {"input": "hi"}}


def parse(route: str, body: dict[str, Any], tok: bpe.BPETokenizer) -> Any:
    if route == "completions":
        return protocol.completion_job(body, tok, 1024, 8)
    if route == "chat":
        return protocol.chat_job(body, tok, 1024, 8, plain)
    if route == "tokenize":
        return tokenize.tokenize(body, tok, 1024, plain)
    if route == "responses":
        return to_chat.responses_job(body, tok, 1024, 8, plain)
    return tokenize.detokenize(body, tok)


def refusal(route: str, body: dict[str, Any], tok: bpe.BPETokenizer) -> ApiError:
    with pytest.raises(ApiError) as e:
        parse(route, body, tok)
    return e.value


def bounded() -> list[tuple[str, Field]]:
    """(route, field) of each field with bounds; best_of's (>= 1) is n's, whom it must equal (checked as such)."""
    return [(route, f) for route, table in fields.ROUTE_FIELDS.items() for f in table.values()
            if (f.lo is not None or f.hi is not None) and f.name != "best_of"]


def test_each_field_is_defined_once_per_route() -> None:
    seen: set[tuple[str, str]] = set()
    for f in fields.FIELDS:
        for route in f.routes:
            assert (route, f.name) not in seen, f"{f.name} is defined twice for {route}"
            seen.add((route, f.name))
    assert set(fields.REFUSED) and not set(fields.REFUSED) & set(fields.ROUTE_FIELDS["chat"])


@pytest.mark.parametrize(("route", "field"), bounded(), ids=lambda x: x if isinstance(x, str) else x.name)
def test_declared_bounds_are_enforced_and_documented(route: str, field: Field, tok: bpe.BPETokenizer) -> None:
    """Its bounds accepted, one step past each refused with 'must be <its words>, not <value>', and the
    schema's minimum / maximum the same numbers."""
    schema = schema_of(field, LIMITS)
    step = 1 if field.kind == "integer" else 0.5
    if field.lo is not None:
        assert schema["exclusiveMinimum" if field.above else "minimum"] == field.lo
        if not field.above:
            parse(route, {**BASE[route], field.name: field.lo}, tok)
        past = field.lo if field.above else field.lo - step
        err = refusal(route, {**BASE[route], field.name: past}, tok)
        assert (err.param, err.code) == (field.name, "invalid_value"), err.message
        assert err.message == f"'{field.name}': must be {field.words()}, not {float(past) if step != 1 else past}"
    if field.hi is not None:
        assert schema["maximum"] == field.hi
        parse(route, {**BASE[route], field.name: field.hi}, tok)
        err = refusal(route, {**BASE[route], field.name: field.hi + step}, tok)
        assert err.message.startswith(f"'{field.name}': must be {field.words()}, not "), err.message


@pytest.mark.parametrize("route", sorted(fields.ROUTE_FIELDS))
def test_a_wrong_type_is_refused_in_the_declared_words(route: str, tok: bpe.BPETokenizer) -> None:
    words = {"integer": "an integer", "number": "a number", "boolean": "true or false", "string": "a string",
             "object": "an object"}
    for f in fields.ROUTE_FIELDS[route].values():
        if f.kind not in words or f.name in ("model", "best_of"):  # the app checks model (404); best_of against n
            continue
        base = BASE["chat"] if route == "tokenize" else BASE[route]  # a chat: add_generation_prompt applies
        body = {**({} if route == "tokenize" and f.name in ("prompt", "content") else base), f.name: ["x"]}
        err = refusal(route, body, tok)
        tail = "" if f.brief else ", got list ['x']"
        assert (err.param, err.message) == (f.name, f"'{f.name}': expected {words[f.kind]}{tail}"), route


def test_extras_are_marked_in_the_document_and_the_reference() -> None:
    path = Path(__file__).resolve().parents[3] / "docs" / "hooks" / "http_reference.py"
    spec = importlib.util.spec_from_file_location("docs_hook_http_reference", path)  # docs/ is no package
    assert spec is not None and spec.loader is not None
    http_reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(http_reference)
    for name, route in REQUESTS.items():
        props = request_body(name, LIMITS)["properties"]
        marked = {f for f, s in props.items() if any(a.get("x-gptport-extra") for a in s.get("anyOf", [s]))}
        expected = {"completions": fields.EXTRAS_COMPLETION, "chat": fields.EXTRAS_CHAT}.get(route, set())
        assert marked == expected, name
    rows = http_reference.field_rows(request_body("ChatRequest", LIMITS))
    assert any(r.startswith("| `top_k` |") and "gptport's extra" in r for r in rows)
    assert not any(r.startswith("| `temperature` |") and "gptport's extra" in r for r in rows)
