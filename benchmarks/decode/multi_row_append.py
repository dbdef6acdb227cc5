"""Which attention serves which step of the static cache: GroupQueryAttention (the static-cache graph,
gqa_graph.py) or TensorScatter + Attention-24 (the multi-row append graph, scatter_graph.py), over the
same StaticSlots buffers, at the `small` and `gpt2-124m` shapes (seeded random weights: speed does not
depend on what weights learned), each at its preset n_ctx and at a larger one (the CPU Attention kernel
computes over the buffer's whole capacity, GroupQueryAttention over each row's length).

- decode: one token per row, every row holding --held positions, at batch 1 and 16: the GQA graph's
  decode step (StaticSlots.decode) against the multi-row append graph (StaticSlots.append_many, 1 token
  a row);
- wave: 16 rows holding different lengths (seeded, up to twice the decode rows') each append 24 to 64
  tokens (a wave of prefix-reuse rests or new chat turns): one multi-row run (append_many) against 16 one-row runs of
  the GQA graph (StaticSlots.append, as the scheduler appends today).
Each configuration's median of --repeat steps per round (the configurations in alternating order), then
the median over the kept rounds, in wall-clock and in process CPU time: on a shared host, CPU time at
--threads 1 measures the work itself (no spinning workers, no waiting for a core); wall-clock at
--threads 2 is what a server sees. A wave row's wait for its logits (its share of a time to first token)
is the whole run for every row of one run, the runs before its own and its own for one run per row.

    python -m benchmarks.decode.multi_row_append [--shapes small,gpt2-124m] [--rounds 3] [--threads 2]
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import onnxruntime as ort

from benchmarks.harness import cli, results
from benchmarks.harness.models import VOCAB
from benchmarks.harness.run import Run
from gptport.config import ModelConfig
from gptport.export import gqa_graph, scatter_graph
from gptport.preset import load_preset
from gptport.runtime.onnx_engine import session_options
from gptport.runtime.slots import StaticSlots

ROWS = 16
WAVE = (24, 64)  # tokens each row of a wave appends: uniform in [24, 64]
CAPACITY = {"small": 1024, "gpt2-124m": 2048}  # the larger n_ctx measured beside the preset's
HELD = {"small": 128, "gpt2-124m": 256}


def sessions(shape: str, n_ctx: int, threads: int) -> tuple[ModelConfig, Any, Any]:
    """The config and the two graphs' CPU sessions of seeded random weights of `shape` at `n_ctx`."""
    import torch

    from gptport.training.model import GPT

    cfg = ModelConfig(vocab_size=VOCAB[shape], **{**load_preset(shape).model, "n_ctx": n_ctx})
    torch.manual_seed(0)
    weights = {k: v.detach().numpy() for k, v in GPT(cfg).state_dict().items()}
    opts = session_options(threads, "step")
    out = [ort.InferenceSession(build(cfg, weights).SerializeToString(), opts, providers=["CPUExecutionProvider"])
           for build in (gqa_graph.build, scatter_graph.build)]
    del weights
    gc.collect()
    return cfg, out[0], out[1]


def median_ms(fn: Callable[[], Any], repeat: int) -> dict[str, float]:
    """Median wall-clock and process CPU ms of `fn` (CPU time: the work itself, however busy the host;
    with one thread it has no spinning workers in it)."""
    fn()  # warm
    wall, cpu = [], []
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return {"wall": statistics.median(wall) * 1e3, "cpu": statistics.median(cpu) * 1e3}


def decode_ms(slots: StaticSlots, batch: int, how: str, repeat: int, rng: np.random.Generator
              ) -> dict[str, float]:
    """A step of one token on each of rows 0..batch-1 (every one holding what it holds), put back after."""
    rows = list(range(batch))
    tokens = rng.integers(1, slots.vocab_size, batch)

    def step() -> None:
        if how == "gqa":
            slots.decode(rows, tokens)
        else:
            slots.append_many(rows, [tokens[i:i + 1] for i in range(batch)])
        slots.lengths[rows] -= 1  # back: every repeat steps the same shape
        slots.kept[rows] = slots.lengths[rows]

    return median_ms(step, repeat)


def wave_ms(slots: StaticSlots, held: np.ndarray, how: str, repeat: int, rng: np.random.Generator
            ) -> dict[str, float]:
    """16 rows each appending 24-64 tokens at their own length: one run, or one run per row. Besides the
    step's time, `first_wall` is the median over rows of the wall ms until the row's logits are there (its
    share of a time to first token): the whole step for every row of one run, the runs before it and its
    own for one run per row."""
    rows = list(range(ROWS))
    chunks = [rng.integers(1, slots.vocab_size, int(rng.integers(WAVE[0], WAVE[1] + 1))) for _ in rows]
    ready: list[list[float]] = []

    def step() -> None:
        t0, done = time.perf_counter(), []
        if how == "multi":
            slots.append_many(rows, chunks)
            done = [time.perf_counter() - t0] * ROWS
        else:
            for r, c in zip(rows, chunks, strict=True):
                slots.append(r, c)
                done.append(time.perf_counter() - t0)
        ready.append(done)
        for r in rows:
            slots.truncate(r, int(held[r]))

    out = median_ms(step, repeat)
    return out | {"first_wall": statistics.median(statistics.median(d) for d in ready[1:]) * 1e3}


def one_round(cfg: ModelConfig, gqa: Any, scatter: Any, held: int, repeat: int, rnd: Any
              ) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(rnd.index)
    slots = StaticSlots(gqa, cfg, ROWS, appender=scatter)
    slots.prefill_many(0, [rng.integers(1, cfg.vocab_size, held) for _ in range(ROWS)])
    out: dict[str, dict[str, float]] = {}
    for batch in (1, ROWS):
        for how in rnd.order(["gqa", "scatter"]):
            out[f"decode_b{batch}_{how}"] = decode_ms(slots, batch, how, repeat, rng)
    lengths = rng.integers(1, min(2 * held, cfg.n_ctx - WAVE[1]) + 1, ROWS)  # (16,) different offsets
    for r in range(ROWS):
        slots.free(r)
    slots.prefill_many(0, [rng.integers(1, cfg.vocab_size, int(n)) for n in lengths])
    for how in rnd.order(["multi", "one_row"]):
        out[f"wave_{how}"] = wave_ms(slots, lengths, how, max(3, repeat // 4), rng)
    return out


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--shapes", default="small,gpt2-124m")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=20, help="decode steps per configuration and round (waves: 1/4)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    run, rows = Run(), []
    series = [(shape, n_ctx) for shape in args.shapes.split(",")
              for n_ctx in (load_preset(shape).model["n_ctx"], CAPACITY[shape])]
    for shape, n_ctx in series:
        cfg, gqa, scatter = sessions(shape, n_ctx, args.threads)
        for rnd in run.series(args.rounds, shape=shape, n_ctx=n_ctx):
            rnd.data["ms"] = one_round(cfg, gqa, scatter, HELD[shape], args.repeat, rnd)
        del gqa, scatter
        gc.collect()
    for shape, n_ctx in series:  # once every round is judged
        kept = run.values("ms", shape=shape, n_ctx=n_ctx)
        for clock in ("cpu", "wall"):
            med = {k: statistics.median(r[k][clock] for r in kept) for k in kept[0]}
            rows.append({"shape": shape, "n_ctx": n_ctx, "held": HELD[shape], "clock": clock,
                         "kept_rounds": len(kept), **{f"{k}_ms": v for k, v in med.items()},
                         "wave_speedup": med["wave_one_row"] / med["wave_multi"],
                         "decode_b1_scatter_over_gqa": med["decode_b1_scatter"] / med["decode_b1_gqa"],
                         "decode_b16_scatter_over_gqa": med["decode_b16_scatter"] / med["decode_b16_gqa"]})
            if clock == "wall":  # a wave row's wait for its logits, median over rows
                med |= {f"{k}_first": statistics.median(r[k]["first_wall"] for r in kept)
                        for k in ("wave_multi", "wave_one_row")}
                rows[-1] |= {f"{k}_ms": med[k] for k in ("wave_multi_first", "wave_one_row_first")}
            print(f"\n{shape} n_ctx {n_ctx}, {clock} ms ({args.threads} threads, {len(kept)} kept rounds, "
                  f"rows holding {HELD[shape]})")
            for k, v in med.items():
                print(f"  {k:20} {v:9.2f}")
    results.write(results.document(results.benchmark_name(__spec__), run, rows, cli.settings(args),
                                   label=args.label), args.results)


if __name__ == "__main__":
    main()
