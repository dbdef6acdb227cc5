"""The clients people use, each the released package (openai, openai-agents, langchain-openai, litellm) in a
virtual environment of its own, driven against a real `gptport serve` (127.0.0.1, a free port, an API key,
a served name) of a tiny model: every request succeeds and every structured reply is valid. The scenarios
themselves are tests/interop/clients_*.py, run with that venv's python; see clients_venv for the venv."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.interop.clients_venv import clients_python, needs_clients, run_scenarios
from tests.support.serving import Served, serve

KEY, NAME = "k", "tiny"
SCENARIOS = {
    "clients_openai": ["chat", "completions", "parse", "tools", "responses", "responses_parse"],
    "clients_agents": ["agents_responses", "agents_chat"],
    "clients_langchain": ["langchain_chat", "langchain_tools", "langchain_structured"],
    "clients_litellm": ["litellm"],
}
CASES = [(module, name) for module, names in SCENARIOS.items() for name in names]
pytestmark = needs_clients


@pytest.fixture(scope="module")
def python() -> Path:
    return clients_python()


@pytest.fixture(scope="module")
def server(python: Path, structured_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve(structured_dir, tmp_path_factory.mktemp("clients") / "serve.log", "--slots", "2", "--api-key", KEY,
               "--served-model-name", NAME) as s:
        yield s


class Outcomes:
    """Each client module's scenarios, run in one process the first time one of them is asked for."""

    def __init__(self, python: Path, server: Served, home: Path) -> None:
        self.python, self.server, self.home = python, server, home
        self.seen: dict[str, dict[str, Any]] = {}

    def of(self, module: str, name: str) -> dict[str, Any]:
        if name not in self.seen:
            self.seen.update(run_scenarios(self.python, module, SCENARIOS[module], self.server.url, NAME, KEY,
                                           self.home))
        return self.seen[name]


@pytest.fixture(scope="module")
def outcomes(python: Path, server: Served, tmp_path_factory: pytest.TempPathFactory) -> Outcomes:
    return Outcomes(python, server, tmp_path_factory.mktemp("clients_home"))


@pytest.mark.parametrize(("module", "name"), CASES, ids=[name for _, name in CASES])
def test_client_scenario(outcomes: Outcomes, server: Served, module: str, name: str) -> None:
    """The scenario ran without an error and its own checks of every reply held."""
    out = outcomes.of(module, name)
    assert out["ok"], f"{module} {name} failed:\n{out['error']}\nserver log tail:\n{tail(server.log)}"


def tail(log: Path, lines: int = 20) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else "(no log)"
