"""The variants' accuracy gate: `export --no-gate` writes untrained weights' variants marked ungated
(gptport.gated = false) and generate, eval and bench say so; the gate scores real held-out text
(data/val.bin or --heldout FILE) and uses the model's own samples only when told to."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from gptport import contract, provenance
from gptport import tokenizer as bpe
from gptport.errors import UsageError
from gptport.export import exporter, validate
from gptport.runtime.choice import GraphChoice
from gptport.runtime.loader import open_graph, ungated_warning
from gptport.runtime.onnx_engine import file_metadata
from gptport.training.checkpoint import load_model
from tests.conftest import build_model_dir, make_text
from tests.support.cli import assert_one_line_error, gptport

UNGATED = "was exported with --no-gate"


def gated(path: Path) -> str | None:
    return file_metadata(path).get(contract.META_GATED)


@pytest.fixture(scope="module")
def rough_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path) -> Path:
    """Untrained weights that miss the int4 gate: every matrix redrawn at std 0.2 (10x the init), seeded
    (at the init's std a model this small keeps 99% top-1 under int4; larger random models do not)."""
    d = build_model_dir(tmp_path_factory.mktemp("rough") / "m", tokenizer_dir, corpus_file, steps=0)
    weights = load_file(d / "model.safetensors")
    g = torch.Generator().manual_seed(0)
    save_file({k: torch.randn(v.shape, generator=g) * 0.2 if v.ndim == 2 else v for k, v in weights.items()},
              d / "model.safetensors")
    config = json.loads((d / "config.json").read_text())  # their sha256, as train records the weights it writes
    config[provenance.WEIGHTS_SHA] = provenance.file_digest(d / "model.safetensors")
    (d / "config.json").write_text(json.dumps(config))
    return d


@pytest.fixture()
def no_val(tmp_path: Path, trained_dir: Path) -> Path:
    """The trained model without its validation shard or graphs (as import-hf leaves a directory)."""
    d = tmp_path / "m"
    shutil.copytree(trained_dir, d, ignore=shutil.ignore_patterns("*.onnx"))
    (d / "data" / "val.bin").unlink()
    return d


@pytest.mark.slow
def test_untrained_weights_are_refused_by_the_gate_and_written_marked_with_no_gate(rough_dir: Path,
                                                                                  tmp_path: Path) -> None:
    r = gptport("export", str(rough_dir), "--precision", "fp32,int4", "--no-static")
    assert_one_line_error(r, 1, "int4", "missed the accuracy gate")
    assert "✗" in r.stderr and not (rough_dir / "model.int4.onnx").exists()

    r = gptport("export", str(rough_dir), "--precision", "fp32,int8,int4", "--no-gate", "--force")
    assert r.returncode == 0, r.stderr
    assert "variants against fp32" not in r.stderr and "--no-gate" in r.stderr  # no gate table; a warning
    for name in ("model.onnx", "model.static.onnx"):
        assert gated(rough_dir / name) == "true", name
    for name in ("model.int8.onnx", "model.int4.onnx", "model.int8.static.onnx", "model.int4.static.onnx"):
        assert gated(rough_dir / name) == "false", name
        assert contract.META_GATE_TEXT not in file_metadata(rough_dir / name)

    def warnings(r: object) -> list[str]:
        return [line for line in r.stderr.splitlines() if UNGATED in line]  # type: ignore[attr-defined]

    r = gptport("generate", str(rough_dir), "ka", "--precision", "int4", "--max-new-tokens", "3")
    assert r.returncode == 0 and warnings(r) == [f"warning: {ungated_warning(rough_dir / 'model.int4.static.onnx')}"]
    r = gptport("generate", str(rough_dir), "ka", "--max-new-tokens", "3")
    assert r.returncode == 0 and warnings(r) == []  # fp32: gated
    text = tmp_path / "text.txt"
    text.write_text(make_text(40, seed=3), encoding="utf-8")
    r = gptport("eval", str(rough_dir), str(text), "--precision", "fp32,int8")
    assert r.returncode == 0 and len(warnings(r)) == 1 and "model.int8.static.onnx" in warnings(r)[0], r.stderr
    r = gptport("bench", str(rough_dir), "--precisions", "int8", "--prompt-len", "4", "--gen-len", "4",
                "--repeat", "1", "--warmup", "0", "--no-torch-baseline")
    assert r.returncode == 0 and len(warnings(r)) == 1 and "model.int8.static.onnx" in warnings(r)[0], r.stderr


def test_gated_graphs_record_it_and_open_without_a_warning(tmp_path: Path, trained_dir: Path) -> None:
    for name in ("model.onnx", "model.static.onnx"):
        assert gated(trained_dir / name) == "true"
        assert contract.META_GATE_TEXT not in file_metadata(trained_dir / name)  # fp32: parity, not the gate
    for name in ("model.int8.onnx", "model.int8.static.onnx", "model.fp16.onnx"):
        meta = file_metadata(trained_dir / name)
        assert (meta[contract.META_GATED], meta[contract.META_GATE_TEXT]) == ("true", "data/val.bin"), name
    said: list[str] = []
    open_graph(trained_dir, GraphChoice.parse(precision="int8"), say=said.append)
    assert said == []
    d = tmp_path / "m"
    shutil.copytree(trained_dir, d)
    graph = d / "model.int8.static.onnx"
    exporter.set_metadata(graph, {**file_metadata(graph), contract.META_GATED: "false"})
    open_graph(d, GraphChoice.parse(precision="int8"), say=said.append)
    assert said == [ungated_warning(graph)]


def test_without_held_out_text_export_refuses_a_variant_and_writes_nothing(no_val: Path) -> None:
    r = gptport("export", str(no_val), "--precision", "fp32,int8")
    assert_one_line_error(r, 2, "data/val.bin is missing", "--heldout FILE", "--gate-on-sampled-text", "--no-gate")
    assert not list(no_val.glob("*.onnx")) and not list(no_val.glob(".*tmp*"))
    assert_one_line_error(gptport("export", str(no_val), "--precision", "fp32,int8", "--no-gate", "--heldout",
                                   str(no_val / "config.json")), 2, "--no-gate", "--heldout")
    assert_one_line_error(gptport("export", str(no_val), "--precision", "fp32,int8", "--heldout",
                                   str(no_val / "absent.txt")), 1, "absent.txt", "no such file")
    short = no_val / "short.txt"
    short.write_text("ka to ri.\n", encoding="utf-8")
    assert_one_line_error(gptport("export", str(no_val), "--precision", "fp32,int8", "--heldout", str(short)), 1,
                           "short.txt", "at least 64")
    assert not list(no_val.glob("*.onnx"))


@pytest.mark.slow
def test_the_gate_scores_the_heldout_file_or_says_it_scored_samples(no_val: Path) -> None:
    heldout = no_val / "heldout.txt"
    heldout.write_text(make_text(200, seed=11), encoding="utf-8")
    r = gptport("export", str(no_val), "--precision", "fp32,int8", "--no-static", "--heldout", str(heldout))
    assert r.returncode == 0, r.stderr
    assert "heldout.txt" in r.stderr and "own samples" not in r.stderr
    assert file_metadata(no_val / "model.int8.onnx")[contract.META_GATE_TEXT] == str(heldout)
    r = gptport("export", str(no_val), "--precision", "fp32,int8", "--no-static", "--gate-on-sampled-text",
                "--force")
    assert r.returncode == 0, r.stderr
    assert "on the model's own samples (no held-out text; --gate-on-sampled-text)" in " ".join(r.stderr.split())
    assert file_metadata(no_val / "model.int8.onnx")[contract.META_GATE_TEXT] == validate.SAMPLED


def test_held_out_windows_come_from_the_file_else_the_shard(no_val: Path, trained_dir: Path) -> None:
    tok = bpe.load(trained_dir)
    model, _ = load_model(trained_dir, tok)
    text = make_text(200, seed=11)
    heldout = no_val / "heldout.txt"
    heldout.write_text(text, encoding="utf-8")
    ids = np.array(tok.encode(text))
    for d in (no_val, trained_dir):  # the file wins over data/val.bin
        got = validate.heldout(d, model, tok, heldout)
        assert got.source == str(heldout) and not got.sampled
        assert got.windows.shape[1] == model.cfg.n_ctx and len(got.windows) > 1
        for row in got.windows:
            starts = np.flatnonzero(np.all(np.lib.stride_tricks.sliding_window_view(ids, len(row)) == row, axis=1))
            assert len(starts), "every window is a slice of the file's tokens"
    shard = validate.heldout(trained_dir, model, tok)
    assert shard.source == "data/val.bin" and not shard.sampled
    val = np.fromfile(trained_dir / "data" / "val.bin", dtype=np.uint16)
    np.testing.assert_array_equal(shard.windows[0], val[:model.cfg.n_ctx])
    with pytest.raises(UsageError, match="val.bin is missing"):
        validate.heldout(no_val, model, tok)
    sampled = validate.heldout(no_val, model, tok, sampled=True)
    assert sampled.sampled and sampled.source == validate.SAMPLED
    assert sampled.windows.shape == (8, min(model.cfg.n_ctx, validate.SAMPLED_WINDOW))
