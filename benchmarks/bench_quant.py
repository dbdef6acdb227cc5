"""Weight-quantization schemes of onnxruntime, side by side: accuracy gate and CPU decode speed.

For a trained model directory (default: the one bench_train.py leaves), every scheme in
gptport.variants.SCHEMES is made from model.onnx, checked against fp32 torch on held-out text (top-1
agreement, mean KL) and timed decoding at batch 1 (prompt 64, --gen new tokens, 2 threads). The
fastest scheme that passes the gate is what `gptport export` ships for int8 and int4.
Writes benchmarks/results/quant.json.

    python benchmarks/bench_quant.py [MODEL_DIR] [--gen 64] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np

from gptport import tokenizer as bpe
from gptport import validate, variants
from gptport.checkpoint import load_model
from gptport.generate import empty_past, positions
from gptport.runtime import OnnxModel, load_cpu

HERE = Path(__file__).resolve().parent


def decode_tok_s(model: OnnxModel, prompt_len: int, gen: int, repeat: int) -> float:
    """Median decode tokens/s at batch 1 after a prefill of `prompt_len` tokens."""
    cfg = model.config
    step = model.step()
    rates = []
    for _ in range(repeat + 1):  # the first is warm-up
        ids = np.random.default_rng(0).integers(0, cfg["vocab_size"], (1, prompt_len), dtype=np.int64)
        mask = np.ones_like(ids)
        past = empty_past(1, cfg["n_layer"], cfg["n_head"], cfg["d_model"] // cfg["n_head"], model.kv_dtype)
        logits, past = step(ids, mask, positions(mask), past)
        t0 = time.perf_counter()
        for _ in range(gen):
            nxt = logits[:, -1].argmax(-1)[:, None].astype(np.int64)
            mask = np.concatenate([mask, np.ones((1, 1), dtype=np.int64)], axis=1)
            logits, past = step(nxt, mask, np.array([[mask.shape[1] - 1]], dtype=np.int64), past)
        rates.append(gen / (time.perf_counter() - t0))
    return statistics.median(rates[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", type=Path, nargs="?", default=HERE / "work" / "train")
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    d = args.model_dir
    fp32 = d / "model.onnx"
    if not fp32.exists():
        raise SystemExit(f"{fp32}: run `gptport export {d}` first")
    tok = bpe.load(d)
    model, card = load_model(d, tok)
    windows = validate.heldout_windows(d, model)
    prompt_len = min(64, card.model.n_ctx - args.gen)
    rows = [{"scheme": "fp32", "bytes": fp32.stat().st_size, "top1": 1.0, "mean_kl": 0.0, "passes": True,
             "decode_tok_s": decode_tok_s(load_cpu(fp32, args.threads), prompt_len, args.gen, args.repeat)}]
    work = HERE / "work" / "quant"
    work.mkdir(parents=True, exist_ok=True)
    for name, scheme in variants.SCHEMES.items():
        out = work / f"{name}.onnx"
        variants.quantize(fp32, out, scheme)
        q = load_cpu(out, args.threads)
        g = validate.gate(model, q, windows, name)
        rows.append({"scheme": name, "bits": scheme.bits, "bytes": out.stat().st_size, "top1": g.top1,
                     "mean_kl": g.mean_kl, "passes": g.ok,
                     "decode_tok_s": decode_tok_s(q, prompt_len, args.gen, args.repeat)})
    base = rows[0]["decode_tok_s"]
    print(f"{'scheme':<30}{'MB':>7}{'top-1':>9}{'mean KL':>11}{'gate':>6}{'decode tok/s':>14}{'vs fp32':>9}")
    for r in rows:
        r["speedup_vs_fp32"] = r["decode_tok_s"] / base
        print(f"{r['scheme']:<30}{r['bytes'] / 1e6:>7.2f}{r['top1']:>9.2%}{r['mean_kl']:>11.2e}"
              f"{'ok' if r['passes'] else 'FAIL':>6}{r['decode_tok_s']:>14,.0f}{r['speedup_vs_fp32']:>9.2f}")
    import onnxruntime

    result = {"benchmark": "quantization schemes: accuracy gate and batch-1 CPU decode",
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "threads": args.threads},
              "versions": {"onnxruntime": onnxruntime.__version__}, "model": card.model.__dict__,
              "prompt_len": prompt_len, "gen": args.gen, "gate": "top-1 >= 98% vs fp32 torch", "rows": rows,
              "shipped": variants.DEFAULT}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "quant.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {HERE / 'results' / 'quant.json'}")


if __name__ == "__main__":
    main()
