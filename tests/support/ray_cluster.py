"""A local Ray cluster that `gptport serve --ray` started, as the Ray tests see it: its process and address, the
environment a driver of its own needs, and requests spread over its replicas through the proxy."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.serving import Served

HAVE_RAY = importlib.util.find_spec("ray") is not None
needs_ray = pytest.mark.skipif(not HAVE_RAY, reason="Ray Serve is not installed: pip install -e '.[ray]'")


@dataclass
class Cluster:
    """The cluster's `gptport serve --ray` process, its API, its GCS address and environment; what tests noted."""

    proc: subprocess.Popen[bytes]
    served: Served
    gcs: str
    env: dict[str, str]
    results: dict[str, Any] = field(default_factory=dict)


def ray_env(home: Path, tmp: str) -> dict[str, str]:
    """Ray's token (under HOME) and session files (RAY_TMPDIR) in temporary dirs; a node on the loopback address,
    as `gptport serve --ray` sets it for the cluster it starts (the killer, a driver, needs it too)."""
    return {**os.environ, "HOME": str(home), "RAY_TMPDIR": tmp, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            "RAY_USAGE_STATS_ENABLED": "0"}


def spread(url: str, path: str, done: Any, seconds: float = 60.0) -> list[httpx.Response]:
    """GET `path` through the proxy eight requests at a time until `done(responses so far)` holds, for at most
    `seconds`: Ray's router may send one request after another to the same idle replica for a while (it picks by
    the queue lengths it last saw, which it keeps for some seconds), and spreads requests in flight together."""
    from concurrent.futures import ThreadPoolExecutor

    seen: list[httpx.Response] = []
    deadline = time.monotonic() + seconds
    with ThreadPoolExecutor(8) as pool:
        while time.monotonic() < deadline:
            seen += pool.map(lambda _: httpx.get(url + path, timeout=10), range(8))
            if done(seen):
                return seen
            time.sleep(0.1)
    return seen


def replica_metrics(url: str, name: str) -> str:
    """/metrics of the replica `name`, scraped through the proxy until that replica answers."""
    answers = spread(url, "/metrics", lambda rs: any(r.headers["x-gptport-replica"] == name for r in rs))
    for r in answers:
        if r.headers["x-gptport-replica"] == name:
            return r.text
    raise AssertionError(f"the replica {name} never answered /metrics in 60 s ({len(answers)} scrapes)")


def replica_names(url: str, k: int = 2) -> set[str]:
    """The names of the replicas that answer /health, once `k` have (at most 60 s)."""
    names = lambda rs: {r.headers["x-gptport-replica"] for r in rs}  # noqa: E731
    answers = spread(url, "/health", lambda rs: len(names(rs)) >= k)
    if len(names(answers)) < k:
        raise AssertionError(f"only {names(answers)} answered /health in 60 s ({len(answers)} requests)")
    return names(answers)


async def stream(client: httpx.AsyncClient, url: str, body: dict[str, Any],
                 started: asyncio.Future[str] | None = None) -> tuple[int, str | None, list[Any]]:
    """(status, x-gptport-replica, the parsed data: payloads) of one streamed completion; `started` gets the
    replica's name at its first chunk."""
    out: list[Any] = []
    async with client.stream("POST", url + "/v1/completions", json={**body, "stream": True}) as r:
        if r.status_code != 200:
            if started is not None and not started.done():
                started.set_result("")  # it never started: the caller sees no replica
            return r.status_code, r.headers.get("x-gptport-replica"), [json.loads(await r.aread())]
        async for line in r.aiter_lines():
            if started is not None and not started.done():
                started.set_result(r.headers.get("x-gptport-replica", ""))
            if line.startswith("data: "):
                data = line[len("data: "):]
                out.append(data if data == "[DONE]" else json.loads(data))
    return r.status_code, r.headers.get("x-gptport-replica"), out


def completed(events: list[Any]) -> bool:
    """A stream that ended normally: [DONE] last, a finish_reason, no error event."""
    return bool(events) and events[-1] == "[DONE]" and not any("error" in e for e in events[:-1]) and any(
        c.get("finish_reason") for e in events[:-1] for c in e["choices"])
