"""The model in a browser: decode tokens/s of `gptport export-web`'s page in headless Chromium
(WebAssembly, 1 and 2 threads, cross-origin isolated), beside native `gptport bench` on the same graph
(model.onnx, the contract graph, batch 1) and beside transformers.js generating from the same bundle in
the same browser (the anchor a web developer would pick; its npm package pinned by
benchmarks/export/transformers_js/package-lock.json). Also the time from navigation to the first
generated token with the files cached. Random weights of each preset's shape (the serving benchmarks'
model directories): speed does not depend on what the weights learned. A first round warms the
browser's cache and is not kept; the rounds alternate which page goes first.

    python -m benchmarks.export.web [--shapes tiny,small] [--rounds 3] [--tokens 128] [--prompt 16]
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

from benchmarks.harness import cli, results
from benchmarks.harness.models import WORK, serve_model
from benchmarks.harness.run import Run
from gptport.export.web_server import BundleHandler

HERE = Path(__file__).resolve().parent
WEB = WORK / "web"
ENGINES = ("gptport", "transformers.js")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
PROMPT_TEXT = "ROMEO: "  # repeated to --prompt tokens or so; both engines get the same ids

TJS_PAGE = """<!doctype html><meta charset="utf-8"><title>transformers.js</title>
<script type="module">
import { AutoModelForCausalLM, env } from "./transformers.min.js";
const q = new URLSearchParams(location.search);
env.allowRemoteModels = false; env.allowLocalModels = true; env.localModelPath = "/";
env.backends.onnx.wasm.wasmPaths = new URL("./ort/", location.href).href;
env.backends.onnx.wasm.numThreads = Number(q.get("threads") || 1);
const model = await AutoModelForCausalLM.from_pretrained(q.get("model"), { dtype: "fp32", device: "wasm" });
async function generate(ids, n) {  // greedy, exactly n new tokens
  const { Tensor } = await import("./transformers.min.js");
  const input_ids = new Tensor("int64", BigInt64Array.from(ids, BigInt), [1, ids.length]);
  const attention_mask = new Tensor("int64", new BigInt64Array(ids.length).fill(1n), [1, ids.length]);
  const t0 = performance.now();
  const out = await model.generate({ input_ids, attention_mask, max_new_tokens: n, min_new_tokens: n,
                                     do_sample: false });
  return { ms: performance.now() - t0, token_ids: Array.from(out.data.slice(ids.length), Number) };
}
window.tjs = { ready: Promise.resolve(true), generate };
</script>"""


def gptport(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "gptport", *args], check=True, capture_output=True, text=True).stdout


def tjs_runtime() -> Path:
    """transformers.js and its onnxruntime-web from transformers_js/package-lock.json (npm ci, once)."""
    root = WEB / "tjs"
    if not (root / "node_modules" / "@huggingface" / "transformers").is_dir():
        root.mkdir(parents=True, exist_ok=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copyfile(HERE / "transformers_js" / name, root / name)
        subprocess.run(["npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"], cwd=root,
                       check=True)
    return root / "node_modules"


def site(shapes: list[str]) -> tuple[Path, dict[str, Path]]:
    """One folder served at one origin: each shape's bundle at /<shape>/, transformers.js's page at /tjs/."""
    top = Path(tempfile.mkdtemp(prefix="bench-web-"))
    dirs = {}
    for shape in shapes:
        d = serve_model(shape)
        bundle = WEB / f"bundle-{shape}"
        gptport("export-web", str(d), "--out", str(bundle), "--force")
        (top / shape).symlink_to(bundle)
        dirs[shape] = d
    modules = tjs_runtime()
    tjs = top / "tjs"
    tjs.mkdir()
    (tjs / "index.html").write_text(TJS_PAGE)
    (tjs / "transformers.min.js").symlink_to(modules / "@huggingface" / "transformers" / "dist" / "transformers.min.js")
    (tjs / "ort").symlink_to(modules / "onnxruntime-web" / "dist")
    return top, dirs


def native(d: Path, threads: int, prompt: int, tokens: int) -> float:
    """`gptport bench`'s decode tokens/s on the contract graph (model.onnx), batch 1."""
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        gptport("bench", str(d), "--providers", "cpu", "--precisions", "fp32", "--kv-cache", "concat", "--batch", "1",
                "--prompt-len", str(prompt), "--gen-len", str(tokens), "--threads", str(threads), "--repeat", "3",
                "--no-torch-baseline", "--json", f.name)
        rows = json.loads(Path(f.name).read_text())["rows"]
    return float(rows[0]["decode_tok_s"])


def page_run(browser: Any, url: str, prompt_ids: list[int], tokens: int, engine: str) -> dict[str, Any]:
    """Load the page, generate one token (the time from navigation to it), then `tokens` greedy tokens."""
    page = browser.new_page()
    page.set_default_timeout(600_000)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    if engine == "gptport":
        page.evaluate("window.gptport.ready")
        first = page.evaluate("async (ids) => { const m = window.gptport; const p = await m.detokenize(ids);"
                              " await m.generate(p, {max_new_tokens: 1, ignore_eos: true});"
                              " return performance.now(); }", prompt_ids)
        r = page.evaluate("async ([ids, n]) => { const p = await window.gptport.detokenize(ids);"
                          " return window.gptport.generate(p, {max_new_tokens: n, ignore_eos: true}); }",
                          [prompt_ids, tokens])
        out = {"first_token_ms": first, "decode_tok_s": r["decode_tok_s"], "token_ids": r["token_ids"]}
    else:
        page.wait_for_function("window.tjs !== undefined")
        first = page.evaluate("async (ids) => { await window.tjs.generate(ids, 1); return performance.now(); }",
                              prompt_ids)
        one = page.evaluate("(ids) => window.tjs.generate(ids, 1)", prompt_ids)
        full = page.evaluate("([ids, n]) => window.tjs.generate(ids, n)", [prompt_ids, tokens])
        out = {"first_token_ms": first, "decode_tok_s": (tokens - 1) / ((full["ms"] - one["ms"]) / 1000),
               "token_ids": full["token_ids"]}
    page.close()
    if errors:
        raise SystemExit(f"{engine} page at {url}: {errors[0]}")
    return out


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--shapes", default="tiny,small")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=16)
    ap.add_argument("--chromium", default=os.environ.get("GPTPORT_CHROMIUM") or shutil.which("chromium"))
    args = ap.parse_args()
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    top, dirs = site(shapes)
    from playwright.sync_api import sync_playwright

    from gptport import tokenizer as bpe

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(BundleHandler, directory=str(top)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{server.server_address[1]}"
    run = Run()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, headless=True, args=ARGS)
        version = browser.version

        def one_round(data: dict[str, Any], engines: list[str]) -> None:
            for shape in shapes:
                tok = bpe.load(dirs[shape])
                ids = (tok.encode(PROMPT_TEXT * args.prompt))[: args.prompt]
                for threads in (1, 2):
                    for engine in engines:
                        url = (f"{origin}/{shape}/?threads={threads}" if engine == "gptport" else
                               f"{origin}/tjs/?model={shape}&threads={threads}")
                        r = page_run(browser, url, ids, args.tokens, engine)
                        print(f"{shape} {engine} {threads}t: {r['decode_tok_s']:.0f} tok/s, first token "
                              f"{r['first_token_ms']:.0f} ms", flush=True)
                        data[f"{shape} {engine} {threads}"] = r

        one_round({}, list(ENGINES))  # warms the browser's cache: not kept
        for rnd in run.series(args.rounds):
            one_round(rnd.data, rnd.order(ENGINES))
            for shape in shapes:
                for threads in (1, 2):
                    rnd.data[f"{shape} native {threads}"] = {"decode_tok_s": native(dirs[shape], threads, args.prompt,
                                                                                    args.tokens)}
        browser.close()
    server.shutdown()
    rows = []
    for shape in shapes:
        for threads in (1, 2):
            for engine in (*ENGINES, "native"):
                runs = run.values(f"{shape} {engine} {threads}")
                rows.append({"shape": shape, "engine": engine, "threads": threads,
                             "decode_tok_s": statistics.median(r["decode_tok_s"] for r in runs),
                             "first_token_ms": statistics.median(r["first_token_ms"] for r in runs)
                             if engine != "native" else None, "rounds": len(runs)})
    same = {shape: run.rounds[0].data[f"{shape} gptport 1"]["token_ids"]
            == run.rounds[0].data[f"{shape} transformers.js 1"]["token_ids"] for shape in shapes}
    print_table(rows, same)
    settings = cli.settings(args, browser=f"Chromium {version} (headless)")
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label=args.label,
                                   details={"same_greedy_tokens": same}), args.results)


def print_table(rows: list[dict[str, Any]], same: dict[str, bool]) -> None:
    by = {(r["shape"], r["engine"], r["threads"]): r for r in rows}
    print(f"{'shape':8} {'threads':>7} {'gptport page':>13} {'transformers.js':>16} {'ratio':>6} {'native':>8} "
          f"{'native/page':>12} {'first token ms':>15}")
    for shape, threads in sorted({(s, t) for s, _, t in by}):
        g, t = by[(shape, "gptport", threads)], by[(shape, "transformers.js", threads)]
        n = by[(shape, "native", threads)]
        print(f"{shape:8} {threads:>7} {g['decode_tok_s']:>13,.0f} {t['decode_tok_s']:>16,.0f} "
              f"{g['decode_tok_s'] / t['decode_tok_s']:>5.2f}x {n['decode_tok_s']:>8,.0f} "
              f"{n['decode_tok_s'] / g['decode_tok_s']:>11.2f}x {g['first_token_ms']:>15,.0f}")
    print(f"greedy tokens equal between the two pages: {same}")


if __name__ == "__main__":
    main()
