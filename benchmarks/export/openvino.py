"""OpenVINO beside onnxruntime's CPU provider on the same graphs: decode and prefill tokens/s of
`gptport bench --providers cpu,openvino` (the contract graph exported with --no-optimize, fp32 and int8,
batch 1, 2 threads) in an environment with onnxruntime-openvino (requirements-openvino.txt; made under
benchmarks/work/ when missing), and the CPU provider of gptport's own environment (onnxruntime-gpu) on the
same files, in rounds that alternate the two environments. Random weights of each preset's shape: speed
does not depend on them.

    python -m benchmarks.export.openvino [--shapes tiny,small] [--rounds 2] [--venv DIR]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, results
from benchmarks.harness.models import ROOT, WORK, random_weights
from benchmarks.harness.run import Run

OPENVINO = WORK / "openvino"


def venv(path: Path) -> Path:
    """The OpenVINO environment's python, made once."""
    python = path / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(ROOT / "requirements-openvino.txt")],
                       check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "-e", str(ROOT)], check=True)
    return python


def bench(python: str, d: Path, providers: str) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.json"
        subprocess.run([python, "-m", "gptport", "bench", str(d), "--providers", providers, "--precisions", "fp32,int8",
                        "--kv-cache", "concat", "--batch", "1", "--prompt-len", "64", "--gen-len", "128",
                        "--threads", "2", "--repeat", "5", "--no-torch-baseline", "--json", str(path)],
                       check=True, capture_output=True, text=True)
        result = json.loads(path.read_text())
    v = result["versions"]
    ort = v.get("onnxruntime-openvino") or v.get("onnxruntime-gpu") or v.get("onnxruntime") or "?"
    return [{"provider": r["provider"], "precision": r["precision"], "onnxruntime": ort,
             "decode_tok_s": r["decode_tok_s"], "prefill_tok_s": r["prefill_tok_s"], "error": r["error"]}
            for r in result["rows"]]


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--shapes", default="tiny,small")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--venv", type=Path, default=OPENVINO / "venv")
    args = ap.parse_args()
    envs = {"openvino venv": (str(venv(args.venv)), "cpu,openvino"), "gptport venv": (sys.executable, "cpu")}
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    run = Run()
    for shape in shapes:
        d = OPENVINO / shape
        if not (d / "model.int8.onnx").exists():
            random_weights(d, shape)
            subprocess.run([sys.executable, "-m", "gptport", "export", str(d), "--precision", "fp32,int8",
                            "--no-optimize", "--no-static", "--no-gate", "--force"], check=True, capture_output=True)
        run.interleaved(args.rounds, list(envs), lambda env, _rnd, d=d: bench(envs[env][0], d, envs[env][1]),
                        shape=shape)
    rows = []
    for shape in shapes:
        for env in envs:
            measured = run.values(env, shape=shape)
            for i, first in enumerate(measured[0]):
                got = [m[i] for m in measured]
                ok = [g for g in got if not g["error"]]
                rows.append({"shape": shape, "environment": env, **{k: first[k] for k in ("provider", "precision",
                                                                                             "onnxruntime")},
                             "decode_tok_s": statistics.median(g["decode_tok_s"] for g in ok) if ok else None,
                             "prefill_tok_s": statistics.median(g["prefill_tok_s"] for g in ok) if ok else None,
                             "error": None if ok else first["error"]})
    print(f"{'shape':6} {'provider':9} {'precision':9} {'onnxruntime':12} {'decode tok/s':>13} {'prefill tok/s':>14}")
    for r in rows:
        dec = f"{r['decode_tok_s']:,.0f}" if r["decode_tok_s"] else r["error"]
        pre = f"{r['prefill_tok_s']:,.0f}" if r["prefill_tok_s"] else "-"
        print(f"{r['shape']:6} {r['provider']:9} {r['precision']:9} {r['onnxruntime']:12} {dec:>13} {pre:>14}")
    settings = cli.settings(args, batch=1, prompt=64, gen=128, threads=2, graph="contract graph (model*.onnx), "
                            "--no-optimize, int8 --no-gate")
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label=args.label),
                  args.results)


if __name__ == "__main__":
    main()
