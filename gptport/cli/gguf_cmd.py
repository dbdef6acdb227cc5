"""`gptport export-gguf`: one GGUF file of llama.cpp's gpt2 architecture (no torch needed)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from gptport.cli.common import Force, ModelDir, err, human_bytes

EXAMPLES = """Examples:

  gptport export-gguf models/mymodel

  gptport export-gguf models/mymodel --outtype q8_0 --out mymodel.q8_0.gguf

  llama-cli -m models/mymodel/model.f32.gguf -p "To be or not" -n 64 --temp 0
"""


class OutType(str, Enum):
    f32 = "f32"
    f16 = "f16"
    q8_0 = "q8_0"


def export_gguf(
    model_dir: ModelDir,
    outtype: Annotated[OutType, typer.Option("--outtype", help="Weight type of the matrices (norms, biases "
                                             "and the position table stay f32).")] = OutType.f32,
    out: Annotated[Path | None, typer.Option("--out", help="GGUF file to write (default: "
                                             "MODEL_DIR/model.OUTTYPE.gguf).", show_default=False)] = None,
    force: Force = False,
) -> None:
    """Write the model and its tokenizer as a GGUF file that llama.cpp runs (architecture gpt2)."""
    from gptport.export.gguf_export import export_gguf as run

    s = run(model_dir, outtype.value, out, force)
    types = ", ".join(f"{n} {t.lower()}" for t, n in sorted(s.tensor_types.items()))
    err.print(f"wrote {s.path} ({human_bytes(s.n_bytes)}, gpt2, {s.outtype}): {s.n_params / 1e6:.2f}M parameters "
              f"in {sum(s.tensor_types.values())} tensors ({types}); vocabulary {s.vocab_size}, "
              f"{s.n_merges} merges")
    err.print(f"next: llama-cli -m {s.path} -p \"...\" --temp 0")
