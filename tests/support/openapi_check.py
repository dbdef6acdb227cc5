"""Checking a response against gptport's OpenAPI document (GET /openapi.json) with `jsonschema`: its status
documented for the route, its content type one the document names, its headers and body (each server-sent
event of a stream) valid under the documented schemas."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012

ROOT = "urn:gptport:openapi"


def pointer(*parts: str) -> str:
    return "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


class Conformance:
    """The document's schemas, ready to validate the responses of its routes."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.registry: Registry[Any] = Registry().with_resource(ROOT, DRAFT202012.create_resource(doc))

    def validate(self, location: str, instance: Any) -> None:
        """Validate against the schema at this JSON pointer of the document (raises ValidationError)."""
        Draft202012Validator({"$ref": f"{ROOT}#/{location}"}, registry=self.registry).validate(instance)

    def check(self, path: str, method: str, status: int, headers: Mapping[str, str], content: bytes) -> Any:
        """The response conforms: status, content type, headers, body. Returns the parsed body (a list of
        parsed `data:` payloads for a stream)."""
        op = self.doc["paths"][path][method.lower()]
        where = pointer("paths", path, method.lower(), "responses", str(status))
        assert str(status) in op["responses"], f"{method} {path}: status {status} is not documented: {content[:300]!r}"
        response = op["responses"][str(status)]
        for name, header in response.get("headers", {}).items():
            value = headers.get(name.lower())
            assert value is not None or not header.get("required"), f"{method} {path} {status}: no {name} header"
            if value is not None:
                self.validate(f"{where}/{pointer('headers', name, 'schema')}", int(value) if value.isdigit() else value)
        ctype = headers.get("content-type", "")
        media = next((m for m in response["content"] if _matches(m, ctype)), None)
        assert media is not None, f"{method} {path} {status}: {ctype!r} is not one of {list(response['content'])}"
        schema_at = f"{where}/{pointer('content', media, 'schema')}"
        text = content.decode("utf-8")
        if media == "text/event-stream":
            return self._events(schema_at, text)
        body = json.loads(text) if media == "application/json" else text
        self.validate(schema_at, body)
        return body

    def _events(self, schema_at: str, text: str) -> list[Any]:
        assert text.endswith("\n\n"), text[-200:]
        datas = []
        for block in text[:-2].split("\n\n"):
            lines = block.split("\n")
            assert all(line.startswith("data: ") for line in lines), block
            event = {"data": "\n".join(line[len("data: "):] for line in lines), "event": "message"}
            self.validate(schema_at, event)
            datas.append(event["data"])
        assert datas and datas[-1] == "[DONE]" and datas.count("[DONE]") == 1, datas[-3:]
        content = self.doc
        for part in schema_at.split("/"):
            content = content[part.replace("~1", "/").replace("~0", "~")]
        branch = next(i for i, s in enumerate(content["properties"]["data"]["anyOf"]) if "contentSchema" in s)
        payload_at = f"{schema_at}/properties/data/anyOf/{branch}/contentSchema"
        out = []
        for data in datas[:-1]:
            parsed = json.loads(data)
            self.validate(payload_at, parsed)
            out.append(parsed)
        return [*out, "[DONE]"]


def _matches(documented: str, received: str) -> bool:
    """Same type/subtype, and every parameter the document names (version=0.0.4) present as named."""
    doc_parts = [p.strip() for p in documented.lower().split(";")]
    got_parts = [p.strip() for p in received.lower().split(";")]
    return doc_parts[0] == got_parts[0] and all(p in got_parts[1:] for p in doc_parts[1:])
