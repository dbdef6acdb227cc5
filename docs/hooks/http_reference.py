"""The HTTP API reference, generated at build time (a mkdocs hook) from the OpenAPI document the server
serves at GET /openapi.json: the app of `gptport serve` is built with example settings and asked for
the document in process (no server started, no model loaded), then rendered as Markdown beside the
JSON itself. The refused fields come from the server's own list. Nothing here is written by hand.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PAGE, DOCUMENT = "reference/http-api.md", "reference/openapi.json"
MODEL, SLOTS = "mymodel", 16  # the example server the document describes
NAMES = ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum", "minLength", "maxLength", "minItems",
         "maxItems", "pattern")
SYMBOLS = {"minimum": "≥", "exclusiveMinimum": ">", "maximum": "≤", "exclusiveMaximum": "<"}
Schema = dict[str, Any]


def openapi_document() -> Schema:
    """GET /openapi.json of an app built as `gptport serve models/mymodel` builds it (before any model loads)."""
    from starlette.testclient import TestClient

    from gptport.serve.http.app import create_app
    from gptport.serve.settings import Settings

    app = create_app(Settings(model_dir=Path("models") / MODEL, model_name=MODEL, slots=SLOTS))
    response = TestClient(app).get("/openapi.json")
    response.raise_for_status()
    return response.json()


def _cell(text: str) -> str:
    parts = str(text).replace("\n", " ").split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("|", "\\|").replace("<", "&lt;").replace("*", "\\*")
    return "`".join(parts)


def _json(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def _alternatives(schema: Schema) -> tuple[list[Schema], bool]:
    """A schema's alternatives other than null (nested anyOf flattened), and whether null is allowed."""
    out, nullable = [], False
    for alt in schema.get("anyOf", [schema]):
        if alt is not schema and "anyOf" in alt:
            inner, inner_null = _alternatives(alt)
            out += [{**a, **{k: v for k, v in alt.items() if k != "anyOf"}} for a in inner]
            nullable |= inner_null
        elif alt.get("type") == "null":
            nullable = True
        else:
            out.append(alt)
    return out, nullable


def type_of(schema: Schema) -> str:
    """A schema's type in a few words: `integer`, `array of string`, a link to a named schema, ..."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "anyOf" in schema:
        alts, nullable = _alternatives(schema)
        return " or ".join([type_of(a) for a in alts] + (["null"] if nullable else []))
    if "const" in schema:
        return _json(schema["const"])
    if "enum" in schema:
        return "one of " + ", ".join(_json(v) for v in schema["enum"])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind == "array":
        return f"array of {type_of(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"object of {type_of(schema['additionalProperties'])}"
    return kind or "any"


def _notes(schema: Schema) -> str:
    notes = []
    for alt in _alternatives(schema)[0] or [schema]:
        notes += [f"{SYMBOLS.get(k, k)} {_json(alt[k]) if k == 'pattern' else alt[k]}" for k in NAMES if k in alt]
        if "default" in alt:
            notes.append(f"default {_json(alt['default'])}")
        if alt.get("description"):
            notes.append(_cell(alt["description"]))
        if alt.get("x-gptport-extra"):
            notes.append("gptport's extra (not in OpenAI's API)")
    if schema.get("description") and "anyOf" in schema:
        notes.append(_cell(schema["description"]))
    return "; ".join(dict.fromkeys(notes))


def _nested(schema: Schema) -> tuple[Schema | None, str]:
    """The object schema whose fields a property's rows go on to list, and the path suffix ('' or '[]')."""
    alts = _alternatives(schema)[0]
    if len(alts) != 1:
        return None, ""
    alt = alts[0]
    if alt.get("type") == "array" and "properties" in alt.get("items", {}):
        return alt["items"], "[]"
    return (alt, "") if "properties" in alt else (None, "")


def field_rows(schema: Schema, prefix: str = "", depth: int = 0) -> list[str]:
    """One table row per field of an object schema, nested objects' fields as dotted paths."""
    rows, required = [], set(schema.get("required", []))
    for name, prop in schema.get("properties", {}).items():
        path = f"{prefix}{name}"
        mark = " (required)" if name in required else ""
        rows.append(f"| `{path}`{mark} | {_cell(type_of(prop))} | {_notes(prop)} |")
        inner, suffix = _nested(prop)
        if inner is not None and depth < 4:
            rows += field_rows(inner, f"{path}{suffix}.", depth + 1)
    return rows


def _schema_section(name: str, schema: Schema) -> list[str]:
    out = [f"### {name}", ""]
    if schema.get("description"):
        out += [_cell(schema["description"]), ""]
    if "properties" in schema:
        out += ["| field | type | notes |", "| --- | --- | --- |", *field_rows(schema), ""]
    else:
        out += [f"Type: {type_of(schema)}.", ""]
    return out


def _anchor(method: str, path: str) -> str:
    """The id Markdown's table of contents gives the heading of a route."""
    from markdown.extensions.toc import slugify

    return slugify(f"{method.upper()} {path}", "-")


def _operation(path: str, method: str, op: Schema) -> list[str]:
    out = [f"### {method.upper()} {path}", "", _cell(op.get("summary", "")), ""]
    out += [("No API key needed." if op.get("security") == [] else
             "Needs `Authorization: Bearer KEY` when the server has an API key."), ""]
    for param in op.get("parameters", []):
        out += [f"Path parameter `{param['name']}`: {type_of(param['schema'])}.", ""]
    body = op.get("requestBody", {}).get("content", {})
    for media, content in body.items():
        out += [f"Request body (`{media}`): {type_of(content['schema'])}.", ""]
    out += ["| status | when | body |", "| --- | --- | --- |"]
    for status, answer in op["responses"].items():
        bodies = [f"`{media}` {type_of(c['schema'])}" + (f" ({_cell(c['schema']['description'])})"
                  if "description" in c["schema"] else "") for media, c in answer.get("content", {}).items()]
        headers = [f"header `{h}`" for h in answer.get("headers", {})]
        out.append(f"| {status} | {_cell(answer.get('description', ''))} | {'; '.join(bodies + headers)} |")
    return [*out, ""]


def refused_fields() -> list[str]:
    """The OpenAI fields the server refuses whenever they are set, by route, with its reason (their definitions
    in gptport.serve.api.fields and gptport.serve.api.responses_fields)."""
    from gptport.serve.api import fields, responses_fields

    by_route = (("/v1/chat/completions", fields.REFUSED), ("/v1/responses", responses_fields.REFUSED))
    rows = [f"| `{name}` | `{route}` | {_cell(why)} |" for route, refused in by_route
            for name, why in sorted(refused.items())]
    return ["| field | route | why |", "| --- | --- | --- |", *rows]


def render(doc: Schema) -> str:
    """The reference page of an OpenAPI document."""
    info, schemas = doc["info"], doc["components"]["schemas"]
    routes = [(path, method, op) for path, methods in doc["paths"].items() for method, op in methods.items()]
    requests = sorted(n for n in schemas if n.endswith("Request"))
    errors = sorted(n for n in schemas if n.startswith("Error"))
    bodies = sorted(n for n in schemas if n not in requests and n not in errors)
    out = [
        "# HTTP API", "",
        "Generated when the site is built from the OpenAPI document that `gptport serve` answers at "
        "`GET /openapi.json` (the app is made in process with example settings; no server runs): "
        f"{_cell(info['description'])} The document itself: [openapi.json](openapi.json). "
        "A running server's document gives its own model name, slots and vocabulary.", "",
        "What each route does in practice, with examples: [Serving](../guide/serving.md) and "
        "[Structured outputs and tools](../guide/structured-outputs.md).", "",
        "## Routes", "", "| method | path | what |", "| --- | --- | --- |",
        *[f"| {m.upper()} | [`{p}`](#{_anchor(m, p)}) | {_cell(op.get('summary', ''))} |" for p, m, op in routes], "",
    ]
    for path, method, op in routes:
        out += _operation(path, method, op)
    out += ["## Request bodies", "", "A field sent as null counts as absent. Any field not listed is refused "
            "with 400 `unrecognized_argument`, as OpenAI refuses it.", ""]
    for name in requests:
        out += _schema_section(name, schemas[name])
    out += ["## Refused fields", "", "OpenAI's fields that gptport does not implement: a request that sets one "
            "gets 400 `unsupported`, with the reason as its message.", "", *refused_fields(), ""]
    out += ["## Response bodies", ""]
    for name in bodies:
        out += _schema_section(name, schemas[name])
    out += ["## Errors", "", "Every error is OpenAI's error object; `param` names the field at fault.", ""]
    for name in errors:
        out += _schema_section(name, schemas[name])
    return "\n".join(out)


def on_files(files: Any, config: Any) -> Any:
    """mkdocs hook: add the rendered page and the JSON document."""
    from mkdocs.structure.files import File

    doc = openapi_document()
    files.append(File.generated(config, PAGE, content=render(doc)))
    files.append(File.generated(config, DOCUMENT, content=json.dumps(doc, indent=2, ensure_ascii=False)))
    return files
