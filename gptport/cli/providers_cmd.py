"""`gptport providers`: which onnxruntime execution providers really initialise here, and why not."""

from __future__ import annotations

from gptport.cli.common import err

EXAMPLES = """Example:

  gptport providers
"""


def providers() -> None:
    """List cpu, cuda and tensorrt, whether each really initialises here, and the reason when not."""
    import onnxruntime as ort
    from rich.markup import escape
    from rich.table import Table

    from gptport.runtime.providers import ORT_NAMES, probe

    table = Table("provider", "onnxruntime name", "runs here", "detail",
                  title=f"onnxruntime {ort.__version__} ({ort.get_device()} build)")
    for name in ORT_NAMES:
        status = probe(name)
        table.add_row(name, ORT_NAMES[name], "[green]yes[/]" if status.ok else "[red]no[/]", escape(status.reason))
    err.print(table)
