"""`gptport export-gguf`: one GGUF file that llama.cpp runs (gpt2, or the architecture of the model's family: llama,
qwen2, qwen3, gemma2, gemma3, granite, olmo2, phi3, smollm3; no torch needed); `gptport import-gguf`: a llama.cpp
GGUF file of one of those architectures (float or quantized) as a gptport model directory."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from gptport.cli.common import Force, ModelDir, err, human_bytes, write_progress

EXAMPLES = """Examples:

  gptport export-gguf models/mymodel

  gptport export-gguf models/mymodel --outtype q8_0 --out mymodel.q8_0.gguf

  llama-cli -m models/mymodel/model.f32.gguf -p "To be or not" -n 64 --temp 0
"""
IMPORT_EXAMPLES = """Examples:

  gptport import-gguf SmolLM2-135M-Instruct.Q4_1.gguf --out models/smollm2

  gptport import-gguf gemma-3-270m-q4_k_m.gguf --out models/gemma3
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
    """Write the model and its tokenizer as a GGUF file that llama.cpp runs (architecture gpt2 for GPT-2's layers;
    llama, qwen2, qwen3, gemma2, gemma3, granite, olmo2, phi3 or smollm3 for the others, as llama.cpp's converter
    writes each)."""
    from gptport.export.gguf_export import export_gguf as run

    s = run(model_dir, outtype.value, out, force)
    types = ", ".join(f"{n} {t.lower()}" for t, n in sorted(s.tensor_types.items()))
    err.print(f"wrote {s.path} ({human_bytes(s.n_bytes)}, {s.architecture}, {s.outtype}): "
              f"{s.n_params / 1e6:.2f}M parameters in {sum(s.tensor_types.values())} tensors ({types}); "
              f"vocabulary {s.vocab_size}, {s.n_merges} merges")
    if s.note:
        err.print(f"note: {s.note}")
    err.print(f"next: llama-cli -m {s.path} -p \"...\" --temp 0")


def import_gguf(
    gguf_file: Annotated[Path, typer.Argument(help="A llama.cpp GGUF file of architecture llama, qwen2, qwen3, "
                                              "gpt2, gemma2, gemma3, granite, olmo2, phi3 or smollm3 "
                                              "(F32, F16, BF16 or block-quantized: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, "
                                              "Q2_K-Q6_K, IQ4_NL, IQ4_XS, IQ3_S).",
                                              show_default=False)],
    out: Annotated[Path, typer.Option("--out", help="gptport model directory to create.")],
    force: Force = False,
) -> None:
    """Turn a GGUF file into a gptport model directory: weights dequantized to float32, the tokenizer rebuilt."""
    from gptport.cli.hf_cmd import _next
    from gptport.export.gguf_import import import_gguf as run

    with write_progress("dequantizing into") as progress:
        s = run(gguf_file, out, force, progress)
    cfg = s.cfg
    types = ", ".join(f"{n} {t}" for t, n in s.tensor_types.items())
    err.print(f"wrote {out}: {cfg.n_params() / 1e6:.1f}M parameters ({s.architecture}; {types} in the file), "
              f"vocabulary {cfg.vocab_size}, n_ctx {cfg.n_ctx}, {cfg.n_head} heads ({cfg.n_kv_head} key/value)"
              f"{', chat template' if s.chat_template else ''}; next: {_next(cfg, out)}")
