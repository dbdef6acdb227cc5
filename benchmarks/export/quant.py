"""Weight-quantization schemes of onnxruntime, side by side: accuracy gate and CPU decode speed.

For a trained model directory (default: the one benchmarks.train.fixed_time leaves), every scheme in
gptport.export.variants.SCHEMES is made from the fp32 static-cache graph (what the CPU runs by default,
built from model.safetensors; a smoothing scheme with the activations' ranges measured on every other gate
window, as export does), checked once against fp32 torch on held-out text (the model's validation shard,
or --heldout FILE: top-1 agreement, mean KL), then timed at batch 1 (prefill of 64 tokens, then --gen new
tokens, 2 threads) in rounds that rotate the schemes' order. The scheme that passes the gate and decodes
fastest, prefill deciding near-ties, is what `gptport export` ships for int8 and int4.

    python -m benchmarks.export.quant [MODEL_DIR] [--heldout FILE] [--schemes a,b,...] [--gen 64] [--repeat 3]
        [--rounds 2]
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, results
from benchmarks.harness.models import WORK
from benchmarks.harness.run import Run


def speeds(model: Any, prompt_len: int, gen: int, repeat: int) -> dict[str, float]:
    """Median prefill and decode tokens/s at batch 1 (prompt of `prompt_len`, `gen` new tokens)."""
    from gptport.runtime.bench import time_generation

    vocab = model.config.vocab_size
    prefill, decode = [], []
    for i in range(repeat + 1):  # the first is warm-up
        t_prefill, _, steps = time_generation(model, vocab, 1, prompt_len, gen, seed=i)
        prefill.append(prompt_len / t_prefill)
        decode.append(len(steps) / sum(steps))
    return {"prefill_tok_s": statistics.median(prefill[1:]), "decode_tok_s": statistics.median(decode[1:])}


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("model_dir", type=Path, nargs="?", default=WORK / "train")
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--heldout", type=Path, help="held-out text for the gate (default: the validation shard)")
    ap.add_argument("--schemes", default="", help="comma-separated SCHEMES names (default: all)")
    args = ap.parse_args()
    d = args.model_dir
    if not (d / "model.safetensors").exists():
        raise SystemExit(f"{d}: no model.safetensors; run python -m benchmarks.train.fixed_time or `gptport train`")
    from gptport import contract
    from gptport import tokenizer as bpe
    from gptport.export import calibration, exporter, validate, variants
    from gptport.runtime.onnx_engine import load_cpu
    from gptport.training.checkpoint import load_model

    tok = bpe.load(d)
    model, card = load_model(d, tok)
    windows = validate.heldout(d, model, tok, args.heldout).windows
    chosen = [s for s in args.schemes.split(",") if s] or list(variants.SCHEMES)
    unknown = [s for s in chosen if s not in variants.SCHEMES]
    if unknown:
        raise SystemExit(f"--schemes: unknown {', '.join(unknown)} (known: {', '.join(variants.SCHEMES)})")
    ranges = calibration.activation_ranges(model, windows[::2]) if any(variants.SCHEMES[s].smooth for s in chosen) \
        else None
    prompt_len = min(64, card.model.n_ctx - args.gen)
    work = WORK / "quant"
    work.mkdir(parents=True, exist_ok=True)
    fp32 = work / "static.onnx"  # the fp32 static-cache graph: what the CPU runs by default
    exporter.save_static(model, card, fp32)
    rows = {"fp32": {"scheme": "fp32", "bits": 32, "mb": fp32.stat().st_size / 1e6, "top1": 1.0, "mean_kl": 0.0,
                     "passes": True}}
    graphs = {"fp32": load_cpu(fp32, args.threads)}
    for name in chosen:
        scheme = variants.SCHEMES[name]
        out = work / f"{name}.onnx"
        out.unlink(missing_ok=True)
        try:
            variants.quantize(fp32, out, scheme, ranges)
        except variants.NotApplicable as e:
            print(f"{name}: does not apply to this model ({e})")
            continue
        exporter.set_metadata(out, exporter.metadata(card, "int8", contract.CACHE_STATIC))
        graphs[name] = load_cpu(out, args.threads)
        g = validate.gate(model, graphs[name], windows, name)
        rows[name] = {"scheme": name, "bits": scheme.bits, "mb": out.stat().st_size / 1e6, "top1": g.top1,
                      "mean_kl": g.mean_kl, "passes": g.ok}
    run = Run()
    for rnd in run.series(args.rounds):
        for name in rnd.rotation(list(graphs)):
            rnd.data[name] = speeds(graphs[name], prompt_len, args.gen, args.repeat)
    for name, row in rows.items():
        for key in ("prefill_tok_s", "decode_tok_s"):
            row[key] = statistics.median(v[key] for v in run.values(name))
    base = rows["fp32"]
    for r in rows.values():
        r["decode_vs_fp32"] = r["decode_tok_s"] / base["decode_tok_s"]
        r["prefill_vs_fp32"] = r["prefill_tok_s"] / base["prefill_tok_s"]
        print(f"{r['scheme']:<30}{r['mb']:>7.2f} MB {r['top1']:>8.2%} KL {r['mean_kl']:>9.2e} "
              f"{'ok' if r['passes'] else 'FAIL':>5}{r['decode_tok_s']:>10,.0f} decode tok/s "
              f"({r['decode_vs_fp32']:.2f}x){r['prefill_tok_s']:>10,.0f} prefill ({r['prefill_vs_fp32']:.2f}x)")
    settings = cli.settings(args, prompt_len=prompt_len, gate="top-1 >= 98% vs fp32 torch",
                            heldout=str(args.heldout.name) if args.heldout else "validation shard", model_dir=d.name)
    results.write(results.document(results.benchmark_name(__spec__), run, list(rows.values()), settings,
                                   label=args.label, details={"model": card.model.__dict__,
                                                              "shipped": variants.LADDER}), args.results)


if __name__ == "__main__":
    main()
