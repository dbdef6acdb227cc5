"""The torch model as an engine of the generation loop: the reference that ONNX is checked against, and
what `--engine torch` runs in generate, eval and bench's baseline."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from gptport.config import ModelConfig
from gptport.errors import UsageError
from gptport.runtime.engine import Capability, Past, StepFn
from gptport.runtime.loader import Opened, load_tokenizer
from gptport.training.checkpoint import load_model
from gptport.training.model import GPT

TORCH_DEVICES = ("cpu", "cuda")  # the --provider values the torch engine takes


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

    @property
    def config(self) -> ModelConfig:
        return self.model.cfg

    @property
    def capabilities(self) -> frozenset[Capability]:
        """Its logits come to the host each step; its cache is concatenated."""
        return frozenset({Capability.CONSTRAIN})

    def step(self, last_only: bool = False) -> StepFn:
        return torch_step(self.model, last_only)

    def empty_past(self, batch: int) -> Past:
        cfg = self.model.cfg
        return [np.zeros((batch, cfg.n_kv_head, 0, cfg.head_dim), dtype=np.float32) for _ in range(2 * cfg.n_layer)]


def open_torch(model_dir: Path, provider: str = "cpu", threads: int = 0) -> Opened:
    """The directory's tokenizer and its torch model from model.safetensors on `provider` (cpu or cuda)."""
    if provider not in TORCH_DEVICES:  # no substitute: torch on CUDA is not TensorRT
        raise UsageError(f"--engine torch --provider {provider}: the torch engine runs on "
                         f"{' or '.join(TORCH_DEVICES)} only; TensorRT runs through onnxruntime (--engine onnx)")
    tok = load_tokenizer(model_dir)
    if threads > 0:
        torch.set_num_threads(threads)
    if provider == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--engine torch --provider {provider}: torch sees no CUDA GPU here")
    model, _ = load_model(model_dir, tok, provider)
    return Opened(TorchEngine(model), tok, "torch", provider, "fp32")
