"""`gptport providers`: which onnxruntime execution providers really initialise here (cpu, cuda, tensorrt,
openvino), and why not; then the browser targets of export-web."""

from __future__ import annotations

from gptport.cli.common import err

EXAMPLES = """Example:

  gptport providers
"""


def providers() -> None:
    """List cpu, cuda, tensorrt and openvino, whether each really initialises here, and the reason when not; then
    the browser targets of export-web (the bundle runs in the visitor's browser, not in this process)."""
    import onnxruntime as ort
    from rich.markup import escape
    from rich.table import Table

    from gptport.export.web import can_bundle
    from gptport.runtime.providers import ORT_NAMES, probe

    table = Table("provider", "onnxruntime name", "runs here", "detail",
                  title=f"onnxruntime {ort.__version__} ({ort.get_device()} build)")
    for name in ORT_NAMES:
        status = probe(name)
        table.add_row(name, ORT_NAMES[name], "[green]yes[/]" if status.ok else "[red]no[/]", escape(status.reason))
    err.print(table)
    ok, why = can_bundle()
    web = Table("target", "through", "can build here", "detail", title="in the browser (gptport export-web)")
    for target, note in (("wasm", "WebAssembly: any current browser; several threads where the page is "
                                  "cross-origin isolated (export-web --serve)"),
                         ("webgpu", "WebGPU (?device=webgpu): browsers that offer an adapter; checked on Chromium's "
                                    "SwiftShader, never on a real GPU here")):
        web.add_row(target, "onnxruntime-web", "[green]yes[/]" if ok else "[red]no[/]", escape(f"{why}. {note}"))
    err.print(web)
