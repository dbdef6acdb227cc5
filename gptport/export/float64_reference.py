"""The reference's own rounding, measured: the torch model computed in float64, against which export's checks
measure how far torch's float32 lies from exact (tolerance.py's second term)."""

from __future__ import annotations

import functools

import numpy as np
import torch

from gptport.runtime.engine import Past, StepFn
from gptport.training.model import GPT

HEAD_ROWS = 8192  # a Linear of more outputs (a vocabulary's head) is widened this many rows at a time


def float64_copy(model: GPT) -> GPT:
    """`model` computed in float64 for the cost of one module's float64 weights at a time (a whole copy is twice
    the model's bytes: 1.1 GB for 135M parameters): its structure on the meta device, each module given its
    weights from `model`'s, widened, just before it runs, and dropped after; an embedding widens only the rows
    it looks up, a head of more than HEAD_ROWS outputs that many rows at a time. Buffers (RoPE's inverse
    frequencies) are widened once."""
    with torch.device("meta"):
        m64 = GPT(model.cfg).double()
    for name, buf in model.named_buffers():
        owner, _, attr = name.rpartition(".")
        setattr(m64.get_submodule(owner), attr, buf.detach().double())
    sources = dict(model.named_modules())
    for name, module in m64.named_modules():
        if isinstance(module, torch.nn.Embedding):  # rows looked up, then widened: not the whole table
            module.forward = functools.partial(_lookup, sources[name])  # type: ignore[method-assign]
        elif isinstance(module, torch.nn.Linear) and module.out_features > HEAD_ROWS:  # a vocabulary's head
            module.forward = functools.partial(_rows_widened, sources[name])  # type: ignore[method-assign]
        elif next(module.parameters(recurse=False), None) is not None:
            module.register_forward_pre_hook(functools.partial(_widen, sources[name]))
            module.register_forward_hook(_drop)
    return m64.eval()


def _rows_widened(source: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`source` (a head of more than HEAD_ROWS outputs) in float64 on float64 `x`, HEAD_ROWS of its rows widened
    at a time into one buffer: each output is the same float64 dot product, without a float64 copy of the whole
    weight (1.3 GB, and as many fresh pages, for each call of a 262,144-row head)."""
    w = source.weight.detach()  # (V, D) float32
    rows = x.reshape(-1, x.shape[-1])  # (N, D)
    out = rows.new_empty((rows.shape[0], w.shape[0]))  # (N, V)
    wide = torch.empty((HEAD_ROWS, w.shape[1]), dtype=torch.float64)  # (R, D)
    part = rows.new_empty((rows.shape[0], HEAD_ROWS))  # (N, R)
    for a in range(0, w.shape[0], HEAD_ROWS):
        n = min(HEAD_ROWS, w.shape[0] - a)
        wide[:n].copy_(w[a:a + n])
        torch.mm(rows, wide[:n].t(), out=part[:, :n])
        out[:, a:a + n] = part[:, :n]
    if source.bias is not None:
        out += source.bias.detach().double()
    return out.view(*x.shape[:-1], w.shape[0])  # (..., V)


def _lookup(source: torch.nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    """The float64 embedding of `ids`: `source`'s float32 rows gathered, then widened (exactly the widened
    table's rows, without widening a 262,144-row vocabulary for a few tokens)."""
    return torch.nn.functional.embedding(ids, source.weight.detach()).double()  # (B, T, D)


def _widen(source: torch.nn.Module, module: torch.nn.Module, args: object) -> None:
    """`module`'s parameters from `source`'s, in float64 (a forward pre-hook of float64_copy)."""
    for name, p in source.named_parameters(recurse=False):
        setattr(module, name, torch.nn.Parameter(p.detach().double(), requires_grad=False))


def _drop(module: torch.nn.Module, args: object, out: object) -> None:
    """`module`'s float64 parameters back to shapes on the meta device (a forward hook of float64_copy)."""
    for name, p in list(module.named_parameters(recurse=False)):
        setattr(module, name, torch.nn.Parameter(p.detach().to("meta"), requires_grad=False))


def exact_step(model: GPT, tail: int = 0) -> StepFn:
    """The torch model computed in float64 (float64_copy), outputs in float64: what the reference's own
    float32 rounding is measured against (tolerance.py). Export makes it once per job and hands it to each
    check. With `tail`, each layer's present keeps only its last `tail` positions (the new ones): a long past
    then costs no float64 copy of the whole cache."""
    m64 = float64_copy(model)
    device = next(model.parameters()).device
    if tail:
        for block in m64.h:
            block.attn.register_forward_hook(functools.partial(_keep_tail, tail))

    @torch.no_grad()
    def step(ids: np.ndarray, mask: np.ndarray, pos: np.ndarray, past: Past) -> tuple[np.ndarray, Past]:
        # a float32 past is read as it is: each layer widens it as it joins the new keys (torch.cat promotes)
        kv = [(torch.from_numpy(np.asarray(past[i])).to(device), torch.from_numpy(np.asarray(past[i + 1])).to(device))
              for i in range(0, len(past), 2)]
        logits, present = m64(torch.from_numpy(ids).to(device), torch.from_numpy(mask).to(device),
                              torch.from_numpy(pos).to(device), kv)
        return logits.cpu().numpy(), [t.cpu().numpy() for pair in present for t in pair]

    return step


def _keep_tail(tail: int, module: torch.nn.Module, args: object, out: tuple[torch.Tensor, tuple[torch.Tensor, ...]]
               ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """An attention's output with its present cut to the last `tail` positions, copied (a forward hook)."""
    y, kv = out
    return y, tuple(t[:, :, -tail:].clone() for t in kv)
