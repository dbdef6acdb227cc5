"""A model directory read without torch, for the writers of other runtimes' formats (export-hf of the Llama
family, export-gguf): config.json (its format version, the model, the tokenizer it was trained with, where it
was imported from), the tokenizer checked against it, and model.safetensors as float32 numpy arrays, checked
name by name and shape by shape against what the config implies (the names gptport's torch model gives its
tensors, the tied head stored once as wte.weight); bf16 and fp16 weights (an import keeps its source's type)
widened."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gptport import provenance, safetensors_file
from gptport import tokenizer as bpe
from gptport.arch.base import gptport_shapes
from gptport.config import ModelConfig, read_json
from gptport.errors import ArtifactError, InputError
from gptport.model_card import check_tokenizer, read_card
from gptport.paths import CONFIG, WEIGHTS

IMPORTED_FROM = "imported_from"  # config.json: the source import-hf or import-gguf read


@dataclass(frozen=True)
class ModelFiles:
    """What config.json says, with the tokenizer it names."""

    path: Path
    cfg: ModelConfig
    tok: bpe.BPETokenizer
    source: dict[str, Any] = field(default_factory=dict)  # imported_from: {"format", "architecture", ...}


def read_model(model_dir: Path) -> ModelFiles:
    """config.json's model (model_card's checks: its keys, its format version) and the tokenizer it was
    trained with."""
    if not model_dir.is_dir():
        raise InputError(f"{model_dir}: not a directory")
    card = read_card(model_dir)
    tok = bpe.load(model_dir)  # checks tokenizer_meta.json's sha256
    check_tokenizer(card, tok, model_dir)
    source = read_json(model_dir / CONFIG).get(IMPORTED_FROM)
    return ModelFiles(model_dir, card.model, tok, source if isinstance(source, dict) else {})


expected_shapes = gptport_shapes  # the tensors model.safetensors holds for a config (gptport/arch/base.py)


def read_weights(model_dir: Path, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """model.safetensors as float32 numpy arrays (bf16 and fp16 widened; its sha256 checked against config.json),
    checked name by name and shape by shape."""
    path = model_dir / WEIGHTS
    if not path.is_file():
        raise ArtifactError(f"{model_dir}: no {WEIGHTS}; train a model first (`gptport train`)")
    provenance.check_weights(model_dir)
    state = {k: np.asarray(v, dtype=np.float32) for k, v in safetensors_file.read_numpy(path).items()}
    want = expected_shapes(cfg)
    missing, unexpected = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    if missing or unexpected:
        raise ArtifactError(f"{path}: does not fit {CONFIG} (missing {missing[:3]}, unexpected {unexpected[:3]})")
    for name, shape in want.items():
        if state[name].shape != shape:
            raise ArtifactError(f"{path}: {name} has shape {state[name].shape}, {CONFIG} implies {shape}")
    return state
