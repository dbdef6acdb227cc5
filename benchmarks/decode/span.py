"""The decode span's trade-off under prefix caching: what a free row inside the span costs a decode step,
against what a kept prefix saves.

The static-cache decode step runs over the rows [lowest decoding slot, highest + 1): a free row between
them steps a dummy token (one attention position). Admission takes the free slot holding the longest
part of the prompt and, among equals, the lowest, so the span stays as narrow as without prefix
caching; the alternative — keep distinct prefixes in more slots and take them wherever they are — would
widen the span. This measures both sides on the serving benchmarks' random-weight shapes (`StaticSlots`
directly, no scheduler): the 16-row decode step with the 16 rows adjacent (span 16) and spread over
spans of 24 and 32 (the rows between them free, holding kept caches), each row holding --cached
positions, and the one-row append of a prompt's rest (--rest tokens after a --prefix-token prefix)
against prefilling the whole prompt alone. Medians of --repeat steps, then of the kept rounds.

    python -m benchmarks.decode.span [--shapes small,gpt2-124m] [--rounds 3] [--threads 2]
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
from gptport.runtime.choice import GraphChoice, RunOptions
from gptport.runtime.loader import open_model
from gptport.runtime.slots import StaticSlots

ROWS = 16
SPANS = (16, 24, 32)


def median_ms(fn: Any, repeat: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def one_round(engine: Any, cached: int, prefix: int, rest: int, repeat: int, rng: np.random.Generator
              ) -> dict[str, float]:
    """Step times (ms): the 16-row decode step per span, the rest's append, the whole prompt's prefill."""
    vocab = engine.config.vocab_size
    slots = StaticSlots(engine.session, engine.config, max(SPANS), engine.kv_dtype)
    slots.prefill_many(0, [rng.integers(1, vocab, cached) for _ in range(max(SPANS))])  # every row holds a cache
    out: dict[str, float] = {}
    for span in SPANS:
        rows = np.linspace(0, span - 1, ROWS).round().astype(np.int64)  # (16,) spread over [0, span)
        free = [r for r in range(span) if r not in set(rows.tolist())]
        for r in free:
            slots.free(r)  # a free row keeps its cache (a prefix for reuse) and steps a dummy token
        tokens = rng.integers(1, vocab, ROWS)

        def step(rows: np.ndarray = rows, tokens: np.ndarray = tokens) -> None:
            slots.decode(rows.tolist(), tokens)
            slots.lengths[rows] -= 1  # back to `cached` positions: every repeat steps the same shape

        out[f"decode_16_rows_span_{span}_ms"] = median_ms(step, repeat)
        for r in free:
            slots.lengths[r] = slots.kept[r] = cached
    ids = rng.integers(1, vocab, prefix + rest)
    slots.free(0)
    whole = median_ms(lambda: (slots.append(0, ids), slots.truncate(0, 0)), repeat)
    slots.append(0, ids[:prefix])
    out["append_rest_ms"] = median_ms(lambda: (slots.append(0, ids[prefix:]), slots.truncate(0, prefix)), repeat)
    out["prefill_whole_ms"] = whole
    return out


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--shapes", default="small,gpt2-124m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--cached", type=int, default=128, help="positions each decoding row holds")
    ap.add_argument("--rest", type=int, default=24, help="a prompt's own tokens after the shared prefix")
    ap.add_argument("--new", type=int, default=64, help="new tokens per request (decode steps a row lives)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    run, rows = Run(), []
    shapes = args.shapes.split(",")
    for shape in shapes:
        engine = open_model(serve_model(shape), GraphChoice.parse(cache="static"),
                            RunOptions.parse(threads=args.threads, spin="step")).engine
        for rnd in run.series(args.rounds, shape=shape):
            rnd.data["ms"] = one_round(engine, args.cached, SHARED_PREFIX[shape], args.rest, args.repeat,
                                       np.random.default_rng(rnd.index))
    for shape in shapes:  # once every round is judged
        kept = run.values("ms", shape=shape)
        med = {k: statistics.median(r[k] for r in kept) for k in kept[0]}
        per_free_row = (med[f"decode_16_rows_span_{SPANS[-1]}_ms"] - med[f"decode_16_rows_span_{ROWS}_ms"]) / (
            SPANS[-1] - ROWS)
        saved = med["prefill_whole_ms"] - med["append_rest_ms"]
        rows.append({"shape": shape, **med, "ms_per_free_row_per_step": per_free_row,
                     "ms_saved_per_reused_prefix": saved,
                     "break_even_steps": saved / per_free_row if per_free_row > 0 else None})
        print(f"\n{shape} ({args.threads} threads, {len(kept)} kept rounds, {args.cached} cached positions a row; "
              f"prefix {SHARED_PREFIX[shape]} + rest {args.rest})")
        for k, v in med.items():
            print(f"  {k:32} {v:8.2f} ms")
        print(f"  a free row in the span: {per_free_row:.3f} ms a step; a reused prefix saves {saved:.1f} ms; "
              f"break-even {saved / per_free_row:.0f} steps (a request lives {args.new})" if per_free_row > 0 else
              f"  a free row in the span: no measurable cost; a reused prefix saves {saved:.1f} ms")
    results.write(results.document(results.benchmark_name(__spec__), run, rows, cli.settings(args),
                                   label=args.label), args.results)


if __name__ == "__main__":
    main()
