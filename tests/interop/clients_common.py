"""What the client scenarios share. They run inside the clients' own virtual environment (openai,
openai-agents, langchain-openai, litellm, lm-eval), which has no gptport: this module imports the standard
library and pydantic only.

A scenario script is run as `python -m tests.interop.clients_<name> SCENARIO... --url URL --model NAME
--api-key KEY` from the repository's root. It runs each scenario named (one process per client: importing
a client takes seconds) and prints one JSON line for each: {"scenario", "ok": true, ...what it saw} or
{"scenario", "ok": false, "error": the client's own traceback}; it exits 1 when any failed.
"""

from __future__ import annotations

import argparse
import json
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MESSAGES = [{"role": "system", "content": "You help."}, {"role": "user", "content": "ka to ri so ne"}]
TOOL_MESSAGES = [{"role": "user", "content": "Add two numbers, ka to ri."}]


class Person(BaseModel):
    """The structured reply every client asks for: short, bounded fields, so a tiny model finishes it."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)
    color: Literal["red", "green", "blue"]


class Add(BaseModel):
    """The arguments of the `add` tool."""

    model_config = ConfigDict(extra="forbid")
    a: int = Field(ge=-99, le=99)
    b: int = Field(ge=-99, le=99)


ADD_TOOL = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.", "parameters": Add.model_json_schema()}}


@dataclass(frozen=True)
class Target:
    """The server under test: its root URL (no /v1), the model name it serves and its API key."""

    url: str
    model: str
    api_key: str

    @property
    def v1(self) -> str:
        return self.url + "/v1"


Scenario = Callable[[Target], dict[str, Any]]


def check(condition: bool, what: str) -> None:
    """Fail the scenario with `what` (an assert that `python -O` would not drop)."""
    if not condition:
        raise AssertionError(what)


def main(scenarios: dict[str, Scenario], argv: Sequence[str] | None = None) -> int:
    """Run each scenario named on the command line against the server, printing one JSON line for each."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("scenario", nargs="+", choices=sorted(scenarios))
    parser.add_argument("--url", required=True, help="the server's root, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key", default="unused")
    args = parser.parse_args(argv)
    target = Target(args.url.rstrip("/"), args.model, args.api_key)
    failed = 0
    for name in args.scenario:
        try:
            line = {"scenario": name, "ok": True, **scenarios[name](target)}
        except Exception:  # noqa: BLE001 - any failure of a client is the scenario's result, reported whole
            line, failed = {"scenario": name, "ok": False, "error": traceback.format_exc()}, failed + 1
        print(json.dumps(line, default=str), flush=True)
    return 1 if failed else 0
