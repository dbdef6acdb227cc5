"""A soak of a running `gptport serve`: the request mix of `soak_mix` from `concurrency` clients for a while,
the server process sampled all along, and the verdicts. `benchmarks/stress/soak.py` runs it for 20
minutes; tests/load/test_soak.py for one. No torch; aiohttp, and psutil (a dev dependency) for the sampling.

The run: warm-up load (the first `warmup` of the time), a pause until the server is idle (the baseline
sample), the load until both `requests` requests are done and `minutes` have passed (never past
`max_minutes` or `max_requests`), then idle again until the fds and threads are back at the baseline
(at most `settle_s` seconds; the final sample). A sample every `interval_s` seconds: the process's RSS,
open file descriptors and threads, and /metrics' busy slots and queue depth.

Verdicts: RSS grows less than `rss_growth` from the baseline to the final sample (both idle, after
warm-up), and from the first to the last tenth of the load (medians of the samples under load); fds and
threads at most the baseline's at the end; no busy slot and no queued choice at the end; no unexpected
status; at least `requests` requests done and every kind sent; the process alive.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlsplit

from benchmarks.harness.soak_mix import CHAT, Kind, Outcome, Server, default_mix, send
from gptport.errors import InputError, UsageError

MAX_EXAMPLES = 20  # unexpected outcomes kept in the results, per run


@dataclass
class SoakConfig:
    """One soak: the server (its URL and process id) and the load's bounds."""

    url: str
    pid: int
    minutes: float = 20.0
    requests: int = 10_000
    concurrency: int = 16
    max_minutes: float = 0.0  # the load's hard time limit; 0: 2 x minutes + 1
    max_requests: int = 0  # the load's hard request limit; 0: 100 x requests
    warmup: float = 0.1  # of `minutes`
    interval_s: float = 2.0
    settle_s: float = 30.0
    rss_growth: float = 0.05
    timeout_s: float = 120.0
    seed: int = 0
    api_key: str | None = None
    mix: Callable[[Server], list[Kind]] = default_mix  # the kinds of request sent, given the server

    def limits(self) -> tuple[float, int]:
        return (self.max_minutes or 2 * self.minutes + 1) * 60, self.max_requests or 100 * self.requests


def _process(pid: int, url: str) -> Any:
    """The server's process (psutil), checked to listen on the URL's port."""
    try:
        import psutil
    except ImportError:
        raise UsageError("the soak samples the server process with psutil: pip install psutil "
                         "(it is in gptport's dev extras)") from None
    try:
        proc = psutil.Process(pid)
        listing = getattr(proc, "net_connections", None) or proc.connections  # psutil < 6: connections
        ports = {c.laddr.port for c in listing("tcp") if c.status == psutil.CONN_LISTEN}
    except psutil.Error as e:
        raise InputError(f"--pid {pid}: cannot sample it ({type(e).__name__}: {e})") from None
    if urlsplit(url).port not in ports:
        raise InputError(f"--pid {pid} does not listen on {url} (its ports: {sorted(ports) or 'none'})")
    return proc


def metric(text: str, name: str) -> float | None:
    """A metric's value in Prometheus' text (summed over its label sets); None when absent."""
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(name) and line[len(name):len(name) + 1] in (" ", "{")]
    return sum(values) if values else None


class Run:
    """One soak in progress: counts, samples, and the process and /metrics it samples."""

    def __init__(self, cfg: SoakConfig, proc: Any, probe: Any) -> None:
        self.cfg, self.proc, self.probe = cfg, proc, probe
        self.t0 = time.monotonic()
        self.phase, self.sent, self.done = "start", 0, 0
        self.counts: dict[str, dict[int, int]] = {}
        self.wrong = 0  # outcomes whose status the kind does not expect, or a 200 with a wrong body
        self.examples: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.phases: list[dict[str, Any]] = [{"phase": "start", "t": 0.0}]  # when each phase began

    def enter(self, phase: str) -> None:
        self.phase = phase
        self.phases.append({"phase": phase, "t": round(self.now(), 2)})

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def metrics(self) -> str:
        async with self.probe.get(self.cfg.url + "/metrics") as r:
            if r.status != 200:
                raise InputError(f"GET {self.cfg.url}/metrics: HTTP {r.status}")
            return str(await r.text())

    async def sample(self) -> dict[str, Any]:
        """The process's RSS (MiB), fds and threads, /metrics' busy slots and queue, requests done so far."""
        import aiohttp
        import psutil

        p = self.proc
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                raise psutil.NoSuchProcess(p.pid)
            # the process first: the /metrics request's own connection is not among its fds
            s = {"t": round(self.now(), 2), "phase": self.phase, "rss_mib": round(p.memory_info().rss / 2**20, 2),
                 "fds": p.num_fds(), "threads": p.num_threads()}
            text = await self.metrics()
            s |= {"busy": metric(text, "gptport_slots_busy"), "queue": metric(text, "gptport_queue_depth"),
                  "done": self.done}
        except (psutil.Error, aiohttp.ClientError, OSError, asyncio.TimeoutError) as e:
            raise InputError(f"sampling the server (pid {p.pid}) failed: {type(e).__name__}: {e}") from None
        last = self.samples[-1] if self.samples else None
        s["rps"] = round((s["done"] - last["done"]) / max(s["t"] - last["t"], 1e-9), 2) if last else 0.0
        self.samples.append(s)
        return s

    def record(self, o: Outcome, kind: Kind) -> None:
        self.done += 1
        by_status = self.counts.setdefault(o.kind, {})
        by_status[o.status] = by_status.get(o.status, 0) + 1
        if o.status in kind.expect and o.problem is None:
            return
        self.wrong += 1
        if len(self.examples) < MAX_EXAMPLES:
            self.examples.append({"t": round(self.now(), 2), "kind": o.kind, "status": o.status, "problem": o.problem})


async def describe_server(probe: Any, url: str) -> Server:
    """The model (/v1/models), n_ctx and slots (/metrics), and words per good prompt (one probe request)."""
    async with probe.get(url + "/v1/models") as r:
        model = str((await r.json())["data"][0]["id"])
    async with probe.get(url + "/metrics") as r:
        text = await r.text()
    slots, positions = metric(text, "gptport_slots"), metric(text, "gptport_kv_cache_positions")
    if not slots or not positions:
        raise InputError(f"{url}/metrics has no gptport_slots: is this gptport serve?")
    n_ctx = int(positions // slots)
    words = 40
    body = {"model": model, "messages": [{"role": "system", "content": "the"},
                                         {"role": "user", "content": " ".join(["little"] * words)}], "max_tokens": 1}
    async with probe.post(url + CHAT, json=body) as r:
        tokens = (await r.json())["usage"]["prompt_tokens"] if r.status == 200 else n_ctx
    per_word = max(tokens / words, 1.0)  # the template's own tokens make it higher: prompts come out shorter
    return Server(url, model, n_ctx, int(slots), max(1, int(n_ctx / 4 / per_word)))


async def _load(run: Run, session: Any, server: Server, kinds: list[Kind], until: Callable[[], bool],
                phase: int) -> None:
    """`concurrency` clients, each sending kinds drawn by weight until `until()` says stop."""
    weights = [k.weight for k in kinds]

    async def client(i: int) -> None:
        rng = random.Random(run.cfg.seed * 1_000_003 + phase * 1009 + i)
        while not until():
            kind = rng.choices(kinds, weights)[0]
            run.sent += 1
            run.record(await send(session, server.url, kind, kind.body(rng), run.cfg.timeout_s), kind)

    await asyncio.gather(*(client(i) for i in range(run.cfg.concurrency)))


async def _idle(run: Run, baseline: dict[str, Any] | None, within: float) -> dict[str, Any]:
    """Samples (one a second) until the server is idle for three in a row, with its fds and threads back at
    the baseline's or, without one, unchanged; or until `within` seconds have passed. The last sample."""
    deadline, calm, last = run.now() + within, 0, None
    while True:
        await asyncio.sleep(min(1.0, run.cfg.interval_s))
        s = await run.sample()
        ref = baseline or last
        steady = ref is not None and s["fds"] <= ref["fds"] and s["threads"] <= ref["threads"]
        if baseline is None and ref is not None:
            steady = steady and s["fds"] == ref["fds"]
        calm, last = (calm + 1 if s["busy"] == 0 and s["queue"] == 0 and steady else 0), s
        if calm >= 3 or run.now() > deadline:
            return s


async def _soak(cfg: SoakConfig, say: Callable[[str], None]) -> dict[str, Any]:
    import aiohttp

    proc = _process(cfg.pid, cfg.url)
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    untimed = aiohttp.ClientTimeout(total=None)
    # a new connection per request, as bench-serve does (and every accept and close is exercised)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=cfg.concurrency, force_close=True),
                                     headers=headers, timeout=untimed) as session, \
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True), headers=headers,
                                  timeout=aiohttp.ClientTimeout(total=30)) as probe:
        server = await describe_server(probe, cfg.url)
        kinds = cfg.mix(server)
        run = Run(cfg, proc, probe)
        max_s, max_requests = cfg.limits()
        start = await _idle(run, None, cfg.settle_s)
        say(f"{server.model}: n_ctx {server.n_ctx}, {server.slots} slots, prompts of up to {server.words} words; "
            f"idle at start: RSS {start['rss_mib']:.1f} MiB, {start['fds']} fds, {start['threads']} threads")

        async def sampler() -> None:
            while True:
                await asyncio.sleep(cfg.interval_s)
                s = await run.sample()
                say(f"{s['t']:7.0f} s {s['phase']:>7}: {run.done:>6} done, {s['rps']:6.1f} req/s, RSS "
                    f"{s['rss_mib']:.1f} MiB, {s['fds']} fds, {s['threads']} threads, {s['busy']:.0f} busy")

        task = asyncio.create_task(sampler())
        try:
            run.enter("warmup")
            warm_end = run.now() + cfg.warmup * cfg.minutes * 60
            await _load(run, session, server, kinds, lambda: run.now() >= warm_end or run.sent >= max_requests, 0)
            run.enter("pause")
            baseline = await _idle(run, None, cfg.settle_s)
            run.enter("load")

            def over() -> bool:
                met = run.done >= cfg.requests and run.now() >= cfg.minutes * 60
                return met or run.now() >= max_s or run.sent >= max_requests

            await _load(run, session, server, kinds, over, 1)
            run.enter("settle")
        finally:
            task.cancel()
            failed = (await asyncio.gather(task, return_exceptions=True))[0]
        if isinstance(failed, InputError):
            raise failed
        final = await _idle(run, baseline, cfg.settle_s)
    result = {"url": cfg.url, "model": server.model, "n_ctx": server.n_ctx, "slots": server.slots,
              "config": {k: v for k, v in asdict(cfg).items() if k not in ("api_key", "mix")},
              "kinds": {k.name: {"path": k.path, "weight": k.weight, "expect": sorted(k.expect)} for k in kinds},
              "counts": {name: {str(s): n for s, n in sorted(by.items())} for name, by in sorted(run.counts.items())},
              "requests": run.done, "unexpected": run.wrong, "unexpected_examples": run.examples,
              "phases": run.phases,
              "start": start, "baseline": baseline, "final": final, "alive": proc.is_running(),
              "samples": run.samples}
    result["verdicts"] = verdicts(result, cfg)
    return result


def run(cfg: SoakConfig, say: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Soak the server; the results (curves, counts, verdicts) as a JSON-able dict."""
    if cfg.concurrency < 1 or cfg.minutes <= 0 or cfg.requests < 1 or not 0 < cfg.warmup < 1:
        raise UsageError("the soak needs concurrency >= 1, minutes > 0, requests >= 1 and 0 < warmup < 1")
    return asyncio.run(_soak(cfg, say))


def _growth(before: float, after: float) -> float:
    return (after - before) / before if before else 0.0


def verdicts(r: dict[str, Any], cfg: SoakConfig) -> list[dict[str, Any]]:
    """The soak's checks on its results: [{check, value, limit, passed}] (a pure function, for tests)."""
    base, final = r["baseline"], r["final"]
    under = [s for s in r["samples"] if s["phase"] == "load"]
    load = [s["rss_mib"] for s in under]
    tenth = max(1, len(load) // 10)
    minutes = [s["t"] / 60 for s in under]
    slope = statistics.linear_regression(minutes, load).slope if len(set(minutes)) > 1 else 0.0
    idle_growth = _growth(base["rss_mib"], final["rss_mib"])
    load_growth = _growth(statistics.median(load[:tenth]), statistics.median(load[-tenth:])) if load else 0.0
    pct = f"< {cfg.rss_growth:.0%}"
    unsent = [k for k in r["kinds"] if not r["counts"].get(k)]

    def v(check: str, value: str, limit: str, passed: bool) -> dict[str, Any]:
        return {"check": check, "value": value, "limit": limit, "passed": bool(passed)}

    return [
        v("RSS growth after warm-up (idle to idle)", f"{base['rss_mib']:.1f} -> {final['rss_mib']:.1f} MiB "
          f"({idle_growth:+.1%})", pct, idle_growth < cfg.rss_growth),
        v("RSS growth under load (first to last tenth)", f"{load_growth:+.1%} ({slope:+.2f} MiB/min)", pct,
          load_growth < cfg.rss_growth),
        v("open fds back to baseline", f"{base['fds']} -> {final['fds']}", f"<= {base['fds']}",
          final["fds"] <= base["fds"]),
        v("threads back to baseline", f"{base['threads']} -> {final['threads']}", f"<= {base['threads']}",
          final["threads"] <= base["threads"]),
        v("no busy slot or queued choice at the end", f"{final['busy']:g} busy, {final['queue']:g} queued", "0",
          final["busy"] == 0 and final["queue"] == 0),
        v("unexpected statuses", str(r["unexpected"]), "0", r["unexpected"] == 0),
        v("requests done", str(r["requests"]), f">= {cfg.requests}", r["requests"] >= cfg.requests),
        v("every kind sent", ", ".join(unsent) or f"all {len(r['kinds'])}", "all", not unsent),
        v("server alive", str(r["alive"]), "True", r["alive"]),
    ]
