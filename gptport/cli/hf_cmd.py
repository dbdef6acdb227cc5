"""`gptport export-hf` and `gptport import-hf`: to and from a local transformers GPT-2 directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gptport.cli.common import Force, ModelDir, err

EXPORT_EXAMPLES = """Example:

  gptport export-hf models/mymodel --out hf/mymodel
"""
IMPORT_EXAMPLES = """Example:

  gptport import-hf path/to/gpt2 --out models/gpt2
"""


def export_hf(
    model_dir: ModelDir,
    out: Annotated[Path, typer.Option("--out", help="Directory to write the transformers checkpoint into.")],
    force: Force = False,
) -> None:
    """Write a transformers GPT-2 checkpoint (GPT2LMHeadModel.from_pretrained loads it)."""
    from gptport.export.hf import export_hf as run

    written = run(model_dir, out, force)
    err.print("wrote " + ", ".join(str(p) for p in written))


def import_hf(
    hf_dir: Annotated[Path, typer.Argument(help="A local transformers GPT-2 directory.", show_default=False)],
    out: Annotated[Path, typer.Option("--out", help="gptport model directory to create.")],
    force: Force = False,
) -> None:
    """Turn a local transformers GPT-2 checkpoint into a gptport model directory."""
    from gptport.export.hf import import_hf as run

    cfg = run(hf_dir, out, force)
    err.print(f"wrote {out}: {cfg.n_params() / 1e6:.1f}M parameters, vocabulary {cfg.vocab_size}, n_ctx {cfg.n_ctx}; "
              f"next: gptport export {out}")
