"""Checkpoints: model.safetensors + config.json, and the resume state (trainer.json +
optimizer.safetensors). Safetensors and JSON only, every file written atomically, tied weights once."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from gptport import __version__, atomic
from gptport.checkpoint_paths import CONFIG, OPTIMIZER, TRAINER, WEIGHTS
from gptport.config import ModelConfig, model_config_from_dict, model_config_to_dict, read_json
from gptport.errors import ArtifactError
from gptport.model import GPT
from gptport.tokenizer import BPETokenizer

TIED_KEY = "lm_head.weight"


@dataclass(frozen=True)
class ModelCard:
    """What config.json says: the model's shape and the tokenizer it was trained with."""

    model: ModelConfig
    tokenizer_sha256: str
    special_tokens: dict[str, int]
    eot_id: int
    step: int


def write_config(model_dir: Path, cfg: ModelConfig, tok: BPETokenizer, step: int) -> None:
    data = {
        "format": "gptport-model",
        "format_version": 1,
        "gptport_version": __version__,
        "model": model_config_to_dict(cfg),
        "n_params": cfg.n_params(),
        "tokenizer_sha256": tok.sha256,
        "special_tokens": tok.special_tokens,
        "eot_id": tok.eot_id,
        "step": step,
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
    return ModelCard(model_config_from_dict(data["model"], str(path)), data["tokenizer_sha256"],
                     dict(data.get("special_tokens", {})), int(data["eot_id"]), int(data.get("step", 0)))


def check_tokenizer(card: ModelCard, tok: BPETokenizer, model_dir: Path) -> None:
    """Refuse a tokenizer other than the one the model was trained with."""
    if card.tokenizer_sha256 != tok.sha256:
        raise ArtifactError(
            f"{model_dir}/tokenizer.json (sha256 {tok.sha256[:12]}…) is not the tokenizer this model was "
            f"trained with ({card.tokenizer_sha256[:12]}…); retrain the model or restore the tokenizer")
    if card.model.vocab_size != tok.vocab_size:
        raise ArtifactError(f"{model_dir}: model vocab_size {card.model.vocab_size} != tokenizer's {tok.vocab_size}")


def save_weights(model_dir: Path, model: GPT, step: int) -> None:
    """model.safetensors, the tied head stored once (as wte.weight)."""
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()
             if not (model.cfg.tie_embeddings and k == TIED_KEY)}
    with atomic.atomic_path(model_dir / WEIGHTS) as tmp:
        save_file(state, str(tmp), metadata={"format": "pt", "step": str(step)})


def load_weights(model_dir: Path, cfg: ModelConfig, device: str | torch.device = "cpu") -> GPT:
    path = model_dir / WEIGHTS
    if not path.is_file():
        raise ArtifactError(f"{model_dir}: no {WEIGHTS}; train a model first (`gptport train`)")
    try:
        state = load_file(str(path), device=str(device))
    except (SafetensorError, OSError) as e:
        raise ArtifactError(f"{path}: unreadable ({e})") from e
    model = GPT(cfg).to(device)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (cfg.tie_embeddings and k == TIED_KEY)]
    if missing or unexpected:
        raise ArtifactError(f"{path}: does not fit config.json (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return model


def load_model(model_dir: Path, tok: BPETokenizer, device: str | torch.device = "cpu") -> tuple[GPT, ModelCard]:
    """The trained model of a directory, after checking that its tokenizer is the one it was trained with."""
    card = read_card(model_dir)
    check_tokenizer(card, tok, model_dir)
    model = load_weights(model_dir, card.model, device)
    model.eval()
    return model, card


def save_resume(model_dir: Path, state: dict[str, Any], optimizer: torch.optim.Optimizer,
                tensors: dict[str, torch.Tensor]) -> None:
    """optimizer.safetensors (optimizer moments + RNG states) then trainer.json, the commit point."""
    opt = optimizer.state_dict()
    flat = {f"state.{i}.{name}": t.detach().cpu().contiguous()
            for i, entry in opt["state"].items() for name, t in entry.items() if torch.is_tensor(t)}
    flat.update({f"rng.{k}": v.cpu().contiguous() for k, v in tensors.items()})
    with atomic.atomic_path(model_dir / OPTIMIZER) as tmp:
        save_file(flat, str(tmp), metadata={"step": str(state["step"])})
    state = {**state, "param_groups": opt["param_groups"]}
    atomic.write_text(model_dir / TRAINER, json.dumps(state, indent=2) + "\n")


def load_resume(model_dir: Path, optimizer: torch.optim.Optimizer
                ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Restore the optimizer; return trainer.json's state and the saved RNG tensors."""
    state = read_json(model_dir / TRAINER)
    try:
        flat = load_file(str(model_dir / OPTIMIZER))
    except (SafetensorError, OSError) as e:
        raise ArtifactError(f"{model_dir / OPTIMIZER}: unreadable ({e}); cannot --resume") from e
    entries: dict[int, dict[str, torch.Tensor]] = {}
    rng: dict[str, torch.Tensor] = {}
    for key, t in flat.items():
        kind, _, rest = key.partition(".")
        if kind == "rng":
            rng[rest] = t
        else:
            idx, _, name = rest.partition(".")
            entries.setdefault(int(idx), {})[name] = t
    optimizer.load_state_dict({"state": entries, "param_groups": state.pop("param_groups")})
    return state, rng

