"""Where a constrained row's token mask should be computed, measured in one process: decode steps of the
static-cache graph over R rows (StaticSlots, serve's `--spin step`), free or with every row constrained
to bench_structured.py's JSON schema, the masks computed

- `bg-serial`: on one background thread, one mask after another, while the step runs (what the server
  and `generate` do);
- `bg-pool`: on llguidance's parallel executor (a rayon pool of 2 threads), in the background (before);
- `sync-serial`: one after another in the stepping thread, after the step, before sampling;

then applied (-inf) and each row advanced by a random allowed token. Interleaved rounds; medians of
the per-iteration time (step + masks + apply). Writes benchmarks/results/mask-overlap-<shape>.json
naming the CPU.

    python benchmarks/bench_mask_overlap.py [--shape small] [--rows 1,16] [--rounds 4] [--steps 150]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import llguidance as llg
import llguidance.numpy as llg_np
import numpy as np
from bench_serve import WORK, model_dir
from bench_structured import SCHEMA
from bench_tokenizer import big_corpus

from gptport.machine import describe
from gptport.runtime.constraint import Grammars, Masks, Matcher, Spec, allowed_ids
from gptport.runtime.loader import open_model
from gptport.runtime.slots import open_slots

HERE = Path(__file__).resolve().parent
MODES = ("free", "bg-serial", "bg-pool", "sync-serial")


def measure(d: Path, rows: int, rounds: int, steps: int, seed: int = 0) -> dict[str, Any]:
    opened = open_model(d, "cpu", "fp32", 2, cache="static", spin="step")
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

    def run(mode: str) -> float:
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

    got: dict[str, list[float]] = {m: [] for m in MODES}
    for r in range(rounds):
        for mode in (MODES if r % 2 == 0 else MODES[::-1]):
            got[mode].append(run(mode))
    free = statistics.median(got["free"])
    return {"rows": rows, "ms_per_iteration": got,
            "median_ms": {m: statistics.median(v) for m, v in got.items()},
            "vs_free": {m: statistics.median(v) / free for m, v in got.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="small")
    ap.add_argument("--rows", default="1,16")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    d = model_dir(args.shape, big_corpus(), gguf=False)
    result: dict[str, Any] = {"shape": args.shape, "machine": describe(), "threads": 2, "spin": "step",
                              "rounds": args.rounds, "steps": args.steps, "schema": "bench_structured.SCHEMA",
                              "by_rows": [measure(d, int(r), args.rounds, args.steps) for r in args.rows.split(",")]}
    m = result["machine"]
    print(f"{m['cpu']}, {m['cores']} cores · {args.shape} · medians of {args.rounds} rounds, ms per iteration")
    print(f"{'rows':>4} " + " ".join(f"{mode:>18}" for mode in MODES))
    for row in result["by_rows"]:
        print(f"{row['rows']:>4} " + " ".join(f"{row['median_ms'][mode]:>9.3f} ({row['vs_free'][mode]:.3f}x)"
                                              for mode in MODES))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"mask-overlap-{args.shape}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
