"""import-gguf: a llama.cpp GGUF file (any architecture of gptport/arch/, float or block-quantized tensors) as
a gptport model directory. The file is read memory-mapped (gguf_file.py); its tokenizer is rebuilt (gguf_tokenizer.py),
its metadata becomes a ModelConfig and its tensors gptport's (gguf_config.py). Every check runs before anything
is written; the weights are then dequantized a piece at a time and streamed into model.safetensors (float32,
gptport's names, the tied head stored once, as training writes them), so that the peak memory is about one
layer's attention weights, not the model's. The directory is staged whole beside --out and renamed into place, as
import-hf does; config.json records the source file's name and sha256 under "imported_from"."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gptport import atomic, model_card, provenance
from gptport import tokenizer as bpe
from gptport.arch.base import Planned, take
from gptport.config import ModelConfig
from gptport.errors import ArtifactError, InputError
from gptport.export.gguf_config import architecture, model_config, plan
from gptport.export.gguf_file import GGUFFile
from gptport.export.gguf_tokenizer import Rebuilt, rebuild
from gptport.export.hf_files import CHAT_TEMPLATE
from gptport.paths import CONFIG, WEIGHTS
from gptport.safetensors_stream import Out, Progress, check_disk, file_size, write

IMPORTED_FROM = "imported_from"  # config.json: the GGUF file the model came from
METADATA = {"format": "pt", "step": "0"}
CHUNK = 1 << 22  # float32 values dequantized at a time (16 MiB) where a tensor's rows can come in pieces


@dataclass(frozen=True)
class Summary:
    """What import_gguf wrote."""

    out: Path
    cfg: ModelConfig
    architecture: str
    tensor_types: dict[str, int]  # the source's GGML type name -> tensor count
    n_tensors: int  # in model.safetensors
    source_sha256: str
    chat_template: bool


def _pieces(f: GGUFFile, planned: Planned) -> Iterator[np.ndarray]:
    """One of gptport's tensors from the file's, in pieces of rows: dequantized, cut, un-permuted, stacked. A
    tensor of one part, whose rows need no reordering (the embedding, the head, the MLP's), comes CHUNK values at a
    time, so that gguf.quants' intermediates stay small; q, k and v (whose heads are reordered) come whole."""
    parts = planned.parts
    if len(parts) == 1 and parts[0].heads is None and len(planned.shape) == 2:
        rows, cols = planned.shape
        step, first = max(1, CHUNK // cols), parts[0].start  # first: a row block of a fused tensor (ffn_up's)
        for start in range(0, rows, step):
            yield f.dequantize(parts[0].name, first + start, first + min(rows, start + step))
        return
    for part in parts:  # [q | k | v] stacked: written one after another
        yield take(part, f.dequantize(part.name))


def _finite(f: GGUFFile, planned: Planned) -> Iterator[np.ndarray]:
    for piece in _pieces(f, planned):
        if not np.isfinite(piece).all():
            raise ArtifactError(f"{f.path}: tensor {planned.parts[0].name} holds NaN or infinite values")
        yield np.ascontiguousarray(piece, dtype="<f4")


def weights(f: GGUFFile, planned: list[Planned]) -> list[Out]:
    """model.safetensors' tensors (float32, gptport's names), each dequantized when its turn to be written comes."""
    return [Out(p.name, "F32", p.shape, lambda p=p: _finite(f, p)) for p in planned]  # type: ignore[misc]


def _write_config(model_dir: Path, cfg: ModelConfig, tok: bpe.BPETokenizer, sha: str, source: dict[str, Any]) -> None:
    """model_card.write_config's config.json, with the source file recorded."""
    model_card.write_config(model_dir, cfg, tok, 0, sha)
    path = model_dir / CONFIG
    data = json.loads(path.read_text(encoding="utf-8"))
    atomic.write_text(path, json.dumps({**data, IMPORTED_FROM: source}, indent=2) + "\n")


def _stage_tokenizer(stage: Path, rebuilt: Rebuilt) -> None:
    """tokenizer.json (rebuilt), its meta and GPT-2 files, and the file's tokenizer_config.json and chat template."""
    bpe.save(rebuilt.tokenizer, stage, force=True)
    (stage / bpe.HF_CONFIG_FILE).write_text(json.dumps(rebuilt.config, indent=2, ensure_ascii=False) + "\n",
                                            encoding="utf-8")
    if rebuilt.chat_template is not None:
        (stage / CHAT_TEMPLATE).write_text(rebuilt.chat_template, encoding="utf-8")


def check_out(out: Path, force: bool) -> None:
    """Refuse an --out that is a file, or that holds a model already (unless `force`)."""
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a directory")
    if (out / bpe.TOKENIZER_FILE).exists() and not force:
        raise InputError(f"{out}: already holds a model; pass --force to replace it")


def import_gguf(path: Path, out: Path, force: bool = False, progress: Progress | None = None) -> Summary:
    """Turn the GGUF file at `path` into a gptport model directory `out` (see the module's docstring)."""
    check_out(out, force)
    f = GGUFFile(path)
    family = architecture(f)
    arch = str(family.gguf_arch)
    f.check_types()
    rebuilt = rebuild(f)
    cfg = model_config(f, family, rebuilt.tokenizer.vocab_size, rebuilt.specials)
    planned = weights(f, plan(f, family, cfg))
    types = dict(sorted(Counter(f.type_name(n) for n in f.tensors).items()))
    source = {"format": "gguf", "file": path.name, "sha256": provenance.file_digest(path),
              "bytes": path.stat().st_size, "architecture": arch, "tensor_types": types}

    whole = not out.exists() or not any(out.iterdir())
    parent = out.parent if whole else out
    check_disk(parent, file_size(planned, METADATA), f"importing into {out}")
    parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.import-", dir=parent))
    try:
        _stage_tokenizer(stage, rebuilt)
        staged = stage / WEIGHTS
        sha = write(staged, planned, METADATA, progress)
        if whole:
            _write_config(stage, cfg, rebuilt.tokenizer, sha, source)
            atomic.replace_dir(stage, out)
        else:  # into a directory holding other files: config.json last, accepting the new weights before they land
            for item in stage.iterdir():
                if item != staged:
                    item.replace(out / item.name)
            model_card.mark_pending(out, sha)
            staged.replace(out / WEIGHTS)
            _write_config(out, cfg, rebuilt.tokenizer, sha, source)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return Summary(out, cfg, arch, types, len(planned), source["sha256"], rebuilt.chat_template is not None)
