"""The scalings around a graph's layers that Gemma 2 and Granite add, from onnx's stock operators, as the torch
model computes them (training/model.py): each sublayer's output times residual_scale before its residual add,
the head's output divided by logits_divisor and soft-capped by final_softcap, and an attention's scores
soft-capped by attn_softcap (tanh(s / cap) * cap: a Div, a Tanh and a Mul on the (B, H, S, T) scores, where an
attention made of stock operators computes its scores; design record 0052 measures the cost). No torch."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from gptport import contract
from gptport.config import ModelConfig


class Builder(Protocol):
    """What these need of graph_body.Builder (named here, not imported: graph_body imports this module)."""

    config: ModelConfig

    def const(self, name: str, array: np.ndarray) -> str: ...

    def op(self, op_type: str, inputs: list[str], outputs: int | list[str] = 1, domain: str = "",
           **attrs: Any) -> list[str]: ...


def softcap(g: Builder, x: str, cap: float, name: str) -> str:
    """tanh(x / cap) * cap, elementwise, in float32 (Gemma 2's soft-capping; `name`: its constant's)."""
    c = g.const(name, np.array(cap, np.float32))
    return g.op("Mul", [g.op("Tanh", [g.op("Div", [x, c])[0]])[0], c])[0]


def scaled(g: Builder, delta: str, bias: str) -> tuple[str, str]:
    """A sublayer's output (delta + bias) times residual_scale (Granite's residual_multiplier), bias folded in
    first; as it is at scale 1 or without a delta (a rope model's embeddings)."""
    scale = g.config.residual_scale
    if scale == 1.0 or not delta:
        return delta, bias
    total = g.op("Add", [delta, bias])[0] if bias else delta
    return g.op("Mul", [total, g.const("residual_scale", np.array(scale, np.float32))])[0], ""


def finishes(g: Builder) -> bool:
    """Whether the head's output is finished by more operators (divided, soft-capped): its MatMul then writes
    contract.HEAD and the last of them contract.LOGITS."""
    return g.config.logits_divisor != 1.0 or g.config.final_softcap > 0


def finish(g: Builder, head: str) -> None:
    """contract.LOGITS from the head's output `head` (B, L, V): divided by logits_divisor, then soft-capped."""
    cfg = g.config
    steps: list[tuple[str, list[str]]] = []
    if cfg.logits_divisor != 1.0:
        steps.append(("Div", [g.const("logits_divisor", np.array(cfg.logits_divisor, np.float32))]))
    if cfg.final_softcap > 0:
        cap = g.const("final_softcap", np.array(cfg.final_softcap, np.float32))
        steps += [("Div", [cap]), ("Tanh", []), ("Mul", [cap])]
    x = head
    for n, (op, rest) in enumerate(steps):
        x = g.op(op, [x, *rest], [contract.LOGITS] if n == len(steps) - 1 else 1)[0]  # (B, L, V)
