"""`gptport export-web`: the model as a static bundle that runs in a browser (no torch needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gptport.cli import options as opt
from gptport.cli.common import Force, ModelDir, err, human_bytes

EXAMPLES = """Examples:

  gptport export-web models/mymodel --out web/

  gptport export-web models/mymodel --out web/ --force --serve --port 8080

  gptport export models/smollm2 --precision fp32,int8 --heldout heldout.txt
  gptport export-web models/smollm2 --out web/ --precision int8

  python -m http.server -d web/     # any static host works (one thread without COOP/COEP headers)
"""


def export_web(
    model_dir: ModelDir,
    out: Annotated[Path, typer.Option("--out", help="Folder to write the bundle to.", show_default=False)],
    force: Force = False,
    serve: Annotated[bool, typer.Option("--serve", help="Serve the bundle on 127.0.0.1 afterwards (MIME types, "
                                        "COOP/COEP headers for multi-threaded wasm) until Ctrl-C.")] = False,
    host: Annotated[str, typer.Option(help="Address to serve on (with --serve).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to serve on (with --serve; 0 picks a free one).")] = 8080,
    precision: opt.WebPrecision = "auto",
    runtime_dir: Annotated[Path | None, typer.Option(
        "--runtime-dir", help="A node_modules folder holding the lock file's onnxruntime-web and tokenizers.js "
        "(default: fetched once with npm into the user cache).", show_default=False)] = None,
) -> None:
    """Write a static bundle (page, ES modules, one graph, tokenizer, onnxruntime-web, manifest) that runs the
    model in a browser with WebAssembly or WebGPU."""
    from gptport.export.web import export_web as run
    from gptport.export.web_server import make_server

    with err.status("export-web") as status:
        bundle = run(model_dir, out, force, runtime_dir, say=status.update, precision=precision)
    m = bundle.manifest
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    graph_bytes = sum(m["files"][name]["bytes"] for name in [m["graph"], *m.get("external_data", [])])
    outside = " with its external data" if m.get("external_data") else ""
    err.print(f"wrote {out}: {len(bundle.files)} files, {human_bytes(bundle.total_bytes)} ({versions}); the "
              f"{m['precision']} graph ({m['source_graph']}{outside}, {human_bytes(graph_bytes)}, "
              f"gated); {len(m['reference'])} reference prompts for the page's self-check")
    if not serve:
        err.print(f"next: gptport export-web {model_dir} --out {out} --force --serve, or any static file server")
        return
    server = make_server(out, host, port)
    url = f"http://{host}:{server.server_address[1]}/"
    print(url, flush=True)
    err.print(f"serving {out} at {url} (Ctrl-C stops)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
