"""The CPU's GEMM ceiling at the `small` shape: how fast onnxruntime's MatMul kernels run the
prefill's and the decode's matrix products, with the weights in the L3 cache and streaming from
memory. It bounds what any graph change can give a prefill (see ARCHITECTURE.md).

A chain of `--layers` MLP pairs (d -> ffn -> d; d = 384, ffn = 4d by default) with distinct weights (fp32:
4.7 MB per pair at d 384; 12 pairs, 57 MB, exceed a 32 MB L3) or one pair repeated (in cache), per kernel:
fp32 MatMul, MatMulNBits 8-bit block 32 / 128 (int8 compute), and dynamic int8 (DynamicQuantizeMatMul), at
M = 1 (decode) and M = 64 (a 64-token prefill); rounds rotate the kernels' order. `--d 576 --ffn 1536
--m 1,16,64 --kernels fp32,nbits8-b16-acc4,nbits8-b32-acc4,dynamic-int8` is SmolLM2-135M's MLP, with the
16 rows of a serving step and the 8-bit blocks its int8 graphs ship (16 and 32); `w8a8` is the per-token
int8 scheme (MatMulInteger, gptport/export/w8a8.py).

    python -m benchmarks.decode.gemm [--layers 12] [--threads 2] [--repeat 50] [--rounds 2] [--d 384] [--ffn 1536]
"""

from __future__ import annotations

import re
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from benchmarks.harness import cli, results
from benchmarks.harness.run import Run
from gptport import contract
from gptport.export import variants

D = 384
KERNELS = "fp32,nbits8-b32-acc4,nbits8-b128-acc4,dynamic-int8"


def chain(layers: int, distinct: int, seed: int = 0, d: int = D, ffn: int = 4 * D) -> onnx.ModelProto:
    """x (1, M, d) through `layers` MLP pairs (d -> ffn -> d) whose weights repeat every `distinct` pairs. The
    last output is named logits (the quantizers look for the head by that name)."""
    rng = np.random.default_rng(seed)
    inits, nodes, x = [], [], "x"
    for i in range(layers):
        up, down = f"W{i % distinct}_up", f"W{i % distinct}_down"
        if i < distinct:
            inits += [numpy_helper.from_array((rng.standard_normal((d, ffn)) * 0.02).astype(np.float32), up),
                      numpy_helper.from_array((rng.standard_normal((ffn, d)) * 0.02).astype(np.float32), down)]
        out = contract.LOGITS if i == layers - 1 else f"y{i}"
        nodes += [helper.make_node("MatMul", [x, up], [f"h{i}"]), helper.make_node("MatMul", [f"h{i}", down], [out])]
        x = out
    graph = helper.make_graph(nodes, "gemm_chain", [helper.make_tensor_value_info("x", 1, [1, "M", d])],
                              [helper.make_tensor_value_info(x, 1, [1, "M", d])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


def variant(src: Path, kind: str, dst: Path) -> Path:
    """The chain at `src` with its weights quantized by the scheme `kind` (fp32: as it is): one of the variants'
    schemes, or nbitsB-bK-accL."""
    if kind == "fp32":
        return src
    scheme = variants.SCHEMES.get(kind)
    if scheme is None:  # nbitsB-bK-accL: MatMulNBits of B bits, blocks of K, accuracy level L
        match = re.fullmatch(r"nbits(\d+)-b(\d+)-acc(\d+)", kind)
        if match is None:
            raise SystemExit(f"--kernels {kind!r}: fp32, a scheme of {', '.join(variants.SCHEMES)}, or nbitsB-bK-accL")
        bits, block, level = (int(g) for g in match.groups())
        scheme = variants.Scheme(kind, bits=bits, block=block, accuracy_level=level)
    variants.quantize(src, dst, scheme)
    return dst


def time_ms(session: ort.InferenceSession, m: int, repeat: int, d: int = D) -> float:
    x = np.random.default_rng(1).standard_normal((1, m, d)).astype(np.float32) * 0.1  # (1, M, d)
    session.run(None, {"x": x})
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        session.run(None, {"x": x})
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--d", type=int, default=D, help="the model's width")
    ap.add_argument("--ffn", type=int, default=0, help="the MLP's width (default 4 d)")
    ap.add_argument("--m", default="1,64", help="rows per product, comma-separated")
    ap.add_argument("--kernels", default=KERNELS, help="comma-separated, of fp32 and the variants' schemes")
    args = ap.parse_args()
    ffn = args.ffn or 4 * args.d
    ms_ = [int(m) for m in args.m.split(",")]
    flop_per_token = args.layers * 2 * 2 * args.d * ffn
    run = Run()
    sessions: dict[tuple[str, str], tuple[ort.InferenceSession, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for placement, distinct in (("in cache", 1), ("from memory", args.layers)):
            src = Path(tmp) / f"chain-{distinct}.onnx"
            onnx.save(chain(args.layers, distinct, d=args.d, ffn=ffn), str(src))
            for kind in args.kernels.split(","):
                path = variant(src, kind, Path(tmp) / f"chain-{distinct}-{kind}.onnx")
                opts = ort.SessionOptions()
                opts.intra_op_num_threads = args.threads
                opts.log_severity_level = 3
                sessions[(kind, placement)] = (ort.InferenceSession(str(path), opts,
                                                                    providers=["CPUExecutionProvider"]),
                                               path.stat().st_size / 1e6)
        for rnd in run.series(args.rounds):
            for kind, placement in rnd.rotation(list(sessions)):
                for m in ms_:
                    rnd.data[f"{kind} {placement} M={m}"] = time_ms(sessions[(kind, placement)][0], m, args.repeat,
                                                                    args.d)
    rows = []
    for (kind, placement), (_, mb) in sessions.items():
        for m in ms_:
            ms = statistics.median(run.values(f"{kind} {placement} M={m}"))
            rows.append({"kernel": kind, "weights": placement, "weight_mb": mb, "m": m, "ms": ms,
                         "gflop_s": flop_per_token * m / ms / 1e6})
            print(f"{kind:<18}{placement:<13}{mb:>7.1f} MB  M={m:<3}{ms:>8.3f} ms {rows[-1]['gflop_s']:>8.1f} GFLOP/s")
    settings = cli.settings(args, d_model=args.d, ffn=ffn)
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label=args.label),
                  args.results)


if __name__ == "__main__":
    main()
