"""Export: the ONNX graph keeps the I/O contract and the torch model's numbers, variants pass the gate."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptport import contract
from gptport import tokenizer as bpe
from gptport.errors import ArtifactError, UsageError, ValidationError
from gptport.export import exporter, validate, variants
from gptport.export.tolerance import Tolerance, compare
from gptport.export.validate import parity
from gptport.runtime.engine import empty_past, positions
from gptport.runtime.onnx_engine import OnnxModel, load_cpu
from gptport.training.checkpoint import load_model
from gptport.training.torch_engine import torch_step
from tests.support.cli import assert_one_line_error, gptport


def random_case(model: torch.nn.Module, data: st.DataObject) -> tuple[np.ndarray, ...]:
    """A (B, T, P) case with random left padding, and the torch model's own past for it."""
    cfg = model.cfg
    B = data.draw(st.integers(1, 4), "batch")
    T = data.draw(st.integers(1, cfg.n_ctx), "sequence")
    P = data.draw(st.integers(0, cfg.n_ctx - T), "past")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), "seed"))
    mask = np.ones((B, P + T), dtype=np.int64)
    for row in range(B):
        pad = data.draw(st.integers(0, P + T - 1), f"pad{row}") if data.draw(st.booleans(), f"padded{row}") else 0
        mask[row, :pad] = 0
    ids_past = rng.integers(0, cfg.vocab_size, (B, P), dtype=np.int64)
    past = empty_past(B, cfg.n_layer, cfg.n_head, cfg.head_dim)
    if P:
        _, past = torch_step(model)(ids_past, mask[:, :P], positions(mask[:, :P]), past)
    ids = rng.integers(0, cfg.vocab_size, (B, T), dtype=np.int64)
    return ids, mask, positions(mask)[:, P:], past


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_parity_on_random_shapes(exported: tuple[Path, torch.nn.Module, OnnxModel], data: st.DataObject) -> None:
    _, model, onnx_model = exported
    ids, mask, pos, past = random_case(model, data)
    want_logits, want_present = torch_step(model)(ids, mask, pos, past)
    got_logits, got_present = onnx_model.step()(ids, mask, pos, past)
    assert got_logits.shape == want_logits.shape
    assert compare("logits", got_logits, want_logits, Tolerance()).ok
    for got, want in zip(got_present, want_present, strict=True):
        assert got.shape == want.shape
        check = compare("cache", got, want, Tolerance())
        assert check.ok, check.describe()


def test_graph_follows_the_contract(exported: tuple[Path, torch.nn.Module, OnnxModel]) -> None:
    out, model, _ = exported
    cfg = model.cfg
    proto = onnx.load(str(out / "model.onnx"))
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in [*proto.graph.input, *proto.graph.output]}
    assert [v.name for v in proto.graph.input] == contract.input_names(cfg.n_layer)
    assert [v.name for v in proto.graph.output] == contract.output_names(cfg.n_layer)
    assert dims["input_ids"] == ["batch", "sequence"]
    assert dims["attention_mask"] == ["batch", "total_sequence"]
    assert dims["past_key_values.0.key"] == ["batch", cfg.n_head, "past_sequence", cfg.head_dim]
    assert dims["present.1.value"] == ["batch", cfg.n_head, "total_sequence", cfg.head_dim]
    assert dims["logits"] == ["batch", "sequence", cfg.vocab_size]
    assert proto.opset_import[0].version >= 18
    meta = {p.key: p.value for p in proto.metadata_props}
    assert json.loads(meta["gptport.config"])["d_model"] == cfg.d_model
    assert meta["gptport.tokenizer_sha256"] == bpe.load(out).sha256
    assert meta["gptport.precision"] == "fp32" and meta["gptport.version"]


def test_weights_are_stored_once(exported: tuple[Path, torch.nn.Module, OnnxModel]) -> None:
    out, model, _ = exported
    proto = onnx.load(str(out / "model.onnx"))
    stored = sum(onnx.numpy_helper.to_array(i).nbytes for i in proto.graph.initializer)
    params = sum(p.numel() * 4 for p in model.parameters())
    assert stored <= 1.01 * params


def top1_agreement(model: torch.nn.Module, engine: Any, windows: np.ndarray) -> float:
    """Top-1 agreement of `engine` with the torch model at every position of the windows (each one
    prefill from an empty cache), computed here rather than by validate.gate."""
    agree = total = 0
    step = engine.step()
    for row in windows:
        ids = row[None, :]
        mask = np.ones_like(ids)
        with torch.no_grad():
            want = model(torch.from_numpy(ids))[0].float().numpy()[0]  # (T, V)
        got = step(ids, mask, positions(mask), engine.empty_past(1))[0][0]  # (T, V)
        agree += int((want.argmax(-1) == got.argmax(-1)).sum())
        total += len(row)
    return agree / total


def test_variants_pass_the_gate_and_keep_the_contract(trained_dir: Path) -> None:
    model, _ = load_model(trained_dir, bpe.load(trained_dir))
    cfg = model.cfg
    windows = validate.heldout(trained_dir, model, bpe.load(trained_dir)).windows  # what export gated them on
    assert windows.size >= 500 and validate.GATE_TOP1 >= 0.98  # the gate ARCHITECTURE.md states
    for precision, kv_dtype in (("int8", np.float32), ("fp16", np.float16)):
        variant = load_cpu(trained_dir / contract.onnx_file(precision))
        assert variant.precision == precision
        ids = np.arange(1, 11, dtype=np.int64)[None, :]
        mask = np.ones_like(ids)
        logits, present = variant.step()(ids, mask, positions(mask),
                                         empty_past(1, cfg.n_layer, cfg.n_head, cfg.head_dim, np.dtype(kv_dtype)))
        assert logits.dtype == np.float32 and present[0].dtype == kv_dtype
        assert len(present) == 2 * cfg.n_layer and present[0].shape == (1, cfg.n_head, 10, cfg.head_dim)
        assert top1_agreement(model, variant, windows) >= validate.GATE_TOP1, precision
    int8 = onnx.load(str(trained_dir / "model.int8.onnx"))
    head = next(n for n in int8.graph.node if "logits" in n.output)
    assert head.op_type != "MatMul", "the head must be quantized too"


class Tampered:
    """An engine that passes `engine`'s logits through, counting the calls and the tokens they choose
    (one per row), except that call `at` (0: the prefill) promotes row `row`'s runner-up to the top."""

    def __init__(self, engine: Any, at: int = -1, row: int = 0) -> None:
        self.engine, self.at, self.row, self.calls, self.tokens = engine, at, row, 0, 0
        self.n_ctx, self.capabilities, self.config = engine.n_ctx, engine.capabilities, engine.config

    def empty_past(self, batch: int) -> Any:
        return self.engine.empty_past(batch)

    def step(self, last_only: bool = False) -> Any:
        inner = self.engine.step(last_only)

        def step(ids: np.ndarray, mask: np.ndarray, pos: np.ndarray, past: Any) -> tuple[np.ndarray, Any]:
            logits, present = inner(ids, mask, pos, past)
            if self.calls == self.at:
                logits = logits.copy()
                last = logits[self.row, -1]
                last[np.argsort(last)[-2]] = last.max() + 1.0
            self.calls += 1
            self.tokens += ids.shape[0]
            return logits, present

        return step


def test_the_greedy_check_compares_every_new_token(trained_dir: Path) -> None:
    tok = bpe.load(trained_dir)
    model, _ = load_model(trained_dir, tok)
    prompts = validate.prompts(trained_dir, tok, model.cfg.n_ctx)
    engine = load_cpu(trained_dir / "model.onnx")
    counted = Tampered(engine)
    assert validate.greedy_match(model, counted, prompts) == counted.tokens > len(prompts)
    for at, row in ((0, 1), (counted.calls - 1, len(prompts) - 1)):  # the first new token, and the last
        with pytest.raises(ValidationError, match=f"prompt {row} at new token {at}$"):
            validate.greedy_match(model, Tampered(engine, at, row), prompts)


def test_export_refuses_existing_files_and_bad_input(tmp_path: Path, trained_dir: Path) -> None:
    d = tmp_path / "m"
    shutil.copytree(trained_dir, d)
    assert_one_line_error(gptport("export", str(d)), 1, "already exist", "--force")
    assert_one_line_error(gptport("export", str(d), "--precision", "fp32,int3", "--force"), 2, "int3")
    (d / "tokenizer_meta.json").unlink()
    (d / "tokenizer.json").write_text((d / "tokenizer.json").read_text() + " ")
    assert_one_line_error(gptport("export", str(d), "--force"), 1, "not the tokenizer this model was trained with")
    empty = tmp_path / "empty"
    shutil.copytree(trained_dir, empty, ignore=shutil.ignore_patterns("model.safetensors", "*.onnx"))
    assert_one_line_error(gptport("export", str(empty)), 1, "no model.safetensors")
    (empty / "config.json").unlink()
    assert_one_line_error(gptport("export", str(empty)), 1, "no config.json")


def test_cli_export_prints_the_parity_table(tmp_path: Path, trained_dir: Path) -> None:
    d = tmp_path / "m"
    shutil.copytree(trained_dir, d, ignore=shutil.ignore_patterns("*.onnx"))
    r = gptport("export", str(d))
    assert r.returncode == 0, r.stderr
    for needle in ("(1, 1, 0)", "(1, 96, 0)", "(3, 7, 5) padded", "(2, 1, 95)", "static-cache graph",
                   "(3, 7) padded + 3 steps", "(2, 95) + 1 step"):
        assert needle in r.stderr
    compared = re.search(r"greedy decoding: (\d+) tokens identical", r.stderr)
    assert compared and int(compared.group(1)) > 0, r.stderr
    assert (d / "model.onnx").exists() and (d / "model.static.onnx").exists() and not list(d.glob(".*tmp*"))


def test_parse_precisions() -> None:
    assert exporter.parse_precisions("int8,fp16") == ["int8", "fp16"]
    assert exporter.parse_precisions("int8,fp32,int8") == ["fp32", "int8"]
    with pytest.raises(UsageError):
        exporter.parse_precisions("bf16")
    with pytest.raises(ArtifactError):
        load_cpu(Path("/nonexistent/model.onnx"))


def test_optimized_graph_passes_the_same_checks(tmp_path: Path, trained_dir: Path) -> None:
    d = tmp_path / "m"
    shutil.copytree(trained_dir, d, ignore=shutil.ignore_patterns("*.onnx"))
    report = exporter.export(d, ["fp32"], optimize=True, static=False)
    assert not (d / "model.static.onnx").exists() and not report.static_parity
    assert report.fused.get("SkipLayerNormalization", 0) > 0
    assert report.size_ratio <= 1.01
    ops = {n.op_type for n in onnx.load(str(d / "model.onnx")).graph.node}
    assert "SkipLayerNormalization" in ops
    model, _ = load_model(d, bpe.load(d))
    assert all(r.ok for r in parity(model, load_cpu(d / "model.onnx").step(), Tolerance()))


def test_a_scheme_that_misses_the_gate_gives_way_to_the_next(tmp_path: Path, trained_dir: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "m"
    shutil.copytree(trained_dir, d, ignore=shutil.ignore_patterns("*.onnx"))
    real_gate, calls = validate.gate, []

    def first_fails(*args: Any, **kwargs: Any) -> validate.GateRow:
        row = real_gate(*args, **kwargs)
        calls.append(row)
        return dataclasses.replace(row, ok=False) if len(calls) == 1 else row

    monkeypatch.setattr(validate, "gate", first_fails)
    report = exporter.export(d, ["fp32", "int8"])
    first, second = variants.LADDER["int8"][:2]
    assert [(g.precision, g.scheme, g.ok) for g in report.gates] == [
        ("int8", first, False), ("int8", second, True), ("int8 static", second, True)]  # the twin's rung first
    assert report.schemes == {"int8": second, "int8 static": second}
    assert (d / "model.int8.onnx").exists() and (d / "model.int8.static.onnx").exists()
    assert not list(d.glob(".*tmp*"))


def test_a_variant_that_misses_its_gate_on_export_again_leaves_no_stale_file(
        tmp_path: Path, trained_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = tmp_path / "m"
    shutil.copytree(trained_dir, d)
    stale = [d / "model.int8.onnx", d / "model.int8.static.onnx"]
    assert all(p.exists() for p in stale)
    monkeypatch.setattr(validate, "GATE_TOP1", 1.01)  # a threshold no agreement reaches: every rung fails
    report = exporter.export(d, ["fp32", "int8"], force=True)
    assert [(g.precision, g.ok) for g in report.gates] == [("int8", False)] * len(variants.LADDER["int8"])
    assert [g.scheme for g in report.gates] == list(variants.LADDER["int8"])  # the smoothing rungs calibrated too
    assert sorted(report.removed) == sorted(stale) and not any(p.exists() for p in stale)
    assert (d / "model.onnx").exists() and (d / "model.static.onnx").exists()


def test_a_variant_is_written_only_if_it_passes_the_gate(tmp_path: Path, trained_dir: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """int8 is gated at the real threshold and passes; int4 is gated at a threshold no agreement reaches
    and fails. Each verdict is the agreement against the threshold, and a file is there exactly when its
    gate passed (int4's static-cache graph is not even tried: its contract twin failed)."""
    d = tmp_path / "m"
    shutil.copytree(trained_dir, d, ignore=shutil.ignore_patterns("*.onnx"))
    real_gate, threshold = validate.gate, validate.GATE_TOP1

    def gate(*args: Any, **kwargs: Any) -> validate.GateRow:
        label = args[3] if len(args) > 3 else kwargs["precision"]
        monkeypatch.setattr(validate, "GATE_TOP1", 1.01 if label.startswith("int4") else threshold)
        return real_gate(*args, **kwargs)

    monkeypatch.setattr(validate, "gate", gate)
    report = exporter.export(d, ["fp32", "int8", "int4"])
    gates = {g.precision: g for g in report.gates}
    requant = [s for s in variants.LADDER["int4"] if "grid" not in s]  # the grid rungs do not apply here
    assert [g.precision for g in report.gates] == ["int8", *["int4"] * len(requant), "int8 static"]
    for g in report.gates:
        assert g.ok == (g.top1 >= (1.01 if g.precision.startswith("int4") else threshold)), g
        assert 0.0 <= g.top1 <= 1.0 and g.mean_kl >= 0.0 and g.positions >= 500, g
    assert gates["int8"].ok and gates["int8 static"].ok and not gates["int4"].ok
    for label, path in (("int8", "model.int8.onnx"), ("int8 static", "model.int8.static.onnx"),
                        ("int4", "model.int4.onnx"), ("int4 static", "model.int4.static.onnx")):
        assert (d / path).exists() == (label in gates and gates[label].ok), path
    assert set(report.schemes) == {"int8", "int8 static"}
    assert not list(d.glob(".*tmp*"))
