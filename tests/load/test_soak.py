"""A one-minute soak of `gptport serve` (benchmarks/harness/soak.py, the loop benchmarks/stress/soak.py runs for 20
minutes): the whole request mix from 4 clients against a real server, with the same checks. And the
checks themselves on made-up curves, so that a leak is seen to fail them."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.harness import soak
from tests.support.serving import Served, metrics, sample, serve

MIN_REQUESTS = 1000  # the mix gets ~100 answers a second here on 2 cores; the soak goes on until it has these


@pytest.fixture(scope="module")
def server(trained_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """4 slots and a queue of 16: 4 clients x n=3 choices always fit, so no request is refused with 429."""
    with serve(trained_dir, tmp_path_factory.mktemp("soak") / "serve.log", "--slots", "4", "--max-queue", "16") as s:
        yield s


@pytest.mark.slow
def test_one_minute_soak(server: Served) -> None:
    """The 20-minute soak's checks: RSS grows < 5% after warm-up (a minute catches only fast leaks, ~5 MiB a
    minute in this ~100 MiB process; its own noise is ~0.2%), fds and threads back at the baseline, no busy
    slot, every status expected, at least MIN_REQUESTS requests done with every kind sent, and no request a
    server error. Warm-up is the first 20% here (the allocator's arenas grow during the first seconds)."""
    cfg = soak.SoakConfig(server.url, server.proc.pid, minutes=1.0, requests=MIN_REQUESTS, concurrency=4,
                          max_minutes=3.0, warmup=0.2, interval_s=1.0, rss_growth=0.05)
    result = soak.run(cfg)
    failed = [v for v in result["verdicts"] if not v["passed"]]
    assert not failed, (failed, result["counts"], result["unexpected_examples"])
    assert result["unexpected"] == 0 and result["requests"] >= MIN_REQUESTS
    ok = sum(by.get("200", 0) for by in result["counts"].values())
    assert ok >= MIN_REQUESTS // 2, result["counts"]  # most of the mix is served, not refused
    assert [s for s in result["samples"] if s["phase"] == "load"], "no sample was taken under load"
    assert not sample(metrics(server), "gptport_requests_total", status="500")
    assert server.proc.poll() is None


def _result(**final: Any) -> dict[str, Any]:
    """A soak's results that pass every check, with the final sample's fields replaced by `final`."""
    idle = {"t": 0.0, "rss_mib": 100.0, "fds": 17, "threads": 7, "busy": 0.0, "queue": 0.0, "done": 0, "rps": 0.0}
    load = [{**idle, "t": 10.0 + i, "phase": "load", "rss_mib": 104.0 + i * 0.01, "busy": 4.0} for i in range(50)]
    return {"baseline": {**idle, "phase": "pause"}, "final": {**idle, "phase": "settle", **final}, "samples": load,
            "kinds": {"completion": {}, "bad_json": {}}, "requests": 1000, "unexpected": 0, "alive": True,
            "counts": {"completion": {"200": 900}, "bad_json": {"400": 100}}}


def _failed(result: dict[str, Any]) -> list[str]:
    return [v["check"] for v in soak.verdicts(result, soak.SoakConfig("http://x", 1, requests=1000)) if not v["passed"]]


def test_verdicts_fail_on_leaks() -> None:
    """Each kind of trouble fails its own check, and only that one."""
    assert _failed(_result()) == []
    assert _failed(_result(fds=18)) == ["open fds back to baseline"]
    assert _failed(_result(threads=8)) == ["threads back to baseline"]
    assert _failed(_result(busy=1.0)) == ["no busy slot or queued choice at the end"]
    assert _failed(_result(queue=2.0)) == ["no busy slot or queued choice at the end"]
    assert _failed(_result(rss_mib=106.0)) == ["RSS growth after warm-up (idle to idle)"]
    growing = _result()
    for i, s in enumerate(growing["samples"]):  # a leak under load that idle hides: 104 -> 114 MiB
        s["rss_mib"] = 104.0 + i * 0.2
    assert _failed(growing) == ["RSS growth under load (first to last tenth)"]
    bad = _result()
    bad["unexpected"] = 1
    assert _failed(bad) == ["unexpected statuses"]
    few = copy.deepcopy(_result())
    few["requests"], few["counts"] = 999, {"completion": {"200": 999}}
    assert _failed(few) == ["requests done", "every kind sent"]
    dead = _result()
    dead["alive"] = False
    assert _failed(dead) == ["server alive"]
