"""Where a constrained row's token mask should be computed, measured in one process: decode steps of the
static-cache graph over R rows (StaticSlots, serve's `--spin step`), free or with every row constrained
to the structured-output benchmarks' JSON schema, the masks computed

- `bg-serial`: on one background thread, one mask after another, while the step runs (what the server
  and `generate` do);
- `bg-pool`: on llguidance's parallel executor (a rayon pool of 2 threads), in the background (before);
- `sync-serial`: one after another in the stepping thread, after the step, before sampling;

then applied (-inf) and each row advanced by a random allowed token. Interleaved rounds; medians of
the per-iteration time (step + masks + apply), then of the kept rounds.

    python -m benchmarks.decode.mask_overlap [--shape small] [--rows 1,16] [--rounds 4] [--steps 150]
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import llguidance as llg
import llguidance.numpy as llg_np
import numpy as np

from benchmarks.harness import cli, results
from benchmarks.harness.loads import SCHEMA
from benchmarks.harness.models import serve_model
from benchmarks.harness.run import Run
from gptport.runtime.choice import GraphChoice, RunOptions
from gptport.runtime.constraint import Grammars, Masks, Matcher, Spec, allowed_ids
from gptport.runtime.loader import open_model
from gptport.runtime.slot_layout import open_slots

MODES = ("free", "bg-serial", "bg-pool", "sync-serial")


def measure(run: Run, d: Path, rows: int, rounds: int, steps: int, seed: int = 0) -> None:
    """`rounds` rounds of every mode at `rows` rows, each mode's median ms per iteration in round.data."""
    opened = open_model(d, GraphChoice.parse(precision="fp32", cache="static"),
                        RunOptions.parse(provider="cpu", threads=2, spin="step"))
    vocab, eot = opened.engine.config.vocab_size, opened.tok.eot_id
    slots = open_slots(opened.engine, 16)
    grammars = Grammars(opened.tok.json, vocab, eot)
    grammar = grammars.compile(Spec("json_schema", SCHEMA, "schema"))
    masks, pool, executor = Masks(vocab), ThreadPoolExecutor(1), llg.LLExecutor(2)
    rng = np.random.default_rng(seed)
    prompt = np.array([1, 2, 3, 4], dtype=np.int64)

    def pooled(ms: list[Matcher]) -> None:
        out = np.full((len(ms), masks.words), -1, dtype=np.int32)  # (R, W)
        llg_np.fill_next_token_bitmask_par(executor, [(m.inner, i) for i, m in enumerate(ms)], out)
        masks.set_masks(ms, out)

    def refill() -> None:
        for s in range(rows):
            slots.free(s)
            slots.append(s, prompt)

    def run_mode(mode: str) -> float:
        refill()
        ms = [grammars.matcher(grammar, json=True) for _ in range(rows)]
        tokens, times = np.ones(rows, dtype=np.int64), []
        background: dict[str, Callable[[list[Matcher]], Any]] = {
            "bg-serial": masks.start, "bg-pool": lambda m: pool.submit(pooled, m)}
        for _ in range(steps):
            t0 = time.perf_counter()
            job: Future[None] | None = background[mode](ms) if mode in background else None
            logits = slots.decode(list(range(rows)), tokens)  # (R, V)
            if mode != "free":
                if job is not None:
                    job.result()
                masks.fill(ms)  # sync-serial: all of them, here
                masks.apply(logits, list(range(rows)), ms)
            times.append(time.perf_counter() - t0)
            if mode != "free":
                for i, m in enumerate(ms):
                    ids = allowed_ids(m, vocab)
                    ids = ids[ids != eot]
                    if m.finished or not len(ids):
                        ms[i] = grammars.matcher(grammar, json=True)
                        continue
                    m.consume(int(rng.choice(ids)))
            if slots.length(0) > opened.engine.n_ctx - 8:
                refill()
        return statistics.median(times) * 1e3

    for rnd in run.series(rounds, rows=rows):
        for mode in rnd.order(MODES):
            rnd.data[mode] = run_mode(mode)


def median_row(run: Run, shape: str, rows: int) -> dict[str, Any]:
    """Each mode's median over the kept rounds at `rows` rows, and its ratio to free decoding."""
    median = {m: statistics.median(run.values(m, rows=rows)) for m in MODES}
    return {"shape": shape, "rows": rows, **{f"{m}_ms": v for m, v in median.items()},
            **{f"{m}_vs_free": v / median["free"] for m, v in median.items() if m != "free"}}


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--shape", default="small")
    ap.add_argument("--rows", default="1,16")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=150)
    args = ap.parse_args()
    d = serve_model(args.shape)
    run = Run()
    for r in args.rows.split(","):
        measure(run, d, int(r), args.rounds, args.steps)
    rows = [median_row(run, args.shape, int(r)) for r in args.rows.split(",")]
    print(f"{args.shape} · medians of the kept rounds, ms per iteration")
    print(f"{'rows':>4} " + " ".join(f"{mode:>18}" for mode in MODES))
    for row in rows:
        print(f"{row['rows']:>4} " + " ".join(f"{row[f'{mode}_ms']:>9.3f} ({row.get(f'{mode}_vs_free', 1.0):.3f}x)"
                                              for mode in MODES))
    settings = cli.settings(args, threads=2, spin="step", schema="benchmarks.harness.loads.SCHEMA")
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label=args.label),
                  args.results)


if __name__ == "__main__":
    main()
