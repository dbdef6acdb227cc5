"""What one request field is (`Field`): its routes, type, bounds, default, description, examples and
whether OpenAI's API has it. From one `Field` come both its JSON schema in GET /openapi.json
(`schema_of`) and the parser's checks of its value (`Reader`), with the refusals' wording. The table of
every field is fields.py; the shapes of compound values are shapes.py. No torch here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

from gptport.serve.api.api_error import bad

Schema = dict[str, Any]
ROUTES = ("completions", "chat", "tokenize", "detokenize", "responses")
OPENAI_ROUTES = ("completions", "chat", "responses")
# a field's kind: the JSON type the reader takes (and the words of its refusal); "any": no type (its module checks it)
KINDS = {"integer": ((int,), "an integer"), "number": ((int, float), "a number"), "boolean": ((bool,), "true or false"),
         "string": ((str,), "a string"), "object": ((dict,), "an object"), "any": ((object,), "")}


@dataclass(frozen=True)
class Limits:
    """What the document says about this server: its model's name, slots, vocabulary (None while the
    model loads) and body limit."""

    model: str
    slots: int
    vocab: int | None
    max_body: int


@dataclass(frozen=True)
class Field:
    """One request field, as the routes in `routes` take it."""

    name: str
    kind: str  # a key of KINDS
    routes: tuple[str, ...]
    about: str = ""  # the description
    examples: tuple[Any, ...] = ()  # each one accepted (tests/serve/http/test_openapi.py sends them)
    default: Any = None  # the value an absent (or null) field takes
    lo: float | None = None  # the least value (an integer or number)
    hi: float | None = None  # the greatest
    above: bool = False  # lo itself is refused
    bounds: str = ""  # how a refusal words the bounds, where not "between LO and HI" / "at least LO"
    only: tuple[Any, ...] = ()  # an OpenAI field read in part: the values honoured, others a 400 unsupported
    refusal: str = ""  # the message for a value outside `only` ({value!r} is the value)
    brief: bool = False  # a wrong type is refused as "expected X" (not "expected X, got T V")
    shape: Schema | Callable[[Limits], Schema] | None = None  # a compound value's JSON schema (shapes.py)
    limit: Callable[[Limits], Schema] | None = None  # what this server's limits add to the schema
    openai: tuple[str, ...] = OPENAI_ROUTES  # the routes whose OpenAI counterpart has the field (others: an extra)
    required: tuple[str, ...] = ()  # the routes that need it
    refused: str = ""  # an OpenAI field gptport refuses whenever it is set: why
    # made from the above: the types taken without an isinstance test, the value of an absent field (a number's
    # as a float), whether a value has bounds or honoured values to check
    exact: frozenset[type] = dataclass_field(init=False, repr=False, compare=False)
    absent: Any = dataclass_field(init=False, repr=False, compare=False)
    checked: bool = dataclass_field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS or not set(self.routes) | set(self.required) <= set(ROUTES):
            raise ValueError(f"{self.name}: kind {self.kind!r} or a route of {self.routes + self.required} is unknown")
        exact = frozenset(KINDS[self.kind][0]) if self.kind != "any" else frozenset()
        number = self.kind == "number" and self.default is not None
        object.__setattr__(self, "exact", exact)
        object.__setattr__(self, "absent", float(self.default) if number else self.default)
        object.__setattr__(self, "checked", self.lo is not None or self.hi is not None or bool(self.only))
        if self.absent is not None and not (self.within(self.absent) and self.honoured(self.absent)):
            raise ValueError(f"{self.name}: the default {self.default!r} is not a value the field takes")

    def within(self, value: Any) -> bool:
        """`value` (of the field's kind) is within its bounds."""
        return not (self.lo is not None and (value <= self.lo if self.above else value < self.lo)
                    or self.hi is not None and value > self.hi)

    def honoured(self, value: Any) -> bool:
        """`value` is one of the values honoured of a field read in part (any value of another field)."""
        return not self.only or any(_same(value, v, self.kind) for v in self.only)

    def extra(self, route: str) -> bool:
        """gptport's own field on an OpenAI route (as vLLM or llama-server take it)."""
        return route in OPENAI_ROUTES and route not in self.openai

    def words(self) -> str:
        """The bounds as a refusal words them."""
        if self.bounds:
            return self.bounds
        return f"between {_num(self.lo)} and {_num(self.hi)}" if self.hi is not None else f"at least {_num(self.lo)}"


def _num(x: float | None) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def nullable(schema: Schema) -> Schema:
    """A value the parser reads as absent when it is null (as OpenAI's API does)."""
    return {"anyOf": [schema, {"type": "null"}]}


def schema_of(field: Field, limits: Limits) -> Schema:
    """The field's JSON schema: its type, bounds, honoured values, shape and this server's limits, its
    default, examples and description; `x-gptport-extra` where OpenAI's API does not have it."""
    out: Schema = {} if field.kind == "any" else {"type": field.kind}
    if field.lo is not None:
        out["exclusiveMinimum" if field.above else "minimum"] = field.lo
    if field.hi is not None:
        out["maximum"] = field.hi
    if len(field.only) == 1:
        out["const"] = field.only[0]
    elif field.only:
        out["enum"] = list(field.only)
    shape = field.shape(limits) if callable(field.shape) else field.shape
    out |= shape or {}
    if field.default is not None:
        out["default"] = field.default
    if field.examples:
        out["examples"] = list(field.examples)
    if field.about:
        out["description"] = field.about
    return out | (field.limit(limits) if field.limit else {})


class Reader:
    """A request body's fields read by their `Field`: each refusal names the field."""

    def __init__(self, body: dict[str, Any], fields: dict[str, Field]) -> None:
        self.body, self.fields = body, fields

    def typed(self, name: str) -> Any:
        """The field's value, of its kind (a number as a finite float), or its default."""
        field = self.fields[name]
        value = self.body.get(name)
        return field.absent if value is None else _typed(field, value)

    def bounded(self, name: str, value: Any) -> Any:
        """`value` (the field's, as `typed` read it) refused outside the field's bounds and honoured values."""
        field = self.fields[name]
        if value is None or not field.checked:
            return value
        if not field.within(value):
            raise bad(name, f"must be {field.words()}, not {value}", "invalid_value")
        if not field.honoured(value):
            raise bad(name, field.refusal.format(value=value), "unsupported")
        return value

    def read(self, name: str) -> Any:
        """The field's value, checked, or its default."""
        field = self.fields[name]
        value = self.body.get(name)
        return field.absent if value is None else self.bounded(name, _typed(field, value))


def _typed(field: Field, value: Any) -> Any:
    if value.__class__ not in field.exact and field.kind != "any":  # JSON's types are exact: isinstance for others
        kinds, what = KINDS[field.kind]
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            got = "" if field.brief else f", got {type(value).__name__} {value!r:.40}"
            raise bad(field.name, f"expected {what}{got}", "invalid_type")
    if field.kind == "number":
        try:
            value = float(value)
        except OverflowError:  # an integer past float's range
            value = math.inf
        if not math.isfinite(value):  # Python's json reads NaN and Infinity
            raise bad(field.name, f"must be a finite number, not {value}", "invalid_value")
    return value


def _same(value: Any, honoured: Any, kind: str) -> bool:
    """`value` is `honoured`: of the same type (false is not 0), or, for a number, equal."""
    return value == honoured if kind == "number" else type(value) is type(honoured) and value == honoured
