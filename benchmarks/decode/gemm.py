"""The CPU's GEMM ceiling at the `small` shape: how fast onnxruntime's MatMul kernels run the
prefill's and the decode's matrix products, with the weights in the L3 cache and streaming from
memory. It bounds what any graph change can give a prefill (see ARCHITECTURE.md).

A chain of `--layers` MLP pairs (d -> 4d -> d, d = 384) with distinct weights (fp32: 4.7 MB per pair;
12 pairs, 57 MB, exceed a 32 MB L3) or one pair repeated (in cache), per kernel: fp32 MatMul,
MatMulNBits 8-bit block 32 / 128 (int8 compute), and dynamic int8 (DynamicQuantizeMatMul), at
M = 1 (decode) and M = 64 (a 64-token prefill). Writes benchmarks/results/gemm-<cpu>.json (gemm.json:
an earlier session's machine, whose CPU name it does not record; its fp32 rates imply AVX-512).

    python benchmarks/bench_gemm.py [--layers 12] [--threads 2] [--repeat 50]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from gptport import contract
from gptport.export import variants
from gptport.machine import describe, slug

HERE = Path(__file__).resolve().parent
D = 384


def chain(layers: int, distinct: int, seed: int = 0) -> onnx.ModelProto:
    """x (1, M, D) through `layers` MLP pairs whose weights repeat every `distinct` pairs. The last
    output is named logits (the quantizers look for the head by that name)."""
    rng = np.random.default_rng(seed)
    inits, nodes, x = [], [], "x"
    for i in range(layers):
        up, down = f"W{i % distinct}_up", f"W{i % distinct}_down"
        if i < distinct:
            inits += [numpy_helper.from_array((rng.standard_normal((D, 4 * D)) * 0.02).astype(np.float32), up),
                      numpy_helper.from_array((rng.standard_normal((4 * D, D)) * 0.02).astype(np.float32), down)]
        out = contract.LOGITS if i == layers - 1 else f"y{i}"
        nodes += [helper.make_node("MatMul", [x, up], [f"h{i}"]), helper.make_node("MatMul", [f"h{i}", down], [out])]
        x = out
    graph = helper.make_graph(nodes, "gemm_chain", [helper.make_tensor_value_info("x", 1, [1, "M", D])],
                              [helper.make_tensor_value_info(x, 1, [1, "M", D])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def variant(src: Path, kind: str, dst: Path) -> Path:
    """The chain at `src` with its weights quantized by the scheme `kind` (fp32: as it is)."""
    if kind == "fp32":
        return src
    variants.quantize(src, dst, variants.SCHEMES[kind])
    return dst


def time_ms(session: ort.InferenceSession, m: int, repeat: int) -> float:
    x = np.random.default_rng(1).standard_normal((1, m, D)).astype(np.float32) * 0.1
    session.run(None, {"x": x})
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        session.run(None, {"x": x})
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    flop_per_token = args.layers * 2 * 2 * D * 4 * D
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for placement, distinct in (("in cache", 1), ("from memory", args.layers)):
            src = Path(tmp) / f"chain-{distinct}.onnx"
            onnx.save(chain(args.layers, distinct), str(src))
            for kind in ("fp32", "nbits8-b32-acc4", "nbits8-b128-acc4", "dynamic-int8"):
                path = variant(src, kind, Path(tmp) / f"chain-{distinct}-{kind}.onnx")
                opts = ort.SessionOptions()
                opts.intra_op_num_threads = args.threads
                opts.log_severity_level = 3
                session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
                for m in (1, 64):
                    ms = time_ms(session, m, args.repeat)
                    rows.append({"kernel": kind, "weights": placement, "weight_mb": path.stat().st_size / 1e6,
                                 "m": m, "ms": ms, "gflop_s": flop_per_token * m / ms / 1e6})
                    r = rows[-1]
                    print(f"{kind:<18}{placement:<13}{r['weight_mb']:>7.1f} MB  M={m:<3}{ms:>8.3f} ms "
                          f"{r['gflop_s']:>8.1f} GFLOP/s")
    result = {"benchmark": "onnxruntime CPU GEMM ceiling at d=384 (small)", "layers": args.layers,
              "threads": args.threads, "machine": describe(),
              "versions": {"onnxruntime": ort.__version__}, "rows": rows}
    out = HERE / "results" / f"gemm-{slug(result['machine']['cpu'])}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
