"""The int8 KV cache's step times: a 16-row decode step of the static graph with a float32 cache and
with an int8 cache (both scale kinds, kv_quant.rewrite) at several cached lengths, for the `small` and
`gpt2-124m` shapes of bench_serve.py (random weights; scales calibrated on one window, which does not
change the time). Two rounds, the faster kept, 2 threads. What bounds `serve --kv-dtype int8`'s gain:
the step's share that reads the cache.

    python benchmarks/bench_kv_cache.py [--shapes small,gpt2-124m]
Writes benchmarks/results/kv-cache-steps.json naming the CPU.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_serve import model_dir
from bench_tokenizer import big_corpus

from gptport.export import kv_quant
from gptport.machine import describe
from gptport.runtime.onnx_engine import OnnxModel, load_cpu
from gptport.runtime.slots import StaticSlots

HERE = Path(__file__).resolve().parent
ROWS, LENGTHS = 16, (64, 128, 192, 256, 512, 1000)


def step_ms(model: OnnxModel, held: int, repeat: int = 20) -> float:
    """Median ms of a ROWS-row decode step with `held` positions in every row."""
    cfg = model.config
    slots = StaticSlots(model.session, cfg, ROWS, model.kv_dtype)
    ids = np.arange(1, held + 1, dtype=np.int64) % cfg.vocab_size
    for r in range(ROWS):
        slots.append(r, ids)
    times = []
    for _ in range(repeat + 5):
        slots.lengths[:] = held
        t0 = time.perf_counter()
        slots.decode(list(range(ROWS)), np.ones(ROWS, dtype=np.int64))
        times.append(time.perf_counter() - t0)
    return float(np.median(times[5:]) * 1e3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="small,gpt2-124m")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    result: dict[str, object] = {"machine": describe(), "rows": ROWS, "threads": args.threads, "shapes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for shape in args.shapes.split(","):
            d = model_dir(shape, big_corpus(), False)
            fp32 = load_cpu(d / "model.static.onnx", threads=args.threads)
            cfg = fp32.config
            amax = kv_quant.calibrate(fp32, np.stack([np.arange(1, 129) % cfg.vocab_size]))
            graphs = {"float32": fp32}
            for kind in kv_quant.KINDS:
                out = Path(tmp) / f"{shape}-{kind}.onnx"
                kv_quant.rewrite(d / "model.static.onnx", out, *amax, kind, dict(fp32.meta))
                graphs[kind.lower()] = load_cpu(out, threads=args.threads)
            table: dict[int, dict[str, float]] = {}
            for held in (n for n in LENGTHS if n < cfg.n_ctx):
                times = {name: min(step_ms(m, held) for _ in range(2)) for name, m in graphs.items()}
                table[held] = {k: round(v, 3) for k, v in times.items()}
                best = min(times["per_tensor"], times["per_channel"])
                print(f"{shape} {held:>5} positions: float32 {times['float32']:.2f} ms, int8 per-tensor "
                      f"{times['per_tensor']:.2f}, per-channel {times['per_channel']:.2f} "
                      f"({times['float32'] / best:.2f}x)", flush=True)
            result["shapes"][shape] = {"n_ctx": cfg.n_ctx, "step_ms": table}  # type: ignore[index]
    (HERE / "results" / "kv-cache-steps.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
