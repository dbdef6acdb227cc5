"""Activation-aware int4 (export/awq.py, calibration.activation_samples, the awq and wide schemes of variants.py):
rtn() is onnxruntime's own 4-bit rounding; the rescaled fp32 graph computes the same function; on a matrix read
by activations with outlier channels the searched scales and clipping err less than plain rounding; and an AWQ
scheme's int4 graph is closer to torch than RTN's, with the roles a scheme keeps wide at 8 bits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from gptport.export import awq, calibration, validate, variants
from gptport.export.nbits import Quant, slabs
from gptport.export.tolerance import Tolerance
from tests.export.test_smooth import LLAMA, contract_graph, wide_model, windows
from tests.export.test_smooth import _graph as build

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("symmetric", [True, False])
def test_rtn_is_onnxruntimes_4bit_rounding(symmetric: bool) -> None:
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((96, 40)) * rng.uniform(0.01, 3, (96, 1))).astype(np.float32)  # (K, N)
    packed, scales, zero = next(slabs(np.ascontiguousarray(w.T), Quant(4, 32, 4, symmetric)))
    codes = np.stack([packed & 15, packed >> 4], -1).reshape(40, 3, 32).astype(np.float32)  # (N, nb, block)
    zp = np.full((40, 3), 8.0) if symmetric else np.stack([zero & 15, zero >> 4], -1).reshape(40, -1)[:, :3]
    theirs = ((codes - zp[..., None]) * scales[..., None]).reshape(40, 96).T  # (K, N)
    np.testing.assert_allclose(awq.rtn(w, 32, symmetric), theirs, rtol=0, atol=1e-6)


def _outliers(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Activation rows (n, K) with a few channels 30x their neighbours, and a weight (K, N) to read them."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((512, 128)).astype(np.float32)
    x[:, [5, 40, 77, 100]] *= 30.0
    return x, (rng.standard_normal((128, 64)) * 0.05).astype(np.float32)


def _err(x: np.ndarray, w: np.ndarray, q: np.ndarray) -> float:
    return float(np.square(x @ q - x @ w).mean())


@pytest.mark.parametrize("symmetric", [True, False])
def test_searched_scales_and_clipping_err_less_than_plain_rounding(symmetric: bool) -> None:
    x, w = _outliers()
    held, _ = _outliers(seed=1)  # other rows of the same activation: the search does not fit its own rows only
    held[:, [5, 40, 77, 100]] *= 1.0
    plain = _err(held, w, awq.rtn(w, 32, symmetric))
    s = awq.search_scale(x, [w], 32, symmetric)
    assert s.shape == (128,) and np.all(s > 0)
    scaled = awq.rtn(w * s[:, None], 32, symmetric) / s[:, None]
    assert _err(held, w, scaled) < 0.8 * plain
    clipped = awq.clip(x / s, w * s[:, None], 32, symmetric)
    assert _err(held, w, awq.rtn(clipped, 32, symmetric) / s[:, None]) <= _err(held, w, scaled) * 1.01


def test_clipping_leaves_a_block_it_cannot_improve_alone() -> None:
    """Weights already on a symmetric 4-bit grid quantize exactly: every block keeps its full range."""
    rng = np.random.default_rng(2)
    w = awq.rtn(rng.standard_normal((64, 16)).astype(np.float32), 32, True)
    x = rng.standard_normal((64, 64)).astype(np.float32)
    np.testing.assert_array_equal(awq.clip(x, w, 32, True), w)


def test_rescaled_graph_is_the_same_function() -> None:
    model = wide_model(LLAMA)
    samples = calibration.activation_samples(model, windows(model), rows=128)
    assert {"h.0.ln_1", "h.1.ln_2", "h.0.mlp.c_proj", "h.1.attn.c_proj"} <= set(samples)
    assert "ln_f" not in samples and samples["h.0.ln_1"].shape == (128, model.cfg.d_model)
    proto = variants.materialize_head(build(model))
    done = awq.apply(proto, samples, 32, True, clipping=False)
    want = {f"h.{i}.{m}" for i in range(2) for m in ("ln_1", "ln_2", "mlp.c_proj")}
    assert set(done) == want, sorted(done)
    rows = validate.parity(model, contract_graph(model, proto).step(), Tolerance())
    assert all(r.ok for r in rows), rows


def _logit_error(model: object, path: Path, held: np.ndarray) -> float:
    graph = contract_graph(model, onnx.load(str(path)))  # type: ignore[arg-type]
    err = 0.0
    for row in held:
        ids = row[None, :]  # (1, T)
        mask = np.ones_like(ids)
        with torch.no_grad():
            want = model(torch.from_numpy(ids))[0].numpy()[0]  # type: ignore[operator]  # (T, V)
        got = graph.step()(ids, mask, validate.positions(mask), graph.empty_past(1))[0][0]
        err += float(np.square(got - want).mean())
    return err


def test_awq_int4_is_closer_to_torch_than_rtn_and_keeps_wide_roles_at_8_bits(tmp_path: Path) -> None:
    model = wide_model(LLAMA)
    calib, held = windows(model, seed=0), windows(model, seed=1)
    fp32 = tmp_path / "fp32.onnx"
    onnx.save_model(build(model), str(fp32))
    samples = calibration.activation_samples(model, calib, rows=256)
    errors = {}
    for name in ("nbits4-b32-acc4-head8", "nbits4-b32-awq-acc4-head8", "nbits4-b32-awq-acc4-head8-down8"):
        out = tmp_path / f"{name}.onnx"
        variants.quantize(fp32, out, variants.SCHEMES[name], samples)
        errors[name] = _logit_error(model, out, held)
    assert errors["nbits4-b32-awq-acc4-head8"] < 0.8 * errors["nbits4-b32-acc4-head8"], errors
    bits = {n.input[1].split("_Q")[0]: next(a.i for a in n.attribute if a.name == "bits")
            for n in onnx.load(str(tmp_path / "nbits4-b32-awq-acc4-head8-down8.onnx")).graph.node
            if n.op_type == "MatMulNBits"}
    assert {k for k, v in bits.items() if v == 8} == {
        "lm_head.weight_t", "h.0.mlp.c_proj.weight_t", "h.1.mlp.c_proj.weight_t"}, bits


def test_an_awq_scheme_without_samples_does_not_apply(tmp_path: Path) -> None:
    model = wide_model(LLAMA)
    fp32 = tmp_path / "fp32.onnx"
    onnx.save_model(build(model), str(fp32))
    with pytest.raises(variants.NotApplicable, match="AWQ needs the activations' samples"):
        variants.quantize(fp32, tmp_path / "q.onnx", variants.SCHEMES["nbits4-b32-awq-acc4-head8"])


def test_the_q4_k_m_layers_kept_wide() -> None:
    """llama.cpp's use_more_bits on 30 layers (SmolLM2's): the first and last 3, and every third between."""
    layers = [i for i in range(30) if variants.more_bits(i, 30)]
    assert layers == [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 26, 27, 28, 29]
    assert variants.wide_modules(("down-half",), 8) == {f"h.{i}.mlp.c_proj" for i in (0, 3, 6, 7)}


def test_the_int4_ladder_tries_awq_before_plain_rounding() -> None:
    rungs = variants.LADDER["int4"][2:]  # after the two grid encodings
    awq = [s for s in rungs if variants.SCHEMES[s].awq]
    plain = [s for s in rungs if not variants.SCHEMES[s].awq]
    assert awq and plain and list(rungs) == awq + plain  # every activation-aware rung before plain rounding
    assert variants.direct(awq[0]) is None  # AWQ needs the float graph and its activations
    assert all(variants.direct(s) is not None for s in plain)  # a large model's: RTN, built from the weights
