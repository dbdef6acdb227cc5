"""Every request body checked against its route's JSON schema, the one GET /openapi.json publishes (made from
fields.py's definitions), before any field of it is used. A value of the wrong type anywhere, however deep in a
nested item, is a 400 naming its path (`input[0].call_id`) before a parser reads it: the parsers behind this
check see only values of their declared types. A value of the right type that breaks a bound or an enumeration
is left to the route's parser, whose refusal says more (the tool it names, the bound it breaks); what the
parser lets through and the schema does not is refused after it (`BodyCheck.leftover`), so no request the
document refuses is ever served. Validation is jsonschema-rs (compiled once per route). No torch here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jsonschema_rs

from gptport.serve.api import fields, responses_fields
from gptport.serve.api.api_error import ApiError, bad
from gptport.serve.api.field_spec import Field, Limits, Reader
from gptport.serve.api.openapi_schemas import REQUESTS, request_body

Kind = jsonschema_rs.ValidationErrorKind
# what a value is (its type, the keys its object needs): refused here, before a parser sees it. A key too many
# is not: the parsers refuse it in words of their own (the leftover check catches any they miss)
STRUCTURE = (Kind.Type, Kind.Required, Kind.FalseSchema, Kind.PropertyNames)
# the branches of a union
UNIONS = (Kind.AnyOf, Kind.OneOfNotValid)
JSON_TYPES = {"string": "a string", "integer": "an integer", "number": "a number", "boolean": "true or false",
              "object": "an object", "array": "a list", "null": "null"}
ROUTE_OF = {route: name for name, route in REQUESTS.items()}


@dataclass(frozen=True)
class Problem:
    """One way a body breaks its schema: where (the path into the body), what kind of rule, and the rule's
    own words."""

    path: tuple[str | int, ...]
    kind: Any  # a jsonschema_rs.ValidationErrorKind
    message: str
    top_schema: str  # the first keyword of the schema path ("properties", "additionalProperties", ...)
    untagged: bool = False  # a union of tagged objects none of which has this value's tag (its `type`)

    @property
    def structural(self) -> bool:
        return isinstance(self.kind, STRUCTURE)


def located(body: Any, path: Sequence[str | int]) -> tuple[Any, str]:
    """The value at `path` in `body` and the path's name, `input[0].call_id` (jsonschema-rs gives an object's
    key "0" as the number 0: what a part is comes from the value it indexes)."""
    value, name = body, ""
    for part in path:
        if isinstance(value, list):
            value, name = value[int(part)], f"{name}[{int(part)}]"
        else:
            key = str(part)
            value, name = value.get(key) if isinstance(value, dict) else None, f"{name}.{key}" if name else key
    return value, name


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)


def _branch_score(errors: list[Any], at: int) -> tuple[bool, bool, int, int]:
    """How well a union's branch fits (higher is better): not refused for its type where the union stands, not
    refused for its discriminating tag (an item's `type`), the depth its errors reach, the fewer the better."""
    wrong_type = any(len(e.instance_path) == at and isinstance(e.kind, Kind.Type) for e in errors)
    wrong_tag = any(len(e.instance_path) == at + 1 and e.instance_path[-1] == "type" for e in errors)
    depth = max((len(e.instance_path) for e in errors), default=at)
    return (not wrong_type, not wrong_tag, depth, -len(errors))


def _resolved(error: Any) -> list[Any]:
    """The errors inside a union that say most: those of the branch the value fits best (as jsonschema's
    best_match chooses), down nested unions. A union none of whose branches takes the value's type stays
    itself (its message lists the types)."""
    if not isinstance(error.kind, UNIONS) or not error.kind.context:
        return [error]
    at = len(error.instance_path)
    branches = [list(b) for b in error.kind.context if b]
    if not branches:
        return [error]
    best = max(branches, key=lambda b: _branch_score(b, at))
    if not _branch_score(best, at)[0]:
        return [error]
    return [inner for e in best for inner in _resolved(e)]


def problems(validator: Any, body: Any) -> list[Problem]:
    """Every way `body` breaks the schema, each union resolved to its most telling errors."""
    out = []
    for error in validator.iter_errors(body):
        top = str(error.schema_path[0]) if error.schema_path else ""
        for e in _resolved(error):
            at = len(e.instance_path)
            untagged = isinstance(e.kind, UNIONS) and all(not _branch_score(list(b), at)[1]
                                                          for b in e.kind.context or [])
            out.append(Problem(tuple(e.instance_path), e.kind, e.message, top, untagged))
    return out


def _tag_refused(found: list[Problem], body: Any) -> set[tuple[str | int, ...]]:
    """The objects whose tag (a string `type`) names a kind the schema lacks, or whose keys contradict their tag
    (a `not` of an if/then/else): what else they need depends on the tag, so the parser speaks first (it names
    the kind it does not support, or the key that does not go with it)."""
    out = set()
    for p in found:
        if p.untagged or isinstance(p.kind, Kind.Not):
            out.add(p.path)
        elif p.path and p.path[-1] == "type" and isinstance(p.kind, (Kind.Constant, Kind.Enum)):
            if isinstance(located(body, p.path)[0], str):
                out.add(p.path[:-1])
    return out


def _union_types(kind: Any, at: int) -> list[str]:
    """The types a union's branches take where it stands."""
    types: list[str] = []
    for branch in kind.context or []:
        for e in branch:
            if isinstance(e.kind, Kind.Type) and len(e.instance_path) == at:
                types += [t for t in _types(e.kind) if t not in types]
    return types


def _types(kind: Any) -> list[str]:
    types = kind.types
    return [types] if isinstance(types, str) else list(types)


def refusal(p: Problem, body: Any) -> ApiError:
    """The 400 of a problem: its path named as the parameter, what was expected and what came."""
    value, name = located(body, p.path)
    got = f"got {_json_type(value)} {json.dumps(value, default=str)[:40]}" if value is not None else "got null"
    kind = p.kind
    if isinstance(kind, Kind.Type):
        wanted = " or ".join(JSON_TYPES.get(t, t) for t in _types(kind))
        return bad(name, f"expected {wanted}, {got}", "invalid_type")
    if isinstance(kind, Kind.Required):
        where = f"'{name}'" if name else "the request"
        return ApiError(400, f"{where}: '{kind.property}' is required",
                        f"{name}.{kind.property}" if name else kind.property, "missing")
    if isinstance(kind, Kind.AdditionalProperties):
        return bad(name, f"unknown key {kind.unexpected[0]!r:.40}", "invalid_value")
    if isinstance(kind, UNIONS):
        wanted = " or ".join(JSON_TYPES.get(t, t) for t in _union_types(kind, len(p.path))) or "another value"
        return bad(name, f"expected {wanted}, {got}", "invalid_type")
    return bad(name, p.message[:200], "invalid_value")


class BodyCheck:
    """The routes' schemas compiled once for this server's limits (the vocabulary's size left out: a token id
    past it is the parser's `invalid_token`)."""

    def __init__(self, limits: Limits, fields: dict[str, dict[str, Field]],
                 names: dict[str, Callable[[dict[str, Any]], object]]) -> None:
        self.fields, self.names = fields, names
        self.validators = {route: jsonschema_rs.validator_for(request_body(name, limits))
                           for route, name in ROUTE_OF.items()}

    def before(self, route: str, body: Any) -> list[Problem]:
        """Refuse a body whose values are not of their declared types (400 naming the first one's path); the
        other problems, for `leftover` once the parser has spoken. A body that is not an object is refused."""
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object", None, "invalid_json")
        found = problems(self.validators[route], body)
        tagged = _tag_refused(found, body)
        for p in found:
            if any(p.path[:len(t)] == t for t in tagged):
                continue
            if p.structural or isinstance(p.kind, UNIONS):
                raise self._named(route, body, p)
        return found

    def leftover(self, route: str, body: dict[str, Any], found: list[Problem]) -> None:
        """After the parser took the body: a problem it let through is refused all the same."""
        if found:
            raise self._named(route, body, found[0])

    def _named(self, route: str, body: dict[str, Any], p: Problem) -> ApiError:
        """The refusal of a problem, in the words of the field's own definition where it is a top-level field
        (the unknown and refused fields' words, a scalar's expected type and bounds)."""
        if not p.path:
            return refusal(p, body)
        name = str(p.path[0])
        fields = self.fields[route]
        if p.top_schema == "additionalProperties" or name not in fields:
            self.names[route](body)  # raises: unknown, or one of OpenAI's fields gptport refuses
        field = fields.get(name)
        if field is not None and len(p.path) == 1 and field.kind != "any":
            try:
                Reader(body, fields).read(name)
            except ApiError as e:
                return e
        return refusal(p, body)


def for_server(model: str, slots: int, max_body: int) -> BodyCheck:
    """The check of every route of a server with `slots` slots and a `max_body`-byte limit; each route's
    unknown and refused fields named as its parser names them."""
    def names(route: str) -> Callable[[dict[str, Any]], object]:
        if route == "responses":
            return responses_fields.reader  # raises for an unknown or a refused field
        return lambda body: fields.check_names(body, route)

    return BodyCheck(Limits(model, slots, None, max_body), fields.ROUTE_FIELDS,
                     {route: names(route) for route in ROUTE_OF})
