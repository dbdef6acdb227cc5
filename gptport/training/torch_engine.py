"""The torch model as an engine of the generation loop: the reference that ONNX is checked against."""

from __future__ import annotations

import numpy as np
import torch

from gptport.engine import Past, StepFn
from gptport.model import GPT


def torch_step(model: GPT, last_only: bool = False) -> StepFn:
    """The torch model as a step function over numpy arrays (float32 cache); `last_only`: logits
    (B, 1, V) of the last position, the head computed for it alone (as the ONNX engines do)."""
    device = next(model.parameters()).device

    @torch.no_grad()
    def step(ids: np.ndarray, mask: np.ndarray, pos: np.ndarray, past: Past) -> tuple[np.ndarray, Past]:
        kv = [(torch.from_numpy(np.asarray(past[i])).to(device), torch.from_numpy(np.asarray(past[i + 1])).to(device))
              for i in range(0, len(past), 2)]
        logits, present = model(torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device),
                                torch.from_numpy(pos).to(device), kv, last_only=last_only)
        flat = [t.float().cpu().numpy() for pair in present for t in pair]
        return logits.float().cpu().numpy(), flat

    return step


class TorchEngine:
    """`gptport generate --engine torch`: the same loop over the torch model."""

    def __init__(self, model: GPT) -> None:
        self.model = model.eval()

    @property
    def n_ctx(self) -> int:
        return self.model.cfg.n_ctx

    def step(self, last_only: bool = False) -> StepFn:
        return torch_step(self.model, last_only)

    def empty_past(self, batch: int) -> Past:
        cfg = self.model.cfg
        return [np.zeros((batch, cfg.n_head, 0, cfg.head_dim), dtype=np.float32) for _ in range(2 * cfg.n_layer)]
