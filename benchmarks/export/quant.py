"""Weight-quantization schemes of onnxruntime, side by side: accuracy gate and CPU decode speed.

For a trained model directory (default: the one bench_train.py leaves), every scheme in
gptport.export.variants.SCHEMES is made from the fp32 static-cache graph (what the CPU runs by default, built
from model.safetensors), checked against fp32 torch on held-out text (top-1 agreement, mean KL) and
timed at batch 1 (prefill of 64 tokens, then --gen new tokens, 2 threads). The scheme that passes the
gate and decodes fastest, prefill deciding near-ties, is what `gptport export` ships for int8 and int4.
Writes benchmarks/results/quant.json.

    python benchmarks/bench_quant.py [MODEL_DIR] [--gen 64] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from gptport import contract
from gptport import tokenizer as bpe
from gptport.export import exporter, validate, variants
from gptport.machine import describe
from gptport.runtime.bench import time_generation
from gptport.runtime.onnx_engine import OnnxModel, load_cpu
from gptport.training.checkpoint import load_model

HERE = Path(__file__).resolve().parent


def speeds(model: OnnxModel, prompt_len: int, gen: int, repeat: int) -> tuple[float, float]:
    """Median prefill and decode tokens/s at batch 1 (prompt of `prompt_len`, `gen` new tokens)."""
    vocab = model.config.vocab_size
    prefill, decode = [], []
    for i in range(repeat + 1):  # the first is warm-up
        t_prefill, _, steps = time_generation(model, vocab, 1, prompt_len, gen, seed=i)
        prefill.append(prompt_len / t_prefill)
        decode.append(len(steps) / sum(steps))
    return statistics.median(prefill[1:]), statistics.median(decode[1:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir", type=Path, nargs="?", default=HERE / "work" / "train")
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    d = args.model_dir
    if not (d / "model.safetensors").exists():
        raise SystemExit(f"{d}: no model.safetensors; run benchmarks/bench_train.py or `gptport train` first")
    tok = bpe.load(d)
    model, card = load_model(d, tok)
    windows = validate.heldout(d, model, tok).windows
    prompt_len = min(64, card.model.n_ctx - args.gen)
    work = HERE / "work" / "quant"
    work.mkdir(parents=True, exist_ok=True)
    fp32 = work / "static.onnx"  # the fp32 static-cache graph: what the CPU runs by default
    exporter.save_static(model, card, fp32)
    rows = [{"scheme": "fp32", "bytes": fp32.stat().st_size, "top1": 1.0, "mean_kl": 0.0, "passes": True}]
    rows[0]["prefill_tok_s"], rows[0]["decode_tok_s"] = speeds(load_cpu(fp32, args.threads), prompt_len,
                                                             args.gen, args.repeat)
    for name, scheme in variants.SCHEMES.items():
        out = work / f"{name}.onnx"
        variants.quantize(fp32, out, scheme)
        exporter.set_metadata(out, exporter.metadata(card, "int8", contract.CACHE_STATIC))
        q = load_cpu(out, args.threads)
        g = validate.gate(model, q, windows, name)
        row = {"scheme": name, "bits": scheme.bits, "bytes": out.stat().st_size, "top1": g.top1,
               "mean_kl": g.mean_kl, "passes": g.ok}
        row["prefill_tok_s"], row["decode_tok_s"] = speeds(q, prompt_len, args.gen, args.repeat)
        rows.append(row)
    base = rows[0]
    print(f"{'scheme':<30}{'MB':>7}{'top-1':>9}{'mean KL':>11}{'gate':>6}{'decode tok/s':>14}{'vs fp32':>9}"
          f"{'prefill tok/s':>15}{'vs fp32':>9}")
    for r in rows:
        r["speedup_vs_fp32"] = r["decode_tok_s"] / base["decode_tok_s"]
        r["prefill_speedup_vs_fp32"] = r["prefill_tok_s"] / base["prefill_tok_s"]
        print(f"{r['scheme']:<30}{r['bytes'] / 1e6:>7.2f}{r['top1']:>9.2%}{r['mean_kl']:>11.2e}"
              f"{'ok' if r['passes'] else 'FAIL':>6}{r['decode_tok_s']:>14,.0f}{r['speedup_vs_fp32']:>9.2f}"
              f"{r['prefill_tok_s']:>15,.0f}{r['prefill_speedup_vs_fp32']:>9.2f}")
    import onnxruntime

    result = {"benchmark": "quantization schemes of the static-cache graph: accuracy gate, batch-1 CPU "
                           "prefill and decode",
              "machine": {**describe(), "threads": args.threads},
              "versions": {"onnxruntime": onnxruntime.__version__}, "model": card.model.__dict__,
              "prompt_len": prompt_len, "gen": args.gen, "gate": "top-1 >= 98% vs fp32 torch", "rows": rows,
              "shipped": variants.LADDER}
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "quant.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {HERE / 'results' / 'quant.json'}")


if __name__ == "__main__":
    main()
