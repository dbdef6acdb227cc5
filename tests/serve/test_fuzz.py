"""Fuzzing a real `gptport serve` against its own OpenAPI document (GET /openapi.json) as a hostile client would:
schemathesis's command line with every phase it has (examples, coverage, fuzzing, stateful) over every route,
positive and negative data, bounded in examples per operation and in time (benchmarks/harness/api_fuzz.py;
benchmarks/stress/fuzz_api.py runs it whole). No answer is a 5xx; each has a documented status, content type,
headers and body; a request the document refuses is refused; afterwards a normal request succeeds and no slot is
left busy. The raw bodies the JSON parser sees are fuzzed in tests/serve/test_fuzz_body.py, the request path below
HTTP in tests/serve/api/test_translators_fuzz.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.harness.api_fuzz import PHASES, fuzz
from tests.support.serving import Served, serve, wait_idle

SLOTS = 2
MAX_EXAMPLES = 20  # per operation and phase
BUDGET_S = 75.0  # the whole run: fuzzing and stateful testing repeat until it is spent


@pytest.fixture(scope="module")
def server(trained_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve(trained_dir, tmp_path_factory.mktemp("fuzz") / "serve.log", "--slots", str(SLOTS)) as s:
        yield s


def test_schemathesis_every_phase(server: Served) -> None:
    found = fuzz(server.url, MAX_EXAMPLES, BUDGET_S)
    print(found.summary())
    assert found.report, found.output  # it ran and wrote its report
    assert found.server_errors == 0 and not found.failures, found.output
    assert found.code == 0, found.output
    assert found.phases == {name: "success" for name in PHASES}, found.summary()
    operations = found.report["operations"]
    assert operations["tested"] == operations["selected"] >= 11, operations  # every route of the document
    assert found.cases >= 500, found.summary()  # fewer: the budget ran out early (a slow machine or server)
    assert server.post("/v1/completions", {"prompt": "ka", "max_tokens": 2})[0] == 200
    wait_idle(server, 10)
    assert server.proc.poll() is None
