"""A soak of `gptport serve`: at least 10,000 requests over at least 20 minutes (a mix of streamed and plain
completions and chat completions, n > 1, stop strings, logprobs, clients that leave mid-stream or mid-body,
malformed bodies and over-long prompts, each kind with the statuses it may get), the server process's
RSS, open fds and threads and its busy slots sampled every few seconds. The loop, the mix and the
verdicts are benchmarks/harness/soak.py's (tests/load/test_soak.py runs them for a minute).

Checks (PASS/FAIL): RSS grows < 5% after warm-up (the first 10% of the time), fds and threads back to
their baseline once idle, no slot left busy, no unexpected status, the requests done, every kind sent.
Starts a server on the preset's random weights (the serving benchmarks' model directories; 16 slots,
queue 64, 2 threads) or soaks --url with --pid. One round, whose data holds the curves; --plot draws them
into a PNG. Exit status 1 when a check fails.

    python -m benchmarks.stress.soak [--preset small] [--minutes 20] [--requests 10000] [--plot soak.png]
    python -m benchmarks.stress.soak --url http://127.0.0.1:8000 --pid 12345 --preset mine
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.harness import cli, results, soak
from benchmarks.harness.models import WORK, serve_model
from benchmarks.harness.run import Run
from benchmarks.harness.servers import gptport_serve, served
from gptport.errors import GptportError
from gptport.load.loadgen import base_url

PHASE_COLOURS = {"start": "#dde8f2", "warmup": "#f2e6c9", "pause": "#dde8f2", "settle": "#dde8f2"}


def soak_started(args: argparse.Namespace, cfg: dict[str, Any]) -> dict[str, Any]:
    """Start `gptport serve` on the preset's random weights, soak it, stop it by its pid."""
    cmd = gptport_serve(serve_model(args.preset), "--slots", str(args.slots), "--max-queue", str(args.max_queue),
                        "--threads", str(args.threads))
    return served(cmd, WORK / "serve" / f"soak-{args.preset}.log",
                  lambda url, proc: soak.run(soak.SoakConfig(url, proc.pid, **cfg), say))


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def print_tables(result: dict[str, Any]) -> None:
    console = Console()
    counts = Table(title=f"soak of {result['model']} ({result['requests']:,} requests, "
                         f"{result['unexpected']} unexpected)")
    for col in ("kind", "route", "expected", "got"):
        counts.add_column(col)
    for name, kind in result["kinds"].items():
        got = ", ".join(f"{'left' if s == '0' else 'failed' if s == '-1' else s}: {n:,}"
                        for s, n in result["counts"].get(name, {}).items())
        expected = ", ".join("left" if s == 0 else str(s) for s in kind["expect"])
        counts.add_row(name, kind["path"], expected, got or "-")
    console.print(counts)
    verdicts = Table(title=f"on {result['machine']['cpu']}, {result['machine']['cores']} cores")
    for col in ("check", "value", "limit", "verdict"):
        verdicts.add_column(col)
    for v in result["verdicts"]:
        verdicts.add_row(v["check"], v["value"], v["limit"], "[green]PASS[/]" if v["passed"] else "[red]FAIL[/]")
    console.print(verdicts)
    for e in result["unexpected_examples"][:10]:
        console.print(f"unexpected at {e['t']:.0f} s: {e['kind']} got {e['status']}: {e['problem'] or ''}")


def plot(result: dict[str, Any], path: Path) -> None:
    """RSS, fds, threads, busy slots and requests per second over time, the phases shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    samples = result["samples"]
    t = [s["t"] / 60 for s in samples]
    rows = [("RSS (MiB)", "rss_mib"), ("open fds", "fds"), ("threads", "threads"), ("busy slots", "busy"),
            ("requests / s", "rps")]
    fig, axes = plt.subplots(len(rows), 1, sharex=True, figsize=(9, 9))
    phases = [*result["phases"], {"phase": "end", "t": samples[-1]["t"]}]
    for ax, (label, key) in zip(axes, rows, strict=True):
        for here, after in zip(phases[:-1], phases[1:], strict=True):
            if here["phase"] in PHASE_COLOURS:
                ax.axvspan(here["t"] / 60, after["t"] / 60, color=PHASE_COLOURS[here["phase"]], lw=0)
        # requests / s is the mean over the interval before its sample; the rest are read at the sample
        ax.plot(t, [s[key] for s in samples], lw=1.2, color="#1f4e79", drawstyle="steps-pre" if key == "rps"
                else "default")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[1].axhline(result["baseline"]["fds"], color="grey", ls="--", lw=0.8)
    axes[2].axhline(result["baseline"]["threads"], color="grey", ls="--", lw=0.8)
    axes[-1].set_xlabel("minutes since the start (dashed: the idle baseline after warm-up)")
    axes[0].legend(handles=[Patch(color=PHASE_COLOURS["warmup"], label="warm-up"),
                            Patch(color=PHASE_COLOURS["pause"], label="idle")], loc="lower right", fontsize=8)
    failed = [v["check"] for v in result["verdicts"] if not v["passed"]]
    fig.suptitle(f"gptport serve soak: {result['preset']}, {result['requests']:,} requests, "
                 f"{result['machine']['cpu']}\n{'all checks pass' if not failed else 'FAIL: ' + '; '.join(failed)}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--preset", default="small", help="the random weights' shape (with --url: the results' name)")
    ap.add_argument("--url", help="soak this running server instead of starting one (with --pid)")
    ap.add_argument("--pid", type=int, help="with --url: the server's process id, to sample")
    ap.add_argument("--minutes", type=float, default=20.0, help="at least this long")
    ap.add_argument("--requests", type=int, default=10_000, help="at least this many requests")
    ap.add_argument("--max-minutes", type=float, default=0.0, help="never longer (0: 2 x minutes + 1)")
    ap.add_argument("--concurrency", type=int, default=16, help="clients; x 3 choices must fit slots + queue")
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--max-queue", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    ap.add_argument("--rss-growth", type=float, default=0.05, help="the RSS growth allowed after warm-up")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--api-key", help="the server's API key, if it has one")
    ap.add_argument("--plot", type=Path, help="draw the curves into this PNG")
    args = ap.parse_args()
    if (args.url is None) != (args.pid is None):
        ap.error("--url and --pid go together")
    cfg = {"minutes": args.minutes, "requests": args.requests, "max_minutes": args.max_minutes,
           "concurrency": args.concurrency, "interval_s": args.interval, "rss_growth": args.rss_growth,
           "seed": args.seed, "api_key": args.api_key}
    run = Run()
    try:
        with run.round() as rnd:
            if args.url:
                rnd.data.update(soak.run(soak.SoakConfig(base_url(args.url), args.pid, **cfg), say))
            else:
                rnd.data.update(soak_started(args, cfg))
    except GptportError as e:
        sys.exit(f"soak: error: {e}")
    result = {**rnd.data, "preset": args.preset, "machine": results.machine()}
    print_tables(result)
    rows = [{"check": v["check"], "value": v["value"], "limit": v["limit"], "passed": v["passed"]}
            for v in result["verdicts"]]
    rows += [{"table": "requests by kind", "kind": name, "route": kind["path"],
              **{f"got {s}": n for s, n in result["counts"].get(name, {}).items()}}
             for name, kind in result["kinds"].items()]
    results.write(results.document(results.benchmark_name(__spec__), run, rows, cli.settings(args),
                                   label=args.label), args.results)
    if args.plot:
        plot(result, args.plot)
        say(f"wrote {args.plot}")
    sys.exit(0 if all(v["passed"] for v in result["verdicts"]) else 1)


if __name__ == "__main__":
    main()
