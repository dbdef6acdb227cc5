"""gptport on an NVIDIA GPU: what the CUDA and TensorRT providers give against torch and against the CPU.

For each shape (`small`, vocabulary 4,096; `gpt2-124m`, here 32,768): a tokenizer and a model trained for a
few hundred steps on the Python standard library's sources (`gptport demo`'s corpus: no data needed;
on the GPU when torch sees one), exported to fp32 and fp16 (and int8/int4 with --quantized). Then, for
each provider that really initialises here:
- parity: the fp32 graph's logits and cache against torch's (float32, on the CPU), the export gate's
  cases (`gptport.export.validate.parity`); fp16's differences reported beside them;
- greedy text: 4 prompts x 64 new tokens on the provider against the CPU provider's fp32 tokens;
- speed: `gptport bench` rows (prefill and decode tok/s, batch 1 and 8) for cpu and the GPU providers,
  torch eager beside them on the same device;
- serving: `gptport serve --provider cuda` under `gptport bench-serve` (1 and 8 users).
Each stage's outcome is recorded even when a later one fails; the results file (named after the GPU) is
written after each shape, one round per shape.

    python -m benchmarks.gpu.providers [--shapes small,gpt2-124m] [--steps 300] [--quantized]
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, results
from benchmarks.harness.models import WORK as ROOT_WORK
from benchmarks.harness.run import Run
from tests.support import server_proc

WORK = ROOT_WORK / "gpu"
# gpt2-124m: GPT-2 small's layers with 32,768 tokens (the stdlib corpus runs out of BPE pairs before 50,257)
VOCAB = {"tiny": 1024, "small": 4096, "gpt2-124m": 32768, "smollm2-shape": 32768}
PROMPTS = ["def ", "import os\n", "class Parser:\n    def __init__(self", "# Copyright"]


def gptport(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    run = subprocess.run([sys.executable, "-m", "gptport.cli.main", *args], capture_output=True, text=True,
                         timeout=timeout)
    if run.returncode != 0:
        raise RuntimeError(f"gptport {' '.join(args)} failed ({run.returncode}): {run.stderr.strip()[-1500:]}")
    return run


def gpu_name() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "no GPU"
    return out.splitlines()[0] if out else "no GPU"


def corpus_file() -> Path:
    """The standard library's sources as one text file (the demo's corpus), made once."""
    path = WORK / "stdlib.txt"
    if not path.exists():
        from gptport.corpus import default_corpus

        WORK.mkdir(parents=True, exist_ok=True)
        sources, _ = default_corpus()
        with open(path, "w", encoding="utf-8") as f:
            for s in sources:
                assert s.path is not None
                f.write(Path(s.path).read_text(encoding="utf-8") + "\n")
    return path


def prepare(shape: str, steps: int, precisions: str) -> tuple[Path, dict[str, Any]]:
    """A trained, exported model directory of the preset's shape, and how long each stage took."""
    d, corpus, took = WORK / shape, corpus_file(), {}
    t0 = time.perf_counter()
    if not (d / "tokenizer.json").exists():
        gptport("train-tokenizer", str(corpus), "--vocab-size", str(VOCAB[shape]), "--out", str(d), "--force")
    took["tokenizer_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    if not (d / "model.safetensors").exists():
        gptport("train", str(corpus), "--model-dir", str(d), "--preset", shape, "--steps", str(steps),
                "--batch-size", "16", "--device", "auto", timeout=1800)
    took["train_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    gptport("export", str(d), "--precision", precisions, "--force", timeout=1800)
    took["export_s"] = time.perf_counter() - t0
    return d, took


def accuracy(d: Path, provider: str, precisions: list[str]) -> dict[str, Any]:
    """Parity against torch and greedy tokens against the CPU provider, per precision."""
    import numpy as np

    from gptport import contract
    from gptport import tokenizer as bpe
    from gptport.export.tolerance import GPU_TOL
    from gptport.export.validate import parity
    from gptport.runtime.generate import generate
    from gptport.runtime.onnx_engine import load
    from gptport.runtime.sampling import Sampling
    from gptport.training.checkpoint import load_model

    tok = bpe.load(d)
    torch_model, _ = load_model(d, tok)
    prompts = [tok.encode(p) for p in PROMPTS]
    cpu_rows = generate(load(d / contract.onnx_file("fp32"), "cpu"), prompts, 64, Sampling(), -1)
    out: dict[str, Any] = {}
    for precision in precisions:
        model = load(d / contract.onnx_file(precision), provider)
        # parity feeds float32 caches: the fp32 graph's check (fp16 is judged by its greedy tokens)
        rows = parity(torch_model, model.step(), GPU_TOL) if precision == "fp32" else []
        got = generate(model, prompts, 64, Sampling(), -1)
        same = [a.new_ids == b.new_ids for a, b in zip(cpu_rows, got, strict=True)]
        first = [next((i for i, (x, y) in enumerate(zip(a.new_ids, b.new_ids, strict=True)) if x != y), 64)
                 for a, b in zip(cpu_rows, got, strict=True)]
        out[precision] = {"runs_on": model.session.get_providers(),
                          "parity_ok": all(r.ok for r in rows) if rows else None,
                          "max_abs_logits": max((r.max_logits for r in rows), default=None),
                          "max_abs_present": max((r.max_present for r in rows), default=None),
                          "top1": float(np.mean([r.top1 for r in rows])) if rows else None,
                          "parity": [{"case": r.case, "top1": r.top1, "worst": r.worst.describe(),
                                      "checks": [c.__dict__ for c in r.checks]} for r in rows],
                          "greedy_same_as_cpu_fp32": float(np.mean(same)), "first_difference_at": first}
    return out


def bench_rows(d: Path, providers: list[str], precisions: str, shape: str) -> list[dict[str, Any]]:
    path = WORK / f"bench-{shape}.json"
    gptport("bench", str(d), "--providers", ",".join(providers), "--precisions", precisions, "--batch", "1,8",
            "--kv-cache", "auto", "--gen-len", "128", "--repeat", "5", "--json", str(path), timeout=1800)
    return json.loads(path.read_text())["rows"]


def serving(d: Path, provider: str) -> dict[str, Any]:
    """`gptport serve --provider` under `gptport bench-serve` at 1 and 8 users, then stopped."""
    port, log = server_proc.free_port(), WORK / f"serve-{provider}.log"
    url = server_proc.url_of(port)
    cmd = [sys.executable, "-m", "gptport.cli.main", "serve", str(d), "--provider", provider, "--port", str(port),
           "--slots", "8"]
    with server_proc.running(cmd, url, log):  # a failure to start is recorded by the caller, with the log's end
        path = WORK / f"serve-{provider}.json"
        gptport("bench-serve", url, "--concurrency", "1,8", "--num-prompts", "32", "--max-tokens", "128",
                "--json", str(path), timeout=900)
        return dict(json.loads(path.read_text()))


def table_rows(shape: str, got: dict[str, Any]) -> list[dict[str, Any]]:
    """The shape's speed, accuracy and serving rows from its stages' outcomes."""
    rows: list[dict[str, Any]] = []
    if isinstance(got.get("bench"), list):
        rows += [{"table": "speed", "shape": shape, **{k: r.get(k) for k in ("engine", "provider", "precision",
                                                                              "batch", "prefill_tok_s",
                                                                              "decode_tok_s", "error")}}
                 for r in got["bench"]]
    for key, value in got.items():
        if key.startswith("accuracy") and isinstance(value, dict) and "error" not in value:
            rows += [{"table": "accuracy", "shape": shape, "provider": key.split()[1], "precision": precision,
                      **{k: a[k] for k in ("parity_ok", "max_abs_logits", "top1", "greedy_same_as_cpu_fp32")}}
                     for precision, a in value.items()]
    served = got.get("serve cuda")
    if isinstance(served, dict) and "error" not in served:
        rows += [{"table": "serving", "shape": shape, "provider": "cuda", **{k: r.get(k) for k in (
            "concurrency", "completed", "failed", "output_throughput", "median_ttft_ms", "median_tpot_ms")}}
                 for r in served.get("results", [])]
    rows += [{"table": "failed stages", "shape": shape, "stage": k, "error": v["error"][:300]}
             for k, v in got.items() if isinstance(v, dict) and "error" in v]
    return rows


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--shapes", default="small,gpt2-124m")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--quantized", action="store_true", help="also int8 and int4 (their gates run on the CPU)")
    ap.add_argument("--no-serve", dest="serve", action="store_false")
    ap.add_argument("--stages", default="prepare,accuracy,bench,serve", help="which stages run (prepare made "
                    "the model directories before, when left out)")
    args = ap.parse_args()

    from gptport.runtime.providers import probe

    gpu = gpu_name()
    statuses = {p: probe(p).__dict__ for p in ("cpu", "cuda", "tensorrt")}
    gpus = [p for p in ("cuda", "tensorrt") if statuses[p]["ok"]]
    precisions = "fp32,fp16,int8,int4" if args.quantized else "fp32,fp16"
    run = Run()
    rows: list[dict[str, Any]] = []
    for shape in args.shapes.split(","):
        d = WORK / shape
        stages: list[tuple[str, Any]] = [("prepare", lambda s=shape: prepare(s, args.steps, precisions)[1])]
        for p in gpus:
            stages.append((f"accuracy {p}", lambda d=d, p=p: accuracy(d, p, precisions.split(","))))
        stages.append(("bench", lambda d=d, s=shape: bench_rows(d, ["cpu", *gpus], precisions, s)))
        if args.serve and "cuda" in gpus:
            stages.append(("serve cuda", lambda d=d: serving(d, "cuda")))
        with run.round(shape=shape) as rnd:
            for name, stage in [(n, r) for n, r in stages if n.split()[0] in args.stages.split(",")]:
                print(f"== {shape}: {name}", file=sys.stderr, flush=True)
                t0 = time.perf_counter()
                try:
                    rnd.data[name] = stage()
                except Exception as e:  # a stage's failure is a finding: record it, go on with the next
                    rnd.data[name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
                    print(rnd.data[name]["error"], file=sys.stderr)
                rnd.data[f"{name} seconds"] = time.perf_counter() - t0
        rows += table_rows(shape, rnd.data)
        results.write(results.document(results.benchmark_name(__spec__), run, rows, cli.settings(args),
                                       gpu=None if gpu == "no GPU" else gpu, label=args.label,
                                       details={"gpu": gpu, "providers": statuses}),
                      args.results)
    print_table(gpu, statuses, rows)


def print_table(gpu: str, statuses: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    print(f"\n{gpu}")
    for p, s in statuses.items():
        print(f"  {p:<9} {'yes' if s['ok'] else 'no ':<4} {s['reason']}")
    for r in rows:
        print("  " + " ".join(f"{k}={v}" for k, v in r.items() if v is not None))


if __name__ == "__main__":
    shutil.which("nvidia-smi") or print("no nvidia-smi here: the GPU rows will say why", file=sys.stderr)
    main()
