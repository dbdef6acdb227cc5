"""The per-channel ranges of the activations smooth.py rescales, measured on the torch model over held-out
windows: each norm's output ("h.3.ln_1", "ln_f") and each down projection's input ("h.3.mlp.c_proj"); and
sampled rows of those activations (and of each attention output projection's input), which awq.py searches on."""

from __future__ import annotations

import numpy as np
import torch

from gptport.training.model import GPT

NORM_SUFFIXES = (".ln_1", ".ln_2")


def _watched(name: str) -> str:
    """"out" for a norm whose output MatMuls read, "in" for a down projection, "" otherwise."""
    if name.endswith(NORM_SUFFIXES) or name == "ln_f":
        return "out"
    return "in" if name.endswith(".mlp.c_proj") else ""


@torch.no_grad()
def activation_ranges(model: GPT, windows: np.ndarray) -> dict[str, np.ndarray]:
    """max |x_j| per channel of every watched activation over `windows` ((N, T) token ids), one window at a
    time: module name -> (channels,) float32."""
    ranges: dict[str, torch.Tensor] = {}

    def hook(name: str, side: str):  # noqa: ANN202 (a torch forward hook)
        def record(_module: torch.nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
            x = (args[0] if side == "in" else out).detach().float()  # (B, T, C)
            peak = x.abs().amax(dim=tuple(range(x.dim() - 1)))  # (C,)
            ranges[name] = torch.maximum(ranges[name], peak) if name in ranges else peak
        return record

    handles = [m.register_forward_hook(hook(n, side)) for n, m in model.named_modules() if (side := _watched(n))]
    try:
        for row in windows:
            model(torch.from_numpy(np.ascontiguousarray(row[None, :])))  # (1, T)
    finally:
        for h in handles:
            h.remove()
    return {n: r.numpy().astype(np.float32) for n, r in ranges.items()}


def _sampled(name: str) -> str:
    """_watched, and the attention's output projection's input ("in": awq.py clips that matrix too); not ln_f,
    whose reader, the head, is never 4-bit."""
    if name == "ln_f":
        return ""
    return _watched(name) or ("in" if name.endswith(".attn.c_proj") else "")


@torch.no_grad()
def activation_samples(model: GPT, windows: np.ndarray, rows: int = 512, seed: int = 0) -> dict[str, np.ndarray]:
    """Rows of the activations awq.py searches its scales and clipping on: about `rows` positions drawn at random
    (seeded) from `windows` ((N, T) token ids), the same positions for every module: module name -> (rows, C)."""
    rng = np.random.default_rng(seed)
    each = -(-rows // len(windows))
    picks = [np.sort(rng.choice(windows.shape[1], min(each, windows.shape[1]), replace=False)) for _ in windows]
    samples: dict[str, list[np.ndarray]] = {}
    at: list[np.ndarray] = []

    def hook(name: str, side: str):  # noqa: ANN202 (a torch forward hook)
        def record(_module: torch.nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
            x = (args[0] if side == "in" else out).detach().float()[0]  # (T, C)
            samples.setdefault(name, []).append(x[torch.from_numpy(at[0])].numpy())  # (picked, C)
        return record

    handles = [m.register_forward_hook(hook(n, side)) for n, m in model.named_modules() if (side := _sampled(n))]
    try:
        for row, pick in zip(windows, picks, strict=True):
            at[:] = [pick]
            model(torch.from_numpy(np.ascontiguousarray(row[None, :])))  # (1, T)
    finally:
        for h in handles:
            h.remove()
    return {n: np.concatenate(parts).astype(np.float32) for n, parts in samples.items()}
