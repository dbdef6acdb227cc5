"""The int8 KV cache's step times: a 16-row decode step of the static graph with a float32 cache and
with an int8 cache (both scale kinds, kv_quant.rewrite) at several cached lengths, for the `small` and
`gpt2-124m` shapes of the serving benchmarks (random weights; scales calibrated on one window, which does
not change the time), in rounds that alternate the graphs' order, 2 threads. What bounds
`serve --kv-dtype int8`'s gain: the step's share that reads the cache.

    python -m benchmarks.decode.kv_cache [--shapes small,gpt2-124m] [--rounds 2]
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.harness import cli, results
from benchmarks.harness.models import serve_model
from benchmarks.harness.run import Run
from gptport.export import kv_quant
from gptport.runtime.onnx_engine import load_cpu

ROWS, LENGTHS = 16, (64, 128, 192, 256, 512, 1000)


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--shapes", default="small,gpt2-124m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    run, rows = Run(), []
    lengths: dict[str, list[int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes.split(","):
            d = serve_model(shape)
            fp32 = load_cpu(d / "model.static.onnx", threads=args.threads)
            cfg = fp32.config
            amax = kv_quant.calibrate(fp32, np.stack([np.arange(1, 129) % cfg.vocab_size]))
            graphs = {"float32": fp32}
            for kind in kv_quant.KINDS:
                out = Path(tmp) / f"{shape}-{kind}.onnx"
                kv_quant.rewrite(d / "model.static.onnx", out, *amax, kind, dict(fp32.meta))
                graphs[kind.lower()] = load_cpu(out, threads=args.threads)
            lengths[shape] = [n for n in LENGTHS if n < cfg.n_ctx]
            for rnd in run.series(args.rounds, shape=shape):
                for name in rnd.order(list(graphs)):
                    rnd.data[name] = {str(held): kv_quant.step_ms(graphs[name], ROWS, 20, held)
                                      for held in lengths[shape]}
    for shape, held_lengths in lengths.items():  # once every round is judged
        for held in held_lengths:
            times = {name: statistics.median(v[str(held)] for v in run.values(name, shape=shape))
                     for name in ("float32", "per_tensor", "per_channel")}
            best = min(times["per_tensor"], times["per_channel"])
            rows.append({"shape": shape, "positions": held, "float32_ms": times["float32"],
                         "int8_per_tensor_ms": times["per_tensor"], "int8_per_channel_ms": times["per_channel"],
                         "float32_over_int8": times["float32"] / best})
            print(f"{shape} {held:>5} positions: float32 {times['float32']:.2f} ms, int8 per-tensor "
                  f"{times['per_tensor']:.2f}, per-channel {times['per_channel']:.2f} "
                  f"({times['float32'] / best:.2f}x)", flush=True)
    results.write(results.document(results.benchmark_name(__spec__), run, rows, cli.settings(args, rows=ROWS),
                                   label=args.label), args.results)


if __name__ == "__main__":
    main()
