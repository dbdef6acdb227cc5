"""Checkpoints: model.safetensors + config.json (which records the weights' sha256), and the resume state
(trainer.json + optimizer.safetensors). Safetensors and JSON only, every file written atomically, tied
weights once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file

from gptport import atomic, provenance, safetensors_file
from gptport.config import ModelConfig
from gptport.errors import ArtifactError, first_line
from gptport.model_card import ModelCard, check_tokenizer, mark_pending, read_card, write_config
from gptport.paths import OPTIMIZER, TRAINER, WEIGHTS
from gptport.tokenizer import BPETokenizer
from gptport.training.layers import rope_inv_freq
from gptport.training.model import GPT

__all__ = ["ModelCard", "check_tokenizer", "load_model", "mark_pending", "read_card", "save_model",
           "write_config"]
TIED_KEY = "lm_head.weight"


def write_weights(path: Path, model: GPT, step: int) -> str:
    """The weights as a safetensors file at `path` (the tied head stored once, as wte.weight); its sha256."""
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()
             if not (model.cfg.tie_embeddings and k == TIED_KEY)}
    save_file(state, str(path), metadata={"format": "pt", "step": str(step)})
    return provenance.file_digest(path)


def save_model(model_dir: Path, model: GPT, cfg: ModelConfig, tok: BPETokenizer, step: int) -> None:
    """model.safetensors, then config.json recording its sha256, so that config.json accepts the weights
    in place at every moment a crash could leave: the new weights are written under a temporary name and
    hashed, config.json accepts their sha256 besides its own (mark_pending), they are renamed into place,
    and config.json is written anew with theirs alone."""
    with atomic.atomic_path(model_dir / WEIGHTS) as tmp:
        sha = write_weights(tmp, model, step)
        mark_pending(model_dir, sha)
    write_config(model_dir, cfg, tok, step, sha)


def load_weights(model_dir: Path, cfg: ModelConfig, device: str | torch.device = "cpu") -> GPT:
    path = model_dir / WEIGHTS
    if not path.is_file():
        raise ArtifactError(f"{model_dir}: no {WEIGHTS}; train a model first (`gptport train`)")
    provenance.check_weights(model_dir)
    safetensors_file.read_header(path)  # before the library maps it: one line naming what is wrong
    try:
        state = load_file(str(path), device=str(device))
    except (SafetensorError, OSError) as e:
        raise safetensors_file.unreadable(path, e) from e
    check_finite(path, state)
    state = {k: v.float() if v.is_floating_point() else v for k, v in state.items()}  # no copy when float32
    with torch.device("meta"):  # no weights of its own: the model takes the file's tensors (assign), not copies
        model = GPT(cfg)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as e:  # a tensor of another shape
        raise ArtifactError(f"{path}: does not fit config.json ({first_line(e)})") from e
    missing = [k for k in missing if not (cfg.tie_embeddings and k == TIED_KEY)]
    if missing or unexpected:
        raise ArtifactError(f"{path}: does not fit config.json (missing {missing[:3]}, unexpected {unexpected[:3]})")
    if cfg.tie_embeddings:
        model.lm_head.weight = model.wte.weight
    if cfg.pos_encoding == "rope":  # the buffers not saved: computed from the config
        model.inv_freq = rope_inv_freq(cfg).to(device)
        if cfg.rope_scaling == "longrope":
            model.inv_freq_long = rope_inv_freq(cfg, long=True).to(device)
    if cfg.rope_local_theta > 0:
        model.local_inv_freq = rope_inv_freq(cfg, local=True).to(device)
    unset = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if unset:
        raise ArtifactError(f"{path}: does not fit config.json (missing {unset[:3]})")
    return model


def check_finite(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Refuse weights (or moments) holding NaN or infinity: bytes damaged on disk, or a diverged run."""
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise ArtifactError(f"{path}: {name} holds NaN or infinite values")


def load_model(model_dir: Path, tok: BPETokenizer, device: str | torch.device = "cpu") -> tuple[GPT, ModelCard]:
    """The trained model of a directory, after checking that its tokenizer is the one it was trained with."""
    card = read_card(model_dir)
    check_tokenizer(card, tok, model_dir)
    model = load_weights(model_dir, card.model, device)
    model.eval()
    return model, card


def save_resume(model_dir: Path, state: dict[str, Any], model: GPT, optimizer: torch.optim.Optimizer,
                tensors: dict[str, torch.Tensor]) -> None:
    """The resume state as ONE file, so that a kill at any moment leaves a consistent one:
    optimizer.safetensors holds the weights, the optimizer moments, the RNG states, and the loop's state
    (step, data position, settings, param groups) as JSON metadata. trainer.json repeats that JSON
    for people to read; --resume trusts optimizer.safetensors."""
    opt = optimizer.state_dict()
    flat = {f"state.{i}.{name}": t.detach().cpu().contiguous()
            for i, entry in opt["state"].items() for name, t in entry.items() if torch.is_tensor(t)}
    flat.update({f"rng.{k}": v.cpu().contiguous() for k, v in tensors.items()})
    flat.update({f"model.{k}": v.detach().cpu().contiguous() for k, v in model.state_dict().items()
                 if not (model.cfg.tie_embeddings and k == TIED_KEY)})
    full = {**state, "param_groups": opt["param_groups"]}
    text = json.dumps(full, indent=2)
    with atomic.atomic_path(model_dir / OPTIMIZER) as tmp:
        save_file(flat, str(tmp), metadata={"state": text})
    atomic.write_text(model_dir / TRAINER, text + "\n")


def read_resume_state(model_dir: Path) -> dict[str, Any]:
    """The loop's state in optimizer.safetensors (step, elapsed_s, data_rng, train, param_groups)."""
    path = model_dir / OPTIMIZER
    if path.is_file():
        safetensors_file.read_header(path)
    try:
        with safe_open(str(path), "pt") as f:
            text = (f.metadata() or {}).get("state")
    except (SafetensorError, OSError) as e:
        raise ArtifactError(f"{path}: unreadable ({e}); cannot --resume") from e
    if not text:
        raise ArtifactError(f"{path}: holds no training state; cannot --resume")
    try:
        state = json.loads(text)
    except ValueError as e:
        raise ArtifactError(f"{path}: its training state is not valid JSON ({e}); cannot --resume") from e
    kinds = {"step": int, "elapsed_s": (int, float), "data_rng": dict, "train": dict, "param_groups": list}
    bad = [k for k, kind in kinds.items() if not isinstance(state, dict) or not isinstance(state.get(k), kind)]
    if bad:
        raise ArtifactError(f"{path}: its training state lacks a valid {', '.join(bad)}; cannot --resume")
    return state


def load_resume(model_dir: Path, model: GPT, optimizer: torch.optim.Optimizer
                ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Restore the weights and the optimizer; return the loop's state and the saved RNG tensors."""
    state = read_resume_state(model_dir)
    try:
        return _restore(model_dir, state, model, optimizer)
    except (SafetensorError, KeyError, TypeError, ValueError, RuntimeError) as e:  # bytes damaged on disk
        raise ArtifactError(f"{model_dir / OPTIMIZER}: damaged ({first_line(e)}); cannot --resume") from e


def _restore(model_dir: Path, state: dict[str, Any], model: GPT, optimizer: torch.optim.Optimizer
             ) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    flat = load_file(str(model_dir / OPTIMIZER))
    check_finite(model_dir / OPTIMIZER, flat)
    entries: dict[int, dict[str, torch.Tensor]] = {}
    weights: dict[str, torch.Tensor] = {}
    rng: dict[str, torch.Tensor] = {}
    for key, t in flat.items():
        kind, _, rest = key.partition(".")
        if kind == "rng":
            rng[rest] = t
        elif kind == "model":
            weights[rest] = t
        else:
            idx, _, name = rest.partition(".")
            entries.setdefault(int(idx), {})[name] = t
    device = next(model.parameters()).device
    missing, unexpected = model.load_state_dict({k: v.to(device) for k, v in weights.items()}, strict=False)
    if [k for k in missing if k != TIED_KEY] or unexpected:
        raise ArtifactError(f"{model_dir / OPTIMIZER}: its weights do not fit config.json; cannot --resume")
    optimizer.load_state_dict({"state": entries, "param_groups": state.pop("param_groups")})
    return state, rng
