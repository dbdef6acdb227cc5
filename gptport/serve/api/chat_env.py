"""The Jinja environment chat templates are written for: transformers' (apply_chat_template), so that a model's
template renders here as it renders there. A sandbox (ImmutableSandboxedEnvironment) with trim_blocks and
lstrip_blocks; loop controls ({% break %}, {% continue %}); a `tojson` filter that does not escape HTML and takes
json.dumps' indent, separators and sort_keys; `raise_exception(message)`; `strftime_now(format)` (the local time,
as Llama 3.2's template dates its system prompt); `{% generation %}` blocks rendered as their body (they mark
an assistant's tokens for training); `namespace` without underscore attributes. Unlike Jinja's default, nothing is
computed while a template compiles (`{{ 'x' * 1000000000 }}` would be, at the server's startup): a template's cost
is paid when it renders, where template_worker.py bounds it. No torch here.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from jinja2 import TemplateError, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace


def raise_exception(message: str) -> None:
    """What a template calls to refuse its messages."""
    raise TemplateError(message)


def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
           separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """json.dumps as transformers' filter calls it: no HTML escaping (Jinja's own filter writes < as \\u003c)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class Generation(Extension):
    """{% generation %} ... {% endgeneration %}: its body, rendered as is."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


class TemplateNamespace(Namespace):
    """Jinja's namespace, refusing attribute names that start with an underscore (as transformers' does)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Namespace's own signature trick
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _check(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check(name)
        Namespace.__setitem__(self, name, value)


def _check(name: object) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise SecurityError(f"a chat template cannot store {name!r} (an underscore attribute) on a namespace")


class Unfolded(CodeGenerator):
    """Jinja's code generator, folding no expression into a constant at compile time (its optimizer is off too):
    `{{ 'x'|center(1000000000) }}` or `{{ 'x' * 1000000000 }}` would otherwise be computed by the compiler. Text
    and literals are still written out as they are; the output is the same."""

    def _output_child_to_const(self, node: nodes.Expr, frame: Frame, finalize: Any) -> str:
        if not isinstance(node, (nodes.TemplateData, nodes.Const)):
            raise nodes.Impossible()
        return str(super()._output_child_to_const(node, frame, finalize))


class ChatEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, compiling with Unfolded."""

    code_generator_class = Unfolded


def environment() -> ImmutableSandboxedEnvironment:
    """A fresh environment with transformers' extensions, filters and globals."""
    env = ChatEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols],
                          optimized=False)
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, namespace=TemplateNamespace)
    return env
