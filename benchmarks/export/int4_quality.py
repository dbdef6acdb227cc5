"""int4 quality as held-out perplexity: gptport's fp32 and each int4 scheme against llama.cpp's F32, Q4_0 and
Q4_K_M of the same weights, on the same text, scored the same way.

The text file is split at the first paragraph break after --heldout-fraction from its end: the end is scored,
the beginning is the calibration text (export's gate windows: what a smoothing or AWQ scheme measures). The
F32 GGUF is gptport's `export-gguf --outtype f32` of MODEL_DIR (or --gguf), quantized by `llama-quantize` to Q4_0
and Q4_K_M; each is scored by `llama-perplexity -f TEXT -c CTX -b CTX --chunks N`. gptport's side replicates
its chunking: the text tokenized whole (a BOS first where the model adds one), cut into CTX-token chunks, each
chunk's first token replaced by BOS where the model adds one, the second half of each chunk scored (the
positions CTX/2 .. CTX-2 predicting the next token), perplexity = exp(mean negative log-likelihood). The fp32
row beside llama.cpp's F32 is the check that both sides compute the same thing. Each gptport scheme is made from
the fp32 static-cache graph as `gptport export` makes it (variants.quantize); sizes are the files' bytes and
each role's bits per weight (bits.py: int4 schemes compared at equal size); each scheme's top-1 picks on the
scored positions are compared with fp32's (what export's gate measures, against torch, with ties); each
gptport graph's scoring time (prefill of CTX tokens) and its batch-1 decode speed (--gen tokens, quant.speeds)
are recorded beside it, for the accuracy levels' choice (one run, not interleaved rounds: indicative).

    python -m benchmarks.export.int4_quality MODEL_DIR --text FILE --llama-bin DIR [--gguf F32.gguf]
        [--ctx 512] [--chunks 16] [--schemes a,b,...] [--threads 2]
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import bits, cli, results
from benchmarks.harness.models import WORK
from benchmarks.harness.run import Run

SCHEMES = ("nbits4-b32-acc4-head8", "nbits4-b128-acc4-head8", "nbits4-b32-acc4-head8-down8",
           "nbits4-b128-acc4-head8-down8", "nbits4-b32-acc4-head8-qkv8-down8", "nbits4-b32-awq-acc4-head8",
           "nbits4-b128-awq-acc4-head8", "nbits4-b32-awq-acc4-head8-down8", "nbits4-grid-acc4-head8")
FIRST = ("model", "engine", "name", "ppl", "increase_pct", "top1_vs_fp32", "bpw_blocks", "bpw_head",
         "bpw_embedding", "bpw_file", "mb")  # a row's leading keys
LLAMA_TYPES = ("Q4_0", "Q4_K_M")
PPL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")
RUNNING = re.compile(r"\[(\d+)\](\d+\.\d+)")  # llama-perplexity's estimate after each chunk (the last: no comma)


def split(text: str, fraction: float) -> tuple[str, str]:
    """(calibration, held-out): the held-out part starts at the first paragraph break after 1 - `fraction`."""
    cut = int(len(text) * (1 - fraction))
    at = text.find("\n\n", cut)
    return (text, "") if at < 0 else (text[:at + 2], text[at + 2:])


def chunks(ids: list[int], ctx: int, count: int, bos: int | None) -> np.ndarray:
    """llama-perplexity's chunks: (n, ctx) int64 of the tokens (BOS prepended where `bos` is not None), at most
    `count`, each chunk's first token replaced by `bos` where given."""
    tokens = np.asarray(([bos] if bos is not None else []) + list(ids), dtype=np.int64)
    n = min(count, len(tokens) // ctx)
    if n < 1:
        raise SystemExit(f"the held-out text tokenizes to {len(tokens)} tokens: fewer than one chunk of {ctx}")
    out = tokens[:n * ctx].reshape(n, ctx).copy()
    if bos is not None:
        out[:, 0] = bos
    return out


def nll(logits: np.ndarray, chunk: np.ndarray) -> np.ndarray:
    """(ctx, V) logits of one chunk -> the negative log-likelihoods of the scored half: (ctx - ctx//2 - 1,)."""
    first = len(chunk) // 2
    z = logits[first:-1].astype(np.float64)  # (S, V)
    top = z.max(-1, keepdims=True)
    logz = np.log(np.exp(z - top).sum(-1)) + top[:, 0]
    return logz - z[np.arange(len(z)), chunk[first + 1:]]


def graph_ppl(path: Path, data: np.ndarray, threads: int) -> tuple[float, float, np.ndarray]:
    """(perplexity, seconds, the top-1 picks of the scored positions (n, ctx - ctx//2 - 1)) of the graph at
    `path` over the chunks `data` (n, ctx)."""
    from gptport.export.validate import positions
    from gptport.runtime.onnx_engine import load_cpu

    model = load_cpu(path, threads)
    step, losses, picks, t0 = model.step(), [], [], time.perf_counter()
    for chunk in data:
        ids = chunk[None, :]  # (1, ctx)
        mask = np.ones_like(ids)
        logits = step(ids, mask, positions(mask), model.empty_past(1))[0][0]  # (ctx, V)
        losses.append(nll(np.asarray(logits, np.float32), chunk))
        picks.append(np.asarray(logits)[len(chunk) // 2:-1].argmax(-1))  # (S,)
    return float(np.exp(np.concatenate(losses).mean())), time.perf_counter() - t0, np.stack(picks)


def decode(path: Path, threads: int, gen: int) -> dict[str, float]:
    """Median prefill (64 tokens) and decode tokens/s at batch 1 of the graph at `path` (quant.speeds)."""
    from benchmarks.export.quant import speeds
    from gptport.runtime.onnx_engine import load_cpu

    return speeds(load_cpu(path, threads), 64, gen, 2)


def llama_ppl(binary: Path, gguf: Path, text: Path, ctx: int, count: int, threads: int) -> float:
    """llama-perplexity's estimate for `gguf` over the first `count` chunks of `text`. Its log is written by a
    thread that its exit often cuts short (the last chunk's estimate and the final one lost, measured: one run
    in three), so it is asked for one chunk more and its running estimate after `count` chunks is read (the
    final one where the text holds no more); up to three tries."""
    for _ in range(3):
        r = subprocess.run([str(binary), "-m", str(gguf), "-f", str(text), "-c", str(ctx), "-b", str(ctx),
                            "--chunks", str(count + 1), "-t", str(threads)], capture_output=True, text=True,
                           check=False)
        out = r.stdout + r.stderr
        running, found = dict(RUNNING.findall(out)), PPL.search(out)
        if r.returncode == 0 and str(count) in running:
            return float(running[str(count)])
        if r.returncode == 0 and found and f"calculating perplexity over {count} chunks" in out:
            return float(found.group(1))
    tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
    raise SystemExit(f"llama-perplexity on {gguf.name} failed ({r.returncode}): {tail}")


def ordered(row: dict[str, Any]) -> dict[str, Any]:
    """`row` with its quality and size first (the rendered table's columns follow the first row's keys)."""
    return {k: row[k] for k in FIRST if k in row} | {k: v for k, v in row.items() if k not in FIRST}


def size(path: Path, params: int) -> dict[str, float]:
    """A row's bits per weight (bits.summary) of the graph or GGUF at `path`, of a model of `params` parameters."""
    sizes = bits.gguf_sizes(path) if path.suffix == ".gguf" else bits.onnx_sizes(path)
    return bits.summary(sizes, path.stat().st_size, params)


def ggufs(d: Path, f32: Path | None, quantize: Path, work: Path) -> dict[str, Path]:
    """{"F32", "Q4_0", "Q4_K_M"} -> the GGUFs of MODEL_DIR's weights, made under `work` where missing."""
    out = {"F32": f32 or work / "model.f32.gguf"} | {t: work / f"model.{t.lower()}.gguf" for t in LLAMA_TYPES}
    if not out["F32"].is_file():
        subprocess.run([sys.executable, "-m", "gptport.cli.main", "export-gguf", str(d), "--outtype", "f32",
                        "--out", str(out["F32"]), "--force"], check=True)
    for t in LLAMA_TYPES:
        if not out[t].is_file():
            r = subprocess.run([str(quantize), str(out["F32"]), str(out[t]), t], capture_output=True, text=True,
                               check=False)
            if r.returncode:
                raise SystemExit(f"llama-quantize {t} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
            fallbacks = re.findall(r"falling back to\s+(\w+)", r.stdout + r.stderr)
            (work / f"{t}.fallbacks").write_text(" ".join(fallbacks))
    return out


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("model_dir", type=Path)
    ap.add_argument("--text", type=Path, required=True, help="text whose end is scored, whose beginning calibrates")
    ap.add_argument("--heldout-fraction", type=float, default=0.1)
    ap.add_argument("--gguf", type=Path, help="the model's F32 GGUF (default: gptport export-gguf --outtype f32)")
    ap.add_argument("--llama-bin", type=Path, default=os.environ.get("GPTPORT_LLAMA_BIN"),
                    help="the folder of llama.cpp's llama-perplexity and llama-quantize ($GPTPORT_LLAMA_BIN)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gen", type=int, default=32, help="tokens decoded per timing of each gptport graph (0: none)")
    ap.add_argument("--schemes", default=",".join(SCHEMES), help="comma-separated variants.SCHEMES names")
    args = ap.parse_args()
    if args.llama_bin is None or not (Path(args.llama_bin) / "llama-perplexity").is_file():
        raise SystemExit(f"--llama-bin {args.llama_bin}: no llama-perplexity there")
    args.llama_bin = Path(args.llama_bin)
    from gptport import tokenizer as bpe
    from gptport.export import calibration, graph_files, validate, variants
    from gptport.training.checkpoint import load_model

    d = args.model_dir
    names = [s for s in args.schemes.split(",") if s]
    unknown = [s for s in names if s not in variants.SCHEMES]
    if unknown:
        raise SystemExit(f"--schemes: unknown {', '.join(unknown)}")
    work = WORK / "int4_quality" / d.resolve().name
    work.mkdir(parents=True, exist_ok=True)
    calib_text, held_text = split(args.text.read_text(encoding="utf-8"), args.heldout_fraction)
    (work / "calibration.txt").write_text(calib_text, encoding="utf-8")
    held = work / "heldout.txt"
    held.write_text(held_text, encoding="utf-8")
    tok = bpe.load(d)
    model, card = load_model(d, tok)
    cfg = card.model
    params = sum(int(p.numel()) for p in model.parameters())  # a tied head counted once, as llama.cpp counts
    data = chunks(tok.encode(held_text), args.ctx, args.chunks, cfg.bos_id if cfg.add_bos else None)
    windows = validate.heldout(d, model, tok, work / "calibration.txt").windows
    fp32 = work / "fp32.onnx"
    graph_files.save_static(model, card, fp32)
    rows: list[dict[str, Any]] = []
    run = Run()
    with run.round() as rnd:
        ppl, secs, want = graph_ppl(fp32, data, args.threads)
        rows.append({"engine": "gptport", "name": "fp32", "ppl": ppl, "mb": fp32.stat().st_size / 1e6,
                     "score_s": secs} | size(fp32, params) | (decode(fp32, args.threads, args.gen) if args.gen else {}))
        print(f"gptport fp32: ppl {ppl:.4f} ({secs:.0f} s)")
        samples = ranges = None
        for name in names:
            scheme, out = variants.SCHEMES[name], work / f"{name}.onnx"
            if scheme.awq and samples is None:
                samples = calibration.activation_samples(model, windows[::2])
            if scheme.smooth and ranges is None:
                ranges = calibration.activation_ranges(model, windows[::2])
            t0 = time.perf_counter()
            try:
                variants.quantize(fp32, out, scheme, samples if scheme.awq else ranges)
            except variants.NotApplicable as e:
                print(f"{name}: does not apply ({e})")
                continue
            made = time.perf_counter() - t0
            graph_files.set_metadata(out, graph_files.metadata(card, "int4", "static"))
            ppl, secs, got = graph_ppl(out, data, args.threads)
            rows.append({"engine": "gptport", "name": name, "ppl": ppl, "mb": out.stat().st_size / 1e6,
                         "quantize_s": made, "score_s": secs, "top1_vs_fp32": float((got == want).mean())}
                        | size(out, params)
                        | (decode(out, args.threads, args.gen) if args.gen else {}))
            print(f"gptport {name}: ppl {ppl:.4f}, top-1 {(got == want).mean():.1%} of fp32's ({made:.0f} s to "
                  f"make, {secs:.0f} s to score)")
        files = ggufs(d, args.gguf, args.llama_bin / "llama-quantize", work)
        for t, path in files.items():
            ppl = llama_ppl(args.llama_bin / "llama-perplexity", path, held, args.ctx, len(data), args.threads)
            fallback = (work / f"{t}.fallbacks").read_text().split() if t != "F32" else []
            rows.append({"engine": "llama.cpp", "name": t, "ppl": ppl, "mb": path.stat().st_size / 1e6,
                         "fallback_tensors": len(fallback), "fallback_types": sorted(set(fallback))}
                        | size(path, params))
            print(f"llama.cpp {t}: ppl {ppl:.4f}")
        rnd.data["rows"] = rows
    base = {r["engine"]: r["ppl"] for r in rows if r["name"] in ("fp32", "F32")}
    for r in rows:
        r["model"] = d.resolve().name
        r["increase_pct"] = 100 * (r["ppl"] / base[r["engine"]] - 1)
    rows = [ordered(r) for r in rows]
    settings = cli.settings(args, scored=f"{len(data)} chunks x {args.ctx - args.ctx // 2 - 1} tokens",
                            heldout_tokens=int(data.size), calibration_windows=int(len(windows)))
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label=args.label,
                                   details={"model": cfg.__dict__}), args.results)


if __name__ == "__main__":
    main()
