"""The static-cache graph: torch's numbers for every config variant, the cache appended in place with
no copy, random padded batches decoded step by step, stale caches refused, the int8 variant gated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptport import contract
from gptport import tokenizer as bpe
from gptport.export import validate
from gptport.export.tolerance import Tolerance, compare
from gptport.export.validate import static_parity
from gptport.runtime.engine import empty_past, positions
from gptport.runtime.onnx_engine import load_cpu
from gptport.runtime.static_cache import cache_arrays
from gptport.training.checkpoint import load_model
from gptport.training.torch_engine import torch_step
from tests.export.test_export import top1_agreement


def within(got: np.ndarray, want: np.ndarray) -> bool:
    """`got` within the export gate's bound of `want` (relative to its magnitude: tolerance.py)."""
    check = compare("quantity", got, want, Tolerance())
    assert check.ok, check.describe()
    return True


def static_engine(model_dir: Path, precision: str = "fp32") -> Any:
    engine = load_cpu(model_dir / contract.onnx_file(precision, contract.CACHE_STATIC))
    assert engine.cache == contract.CACHE_STATIC and engine.precision == precision
    return engine


def test_every_config_variant_matches_torch(exported: tuple[Path, Any, Any]) -> None:
    out, model, _ = exported
    rows = static_parity(model, static_engine(out), Tolerance())
    assert len(rows) == 3 and all(r.ok and r.top1 == 1.0 for r in rows), rows
    ops = {n.op_type for n in onnx.load(str(out / "model.static.onnx")).graph.node}
    assert "GroupQueryAttention" in ops and "Concat" not in ops


def test_weights_are_stored_once(exported: tuple[Path, Any, Any]) -> None:
    out, model, _ = exported
    proto = onnx.load(str(out / "model.static.onnx"))
    stored = sum(onnx.numpy_helper.to_array(i).nbytes for i in proto.graph.initializer)
    params = sum(p.numel() * 4 for p in model.parameters())  # tied weights counted once
    sinusoid = model.cfg.n_ctx * model.cfg.d_model * 4 if model.cfg.pos_encoding == "sinusoidal" else 0
    assert stored <= 1.001 * params + sinusoid


def test_the_cache_is_appended_in_place(trained_dir: Path) -> None:
    engine = static_engine(trained_dir)
    step = engine.step()
    past = engine.empty_past(2)
    buffers = [v.data_ptr() for v in past]
    cfg = engine.config
    assert past[0].shape() == [2, cfg.n_head, cfg.n_ctx, cfg.head_dim]
    mask = np.array([[0, 1, 1], [1, 1, 1]], dtype=np.int64)
    ids = np.array([[0, 5, 6], [7, 8, 9]], dtype=np.int64)
    logits, past = step(ids, mask, positions(mask), past)
    assert np.all(logits[0, 0] == 0) and np.all(np.isfinite(logits))  # padded position: zeros
    for _ in range(3):
        mask = np.concatenate([mask, np.ones((2, 1), dtype=np.int64)], axis=1)
        logits, present = step(np.array([[3], [4]]), mask, positions(mask)[:, -1:], past)
        assert present is past and [v.data_ptr() for v in present] == buffers  # no new cache, no copy
    assert list(past.lengths) == [5, 6]
    again = engine.empty_past(2)  # reuses the buffers; the old cache may no longer step
    assert [v.data_ptr() for v in again] == buffers
    with pytest.raises(ValueError, match="handed out again"):
        step(np.array([[3], [4]]), np.ones((2, 7), dtype=np.int64), np.array([[6], [6]]), past)


@settings(max_examples=15, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_random_padded_batches_decode_like_torch(trained_dir: Path, data: st.DataObject) -> None:
    model, _ = load_model(trained_dir, bpe.load(trained_dir))
    engine, cfg = static_engine(trained_dir), model.cfg
    B = data.draw(st.integers(1, 4), "batch")
    T = data.draw(st.integers(1, 24), "prompt")
    steps = data.draw(st.integers(0, 6), "steps")
    mask = np.ones((B, T), dtype=np.int64)
    for row in range(B):
        mask[row, :data.draw(st.integers(0, T - 1), f"pad{row}")] = 0
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), "seed"))
    ids, pos = rng.integers(0, cfg.vocab_size, (B, T), dtype=np.int64), positions(mask)
    last_engine = static_engine(trained_dir)  # the generation loop's way: the head on each row's last token
    ref, step, last = torch_step(model), engine.step(), last_engine.step(last_only=True)
    want, want_past = ref(ids, mask, pos, empty_past(B, cfg.n_layer, cfg.n_head, cfg.head_dim))
    got, past = step(ids, mask, pos, engine.empty_past(B))
    got_last, last_past = last(ids, mask, pos, last_engine.empty_past(B))
    real = mask.astype(bool)
    assert within(got[real], want[real])
    assert got_last.shape == (B, 1, cfg.vocab_size) and within(got_last, want[:, -1:])
    for _ in range(steps):
        ids = rng.integers(0, cfg.vocab_size, (B, 1), dtype=np.int64)
        mask, pos = np.concatenate([mask, np.ones((B, 1), dtype=np.int64)], axis=1), pos[:, -1:] + 1
        want, want_past = ref(ids, mask, pos, want_past)
        got, past = step(ids, mask, pos, past)
        got_last, last_past = last(ids, mask, pos, last_past)
        assert within(got, want) and within(got_last, want)
    for g, w in zip(cache_arrays(past), want_past, strict=True):
        for b, n in enumerate(past.lengths):
            assert within(g[b, :, :n], w[b, :, w.shape[2] - n:])


def test_int8_static_variant_passes_the_gate_and_decodes_like_its_contract_twin(trained_dir: Path) -> None:
    model, _ = load_model(trained_dir, bpe.load(trained_dir))
    engine = static_engine(trained_dir, "int8")
    windows = validate.heldout(trained_dir, model, bpe.load(trained_dir)).windows  # what export gated it on
    assert top1_agreement(model, engine, windows) >= validate.GATE_TOP1
    twin = load_cpu(trained_dir / "model.int8.onnx")
    ids = windows[:1]
    mask = np.ones_like(ids)
    got, _ = engine.step()(ids, mask, positions(mask), engine.empty_past(1))
    want, _ = twin.step()(ids, mask, positions(mask), twin.empty_past(1))
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.95  # same weights, same quantizer, other graph
    proto = onnx.load(str(trained_dir / "model.int8.static.onnx"))
    assert {n.op_type for n in proto.graph.node} >= {"MatMulNBits", "GroupQueryAttention"}
    assert "MatMul" not in {n.op_type for n in proto.graph.node}  # every product quantized, the head too

    def nbits(graph: onnx.ModelProto) -> set[tuple[int, int]]:
        """(bits, block size) of every MatMulNBits of the graph."""
        return {tuple(onnx.helper.get_attribute_value(a) for a in sorted(n.attribute, key=lambda a: a.name)
                      if a.name in ("bits", "block_size"))  # type: ignore[misc]
                for n in graph.graph.node if n.op_type == "MatMulNBits"}

    schemes = nbits(proto)  # one scheme, the rung its contract twin shipped: 8 bits
    assert schemes == nbits(onnx.load(str(trained_dir / "model.int8.onnx"))) and len(schemes) == 1
    assert next(iter(schemes))[0] == 8


def test_a_head_size_groupqueryattention_cannot_take_skips_the_static_graph(
        tmp_path: Path, tokenizer_dir: Path, corpus_file: Path) -> None:
    from gptport.export import exporter
    from gptport.runtime.loader import open_model
    from tests.conftest import build_model_dir

    d = build_model_dir(tmp_path / "m", tokenizer_dir, corpus_file, steps=0, d_model=48, n_head=4)  # head size 12
    report = exporter.export(d, ["fp32"])
    assert "multiple of 8" in report.static_skipped and "12" in report.static_skipped
    assert (d / "model.onnx").exists() and not (d / "model.static.onnx").exists()
    assert open_model(d).cache == contract.CACHE_CONCAT  # auto falls back to the contract graph
