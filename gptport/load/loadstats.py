"""bench-serve's numbers: what one request gave (`RequestRecord`) and the metrics of a level, under
vLLM's names, as pure functions of the records. No torch here."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_ERRORS_KEPT = 5
METRICS = ("ttft", "tpot", "itl", "e2el")


@dataclass
class RequestRecord:
    """What one request gave: perf_counter times (s), the server's token counts, or its error."""

    start: float
    end: float = 0.0
    text_times: list[float] = field(default_factory=list)  # arrival of each chunk that carried text
    prompt_tokens: int | None = None  # from usage; None when the server sent none
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens, where the server sends it
    error: str | None = None


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile with linear interpolation between closest ranks (numpy's default)."""
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def summarize(values_s: Sequence[float], name: str) -> dict[str, float | None]:
    """mean/median/std (population)/p99 of `values_s` (seconds) as `mean_{name}_ms` etc.; None when empty."""
    keys = (f"mean_{name}_ms", f"median_{name}_ms", f"std_{name}_ms", f"p99_{name}_ms")
    if not values_s:
        return dict.fromkeys(keys)
    ms = [v * 1000 for v in values_s]
    stats = (statistics.fmean(ms), statistics.median(ms), statistics.pstdev(ms), percentile(ms, 99))
    return {k: round(v, 4) for k, v in zip(keys, stats, strict=True)}


def output_tokens(r: RequestRecord) -> int:
    """The server's completion_tokens, else the number of text chunks."""
    return r.completion_tokens if r.completion_tokens is not None else len(r.text_times)


def request_latencies(r: RequestRecord) -> dict[str, Any]:
    """One completed request's ttft, tpot (None unless > 1 output token), itl gaps and e2el, in seconds."""
    ttft = r.text_times[0] - r.start if r.text_times else None
    e2el = r.end - r.start
    n = output_tokens(r)
    tpot = (e2el - ttft) / (n - 1) if ttft is not None and n > 1 else None
    itl = [b - a for a, b in zip(r.text_times, r.text_times[1:], strict=False)]
    return {"ttft": ttft, "tpot": tpot, "itl": itl, "e2el": e2el}


def level_metrics(records: Sequence[RequestRecord], duration_s: float, prompt_len: int) -> dict[str, Any]:
    """vLLM-named metrics of one level: counts, throughputs and the latency statistics of completed requests.
    `prompt_len` stands in for the prompt tokens of a request whose server sent no usage."""
    done = [r for r in records if r.error is None]
    failed = [r for r in records if r.error is not None]
    lat = [request_latencies(r) for r in done]
    n_in = sum(r.prompt_tokens if r.prompt_tokens is not None else prompt_len for r in done)
    n_out = sum(output_tokens(r) for r in done)
    seen = [r.prompt_tokens for r in done if r.prompt_tokens is not None]
    per = duration_s if duration_s > 0 else math.inf
    out: dict[str, Any] = {
        "completed": len(done), "failed": len(failed), "duration_s": round(duration_s, 4),
        "total_input_tokens": n_in, "total_output_tokens": n_out,
        "mean_prompt_tokens": round(statistics.fmean(seen), 2) if seen else None,
        "requests_without_usage": sum(1 for r in done if r.completion_tokens is None),
        "cached_prompt_tokens": (sum(r.cached_tokens for r in done if r.cached_tokens is not None)
                                 if any(r.cached_tokens is not None for r in done) else None),
        "request_throughput": round(len(done) / per, 4), "output_throughput": round(n_out / per, 4),
        "total_token_throughput": round((n_in + n_out) / per, 4),
    }
    for name in METRICS:
        if name == "itl":
            values = [g for x in lat for g in x["itl"]]
        else:
            values = [x[name] for x in lat if x[name] is not None]
        out.update(summarize(values, name))
    out["errors"] = distinct_errors(failed)
    return out


def distinct_errors(failed: Sequence[RequestRecord]) -> list[dict[str, Any]]:
    """The first MAX_ERRORS_KEPT distinct error messages, each with how many requests gave it."""
    counts: dict[str, int] = {}
    for r in failed:
        assert r.error is not None
        if r.error in counts or len(counts) < MAX_ERRORS_KEPT:
            counts[r.error] = counts.get(r.error, 0) + 1
    return [{"message": m, "count": c} for m, c in counts.items()]


# ---- the client -------------------------------------------------------------------------------------
