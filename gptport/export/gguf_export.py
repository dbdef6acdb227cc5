"""A model directory as one GGUF file that llama.cpp runs: GPT-2's layers as llama.cpp's `gpt2` architecture, the
Llama family's as `llama`, `qwen2` or `qwen3` (gguf_llama.py), the tokenizer as GGUF's tokenizer.ggml.* keys
(gguf_vocab.py).

Weights are read with safetensors' numpy API and written with the `gguf` package (GGUFWriter, and its
numpy quantizers for f16 and q8_0); no torch. gptport's Linear weights are (out, in), which is what
llama.cpp wants once GGUF reverses the shape, so nothing is transposed (transformers' GPT-2 Conv1D
checkpoints need the transpose that llama.cpp's convert_hf_to_gguf.py applies). A GPT-2 trained here gets
`<|endoftext|>` as BOS, EOS and unknown, as convert_hf_to_gguf.py writes for a GPT-2 directory (no padding
token, no BOS added to prompts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np

from gptport import atomic
from gptport.arch.gpt2 import mismatches
from gptport.config import ModelConfig
from gptport.errors import InputError, UsageError
from gptport.export import gguf_llama, gguf_vocab, hf_llama_export
from gptport.export.model_read import ModelFiles, read_model, read_weights
from gptport.paths import CONFIG

ARCH = "gpt2"
OUTTYPES = ("f32", "f16", "q8_0")

def default_out(model_dir: Path, outtype: str) -> Path:
    """Where export-gguf writes without --out: MODEL_DIR/model.<outtype>.gguf."""
    return model_dir / f"model.{outtype}.gguf"


@dataclass(frozen=True)
class Summary:
    """What export_gguf wrote."""

    path: Path
    outtype: str
    n_bytes: int
    n_params: int
    tensor_types: dict[str, int] = field(default_factory=dict)  # GGML type name -> count
    vocab_size: int = 0
    n_merges: int = 0
    architecture: str = ARCH
    note: str = ""  # when llama.cpp computes what gptport does, where not always (Phi-3's LongRoPE)


def architecture(files: ModelFiles) -> str:
    """gpt2 for GPT-2's layers, else the Llama family's llama.cpp architecture (gguf_llama.py); any other
    model is refused naming what differs."""
    cfg, path = files.cfg, files.path / CONFIG
    problems = mismatches(cfg)
    if not problems:
        return ARCH
    family = hf_llama_export.mismatches(cfg)
    if len(family) == 3:  # none of rope, RMSNorm, SwiGLU: said as what keeps it from GPT-2
        raise InputError(f"{path}: not GPT-2's architecture, which llama.cpp's gpt2 runs: {'; '.join(problems)}")
    if family:
        raise InputError(f"{path}: not an architecture of the Llama family, which llama.cpp's llama runs: "
                         f"{'; '.join(family)}")
    try:
        return gguf_llama.architecture(cfg)
    except InputError as e:
        raise InputError(f"{path}: {e}") from None


def tensor_type(name: str, array: np.ndarray, outtype: str) -> gguf.GGMLQuantizationType:
    """The GGML type a tensor is written as: what convert_hf_to_gguf.py picks for gpt2. Norms, biases,
    1-D tensors and the position table stay float32; the rest take the output type."""
    if array.ndim <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight") \
            or name.startswith("position_embd."):
        return gguf.GGMLQuantizationType.F32
    return {"f32": gguf.GGMLQuantizationType.F32, "f16": gguf.GGMLQuantizationType.F16,
            "q8_0": gguf.GGMLQuantizationType.Q8_0}[outtype]


def encode_tensor(name: str, array: np.ndarray, outtype: str) -> tuple[np.ndarray, gguf.GGMLQuantizationType]:
    """The bytes (as numpy) and GGML type of one tensor; q8_0 falls back to f16 for rows not a
    multiple of its block, as convert_hf_to_gguf.py does."""
    qtype = tensor_type(name, array, outtype)
    try:
        return gguf.quants.quantize(array, qtype), qtype
    except gguf.QuantError:
        return gguf.quants.quantize(array, gguf.GGMLQuantizationType.F16), gguf.GGMLQuantizationType.F16


def check_out(out: Path, force: bool) -> None:
    """Refuse a directory as --out, and an existing file unless `force`."""
    if out.is_dir():
        raise UsageError(f"--out {out}: is a directory; name the .gguf file to write")
    if out.exists() and not force:
        raise InputError(f"{out}: exists; pass --force to replace it")


def export_gguf(model_dir: Path, outtype: str = "f32", out: Path | None = None, force: bool = False) -> Summary:
    """Write MODEL_DIR's model and tokenizer as one GGUF file (atomically: temp name, then rename)."""
    if outtype not in OUTTYPES:
        raise UsageError(f"--outtype must be one of {', '.join(OUTTYPES)}, not {outtype!r}")
    files = read_model(model_dir)
    cfg = files.cfg
    arch = architecture(files)
    out = default_out(model_dir, outtype) if out is None else out
    check_out(out, force)
    vocab = gguf_vocab.read_vocab(files)
    state = read_weights(model_dir, cfg)
    n_params = sum(int(v.size) for v in state.values())
    named = gguf_llama.tensors(state, cfg, arch)  # the family's GGUF names (gptport/arch/)
    state.clear()
    named.reverse()
    tensors = []
    while named:  # each tensor encoded, its float32 source let go: about one copy of the weights at a time
        name, array = named.pop()
        tensors.append((name, *encode_tensor(name, array, outtype)))
        del array

    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic.atomic_path(out) as tmp:
        writer = gguf.GGUFWriter(tmp, arch=arch)
        try:
            _write_metadata(writer, cfg, outtype, model_dir.resolve().name)
            gguf_vocab.add_to(writer, vocab)
            for name, data, qtype in tensors:
                writer.add_tensor(name, data, raw_dtype=qtype)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
    counts: dict[str, int] = {}
    for _, _, qtype in tensors:
        counts[qtype.name] = counts.get(qtype.name, 0) + 1
    return Summary(out, outtype, out.stat().st_size, n_params, counts, len(vocab.tokens), len(vocab.merges), arch,
                   gguf_llama.note(cfg, arch))


def _write_metadata(writer: gguf.GGUFWriter, cfg: ModelConfig, outtype: str, name: str) -> None:
    """The architecture's hyperparameters under its prefix (gpt2.* here, the Llama family's in gguf_llama.py)."""
    file_type = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                 "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[outtype]
    writer.add_name(name)
    writer.add_file_type(file_type)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if writer.arch != ARCH:
        gguf_llama.add_metadata(writer, cfg)
        return
    writer.add_block_count(cfg.n_layer)
    writer.add_context_length(cfg.n_ctx)
    writer.add_embedding_length(cfg.d_model)
    writer.add_feed_forward_length(cfg.d_ff)
    writer.add_head_count(cfg.n_head)
    writer.add_layer_norm_eps(cfg.ln_eps)
