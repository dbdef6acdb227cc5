"""The load the serving benchmarks send (`gptport bench-serve`), what they read back from a server's
/metrics, and the medians of its rows over rounds."""

from __future__ import annotations

import json
import statistics
import tempfile
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness.models import cli

# new tokens per request: fewer for gpt2-124m, whose steps are ~8x slower
MAX_TOKENS = {"tiny": 128, "small": 128, "gpt2-124m": 64}
# a chat load's shared system prompt, ~60% of the context at small and gpt2-124m (tiny's 1024-token vocabulary
# spends more tokens on the same words)
SHARED_PREFIX = {"tiny": 60, "small": 150, "gpt2-124m": 600}
KEYS = ("completed", "failed", "request_throughput", "output_throughput", "total_token_throughput",
        "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "median_itl_ms", "p99_itl_ms", "median_e2el_ms")
# the structured-output benchmarks' JSON schema: strings long enough that a constrained request runs about
# as long as a free one (~130 tokens at small's vocabulary)
SCHEMA = {"type": "object", "additionalProperties": False,
          "properties": {"name": {"type": "string", "pattern": "^[a-z ]{48,96}$"},
                         "city": {"type": "string", "pattern": "^[a-z ]{48,96}$"},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "score": {"type": "integer", "minimum": -1000, "maximum": 1000},
                         "member": {"type": "boolean"},
                         "tags": {"type": "array", "items": {"type": "string", "pattern": "^[a-z ]{16,32}$"},
                                  "minItems": 3, "maxItems": 4}},
          "required": ["name", "city", "age", "score", "member", "tags"]}


def bench_serve(url: str, *options: str) -> list[dict[str, Any]]:
    """`gptport bench-serve URL OPTIONS`'s result rows (one per concurrency level)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "load.json"
        cli("bench-serve", url, *options, "--json", str(path))
        return list(json.loads(path.read_text())["results"])


def median_of(rows: Sequence[dict[str, Any]], keys: Sequence[str] = KEYS) -> dict[str, Any]:
    """Each key's median over the `rows` that have it (None where none has)."""
    out: dict[str, Any] = {}
    for key in keys:
        values = [r[key] for r in rows if r.get(key) is not None]
        out[key] = statistics.median(values) if values else None
    return out


def metrics(url: str) -> dict[str, float]:
    """Every sample of a server's /metrics now, by its name with labels (`name{label="value"}`)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def phases(url: str) -> dict[str, float]:
    """gptport serve's scheduler seconds per phase so far (prefill, decode, mask, sample, emit)."""
    prefix = 'gptport_scheduler_seconds_total{phase="'
    return {k[len(prefix):-2]: v for k, v in metrics(url).items() if k.startswith(prefix)}


def phases_or_none(url: str) -> dict[str, float]:
    """phases(), or {} from a server without them (llama-server)."""
    try:
        return phases(url)
    except OSError:
        return {}
