"""Time to first token under the scheduler's prefill policies, without HTTP: the scheduler that `gptport
serve` runs, driven in-process on the serving benchmarks' random-weight model directory (fp32 static cache
with the multi-row append graph beside it, `--spin step`), 16 users in a closed loop (a finished request is
replaced at once), 16 slots, temperature 0.8, ignore_eos. Two loads:

- chat: a shared system prompt (loads.SHARED_PREFIX tokens: ~60% of the context) then 24 tokens of each
  request's own, 64 new tokens; under each policy once with prefix caching and once without it (`chat
  no reuse`: `serve --no-prefix-cache`);
- plain: prompts of 64 tokens of their own, loads.MAX_TOKENS new tokens (benchmarks.serve.throughput's
  load, no shared prefix).

A policy is how an iteration's prompt chunks are appended: `--policies` lists them as
name:key=value,... with SchedulerSettings' prefill_chunk (tokens per iteration), run_tokens (tokens per run
of the append graph; 0: one run per iteration), order (arrival, or shortest: the fewest tokens to a
first token first), fill_waves (1: where at least as many prompts wait for a first token as rows
decode, every ready chunk goes in that iteration, prefill_chunk aside) and span_gap (a run's slots at most
that many other rows apart, a lone row appended by the one-row step; -1: any) and rest_tokens (rests
after a reused prefix first, in runs of their own of up to that many tokens; 0: off) and rest_runs (at most
that many runs of rests an iteration; 0: any). Each request's time to first
token is the scheduler's own (Observer.first_token: from submit to its first token's sampling, whether or
not that token's text can be sent yet), the inter-token latency is the Observer's too; prefill runs and
decode steps are counted and timed (what a TTFT is made of: the wait for a slot, the runs, the steps).
With `--live` the scheduler runs on its own thread as in `serve` and each finished request's successor
is submitted from the load's thread when its Finish is delivered, so arrivals fall during iterations as
they do over HTTP; without it the load steps the scheduler and submits between iterations.

    python -m benchmarks.serve.ttft [--shapes small,gpt2-124m] [--loads chat,plain] [--rounds 3] [--live]
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import numpy as np

from benchmarks.harness import cli, results
from benchmarks.harness.loads import MAX_TOKENS, SHARED_PREFIX
from benchmarks.harness.models import serve_model
from benchmarks.harness.run import Run
from gptport.runtime import loader
from gptport.runtime.choice import GraphChoice, RunOptions
from gptport.runtime.sampling import Sampling
from gptport.runtime.slots import StaticSlots
from gptport.serve.engine.choice import Choice
from gptport.serve.engine.events import Finish, Observer
from gptport.serve.engine.scheduler import Order, Scheduler, SchedulerSettings

SLOTS = USERS = 16
OWN, CHAT_NEW, PLAIN_PROMPT, TEMPERATURE = 24, 64, 64, 0.8
POLICIES = ("one run:prefill_chunk=512,rest_tokens=0;rests first:prefill_chunk=512,rest_tokens=96,rest_runs=0;"
            "a run of rests an iteration:prefill_chunk=512,rest_tokens=48,rest_runs=1")
NO_REUSE = "chat no reuse"


def parse_policies(text: str) -> dict[str, dict[str, Any]]:
    """'name:key=value,...;name:...' -> {name: SchedulerSettings keyword arguments}."""
    out: dict[str, dict[str, Any]] = {}
    for part in filter(None, (p.strip() for p in text.split(";"))):
        name, _, spec = part.partition(":")
        kw: dict[str, Any] = {}
        for item in filter(None, spec.split(",")):
            key, _, value = item.partition("=")
            if key not in ("prefill_chunk", "run_tokens", "order", "fill_waves", "span_gap", "rest_tokens",
                           "rest_runs"):
                raise SystemExit(f"--policies: {key!r} is not prefill_chunk, run_tokens, order, fill_waves, span_gap, "
                                 "rest_tokens or rest_runs")
            if key == "order" and value not in {o.value for o in Order}:
                raise SystemExit(f"--policies: order {value!r}: expected one of {', '.join(o.value for o in Order)}")
            kw[key] = Order(value) if key == "order" else bool(int(value)) if key == "fill_waves" else int(value)
        out[name.strip()] = kw
    return out


class Recorder(Observer):
    """Every first-token time, wait for a slot and inter-token latency the scheduler reports (seconds)."""

    def __init__(self) -> None:
        self.ttft: list[float] = []
        self.itl: list[float] = []
        self.queue: list[float] = []

    def admitted(self, seconds: float) -> None:
        self.queue.append(seconds)

    def first_token(self, seconds: float) -> None:
        self.ttft.append(seconds)

    def next_token(self, seconds: float) -> None:
        self.itl.append(seconds)


class Counted:
    """The slot engine's runs counted and timed: prefill runs (append, append_many: their rows and tokens)
    and decode steps (their rows)."""

    def __init__(self, engine: StaticSlots) -> None:
        self.times: dict[str, list[float]] = {"runs": [], "steps": []}
        self.rows: dict[str, list[int]] = {"runs": [], "steps": []}
        self.tokens: list[int] = []
        engine.append = self._count(engine.append, "runs", lambda a: (1, len(a[1])))  # type: ignore[method-assign]
        engine.append_many = self._count(  # type: ignore[method-assign]
            engine.append_many, "runs", lambda a: (len(a[0]), sum(len(c) for c in a[1])))
        engine.decode = self._count(engine.decode, "steps", lambda a: (len(a[0]), len(a[0])))  # type: ignore[method-assign]

    def _count(self, inner: Any, what: str, size: Any) -> Any:
        def counted(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            out = inner(*a, **kw)
            self.times[what].append(time.perf_counter() - t0)
            rows, tokens = size(a)
            self.rows[what].append(rows)
            if what == "runs":
                self.tokens.append(tokens)
            return out
        return counted


def load(opened: Any, appender: Any, shape: str, kind: str, kw: dict[str, Any], reuse: bool, requests: int,
         seed: int, live: bool = False) -> dict[str, float]:
    """`requests` requests of load `kind`, USERS in flight: TTFT median / p99 / mean, median and p99
    inter-token latency (ms), output tok/s, prefill runs and decode steps per request, and what a TTFT is
    made of: the median wait for a slot, prefill run and decode step (ms), rows and tokens per run. With
    `live`, the scheduler runs its own thread as in `serve` and a finished request's successor is submitted
    from another thread as soon as its Finish is delivered, so it arrives during an iteration (as over
    HTTP); else between iterations, the loop stepping the scheduler itself."""
    slots = StaticSlots(opened.engine.session, opened.engine.config, SLOTS, appender=appender)
    counted, seen = Counted(slots), Recorder()
    rng = np.random.default_rng(seed)
    vocab = opened.engine.config.vocab_size
    system = np.random.default_rng(0).integers(1, vocab, SHARED_PREFIX[shape]).tolist() if kind == "chat" else []
    own, new = (OWN, CHAT_NEW) if kind == "chat" else (PLAIN_PROMPT, MAX_TOKENS[shape])
    sent = 0
    ended: list[int] = []  # each finished request's completion tokens
    arrived = threading.Semaphore(0)  # live: one release per finished request

    def finished(events: list[tuple[Any, Any]]) -> None:
        done = [e.completion_tokens for _, e in events if isinstance(e, Finish)]
        ended.extend(done)
        for _ in done:
            arrived.release()

    s = Scheduler(slots, opened.tok, finished, SchedulerSettings(max_queue=4 * SLOTS, prefix_cache=reuse, **kw),
                  observer=seen)

    def send() -> None:
        nonlocal sent
        prompt = system + rng.integers(1, vocab, own).tolist()
        c = Choice(prompt, new, Sampling(temperature=TEMPERATURE, seed=int(rng.integers(1 << 30))), ignore_eos=True,
                   out=sent)
        sent += 1
        if not s.submit([c]):
            raise RuntimeError("the scheduler's queue refused a request")

    t0 = time.perf_counter()
    for _ in range(min(USERS, requests)):
        send()
    if live:
        s.start()
        for _ in range(requests):
            arrived.acquire()
            if sent < requests:
                send()
        s.stop()
    while len(ended) < requests:
        before = len(ended)
        finished(s.iterate(early=finished))
        for _ in range(len(ended) - before):
            if sent < requests:
                send()
    wall = time.perf_counter() - t0
    ttft, itl = np.array(seen.ttft) * 1e3, np.array(seen.itl) * 1e3
    ms = {k: np.array(v) * 1e3 for k, v in counted.times.items()}
    return {"median_ttft_ms": float(np.median(ttft)), "p99_ttft_ms": float(np.percentile(ttft, 99)),
            "mean_ttft_ms": float(ttft.mean()), "median_itl_ms": float(np.median(itl)),
            "p99_itl_ms": float(np.percentile(itl, 99)), "output_throughput": sum(ended) / wall,
            "prefill_runs_per_request": len(ms["runs"]) / requests,
            "decode_steps_per_request": len(ms["steps"]) / requests,
            "median_queue_ms": float(np.median(seen.queue)) * 1e3,
            "median_run_ms": float(np.median(ms["runs"])) if len(ms["runs"]) else 0.0,
            "median_step_ms": float(np.median(ms["steps"])),
            "mean_rows_per_run": float(np.mean(counted.rows["runs"])) if counted.rows["runs"] else 0.0,
            "mean_tokens_per_run": float(np.mean(counted.tokens)) if counted.tokens else 0.0,
            "mean_rows_per_step": float(np.mean(counted.rows["steps"]))}


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--shapes", default="small,gpt2-124m")
    ap.add_argument("--loads", default="chat,plain")
    ap.add_argument("--policies", default=POLICIES,
                    help="name:prefill_chunk=N,run_tokens=N,order=arrival|shortest,fill_waves=0|1;...")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=64, help="requests per load (16 in flight)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--live", action="store_true", help="the scheduler on its own thread, arrivals during iterations")
    args = ap.parse_args()
    policies = parse_policies(args.policies)
    run, rows = Run(), []
    loads = args.loads.split(",")
    for shape in args.shapes.split(","):
        d = serve_model(shape)
        opened = loader.open_model(d, GraphChoice.parse(cache="static"),
                                   RunOptions.parse(threads=args.threads, spin="step"))
        appender = loader.open_appender(d, opened.engine, RunOptions.parse(threads=args.threads, spin="step"))  # type: ignore[arg-type]
        if appender is None:
            raise SystemExit(f"{d} has no multi-row append graph: export it again (gptport export {d} --force)")
        kinds = [(kind, True) for kind in loads] + ([(NO_REUSE, False)] if "chat" in loads else [])
        configs = [(kind, name, kw, reuse) for name, kw in policies.items() for kind, reuse in kinds]
        load(opened, appender.session, shape, loads[0], configs[0][2], True, SLOTS, 99)  # warm-up
        for rnd in run.series(args.rounds, shape=shape):
            for kind, name, kw, reuse in rnd.rotation(configs):
                key = f"{kind} / {name}"
                rnd.data[key] = load(opened, appender.session, shape, kind.split()[0], kw, reuse, args.requests,
                                     rnd.index, args.live)
                print(f"  {shape} round {rnd.index + 1} {key}: "
                      + ", ".join(f"{k} {v:.1f}" for k, v in rnd.data[key].items()), flush=True)
        kept = run.kept(shape=shape)
        for kind, name, _, _ in configs:
            key = f"{kind} / {name}"
            row: dict[str, Any] = {"shape": shape, "load": kind, "policy": name}
            for k in kept[0].data[key]:
                row[k] = statistics.median(r.data[key][k] for r in kept)
            row["p99_over_median_ttft"] = row["p99_ttft_ms"] / row["median_ttft_ms"]
            rows.append(row)
        for name in policies if "chat" in loads else ():
            on, off = (next(r for r in rows if (r["shape"], r["load"], r["policy"]) == (shape, kind, name))
                       for kind in ("chat", NO_REUSE))
            on["ttft_over_no_reuse"] = on["median_ttft_ms"] / off["median_ttft_ms"]
    for r in rows:
        print(r)
    results.write(results.document(results.benchmark_name(__spec__), run, rows,
                                   cli.settings(args, slots=SLOTS, users=USERS, own_tokens=OWN,
                                                chat_new_tokens=CHAT_NEW, plain_prompt=PLAIN_PROMPT,
                                                temperature=TEMPERATURE), label=args.label), args.results)


if __name__ == "__main__":
    main()
