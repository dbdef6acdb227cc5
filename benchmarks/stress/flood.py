"""A flood against `gptport serve`: does overload turn into fast 429s while admitted requests keep their
latency, and how soon is the server itself again once the flood stops?

1. unloaded: sequential short streamed completions (a new connection each): TTFT p50 / p99.
2. flood: 4x (slots + max-queue) clients for 60 s, each looping the same short streamed completion;
   twice (--retry-after): retrying a 429 at once (a flood, not a polite client), then waiting the
   Retry-After seconds as told. Every answer is counted: 200, 429 with Retry-After; any other status,
   a 429 without Retry-After, a broken stream or a connection error is a failure. The flood clients
   run in a child process (--client-nice lowers its priority: on one machine the load generator
   competes with the server for the cores, which clients on other machines would not); beside them,
   in this process at normal priority, --probes clients send the same request, retrying a 429 after
   20 ms: the instrument for what an admitted request waits. Goal: the admitted requests' TTFT p99
   (the probes') within 3x the unloaded p99, which takes a short queue (--max-queue): a deep one
   makes admitted requests wait for the requests ahead of them. The flood clients' own TTFTs, which
   include their own wait for a core, are reported beside it.
3. recovery: from the moment the flood stops, sequential probes until three in a row answer within the
   unloaded TTFT p99 (goal: within 5 s).
4. health: /metrics busy slots and queue depth, the server's RSS before and after.
5. idle sockets (benchmarks.stress.idle): TTFT without and with idle, keep-alive and slowloris sockets open.

Uses the serving benchmarks' random weights of the preset (or --url, a running server: then pass its
--slots and --max-queue). One round: the probe before and after it says how busy the host was.

    python -m benchmarks.stress.flood [--preset small] [--slots 16 --max-queue 0] [--seconds 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.harness import cli, results
from benchmarks.harness.models import ROOT, WORK, serve_model
from benchmarks.harness.run import Run
from benchmarks.harness.servers import gptport_serve, served
from benchmarks.stress.idle import body, idle_phase, idle_rows, ms, quantile, sequential, stream_once

PER_CLIENT = 100_000  # requests a flood client sends at most (it stops at the deadline first)
STREAK = 3  # probes in a row within the unloaded p99 that count as recovered


PROBE_RETRY = 0.02  # s a probe waits after a 429 (it measures; it is not the load)
CHILD_START = 2.0  # s from launching the flood's child process to the flood's start (its imports)


async def clients_until(url: str, payload: dict[str, Any], clients: int, start: float, stop: float, honor: bool,
                        timeout: float, retry: float | None = None) -> dict[str, Any]:
    """`clients` looping the request from the monotonic time `start` until `stop`: the answers counted, the
    admitted TTFTs. After a 429 a client retries at once, after Retry-After (`honor`), or after `retry` s."""
    import aiohttp

    await asyncio.sleep(max(0.0, start - time.monotonic()))
    counts: Counter[str] = Counter()
    admitted: list[float] = []
    refused: list[float] = []
    samples: list[str] = []

    def failed(what: str) -> None:
        counts[what] += 1
        if len(samples) < 10:
            samples.append(what)

    async def client(session: Any) -> None:
        for _ in range(PER_CLIENT):
            if time.monotonic() >= stop:
                return
            r = await stream_once(session, url, payload, timeout)
            if r.status == 200 and r.error is None and r.ttft is not None:
                counts["200"] += 1
                admitted.append(r.ttft)
            elif r.status == 429 and r.error is None and r.retry_after:
                counts["429"] += 1
                refused.append(r.seconds)
                wait = float(r.retry_after) if honor else retry
                if wait:
                    await asyncio.sleep(max(0.0, min(wait, stop - time.monotonic())))
            else:
                failed(f"HTTP {r.status}: {r.error}" if r.status else f"no answer: {r.error}")
                await asyncio.sleep(0.05)  # no tight loop on a server that does not answer

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        started = time.monotonic()
        await asyncio.gather(*(client(session) for _ in range(clients)))
        drained = time.monotonic() - stop
    ok, refusals = counts.pop("200", 0), counts.pop("429", 0)
    return {"clients": clients, "seconds": round(stop - started, 2), "requests": ok + refusals + sum(counts.values()),
            "ok": ok, "refused_429": refusals, "failures": dict(counts), "failure_samples": samples,
            "admitted_ttft": ms(admitted), "refusal_latency": ms(refused),
            "requests_per_s": round((ok + refusals) / max(stop - started, 1e-9), 1),
            "last_requests_ended_s": round(drained, 3)}


async def probe_and_recover(url: str, payload: dict[str, Any], probes: int, start: float, stop: float,
                            timeout: float, recovery_limit: float, threshold: float
                            ) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """The probes during the flood, then the recovery probes from the moment it stops."""
    recovery = asyncio.create_task(recover(url, payload, stop, recovery_limit, threshold))
    probed = await clients_until(url, payload, probes, start, stop, False, timeout, PROBE_RETRY) if probes else None
    return probed, await recovery


def flood_child(spec: str) -> None:
    """The flood's clients, in a process of their own (`--flood-child`): lower their priority, run them,
    print their result as JSON."""
    a = json.loads(spec)
    if a["nice"]:
        os.nice(a["nice"])
    result = asyncio.run(clients_until(a["url"], a["payload"], a["clients"], a["start"], a["stop"], a["honor"],
                                       a["timeout"]))
    print(json.dumps(result))


async def recover(url: str, payload: dict[str, Any], since: float, limit: float, threshold: float) -> dict[str, Any]:
    """Sequential probes from `since` (the flood's end) until STREAK in a row have a TTFT within `threshold`;
    the seconds from `since` to the first of those (None when not within `limit`)."""
    await asyncio.sleep(max(0.0, since - time.monotonic()))
    probes: list[tuple[float, float | None]] = []
    streak_start: float | None = None
    streak = 0
    while time.monotonic() < since + limit:
        t = time.monotonic() - since
        ttfts, _ = await sequential(url, payload, 1, timeout=max(1.0, since + limit - time.monotonic()))
        probes.append((round(t, 3), round(ttfts[0] * 1000, 2) if ttfts else None))
        if ttfts and ttfts[0] <= threshold:
            streak_start = t if streak == 0 else streak_start
            streak += 1
            if streak == STREAK:
                return {"seconds": round(streak_start or 0.0, 3), "threshold_ms": round(threshold * 1000, 2),
                        "probes": probes}
        else:
            streak = 0
        await asyncio.sleep(0.02)
    return {"seconds": None, "threshold_ms": round(threshold * 1000, 2), "probes": probes}


def scrape(url: str) -> str:
    """/metrics' text."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return r.read().decode()


def sample(text: str, name: str) -> float | None:
    """An unlabelled sample's value."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def ttft_buckets(text: str) -> dict[float, float]:
    """The server's TTFT histogram (from a choice's arrival to its first token): upper bound -> count."""
    out = {}
    for line in text.splitlines():
        if line.startswith("gptport_time_to_first_token_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def server_p99_ms(before: dict[float, float], after: dict[float, float]) -> float | None:
    """The upper bound of the bucket that holds the p99 of the TTFTs the server saw between two scrapes."""
    delta = {le: after[le] - before.get(le, 0.0) for le in sorted(after)}
    total = delta.get(float("inf"), 0.0)
    if not total:
        return None
    le = next(le for le, n in delta.items() if n >= 0.99 * total)
    return None if le == float("inf") else le * 1000


def settle(url: str, within: float = 10.0) -> dict[str, Any]:
    """Poll /metrics until no slot is busy and nothing waits (at most `within` s): what it said, how soon."""
    t0 = time.monotonic()
    while True:
        text = scrape(url)
        busy, queue = sample(text, "gptport_slots_busy"), sample(text, "gptport_queue_depth")
        if (busy == 0 and queue == 0) or time.monotonic() - t0 > within:
            return {"slots_busy": busy, "queue_depth": queue, "after_s": round(time.monotonic() - t0, 3)}
        time.sleep(0.05)


def rss_mib(pid: int | None) -> float | None:
    """A process's resident memory (Linux /proc), or None."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except (OSError, ValueError):
        pass
    return None


def one_flood(url: str, pid: int | None, payload: dict[str, Any], mode: str, p99: float, args: argparse.Namespace
              ) -> dict[str, Any]:
    """A flood in `mode` (ignore | honor Retry-After), its recovery, the server's state after it, the goals."""
    clients = args.factor * (args.slots + args.max_queue)
    print(f"flood: {clients} clients (nice {args.client_nice}) and {args.probes} probes for {args.seconds:g} s, "
          f"Retry-After: {mode}", file=sys.stderr)
    before = ttft_buckets(scrape(url))
    start = time.monotonic() + CHILD_START
    stop = start + args.seconds
    spec = {"url": url, "payload": payload, "clients": clients, "start": start, "stop": stop, "honor": mode == "honor",
            "timeout": args.timeout, "nice": args.client_nice}
    child = subprocess.Popen([sys.executable, "-m", "benchmarks.stress.flood", "--flood-child", json.dumps(spec)],
                             stdout=subprocess.PIPE, cwd=ROOT)
    try:
        probed, recovered = asyncio.run(probe_and_recover(url, payload, args.probes, start, stop, args.timeout,
                                                          args.recovery_limit, p99))
        out, _ = child.communicate(timeout=args.timeout + 60)
    finally:
        if child.poll() is None:
            child.kill()
    if child.returncode:
        raise SystemExit(f"the flood's client process failed (exit {child.returncode})")
    flooded = json.loads(out)
    flooded["server_ttft_p99_ms_at_most"] = server_p99_ms(before, ttft_buckets(scrape(url)))
    flooded["probes"] = probed
    after = settle(url)
    after["rss_mib"] = rss_mib(pid)
    admitted = (probed or flooded)["admitted_ttft"]["p99_ms"]
    ratio = round(admitted / (p99 * 1000), 2) if admitted and p99 else None
    goals = {"only_200_and_429": not flooded["failures"] and not (probed or {}).get("failures"),
             "admitted_ttft_p99_within_3x": ratio is not None and ratio <= 3.0,
             "recovered_within_5s": recovered["seconds"] is not None and recovered["seconds"] <= 5.0,
             "slots_idle_after": after["slots_busy"] == 0 and after["queue_depth"] == 0}
    return {"retry_after": mode, **flooded, "admitted_p99_over_unloaded_p99": ratio, "recovery": recovered,
            "after": after, "goals": goals}


def measure(url: str, pid: int | None, args: argparse.Namespace) -> dict[str, Any]:
    """Every phase against the server at `url` (its process `pid`, for RSS, when this script started it)."""
    payload = body(args.max_tokens)
    asyncio.run(sequential(url, payload, 5))  # warm up
    rss_before = rss_mib(pid)
    base, results = asyncio.run(sequential(url, payload, args.unloaded, gap=0.02))
    if len(base) < len(results):
        raise SystemExit(f"{len(results) - len(base)} unloaded requests failed: {results}")
    p99 = quantile(base, 0.99) or 0.0
    print(f"unloaded TTFT p99 {p99 * 1000:.1f} ms", file=sys.stderr)
    floods = [one_flood(url, pid, payload, mode, p99, args) for mode in args.retry_after.split(",")]
    counts = {"idle": args.idle, "keepalive": args.keepalive, "slow": args.slow}
    idle = idle_phase(url, payload, counts, args.idle_seconds) if sum(counts.values()) else None
    end = settle(url)
    end.update(rss_mib_before=rss_before, rss_mib_after=rss_mib(pid))
    return {"unloaded_ttft": ms(base), "floods": floods, "idle_sockets": idle, "health_at_end": end}


def print_table(result: dict[str, Any]) -> None:
    r, s, m = result["results"], result["settings"], result["machine"]
    t = Table(title=f"flood: {s['preset']} on {m['cpu']} ({m['cores']} cores), {s['slots']} slots, "
              f"--max-queue {s['max_queue']}, {s['clients']} clients x {s['seconds']:g} s, "
              f"{s['max_tokens']} tokens a request")
    for name, justify in (("measure", "left"), ("value", "right"), ("goal", "left")):
        t.add_column(name, justify=justify)  # type: ignore[arg-type]
    u = r["unloaded_ttft"]
    t.add_row("unloaded TTFT p50 / p99", f"{u['p50_ms']} / {u['p99_ms']} ms", "")
    for f in r["floods"]:
        g, rec, a, q = f["goals"], f["recovery"], f["admitted_ttft"], f["refusal_latency"]
        t.add_row(f"[b]flood, Retry-After {'honored' if f['retry_after'] == 'honor' else 'ignored'}[/b]", "", "")
        t.add_row("  answers 200 / 429", f"{f['ok']} / {f['refused_429']}", f"{f['requests_per_s']} answers/s")
        t.add_row("  failures", str(sum(f["failures"].values())),
                  "0: " + ("met" if g["only_200_and_429"] else f"MISSED {f['failures']}"))
        goal = (f"p99 <= 3x unloaded p99: {f['admitted_p99_over_unloaded_p99']}x "
                + ("met" if g["admitted_ttft_p99_within_3x"] else "MISSED"))
        p = f.get("probes")
        if p:
            pa = p["admitted_ttft"]
            t.add_row(f"  probes: 200 / 429 ({p['clients']} at normal priority)", f"{p['ok']} / {p['refused_429']}", "")
            t.add_row("  admitted TTFT p50 / p99 (probes)", f"{pa['p50_ms']} / {pa['p99_ms']} ms", goal)
        t.add_row(f"  admitted TTFT p50 / p99 (flood clients, nice {s['client_nice']})",
                  f"{a['p50_ms']} / {a['p99_ms']} ms", "" if p else goal)
        t.add_row("  admitted TTFT p99 (server histogram)", f"<= {f['server_ttft_p99_ms_at_most']} ms", "")
        t.add_row("  429 latency p50 / p99", f"{q['p50_ms']} / {q['p99_ms']} ms", "")
        back = "not within the limit" if rec["seconds"] is None else f"{rec['seconds']} s"
        t.add_row("  recovery to unloaded TTFT", back, "<= 5 s: " + ("met" if g["recovered_within_5s"] else "MISSED"))
        t.add_row("  after: busy slots / queue", f"{f['after']['slots_busy']:g} / {f['after']['queue_depth']:g}",
                  "0 / 0: " + ("met" if g["slots_idle_after"] else "MISSED"))
    idle = r["idle_sockets"]
    if idle:
        w = idle["with"]
        t.add_row("[b]idle sockets[/b]", "", "")
        t.add_row("  TTFT p50 / p99 without", f"{idle['without']['ttft']['p50_ms']} / "
                  f"{idle['without']['ttft']['p99_ms']} ms", "")
        t.add_row("  ... with " + ", ".join(f"{n} {k}" for k, n in w["sockets"].items()),
                  f"{w['ttft']['p50_ms']} / {w['ttft']['p99_ms']} ms", f"{w['failed']} of {w['requests']} failed")
        for kind, tally in w["what_the_server_did"].items():
            t.add_row(f"  {kind} sockets", f"{tally['connects']} opened", f"closed {tally['closed']}, "
                      f"answered {tally['statuses']}, errors {tally['errors']}")
    h = r["health_at_end"]
    t.add_row("at the end: busy slots / queue", f"{h['slots_busy']:g} / {h['queue_depth']:g}", "")
    t.add_row("server RSS at start / end", f"{h['rss_mib_before']} / {h['rss_mib_after']} MiB", "")
    probe = result["probe"]
    t.add_row("machine load average (1 min) at start / end",
              f"{probe['loadavg_1m_start']:.1f} / {probe['loadavg_1m_end']:.1f}", f"{m['cores']} cores")
    Console(width=None if sys.stdout.isatty() else 160).print(t)


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--url", help="a running server (else one is started on the preset's random weights)")
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--max-queue", type=int, default=0, help="the server's --max-queue (0: admit only into a free "
                    "slot, the short queue that keeps admitted requests' TTFT)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--factor", type=int, default=4, help="clients per slot + queue place")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--max-tokens", type=int, default=16, help="each completion's length (short)")
    ap.add_argument("--unloaded", type=int, default=40, help="sequential requests for the unloaded TTFT")
    ap.add_argument("--retry-after", default="ignore,honor", help="floods to run: ignore (a 429 is retried at once) "
                    "and/or honor (refused clients wait Retry-After seconds)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds one request may take")
    ap.add_argument("--recovery-limit", type=float, default=30.0)
    ap.add_argument("--idle", type=int, default=500, help="idle sockets in the idle phase (0 with the others: none)")
    ap.add_argument("--keepalive", type=int, default=100)
    ap.add_argument("--slow", type=int, default=50)
    ap.add_argument("--idle-seconds", type=float, default=40.0)
    ap.add_argument("--serve-args", default="", help="more `gptport serve` options, space-separated")
    ap.add_argument("--client-nice", type=int, default=19, help="lower the flood clients' CPU priority by N (19: the "
                    "load yields the cores to the server, as clients on other machines would; 0: equal priority)")
    ap.add_argument("--probes", type=int, default=2, help="clients at normal priority beside the flood whose TTFTs "
                    "measure the goal (0: the flood clients' own)")
    ap.add_argument("--flood-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.flood_child:
        flood_child(args.flood_child)
        return
    run = Run()
    with run.round() as rnd:
        if args.url:
            url, server = args.url.rstrip("/"), None
            rnd.data.update(measure(url, None, args))
        else:
            server = gptport_serve(serve_model(args.preset), "--slots", str(args.slots), "--max-queue",
                                   str(args.max_queue), "--threads", str(args.threads), *args.serve_args.split())
            rnd.data.update(served(server, WORK / "serve" / f"flood-{args.preset}.log",
                                   lambda u, proc: measure(u, proc.pid, args)))
    settings = cli.settings(args, clients=args.factor * (args.slots + args.max_queue),
                            serve_options=server[7:] if server else None)
    doc = results.document(results.benchmark_name(__spec__), run, table_rows(rnd.data), settings, label=args.label)
    print_table({"results": rnd.data, "settings": settings, "machine": doc["machine"], "probe": rnd.probe})
    results.write(doc, args.results)


def table_rows(r: dict[str, Any]) -> list[dict[str, Any]]:
    """The unloaded TTFT, each flood's counts, latencies, recovery and goals, the idle sockets' table."""
    rows: list[dict[str, Any]] = [{"phase": "unloaded", "ttft_p50_ms": r["unloaded_ttft"]["p50_ms"],
                                   "ttft_p99_ms": r["unloaded_ttft"]["p99_ms"]}]
    for f in r["floods"]:
        admitted = (f.get("probes") or f)["admitted_ttft"]
        rows.append({"phase": f"flood, Retry-After {f['retry_after']}", "ok": f["ok"], "refused_429": f["refused_429"],
                     "failures": sum(f["failures"].values()), "answers_per_s": f["requests_per_s"],
                     "ttft_p50_ms": admitted["p50_ms"], "ttft_p99_ms": admitted["p99_ms"],
                     "p99_over_unloaded": f["admitted_p99_over_unloaded_p99"],
                     "refusal_p99_ms": f["refusal_latency"]["p99_ms"], "recovery_s": f["recovery"]["seconds"],
                     "goals_met": all(f["goals"].values())})
    if r.get("idle_sockets"):
        rows += [{"table": "idle sockets", **row} for row in idle_rows(r["idle_sockets"])]
    return rows


if __name__ == "__main__":
    main()
