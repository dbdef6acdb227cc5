"""The variants' top-1 agreement does not count the reference's near-ties: a variant of a model whose top
logits all lie within a hair of each other passes its gate, and a variant of other weights is still
refused. The same rule, read from the reference's top logits only, in the int8 cache's gate."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from gptport import tokenizer as bpe
from gptport.export import exporter, validate
from gptport.export.agreement import TIE_NATS, agrees, agrees_top_k, top_k
from gptport.runtime.onnx_engine import load_cpu
from gptport.training.checkpoint import load_model, save_model
from tests.conftest import build_model_dir


def test_agrees_counts_the_best_and_near_ties_only() -> None:
    want = np.array([[0.0, 1.0, 1.0 - TIE_NATS / 2, -3.0], [2.0, 0.0, 1.9, 2.0 - 2 * TIE_NATS]])  # (2, 4)
    assert agrees(want, np.array([1, 0])).tolist() == [True, True]  # each row's best
    assert agrees(want, np.array([2, 2])).tolist() == [True, False]  # within the tie; 0.1 nats below
    assert agrees(want, np.array([3, 3])).tolist() == [False, False]


def test_top_k_gives_the_same_answers_as_whole_rows() -> None:
    rng = np.random.default_rng(0)
    want = rng.standard_normal((64, 50)).astype(np.float32) * 0.01  # near-ties everywhere
    want[::3] *= 100  # and clear winners on a third of the rows
    picks = rng.integers(0, 50, 64)
    picks[::2] = want[::2].argmax(-1)
    vals, ids = top_k(want, 8)
    assert (np.diff(vals, axis=-1) <= 0).all() and (ids[:, 0] == want.argmax(-1)).all()
    # a pick outside the top 8 disagrees in both (with 50 tokens at 0.01 spread it can be a tie by value:
    # only compare where the pick is inside the top 8 or clearly worse)
    inside = (ids == picks[:, None]).any(-1) | (want.max(-1) - want[np.arange(64), picks] > TIE_NATS)
    np.testing.assert_array_equal(agrees_top_k(vals, ids, picks)[inside], agrees(want, picks)[inside])


@pytest.fixture(scope="module")
def flat_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path) -> Path:
    """A model whose logits are all within a hundredth of a nat of each other (its head scaled down),
    exported to fp32: any pick a variant makes is a near-tie of it."""
    out = build_model_dir(tmp_path_factory.mktemp("flat") / "m", tokenizer_dir, corpus_file, steps=0,
                          tie_embeddings=False)
    tok = bpe.load(out)
    model, card = load_model(out, tok)
    with torch.no_grad():
        model.lm_head.weight.mul_(1e-3)
    save_model(out, model, card.model, tok, 0)
    exporter.export(out, ["fp32"], static=False, optimize=False)
    return out


def test_near_uniform_model_passes_and_other_weights_fail(flat_dir: Path, trained_dir: Path, tmp_path: Path) -> None:
    model, _ = load_model(flat_dir, bpe.load(flat_dir))
    windows = validate.sampled_windows(model, count=2)
    with torch.no_grad():
        logits = model(torch.from_numpy(windows))[0].numpy()  # (N, T, V)
    assert (logits.max(-1) - logits.min(-1)).max() < TIE_NATS  # every pick is within the tie
    d = tmp_path / "m"
    shutil.copytree(flat_dir, d)
    report = exporter.export(d, ["fp32", "int8"], static=False, optimize=False, force=True, sampled_text=True)
    assert "int8" in report.files and report.gates[0].ok and report.gates[0].top1 == 1.0, report.gates
    # the trained model (same tokenizer, other weights) against this int8 graph: not a variant of it
    trained, _ = load_model(trained_dir, bpe.load(trained_dir))
    windows = validate.sampled_windows(trained, 2)[:, :model.cfg.n_ctx]
    row = validate.gate(trained, load_cpu(d / "model.int8.onnx"), windows, "int8")
    assert not row.ok and row.top1 < 0.5, row
