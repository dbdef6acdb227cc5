"""Idle and slow connections against `gptport serve`: a real request's TTFT without and with hundreds of
sockets that connect and send nothing, sockets that make one keep-alive request and then idle, and
slowloris sockets that send a request's headers and then its body one byte a second. Each attacker
reconnects as soon as the server closes it (as a real one would), so the sockets stay open all along;
what the server did to them is counted (closed idle, 408, other answers).

Also the client side of benchmarks.stress.flood: one streamed completion, its TTFT and status. Run alone,
it starts a server on the preset's random weights (the serving benchmarks') or uses --url; one round.

    python -m benchmarks.stress.idle [--preset small] [--idle 500 --keepalive 100 --slow 50] [--seconds 40]
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from benchmarks.harness import cli, results
from benchmarks.harness.models import WORK, serve_model
from benchmarks.harness.run import Run
from benchmarks.harness.servers import gptport_serve, served

PROMPT = "the quick brown fox jumps over the lazy dog and then"


@dataclass
class Result:
    """One streamed completion: its HTTP status (0: no answer), TTFT in s (200 only), Retry-After, error."""

    status: int = 0
    ttft: float | None = None
    seconds: float = 0.0
    retry_after: str | None = None
    error: str | None = None


def body(max_tokens: int, model: str | None = None) -> dict[str, Any]:
    """A short streamed completion that generates `max_tokens` tokens."""
    return {**({"model": model} if model else {}), "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0.8,
            "ignore_eos": True, "stream": True}


async def stream_once(session: Any, url: str, payload: dict[str, Any], timeout: float) -> Result:
    """POST url/v1/completions streamed; TTFT is the time to the first chunk that carries text."""
    import aiohttp

    res, t0 = Result(), time.perf_counter()

    async def go() -> None:
        async with session.post(url + "/v1/completions", json=payload) as r:
            res.status, res.retry_after = r.status, r.headers.get("Retry-After")
            if r.status != 200:
                await r.read()
                return
            async for line in r.content:
                if res.ttft is None and line.startswith(b"data: {") and _text(line[6:]):
                    res.ttft = time.perf_counter() - t0
                if line.startswith(b"data: [DONE]"):
                    return
            res.error = "the stream ended without [DONE]"

    try:
        await asyncio.wait_for(go(), timeout)
    except asyncio.TimeoutError:
        res.error = f"timed out after {timeout:g} s"
    except (aiohttp.ClientError, OSError) as e:
        res.error = f"{type(e).__name__}: {e}"
    res.seconds = time.perf_counter() - t0
    return res


def _text(chunk: bytes) -> bool:
    """A stream chunk that carries text (not the usage chunk, nor an empty one)."""
    try:
        choices = json.loads(chunk).get("choices") or [{}]
    except (ValueError, AttributeError):
        return False
    return bool(choices[0].get("text"))


def quantile(values: list[float], q: float) -> float | None:
    """The nearest-rank quantile (q in 0..1); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def ms(values: list[float]) -> dict[str, Any]:
    """p50, p99 and max in ms, and the count."""
    out: dict[str, Any] = {"n": len(values)}
    for name, q in (("p50_ms", 0.5), ("p99_ms", 0.99), ("max_ms", 1.0)):
        v = quantile(values, q)
        out[name] = None if v is None else round(v * 1000, 2)
    return out


async def sequential(url: str, payload: dict[str, Any], n: int, gap: float = 0.0, until: float = math.inf,
                     timeout: float = 30.0) -> tuple[list[float], list[Result]]:
    """Up to `n` requests one after another (a new connection each, `gap` s apart, until the monotonic time
    `until`): the TTFTs of those answered 200, and every result."""
    import aiohttp

    ttfts, results = [], []
    connector = aiohttp.TCPConnector(force_close=True)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        for _ in range(n):
            if time.monotonic() >= until:
                break
            r = await stream_once(session, url, payload, timeout)
            results.append(r)
            if r.status == 200 and r.ttft is not None and r.error is None:
                ttfts.append(r.ttft)
            if gap:
                await asyncio.sleep(gap)
    return ttfts, results


def raise_open_files(need: int) -> None:
    """This client holds a socket per attacker: the soft open-file limit up to `need` (or the hard limit)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need if hard == resource.RLIM_INFINITY else min(need, hard), hard))


@dataclass
class Tally:
    """What the server did to one kind of attacker's sockets."""

    connects: int = 0
    closed: int = 0  # the server closed it without an answer
    statuses: dict[str, int] = field(default_factory=dict)  # answers, by status
    errors: int = 0  # could not connect, or reset

    def answer(self, head: bytes) -> None:
        status = head.split(b" ", 2)[1].decode() if head.startswith(b"HTTP/") else "garbled"
        self.statuses[status] = self.statuses.get(status, 0) + 1


async def attacker(kind: str, host: str, port: int, stop: float, tally: Tally) -> None:
    """One socket of `kind` (idle | keepalive | slow), reopened whenever the server ends it, until `stop`."""
    while time.monotonic() < stop:
        writer = None
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 10)
            tally.connects += 1
            if kind == "keepalive":
                writer.write(f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
                tally.answer(head)
                length = next((int(line.split(b":", 1)[1]) for line in head.lower().split(b"\r\n")
                               if line.startswith(b"content-length:")), 0)
                await asyncio.wait_for(reader.readexactly(length), 10)
            elif kind == "slow":
                writer.write(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                             "Content-Length: 100000\r\n\r\n{".encode())
            got = b""
            while time.monotonic() < stop and not got:
                if kind == "slow":
                    writer.write(b" ")
                with contextlib.suppress(asyncio.TimeoutError):
                    got = await asyncio.wait_for(reader.read(4096), 1.0)
                    if not got:
                        break  # closed without an answer
            if got:
                tally.answer(got)
            elif time.monotonic() < stop:
                tally.closed += 1
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            tally.errors += 1
            await asyncio.sleep(0.1)
        finally:
            if writer is not None:
                writer.close()


async def under_attack(url: str, payload: dict[str, Any], counts: dict[str, int], seconds: float
                       ) -> dict[str, Any]:
    """Sequential requests' TTFT for `seconds` while `counts` sockets of each kind stay open."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    raise_open_files(sum(counts.values()) + 256)
    stop = time.monotonic() + seconds
    tallies = {kind: Tally() for kind in counts}
    tasks = [asyncio.create_task(attacker(kind, host, port, stop, tallies[kind]))
             for kind, n in counts.items() for _ in range(n)]
    await asyncio.sleep(min(2.0, seconds / 4))  # the sockets open
    ttfts, results = await sequential(url, payload, 100_000, gap=0.2, until=stop - 0.5)
    await asyncio.gather(*tasks)
    return {"ttft": ms(ttfts), "requests": len(results), "failed": sum(r.status != 200 or r.error is not None
                                                                         for r in results),
            "sockets": counts, "seconds": seconds,
            "what_the_server_did": {kind: vars(t) for kind, t in tallies.items()}}


def idle_phase(url: str, payload: dict[str, Any], counts: dict[str, int], seconds: float) -> dict[str, Any]:
    """TTFT without idle sockets (30 sequential requests), then with them for `seconds`."""
    base, _ = asyncio.run(sequential(url, payload, 30, gap=0.05))
    attacked = asyncio.run(under_attack(url, payload, counts, seconds))
    return {"without": {"ttft": ms(base)}, "with": attacked}


def idle_rows(idle: dict[str, Any]) -> list[dict[str, Any]]:
    """The idle phase's table: TTFT without and with the sockets, and what the server did to each kind."""
    w = idle["with"]
    rows = [{"sockets": "none", **idle["without"]["ttft"]},
            {"sockets": ", ".join(f"{n} {k}" for k, n in w["sockets"].items()), **w["ttft"],
             "requests": w["requests"], "failed": w["failed"]}]
    rows += [{"table": "what the server did to the sockets", "kind": kind, "connects": t["connects"],
              "closed": t["closed"], "errors": t["errors"], **{f"answered {k}": v for k, v in t["statuses"].items()}}
             for kind, t in w["what_the_server_did"].items()]
    return rows


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--url", help="an already running server (else one is started on the preset's random weights)")
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--idle", type=int, default=500, help="sockets that connect and send nothing")
    ap.add_argument("--keepalive", type=int, default=100, help="sockets that make one request and idle")
    ap.add_argument("--slow", type=int, default=50, help="sockets that send a body one byte a second")
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--max-tokens", type=int, default=16)
    args = ap.parse_args()
    counts = {"idle": args.idle, "keepalive": args.keepalive, "slow": args.slow}
    payload = body(args.max_tokens)
    run = Run()
    with run.round() as rnd:
        if args.url:
            rnd.data["idle"] = idle_phase(args.url.rstrip("/"), payload, counts, args.seconds)
        else:
            cmd = gptport_serve(serve_model(args.preset), "--slots", str(args.slots), "--threads", str(args.threads))
            rnd.data["idle"] = served(cmd, WORK / "serve" / f"idle-{args.preset}.log",
                                      lambda u, _proc: idle_phase(u, payload, counts, args.seconds))
    print(json.dumps(rnd.data["idle"], indent=2))
    results.write(results.document(results.benchmark_name(__spec__), run, idle_rows(rnd.data["idle"]),
                                   cli.settings(args), label=args.label), args.results)


if __name__ == "__main__":
    main()
