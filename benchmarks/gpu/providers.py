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
Each stage's outcome is recorded even when a later one fails. Writes
benchmarks/results/gpu-<gpu>.json naming the GPU and the CPU, and prints a table.

    python benchmarks/bench_gpu.py [--shapes small,gpt2-124m] [--steps 300] [--quantized]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from bench_serve import free_port, stop_server, wait_healthy

HERE = Path(__file__).resolve().parent
WORK = HERE / "work" / "gpu"
# gpt2-124m: GPT-2 small's layers with 32,768 tokens (the stdlib corpus runs out of BPE pairs before 50,257)
VOCAB = {"tiny": 1024, "small": 4096, "gpt2-124m": 32768}
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
        rows = parity(torch_model, model.step(), atol=1e-3) if precision == "fp32" else []
        got = generate(model, prompts, 64, Sampling(), -1)
        same = [a.new_ids == b.new_ids for a, b in zip(cpu_rows, got, strict=True)]
        first = [next((i for i, (x, y) in enumerate(zip(a.new_ids, b.new_ids, strict=True)) if x != y), 64)
                 for a, b in zip(cpu_rows, got, strict=True)]
        out[precision] = {"runs_on": model.session.get_providers(),
                          "parity_ok": all(r.ok for r in rows) if rows else None,
                          "max_abs_logits": max((r.max_logits for r in rows), default=None),
                          "max_abs_present": max((r.max_present for r in rows), default=None),
                          "top1": float(np.mean([r.top1 for r in rows])) if rows else None,
                          "parity": [r.__dict__ for r in rows],
                          "greedy_same_as_cpu_fp32": float(np.mean(same)), "first_difference_at": first}
    return out


def bench_rows(d: Path, providers: list[str], precisions: str, shape: str) -> list[dict[str, Any]]:
    path = WORK / f"bench-{shape}.json"
    gptport("bench", str(d), "--providers", ",".join(providers), "--precisions", precisions, "--batch", "1,8",
            "--kv-cache", "auto", "--gen-len", "128", "--repeat", "5", "--json", str(path), timeout=1800)
    return json.loads(path.read_text())["rows"]


def serving(d: Path, provider: str) -> dict[str, Any]:
    """`gptport serve --provider` under `gptport bench-serve` at 1 and 8 users, then stopped."""
    port, log = free_port(), WORK / f"serve-{provider}.log"
    url = f"http://127.0.0.1:{port}"
    with open(log, "wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "gptport.cli.main", "serve", str(d), "--provider", provider,
                                   "--port", str(port), "--slots", "8"], stdout=out, stderr=subprocess.STDOUT)
    try:
        try:
            wait_healthy(url, server)  # /health answers 200 once the model is loaded
        except SystemExit as e:  # a stage's failure is recorded, not the end of the run
            raise RuntimeError(f"{e}: {log.read_text()[-1500:]}") from None
        path = WORK / f"serve-{provider}.json"
        gptport("bench-serve", url, "--concurrency", "1,8", "--num-prompts", "32", "--max-tokens", "128",
                "--json", str(path), timeout=900)
        return json.loads(path.read_text())
    finally:
        stop_server(server)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="small,gpt2-124m")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--quantized", action="store_true", help="also int8 and int4 (their gates run on the CPU)")
    ap.add_argument("--no-serve", dest="serve", action="store_false")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--stages", default="prepare,accuracy,bench,serve", help="which stages run (prepare made "
                    "the model directories before, when left out)")
    args = ap.parse_args()

    import onnxruntime as ort

    from gptport.machine import describe, slug
    from gptport.runtime.providers import probe

    gpu = gpu_name()
    statuses = {p: probe(p).__dict__ for p in ("cpu", "cuda", "tensorrt")}
    result: dict[str, Any] = {"gpu": gpu, "machine": describe(), "onnxruntime": ort.__version__,
                              "providers": statuses, "shapes": {}}
    out = args.out / f"gpu-{slug(gpu.split(',')[0])}.json"
    gpus = [p for p in ("cuda", "tensorrt") if statuses[p]["ok"]]
    precisions = "fp32,fp16,int8,int4" if args.quantized else "fp32,fp16"

    def save() -> None:
        args.out.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, default=str) + "\n")

    for shape in args.shapes.split(","):
        got: dict[str, Any] = {}
        result["shapes"][shape] = got
        d = WORK / shape
        stages: list[tuple[str, Any]] = [("prepare", lambda s=shape: prepare(s, args.steps, precisions)[1])]
        for p in gpus:
            stages.append((f"accuracy {p}", lambda d=d, p=p: accuracy(d, p, precisions.split(","))))
        stages.append(("bench", lambda d=d, s=shape: bench_rows(d, ["cpu", *gpus], precisions, s)))
        if args.serve and "cuda" in gpus:
            stages.append(("serve cuda", lambda d=d: serving(d, "cuda")))
        for name, run in [(n, r) for n, r in stages if n.split()[0] in args.stages.split(",")]:
            print(f"== {shape}: {name}", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            try:
                got[name] = run()
            except Exception as e:  # a stage's failure is a finding: record it, go on with the next
                got[name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
                print(got[name]["error"], file=sys.stderr)
            got[f"{name} seconds"] = time.perf_counter() - t0
            save()
    print_table(result)
    print(f"wrote {out}")


def print_table(result: dict[str, Any]) -> None:
    print(f"\n{result['gpu']} · {result['machine']['cpu']} ({result['machine']['cores']} cores) · "
          f"onnxruntime {result['onnxruntime']}")
    for p, s in result["providers"].items():
        print(f"  {p:<9} {'yes' if s['ok'] else 'no ':<4} {s['reason']}")
    for shape, got in result["shapes"].items():
        print(f"\n{shape}")
        for key, value in got.items():
            if key.startswith("accuracy") and isinstance(value, dict) and "error" not in value:
                for precision, a in value.items():
                    check = ("parity not run" if a["parity_ok"] is None else
                             f"parity {'ok' if a['parity_ok'] else 'FAIL'} max|dlogits| {a['max_abs_logits']:.2e} "
                             f"top1 {a['top1']:.3f}")
                    print(f"  {key} {precision:<5} {check} greedy=cpu {a['greedy_same_as_cpu_fp32']:.2f} "
                          f"first diff {a['first_difference_at']}")
            elif isinstance(value, dict) and "error" in value:
                print(f"  {key}: {value['error'][:300]}")
        rows = got.get("bench")
        if isinstance(rows, list):
            print(f"  {'engine':<6} {'provider':<9} {'precision':<9} {'batch':>5} {'prefill tok/s':>14} "
                  f"{'decode tok/s':>13}")
            for r in rows:
                pre, dec = r.get("prefill_tok_s"), r.get("decode_tok_s")
                print(f"  {r.get('engine', ''):<6} {r.get('provider', ''):<9} {r.get('precision', ''):<9} "
                      f"{r.get('batch', ''):>5} {'' if pre is None else f'{pre:,.0f}':>14} "
                      f"{'' if dec is None else f'{dec:,.0f}':>13} {r.get('error') or ''}")
        served = got.get("serve cuda")
        if isinstance(served, dict) and "error" not in served:
            for r in served.get("results", []):
                keys = {k: r.get(k) for k in ("concurrency", "completed", "failed", "output_throughput",
                                              "median_ttft_ms", "median_tpot_ms")}
                print("  serve cuda " + " ".join(f"{k}={v}" for k, v in keys.items()))


if __name__ == "__main__":
    shutil.which("nvidia-smi") or print("no nvidia-smi here: the GPU rows will say why", file=sys.stderr)
    main()
