"""OpenVINO beside onnxruntime's CPU provider on the same graphs: decode and prefill tokens/s of
`gptport bench --providers cpu,openvino` (the contract graph exported with --no-optimize, fp32 and int8,
batch 1, 2 threads) in an environment with onnxruntime-openvino (requirements-openvino.txt; made under
benchmarks/work/ when missing), and the CPU provider of gptport's own environment (onnxruntime-gpu) on the
same files. Random weights of each preset's shape (bench_decode.py's): speed does not depend on them.
Writes benchmarks/results/openvino-<cpu>.json.

    python benchmarks/bench_openvino.py [--shapes tiny,small] [--venv DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_decode import random_weights
from bench_tokenizer import big_corpus

from gptport.machine import describe, slug

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORK = HERE / "work" / "openvino"


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
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([python, "-m", "gptport", "bench", str(d), "--providers", providers, "--precisions", "fp32,int8",
                        "--kv-cache", "concat", "--batch", "1", "--prompt-len", "64", "--gen-len", "128",
                        "--threads", "2", "--repeat", "5", "--no-torch-baseline", "--json", f.name],
                       check=True, capture_output=True, text=True)
        result = json.loads(Path(f.name).read_text())
    for row in result["rows"]:
        v = result["versions"]
        row["onnxruntime"] = v.get("onnxruntime-openvino") or v.get("onnxruntime-gpu") or v.get("onnxruntime") or "?"
    return result["rows"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="tiny,small")
    ap.add_argument("--venv", type=Path, default=WORK / "venv")
    args = ap.parse_args()
    python = str(venv(args.venv))
    rows = []
    for shape in [s.strip() for s in args.shapes.split(",") if s.strip()]:
        d = WORK / shape
        if not (d / "model.int8.onnx").exists():
            random_weights(d, shape, big_corpus())
            subprocess.run([sys.executable, "-m", "gptport", "export", str(d), "--precision", "fp32,int8",
                            "--no-optimize", "--no-static", "--no-gate", "--force"], check=True, capture_output=True)
        for env, py, providers in (("openvino venv", python, "cpu,openvino"), ("gptport venv", sys.executable, "cpu")):
            for row in bench(py, d, providers):
                rows.append({"shape": shape, "environment": env, "provider": row["provider"],
                             "precision": row["precision"], "onnxruntime": row["onnxruntime"],
                             "decode_tok_s": row["decode_tok_s"], "prefill_tok_s": row["prefill_tok_s"],
                             "error": row["error"]})
    host = describe()
    out = HERE / "results" / f"openvino-{slug(host['cpu'])}.json"
    out.write_text(json.dumps({"machine": host, "rows": rows}, indent=2) + "\n")
    print(f"{host['cpu']} ({host['cores']} cores), batch 1, prompt 64, 128 new tokens, 2 threads, contract graph")
    print(f"{'shape':6} {'provider':9} {'precision':9} {'onnxruntime':12} {'decode tok/s':>13} {'prefill tok/s':>14}")
    for r in rows:
        dec = f"{r['decode_tok_s']:,.0f}" if r["decode_tok_s"] else r["error"]
        pre = f"{r['prefill_tok_s']:,.0f}" if r["prefill_tok_s"] else "-"
        print(f"{r['shape']:6} {r['provider']:9} {r['precision']:9} {r['onnxruntime']:12} {dec:>13} {pre:>14}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
