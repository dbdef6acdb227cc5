"""Activation smoothing before int8 quantization (export/smooth.py, calibration.py): on small models of wide random
weights whose norms have outlier channels, the smoothed fp32 graph — contract or static-cache, Llama family or
classic GPT — still passes export's parity gates against torch (the rescaling is exact), it rescales every norm
the graph's MatMuls read and every SwiGLU down projection, and its int8 variant (block 32, int8 activations) is
closer to torch than the unsmoothed one's."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from gptport import contract
from gptport.config import ModelConfig
from gptport.export import calibration, gqa_graph, smooth, validate, variants
from gptport.export import contract_graph as builder
from gptport.export.tolerance import Tolerance
from gptport.runtime.onnx_engine import OnnxModel
from gptport.training.model import GPT

torch = pytest.importorskip("torch")

LLAMA = {"norm": "rmsnorm", "mlp": "swiglu", "pos_encoding": "rope", "n_kv_head": 2, "bias": False,
         "qkv_bias": True, "tie_embeddings": False}
CLASSIC: dict[str, object] = {}
OUTLIERS = (3, 17, 40)  # channels of every norm's weight made 30x their neighbours


def wide_model(change: dict[str, object]) -> GPT:
    cfg = ModelConfig(vocab_size=256, n_ctx=64, d_model=64, n_layer=2, n_head=4, **change)  # type: ignore[arg-type]
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            norm = name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight"))
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if norm else 0.0))
            if norm:
                p[list(OUTLIERS)] *= 30.0
    return model


def windows(model: GPT, count: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, model.cfg.vocab_size, (count, 48)).astype(np.int64)  # (N, T)


def session(proto: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])


def contract_graph(model: GPT, proto: onnx.ModelProto) -> OnnxModel:
    return OnnxModel(session(proto), model.cfg, "fp32", "")


def expected(model: GPT) -> set[str]:
    """The modules a graph of `model` gets smoothed: every norm, and each SwiGLU down projection."""
    names = {f"h.{i}.{n}" for i in range(model.cfg.n_layer) for n in ("ln_1", "ln_2")} | {"ln_f"}
    if model.cfg.mlp == "swiglu":
        names |= {f"h.{i}.mlp.c_proj" for i in range(model.cfg.n_layer)}
    return names


@pytest.mark.parametrize("change", [LLAMA, CLASSIC], ids=["llama", "classic"])
def test_smoothed_contract_graph_is_the_same_function(change: dict[str, object]) -> None:
    model = wide_model(change)
    ranges = calibration.activation_ranges(model, windows(model))
    assert expected(model) <= set(ranges)
    proto = variants.materialize_head(_graph(model))
    done = smooth.smooth(proto, ranges, 0.5)
    assert set(done) == expected(model), sorted(done)
    rows = validate.parity(model, contract_graph(model, proto).step(), Tolerance())
    assert all(r.ok for r in rows), rows


def test_smoothed_static_graph_is_the_same_function() -> None:
    """The static-cache graph's SwiGLU is one [gate | up] MatMul then a Split: up's columns are the second half."""
    model = wide_model(LLAMA)
    ranges = calibration.activation_ranges(model, windows(model))
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    proto = gqa_graph.build(model.cfg, weights)
    done = smooth.smooth(proto, ranges, 0.5)
    assert set(done) == expected(model), sorted(done)
    static = OnnxModel(session(proto), model.cfg, "fp32", "", cache=contract.CACHE_STATIC)
    rows = validate.static_parity(model, static, Tolerance())
    assert all(r.ok for r in rows), rows


def test_a_tied_head_is_left_alone() -> None:
    """A head that shares the embedding's weight (not materialized) cannot be rescaled: ln_f is not smoothed."""
    model = wide_model({**LLAMA, "tie_embeddings": True})
    ranges = calibration.activation_ranges(model, windows(model))
    proto = _graph(model)
    done = smooth.smooth(proto, ranges, 0.5)
    assert "ln_f" not in done and "h.0.ln_1" in done
    rows = validate.parity(model, contract_graph(model, proto).step(), Tolerance())
    assert all(r.ok for r in rows), rows


def test_smoothing_brings_int8_closer_to_torch(tmp_path: object) -> None:
    from pathlib import Path

    d = Path(str(tmp_path))
    model = wide_model(LLAMA)
    calib, held = windows(model, seed=0), windows(model, seed=1)
    fp32 = d / "fp32.onnx"
    onnx.save_model(_graph(model), str(fp32))
    ranges = calibration.activation_ranges(model, calib)
    errors = {}
    for name in ("nbits8-b32-acc4", "nbits8-b32-acc4-smooth"):
        out = d / f"{name}.onnx"
        variants.quantize(fp32, out, variants.SCHEMES[name], ranges)
        step = contract_graph(model, onnx.load(str(out))).step()
        err = 0.0
        for row in held:
            ids = row[None, :]
            mask = np.ones_like(ids)
            with torch.no_grad():
                want = model(torch.from_numpy(ids))[0].numpy()[0]  # (T, V)
            got = step(ids, mask, validate.positions(mask), contract_graph(model, onnx.load(str(out))).empty_past(1))
            err = max(err, float(np.abs(got[0][0] - want).max()))
        errors[name] = err
    assert errors["nbits8-b32-acc4-smooth"] < 0.7 * errors["nbits8-b32-acc4"], errors


def test_a_smoothing_scheme_without_ranges_does_not_apply(tmp_path: object) -> None:
    from pathlib import Path

    model = wide_model(LLAMA)
    fp32 = Path(str(tmp_path)) / "fp32.onnx"
    onnx.save_model(_graph(model), str(fp32))
    with pytest.raises(variants.NotApplicable, match="smoothing needs the activations' ranges"):
        variants.quantize(fp32, fp32.with_name("q.onnx"), variants.SCHEMES["nbits8-b32-acc4-smooth"])


def _graph(model: GPT) -> onnx.ModelProto:
    """The contract graph of `model`, built from its weights as export builds it."""
    return builder.build(model.cfg, {k: v.detach().numpy() for k, v in model.state_dict().items()})
