"""A model directory's config.json: its ModelCard (the model's shape, the tokenizer it was trained with),
written after the weights whose sha256 it records, read and checked. No torch here: importers write it too."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gptport import __version__, atomic, provenance
from gptport.config import (
    MODEL_FORMAT_VERSION,
    ModelConfig,
    check_format_version,
    model_config_from_dict,
    model_config_to_dict,
    read_json,
)
from gptport.errors import ArtifactError
from gptport.paths import CONFIG
from gptport.tokenizer import BPETokenizer, check_trained_with


@dataclass(frozen=True)
class ModelCard:
    """What config.json says: the model's shape and the tokenizer it was trained with."""

    model: ModelConfig
    tokenizer_sha256: str
    special_tokens: dict[str, int]
    eot_id: int
    step: int
    model_dir: Path | None = None  # where config.json was read


def write_config(model_dir: Path, cfg: ModelConfig, tok: BPETokenizer, step: int, weights_sha256: str) -> None:
    """config.json, recording the sha256 of the model.safetensors in place (save_model's last write)."""
    data = {
        "format": "gptport-model",
        "format_version": MODEL_FORMAT_VERSION,
        "gptport_version": __version__,
        "model": model_config_to_dict(cfg),
        "n_params": cfg.n_params(),
        "tokenizer_sha256": tok.sha256,
        "special_tokens": tok.special_tokens,
        "eot_id": tok.eot_id,
        "step": step,
        provenance.WEIGHTS_SHA: weights_sha256,
    }
    atomic.write_text(model_dir / CONFIG, json.dumps(data, indent=2) + "\n")


def read_card(model_dir: Path) -> ModelCard:
    path = model_dir / CONFIG
    if not path.is_file():
        raise ArtifactError(f"{model_dir}: no {CONFIG}; train a model first (`gptport train`)")
    data = read_json(path)
    for key in ("model", "tokenizer_sha256", "eot_id"):
        if key not in data:
            raise ArtifactError(f"{path}: missing {key!r}")
    check_format_version(data, str(path))
    return ModelCard(model_config_from_dict(data["model"], str(path)), data["tokenizer_sha256"],
                     dict(data.get("special_tokens", {})), int(data["eot_id"]), int(data.get("step", 0)), model_dir)


def check_tokenizer(card: ModelCard, tok: BPETokenizer, model_dir: Path) -> None:
    """Refuse a tokenizer other than the one the model was trained with (tokenizer.check_trained_with)."""
    check_trained_with(tok, model_dir, card.tokenizer_sha256, card.model.vocab_size)


def mark_pending(model_dir: Path, sha: str) -> None:
    """Let config.json accept weights of sha256 `sha` too, before they replace model.safetensors (nothing
    to do without a readable config.json: there is no recorded sha256 to keep consistent)."""
    path = model_dir / CONFIG
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    if isinstance(data, dict) and provenance.WEIGHTS_SHA in data:
        atomic.write_text(path, json.dumps({**data, provenance.WEIGHTS_PENDING: sha}, indent=2) + "\n")
