"""What the multi-row append graph does to a prefix-reuse load, without HTTP: the scheduler that `gptport
serve` runs, driven in-process on the serving benchmarks' random-weight model directory, 16 users in a
closed loop (a finished request is replaced at once), each request a shared system prompt
(loads.SHARED_PREFIX tokens) then --rest tokens of its own, --max-tokens new tokens at temperature 0.8,
16 slots, prefill chunk 512, `--spin step`. Three engines in alternating order each round: prefix caching
with one-row appends (the static-cache graph alone), prefix caching with every iteration's rests
appended in one step (the multi-row append graph beside it), and no prefix caching. Each request's time
to first token is taken when its first token is sampled (seen at the scheduler's `early` hand-over), its
time per output token from there to its end.

    python -m benchmarks.serve.append_waves [--shapes small] [--rounds 3] [--requests 48] [--threads 2]
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from benchmarks.harness import cli, results
from benchmarks.harness.loads import SHARED_PREFIX
from benchmarks.harness.models import serve_model
from benchmarks.harness.run import Run
from gptport.runtime import loader
from gptport.runtime.choice import GraphChoice, RunOptions
from gptport.runtime.sampling import Sampling
from gptport.runtime.slots import StaticSlots
from gptport.serve.engine.choice import Choice
from gptport.serve.engine.events import Finish
from gptport.serve.engine.scheduler import Scheduler, SchedulerSettings

SLOTS, USERS, PREFILL_CHUNK, TEMPERATURE = 16, 16, 512, 0.8
ENGINES = ("one_row", "together", "no_reuse")


def load(opened: Any, appender: Any, shape: str, engine: str, requests: int, rest: int, max_tokens: int,
         seed: int) -> dict[str, float]:
    """`requests` requests, USERS in flight: median and p99 TTFT, median TPOT (ms), output tok/s."""
    slots = StaticSlots(opened.engine.session, opened.engine.config, SLOTS,
                        appender=appender if engine == "together" else None)
    knobs = SchedulerSettings(max_queue=4 * SLOTS, prefill_chunk=PREFILL_CHUNK, prefix_cache=engine != "no_reuse")
    s = Scheduler(slots, opened.tok, lambda events: None, knobs)
    rng = np.random.default_rng(seed)
    vocab = opened.engine.config.vocab_size
    system = np.random.default_rng(0).integers(1, vocab, SHARED_PREFIX[shape]).tolist()
    sent: dict[int, float] = {}
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    ended: dict[int, int] = {}
    waiting: dict[int, Choice] = {}  # sent, no token yet

    def send() -> None:
        i = len(sent)
        prompt = system + rng.integers(1, vocab, rest).tolist()
        c = Choice(prompt, max_tokens, Sampling(temperature=TEMPERATURE, seed=int(rng.integers(1 << 30))),
                   ignore_eos=True, out=i)
        sent[i], waiting[i] = time.perf_counter(), c
        if not s.submit([c]):
            raise RuntimeError("the scheduler's queue refused a request")

    def seen(events: list[tuple[Any, Any]]) -> None:
        now = time.perf_counter()
        for i in [i for i, c in waiting.items() if c.new_ids]:  # its first token sampled
            first[i] = now
            del waiting[i]
        for out, event in events:
            if isinstance(event, Finish):
                last[out], ended[out] = now, event.completion_tokens

    t0 = time.perf_counter()
    for _ in range(min(USERS, requests)):
        send()
    while len(ended) < requests:
        before = len(ended)
        seen(s.iterate(early=seen))
        for _ in range(len(ended) - before):
            if len(sent) < requests:
                send()
    wall = time.perf_counter() - t0
    ttft = sorted((first[i] - sent[i]) * 1e3 for i in sent)
    tpot = [(last[i] - first[i]) * 1e3 / max(1, ended[i] - 1) for i in sent]
    return {"median_ttft_ms": statistics.median(ttft), "p99_ttft_ms": ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))],
            "median_tpot_ms": statistics.median(tpot), "output_throughput": sum(ended.values()) / wall}


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--shapes", default="small")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--rest", type=int, default=24, help="a request's own tokens after the shared prefix")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    run, rows = Run(), []
    for shape in args.shapes.split(","):
        d = serve_model(shape)
        opened = loader.open_model(d, GraphChoice.parse(cache="static"),
                                   RunOptions.parse(threads=args.threads, spin="step"))
        appender = loader.open_appender(d, opened.engine, RunOptions.parse(threads=args.threads, spin="step"))  # type: ignore[arg-type]
        if appender is None:
            raise SystemExit(f"{d} has no multi-row append graph: export it again (gptport export {d} --force)")
        load(opened, appender.session, shape, "together", SLOTS, args.rest, args.max_tokens, 99)  # warm-up
        for rnd in run.series(args.rounds, shape=shape):
            for engine in rnd.rotation(list(ENGINES)):
                rnd.data[engine] = load(opened, appender.session, shape, engine, args.requests, args.rest,
                                        args.max_tokens, rnd.index)
                print(f"  {shape} round {rnd.index + 1} {engine}: {rnd.data[engine]}", flush=True)
    for shape in args.shapes.split(","):
        kept = run.kept(shape=shape)
        row: dict[str, Any] = {"shape": shape, "kept_rounds": len(kept)}
        for engine in ENGINES:
            for key in kept[0].data[engine]:
                row[f"{engine}_{key}"] = statistics.median(r.data[engine][key] for r in kept)
        for engine in ("one_row", "together"):
            row[f"{engine}_ttft_over_no_reuse"] = row[f"{engine}_median_ttft_ms"] / row["no_reuse_median_ttft_ms"]
        rows.append(row)
        print(row)
    results.write(results.document(results.benchmark_name(__spec__), run, rows, cli.settings(args),
                                   label=args.label), args.results)


if __name__ == "__main__":
    main()
