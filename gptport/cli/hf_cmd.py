"""`gptport export-hf` and `gptport import-hf`: to and from a local transformers directory of GPT-2 or the Llama
family (Llama, Mistral, Qwen2, Qwen3)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gptport.cli.common import Force, ModelDir, err, write_progress

if TYPE_CHECKING:
    from gptport.config import ModelConfig

EXPORT_EXAMPLES = """Example:

  gptport export-hf models/mymodel --out hf/mymodel
"""
IMPORT_EXAMPLES = """Example:

  gptport import-hf path/to/gpt2 --out models/gpt2
  gptport import-hf path/to/qwen3 --out models/qwen3
"""


def export_hf(
    model_dir: ModelDir,
    out: Annotated[Path, typer.Option("--out", help="Directory to write the transformers checkpoint into.")],
    force: Force = False,
) -> None:
    """Write a transformers checkpoint of the model's architecture (GPT2LMHeadModel, LlamaForCausalLM,
    Qwen2ForCausalLM, Qwen3ForCausalLM or MistralForCausalLM): AutoModelForCausalLM.from_pretrained loads it."""
    from gptport.export.hf import export_hf as run

    written = run(model_dir, out, force)
    err.print("wrote " + ", ".join(str(p) for p in written))


def import_hf(
    hf_dir: Annotated[Path, typer.Argument(help="A local transformers directory: GPT2LMHeadModel, LlamaForCausalLM, "
                                           "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                                           "Gemma2ForCausalLM, Gemma3ForCausalLM, GraniteForCausalLM, "
                                           "Olmo2ForCausalLM, Phi3ForCausalLM or SmolLM3ForCausalLM.",
                                           show_default=False)],
    out: Annotated[Path, typer.Option("--out", help="gptport model directory to create.")],
    force: Force = False,
) -> None:
    """Turn a local transformers checkpoint (GPT-2 or the Llama family) into a gptport model directory: the weights
    streamed tensor by tensor in their own type (bf16, fp16 or fp32), after every check (the shards against their
    index and config.json, the disk's room)."""
    from gptport.export.hf import import_hf as run

    with write_progress("writing") as progress:
        cfg = run(hf_dir, out, force, progress)
    err.print(f"wrote {out}: {cfg.n_params() / 1e6:.1f}M parameters, vocabulary {cfg.vocab_size}, n_ctx {cfg.n_ctx}, "
              f"{cfg.n_head} heads ({cfg.n_kv_head} key/value); next: {_next(cfg, out)}")


def _next(cfg: ModelConfig, out: Path) -> str:
    """What to run next: export, or for the Llama family (whose ONNX export is not finished) the torch engine."""
    if cfg.pos_encoding == "rope":
        return f"gptport generate {out} 'Hello' --engine torch"
    return f"gptport export {out}"
