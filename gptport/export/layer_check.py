"""Parity that scales: a built graph checked against the torch model run one layer at a time (layer_reference.py),
so the check holds one layer of torch weights and its float64 twin, never the model. The graph under check is the
file itself, opened once with each layer's residual stream added to its outputs (a copy of the graph's few hundred
KiB beside it, reading the same external data); each layer's output, keys and values and the logits are compared
within the relative bounds of tolerance.py (record 0031) on a few lengths, left padding included. Greedy decoding
on the graph is then checked token by token against the reference's own choice on the same text (one reference
pass per prompt, teacher-forced), a disagreement accepted only where the reference's two candidates lie within
its rounding. What export checks when the model is too large to hold in torch (graph_write.external)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from gptport.config import ModelConfig
from gptport.errors import ValidationError
from gptport.export import layer_reference
from gptport.export.tolerance import Tolerance, compare
from gptport.export.validate import ParityRow
from gptport.runtime.engine import Engine
from gptport.runtime.onnx_engine import OnnxModel

CHECK_SPAN = 32  # tokens of the unpadded case (fewer where n_ctx is smaller)


@dataclass
class Case:
    """One input of the check and the reference's logits for it (kept for the static-cache graph's check)."""

    name: str
    ids: np.ndarray  # (B, T) int64
    mask: np.ndarray  # (B, T) int64, left padding as 0
    positions: np.ndarray  # (B, T) int64
    logits: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))  # (B, T, V) the reference's
    exact: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))  # (B, T, V) its float64 twin's


def cases(cfg: ModelConfig, seed: int = 0) -> list[Case]:
    """An unpadded row of min(n_ctx, CHECK_SPAN) tokens, and two rows of 9 with the second left-padded by 4."""
    rng = np.random.default_rng(seed)
    span = min(cfg.n_ctx, CHECK_SPAN)
    out = [Case(f"(1, {span})", rng.integers(0, cfg.vocab_size, (1, span)), np.ones((1, span), np.int64),
                np.arange(span, dtype=np.int64)[None])]
    if cfg.n_ctx >= 9:
        mask = np.ones((2, 9), np.int64)
        mask[1, :4] = 0
        pos = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
        out.append(Case("(2, 9) padded", rng.integers(0, cfg.vocab_size, (2, 9)), mask, pos))
    return out


def tapped(graph: Path, taps: Sequence[str]) -> Path:
    """A copy of the graph at `graph` (its external data read in place, not copied) whose outputs add `taps`, the
    residual stream after each layer (graph_body.Builder.residuals)."""
    proto = onnx.load(str(graph), load_external_data=False)
    proto.graph.output.extend(helper.make_tensor_value_info(t, TensorProto.FLOAT, None) for t in taps)
    out = graph.with_name(graph.name + ".check")
    onnx.save_model(proto, str(out))
    return out


def check_contract(graph: Path, taps: Sequence[str], cfg: ModelConfig, weights: Mapping[str, np.ndarray],
                   tol: Tolerance, checked: list[Case]) -> list[ParityRow]:
    """The contract graph at `graph` against the layer-by-layer reference on `checked` (cases()): per case, each
    layer's output, keys and values, then the logits, each within `tol` of its magnitude and of the reference's
    own float32 error (the float64 run); their top-1 agreement at the real positions. Stores each case's
    reference logits in it."""
    import onnxruntime as ort
    import torch

    from gptport import contract

    weight, references = weights.__getitem__, []
    for case in checked:  # the reference first, then the session: the peak is the larger of the two, not both
        want = list(layer_reference.run_layers(cfg, weight, case.ids, case.mask, case.positions))
        exact = list(layer_reference.run_layers(cfg, weight, case.ids, case.mask, case.positions,
                                                dtype=torch.float64))  # (a few MiB a layer at these lengths)
        references.append((want, exact))
        case.logits, case.exact = want[-1], exact[-1]  # type: ignore[assignment]
    copy = tapped(graph, taps)
    try:
        session = ort.InferenceSession(str(copy), providers=["CPUExecutionProvider"])
    finally:
        copy.unlink(missing_ok=True)
    rows = []
    for case, (want, exact) in zip(checked, references, strict=True):
        B = case.ids.shape[0]
        empty = np.zeros((B, cfg.n_kv_head, 0, cfg.head_dim), np.float32)
        feeds = {contract.INPUT_IDS: case.ids, contract.ATTENTION_MASK: case.mask,
                 contract.POSITION_IDS: case.positions, **{n: empty for n in contract.past_names(cfg.n_layer)}}
        outs = session.run(None, feeds)
        logits, presents, hidden = outs[0], outs[1:1 + 2 * cfg.n_layer], outs[1 + 2 * cfg.n_layer:]

        def got(i: int, presents: list[np.ndarray] = presents, hidden: list[np.ndarray] = hidden
                ) -> layer_reference.LayerOut:
            return layer_reference.LayerOut(i, hidden[i], presents[2 * i], presents[2 * i + 1])

        checks = layer_reference.compare_layers(want, got, logits, tol, exact)
        real = case.mask.astype(bool)
        top1 = float((logits.argmax(-1) == case.logits.argmax(-1))[real].mean())
        rows.append(ParityRow(case.name, tuple(checks), top1))
    return rows


def check_static(engine: OnnxModel, checked: list[Case], tol: Tolerance) -> list[ParityRow]:
    """The static-cache graph's logits on the cases check_contract ran, against the reference's kept there, at the
    real positions (its cache is checked by decoding: greedy)."""
    from gptport import contract
    from gptport.runtime import static_cache

    step, rows = engine.step(), []
    for case in checked:
        B = case.ids.shape[0]
        buffers = static_cache.Buffers(engine.config, engine.kv_dtype, case.ids.shape[1])  # the case's length
        got, _ = step(case.ids, case.mask, case.positions, buffers.fresh(B))
        real = case.mask.astype(bool)  # (B, T)
        check = compare(contract.LOGITS, got[real], case.logits[real], tol, case.exact[real])
        rows.append(ParityRow(case.name, (check,), float((got.argmax(-1) == case.logits.argmax(-1))[real].mean())))
    return rows


def greedy(open_engine: Callable[[], Engine], cfg: ModelConfig, weights: Mapping[str, np.ndarray],
           prompts: list[list[int]], n_new: int, tol: Tolerance) -> int:
    """Greedy decoding on the engine `open_engine` opens (closed before the reference runs), each new token the
    reference's argmax on the same text or within its rounding of it (the reference run once per prompt over the
    prompt and the tokens made). Returns the tokens compared."""
    from gptport.runtime.generate import generate
    from gptport.runtime.sampling import Sampling

    made = generate(open_engine(), prompts, n_new, Sampling(), eot_id=-1)
    for i, (prompt, result) in enumerate(zip(prompts, made, strict=True)):
        text = np.array([prompt + list(result.new_ids[:-1])], np.int64)  # (1, T)
        *_, logits = layer_reference.run_layers(cfg, weights.__getitem__, text)
        want = np.asarray(logits)[0, len(prompt) - 1:]  # (n_new, V): the reference's scores of each new token
        for j, token in enumerate(result.new_ids):
            best = float(want[j].max())
            if want[j, token] < best - tol.bound(float(np.abs(want[j]).max())):
                raise ValidationError(f"export: greedy decoding differs from torch for prompt {i} at new token {j} "
                                      f"(the graph chose {token}, torch {int(want[j].argmax())})")
    return n_new * len(prompts)
