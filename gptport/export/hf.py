"""Moving models to and from the Hugging Face transformers format, without transformers itself and without torch.
Out (export-hf): GPT-2, a config.json and a safetensors file whose Conv1D weights are the transposes of gptport's
Linear weights, and the Llama family as its architecture's class (hf_llama_export.py). In (import-hf): GPT-2 and
the Llama family, each read as its family (gptport/arch/) says: config.json into a ModelConfig, the shards'
headers checked against the family's plan (hf_files.py), the weights streamed into model.safetensors in their
source's type (hf_stream.py); config.json records the source's architecture class under imported_from. Only
safetensors are read (no pickles)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from gptport import arch, atomic
from gptport import tokenizer as bpe
from gptport.arch.base import Family, number, split
from gptport.arch.gpt2 import GPT2_FAMILY, mismatches
from gptport.config import LARGEST, ModelConfig, read_json
from gptport.errors import ArtifactError, InputError
from gptport.export import hf_files, hf_stream
from gptport.export.model_read import IMPORTED_FROM, ModelFiles
from gptport.paths import CONFIG, WEIGHTS
from gptport.safetensors_stream import Out, Progress, check_disk, file_size, write

__all__ = ["architecture", "export_hf", "gpt2_config", "import_hf", "mismatches", "write_model_dir"]
METADATA = {"format": "pt", "step": "0"}  # model.safetensors' metadata, as training writes it


def gpt2_config(cfg: ModelConfig, eot_id: int) -> dict[str, Any]:
    """transformers' GPT2Config of a gptport model (also what transformers.js reads of export-web's bundle)."""
    return GPT2_FAMILY.hf_config(cfg, [eot_id])


def export_hf(model_dir: Path, out: Path, force: bool = False) -> list[Path]:
    """Write a transformers checkpoint of the model's architecture: GPT2LMHeadModel for GPT-2's layers, the
    Llama family's class for its layers (hf_llama_export.py); any other is refused naming what differs."""
    from gptport.export import hf_llama_export
    from gptport.export.model_read import read_model

    files = read_model(model_dir)
    cfg = files.cfg
    family = hf_llama_export.mismatches(cfg)
    if mismatches(cfg) and family:
        if len(family) < 3:  # rope, RMSNorm or SwiGLU: said as what keeps it from the Llama family
            raise InputError(f"{model_dir}: not an architecture of the Llama family: {'; '.join(family)}")
        raise InputError(f"{model_dir}: not a GPT-2 architecture (nor the Llama family's): "
                         f"{'; '.join(mismatches(cfg))}")
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a directory")
    if out.exists() and any(out.iterdir()) and not force:
        raise InputError(f"{out}: exists and is not empty; pass --force to write into it")
    if not family:
        return hf_llama_export.export(files, out)
    return _export_gpt2(files, out)


def _export_gpt2(files: ModelFiles, out: Path) -> list[Path]:
    """A transformers GPT-2 checkpoint (config.json, model.safetensors, tokenizer files): the family's plan split
    back (Conv1D weights the transposes of gptport's Linear weights, the tied head not stored)."""
    from safetensors.numpy import save_file

    from gptport.export.model_read import read_weights

    model_dir, cfg, tok = files.path, files.cfg, files.tok
    weights = read_weights(model_dir, cfg)
    state = dict(pair for planned in GPT2_FAMILY.hf_plan(cfg, cfg.vocab_size)
                 for pair in split(planned, weights.pop(planned.name)))
    out.mkdir(parents=True, exist_ok=True)
    with atomic.atomic_path(out / "model.safetensors") as tmp:
        save_file(state, str(tmp), metadata={"format": "pt"})
    atomic.write_text(out / "config.json", json.dumps(gpt2_config(cfg, tok.eot_id), indent=2) + "\n")
    for name in (bpe.TOKENIZER_FILE, *bpe.GPT2_FILES, bpe.HF_CONFIG_FILE):
        atomic.write_bytes(out / name, (model_dir / name).read_bytes())
    return [out / n for n in ("config.json", "model.safetensors", bpe.TOKENIZER_FILE, bpe.HF_CONFIG_FILE)]


def _hf_tokenizer(hf_dir: Path) -> bpe.BPETokenizer:
    """The byte-level BPE of a GPT-2 directory: tokenizer.json, else vocab.json + merges.txt."""
    from tokenizers import AddedToken, Tokenizer, models

    path = hf_dir / bpe.TOKENIZER_FILE
    if path.is_file():
        try:
            backend = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a plain Exception on a malformed file
            raise ArtifactError(f"{path}: not a valid tokenizer file ({e})") from e
        if type(backend.model).__name__ != "BPE":
            raise InputError(f"{path}: a {type(backend.model).__name__} tokenizer, not byte-level BPE")
    elif (hf_dir / "vocab.json").is_file() and (hf_dir / "merges.txt").is_file():
        backend = bpe.new_backend()
        backend.model = models.BPE.from_file(str(hf_dir / "vocab.json"), str(hf_dir / "merges.txt"))
    else:
        raise InputError(f"{hf_dir}: no tokenizer.json, nor vocab.json + merges.txt")
    if backend.token_to_id(bpe.EOT) is None:
        raise InputError(f"{hf_dir}: the tokenizer has no {bpe.EOT} token")
    backend.add_special_tokens([AddedToken(bpe.EOT, special=True, normalized=False)])
    return bpe.BPETokenizer(backend)


def architecture(hf: dict[str, Any], where: Path) -> Family:
    """The family config.json declares (gptport/arch/); any other is refused naming it."""
    family = arch.from_hf(hf)
    if family is None:
        kind = ", ".join(map(str, hf.get("architectures") or [])) or hf.get("model_type") or "unknown"
        raise InputError(f"{where}: architecture {kind} is not one gptport imports ({', '.join(arch.hf_classes())})")
    return family


def import_hf(hf_dir: Path, out: Path, force: bool = False, progress: Progress | None = None) -> ModelConfig:
    """Turn a local transformers directory (GPT-2 or the Llama family) into a gptport model directory. Every
    check runs before anything is written (the shards' headers against the family's plan, the disk's room); the
    directory is then written in one move (write_model_dir), the weights streamed tensor by tensor."""
    config_path = hf_dir / "config.json"
    if not config_path.is_file():
        raise InputError(f"{hf_dir}: no config.json")
    hf_files.weight_files(hf_dir)  # no weights, or pickles only: said before anything is read
    if (out / bpe.TOKENIZER_FILE).exists() and not force:
        raise InputError(f"{out}: already holds a model; pass --force to replace it")
    hf = read_json(config_path)
    family = architecture(hf, config_path)
    kept: dict[str, bytes] = {}
    tokens = None
    if family is GPT2_FAMILY:
        tok = _hf_tokenizer(hf_dir)
    else:
        backend, text = hf_files.read_tokenizer_json(hf_dir)
        tokens = hf_files.specials(hf_dir, backend, hf)
        tok = bpe.BPETokenizer(backend, text, tokens.eot_id)
        kept = hf_files.kept_files(hf_dir)
    model_vocab = number(hf, "vocab_size", config_path, positive=True)
    if model_vocab > LARGEST["vocab_size"]:
        raise InputError(f"{config_path}: vocab_size must be at most {LARGEST['vocab_size']:,}, not {model_vocab:,}")
    if tok.vocab_size > model_vocab:
        raise InputError(f"{hf_dir}: the tokenizer has {tok.vocab_size} tokens but the model's vocabulary only "
                         f"{model_vocab}: the tokenizer does not fit the model")
    cfg = family.model_config(hf, tok.vocab_size, tokens, config_path)  # type: ignore[arg-type]
    weights = hf_stream.outs(family, cfg, model_vocab, hf_files.read_headers(hf_dir), hf_dir)
    archs = hf.get("architectures")
    source = {"format": "transformers", "directory": hf_dir.resolve().name,
              "architecture": archs[0] if isinstance(archs, list) and archs else family.hf_class}
    write_model_dir(out, tok, cfg, kept, weights, source, progress)
    return cfg


def _write_config(model_dir: Path, cfg: ModelConfig, tok: bpe.BPETokenizer, sha: str,
                  source: dict[str, Any] | None) -> None:
    """model_card.write_config's config.json, with the source recorded under imported_from when given."""
    from gptport.model_card import write_config

    write_config(model_dir, cfg, tok, 0, sha)
    if source is not None:
        data = read_json(model_dir / CONFIG)
        atomic.write_text(model_dir / CONFIG, json.dumps({**data, IMPORTED_FROM: source}, indent=2) + "\n")


def write_model_dir(out: Path, tok: bpe.BPETokenizer, cfg: ModelConfig, kept: dict[str, bytes], weights: list[Out],
                    source: dict[str, Any] | None = None, progress: Progress | None = None) -> None:
    """The tokenizer's files, `kept` (transformers' files kept byte for byte, by path: tokenizer_config.json
    and additional_chat_templates/NAME.jinja among them), the weights (written tensor by tensor:
    safetensors_stream.py) and config.json (recording `source` under imported_from), staged in a temporary
    directory, after the disk's room for them is checked. A new (or empty) `out` is that directory renamed into
    place: nothing half-written is ever seen. Into a directory holding other files, the staged files move in one by
    one, config.json last and accepting the weights' sha256 before they land (as checkpoint.save_model does), so a
    crash never pairs a config.json with weights it did not see."""
    from gptport.model_card import mark_pending

    whole = not out.exists() or (out.is_dir() and not any(out.iterdir()))
    parent = out.parent if whole else out
    check_disk(parent, file_size(weights, METADATA) + sum(map(len, kept.values())), f"importing into {out}")
    parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.import-", dir=parent))
    try:
        bpe.save(tok, stage, force=True)
        for name, data in kept.items():
            (stage / name).parent.mkdir(parents=True, exist_ok=True)
            (stage / name).write_bytes(data)
        staged = stage / WEIGHTS
        sha = write(staged, weights, METADATA, progress)
        if whole:
            _write_config(stage, cfg, tok, sha, source)
            atomic.replace_dir(stage, out)
            return
        for path in stage.iterdir():
            if path != staged:
                if path.is_dir() and (out / path.name).is_dir():
                    shutil.rmtree(out / path.name)  # a folder of named templates is replaced whole
                path.replace(out / path.name)
        mark_pending(out, sha)
        staged.replace(out / WEIGHTS)
        _write_config(out, cfg, tok, sha, source)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
