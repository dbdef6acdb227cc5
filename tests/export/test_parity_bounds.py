"""The parity gate's bounds scale with each quantity's magnitude: a model whose weights are scaled up to a
trained model's magnitudes exports, and deliberately wrong graphs (a weight perturbed, the mask off by
one, the positions off by one, a static graph's weight perturbed) are refused, each failure naming the
case, the quantity, its difference, its magnitude and its bound. Nothing here depends on which CPU runs
it: the healthy graphs sit orders of magnitude inside the bound, the broken ones orders outside it."""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from benchmarks.export.parity_bounds import mask_off_by_one, perturbed, positions_off_by_one
from gptport import tokenizer as bpe
from gptport.errors import ValidationError
from gptport.export import exporter, validate
from gptport.export.tolerance import RTOL, Tolerance, cache_quantities, compare, merge, worst
from gptport.runtime.engine import StepFn
from gptport.runtime.onnx_engine import OnnxModel, load_cpu
from gptport.training.checkpoint import load_model, save_model
from tests.conftest import build_model_dir
from tests.support.cli import assert_one_line_error, gptport

# Beyond what models trained minutes on tinyshakespeare reach (docs/design/0031-parity-bounds.md: logits
# 6-9, keys about 3): the scaled model must reach at least these, where the old absolute bounds were in
# reach of float32 rounding.
TRAINED_LOGITS, TRAINED_KEYS = 15.0, 8.0
FAILURE = re.compile(r"failed on case .+?: (logits|layer \d+ (keys|values)): max \|Δ\| \S+ against a bound of "
                     r"\S+ \(magnitude \S+, torch's float32 error \S+\)")


def scale_up(model_dir: Path, tok: bpe.BPETokenizer) -> None:
    """Scale the weights the way training grows them: larger embeddings, queries and keys, MLP and head."""
    model, card = load_model(model_dir, tok)
    gains = {"wte.weight": 12.0, "wpe.weight": 12.0, "ln_1.weight": 6.0, "attn.c_attn.weight": 5.0,
             "mlp.c_fc.weight": 4.0, "mlp.c_proj.weight": 3.0, "attn.c_proj.weight": 3.0, "ln_f.weight": 4.0}
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.mul_(next((g for key, g in gains.items() if name.endswith(key)), 1.0))
    save_model(model_dir, model, card.model, tok, 0)


@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path
           ) -> tuple[Path, Any, OnnxModel]:
    """A 4-layer model scaled to trained magnitudes, exported (fp32 and its static-cache graph)."""
    out = build_model_dir(tmp_path_factory.mktemp("scaled") / "m", tokenizer_dir, corpus_file, steps=0, n_ctx=64,
                          n_layer=4)
    tok = bpe.load(out)
    scale_up(out, tok)
    exporter.export(out, ["fp32"], optimize=False)
    model, _ = load_model(out, tok)
    return out, model, load_cpu(out / "model.onnx")


def test_scaled_model_reaches_trained_magnitudes_and_exports(scaled: tuple[Path, Any, OnnxModel]) -> None:
    out, model, engine = scaled
    rows = validate.parity(model, engine.step(), Tolerance())
    assert rows and all(r.ok for r in rows), [r.worst.describe() for r in rows]
    logits = max(c.magnitude for r in rows for c in r.checks if c.quantity == validate.LOGITS)
    keys = max(c.magnitude for r in rows for c in r.checks if c.quantity.endswith("keys"))
    assert logits >= TRAINED_LOGITS and keys >= TRAINED_KEYS, (logits, keys)
    # at these magnitudes the caches' bound is wider than the old absolute 1e-5: what refused healthy graphs
    assert min(c.bound for r in rows for c in r.checks if c.quantity != validate.LOGITS) > 1e-5
    assert all(r.ok for r in validate.static_parity(model, load_cpu(out / "model.static.onnx"), Tolerance()))


def test_scaled_model_exports_every_graph(scaled: tuple[Path, Any, OnnxModel], tmp_path: Path) -> None:
    """The optimized graph, the int8 variant, the int8 cache and the .ort files go through their gates too."""
    out, _, _ = scaled
    d = tmp_path / "m"
    shutil.copytree(out, d, ignore=shutil.ignore_patterns("*.onnx", "*.ort"))
    report = exporter.export(d, ["fp32", "int8"], gate=False, kv_dtype="int8", ort_level="all")
    assert {"fp32", "int8", "fp32 static", "int8 static", "fp32 static.kv8"} <= set(report.files), report.files
    assert all(r.ok for r in report.parity + report.static_parity)
    assert report.ort and all("greedy" in row.check for row in report.ort if row.path.name == "model.ort")


def assert_refused(rows: list[validate.ParityRow]) -> str:
    with pytest.raises(ValidationError) as caught:
        validate.refuse("fp32 parity", rows)
    message = str(caught.value)
    assert FAILURE.search(message), message
    bad = next(r for r in rows if not r.ok)
    assert bad.worst.ratio > 50, bad.worst.describe()  # far outside: no CPU's rounding comes near
    return message


@pytest.mark.parametrize("breakage", ["weight", "mask", "positions"])
def test_broken_contract_graphs_are_refused(scaled: tuple[Path, Any, OnnxModel], tmp_path: Path,
                                            breakage: str) -> None:
    out, model, engine = scaled
    if breakage == "weight":
        perturbed(out / "model.onnx", tmp_path / "broken.onnx", model.cfg.d_model, 0)
        message = assert_refused(validate.parity(model, load_cpu(tmp_path / "broken.onnx").step(), Tolerance()))
        assert "layer 0" in message, message  # the first quantity the perturbed weight reaches
    else:
        wrap: Callable[[StepFn], StepFn] = mask_off_by_one if breakage == "mask" else positions_off_by_one
        assert_refused(validate.parity(model, wrap(engine.step()), Tolerance()))


def test_broken_static_graph_is_refused(scaled: tuple[Path, Any, OnnxModel], tmp_path: Path) -> None:
    out, model, _ = scaled
    perturbed(out / "model.static.onnx", tmp_path / "broken.onnx", model.cfg.d_model, model.cfg.n_layer - 1)
    rows = validate.static_parity(model, load_cpu(tmp_path / "broken.onnx"), Tolerance())
    with pytest.raises(ValidationError, match=FAILURE):
        validate.refuse("static-cache graph parity", rows)


def test_compare_scales_with_magnitude_and_refuses_nan() -> None:
    rng = np.random.default_rng(0)
    want = rng.standard_normal((2, 8)).astype(np.float32)
    for scale in (1.0, 1e3):
        got = want * scale * (1 + RTOL / 2)  # half the bound's relative error, at any magnitude
        assert compare("logits", got, want * scale, Tolerance()).ok
        assert not compare("logits", want * scale * (1 + 3 * RTOL), want * scale, Tolerance()).ok
    nan = want.copy()
    nan[0, 0] = np.nan
    check = compare("layer 0 keys", nan, want, Tolerance())
    assert not check.ok and math.isinf(check.diff) and "layer 0 keys" in check.describe()
    with pytest.raises(ValueError, match="shape"):
        compare("logits", want[:1], want, Tolerance())
    parts = [compare("logits", want * s + 1e-3, want * s, Tolerance()) for s in (1.0, 100.0)]
    merged = merge(parts, Tolerance())
    assert merged.diff == max(p.diff for p in parts) and merged.magnitude == max(p.magnitude for p in parts)
    assert worst(parts) is parts[0]  # the same |Δ| against a bound 100x smaller
    assert cache_quantities(2) == ["layer 0 keys", "layer 0 values", "layer 1 keys", "layer 1 values"]


@pytest.mark.parametrize(("args", "needle"), [(["--rtol", "-1"], "--rtol"), (["--atol", "nan"], "--atol"),
                                               (["--rtol", "0", "--atol", "0"], "zero bound")])
def test_bad_bounds_are_one_line_errors(trained_dir: Path, args: list[str], needle: str) -> None:
    assert_one_line_error(gptport("export", str(trained_dir), *args), 2, needle)
