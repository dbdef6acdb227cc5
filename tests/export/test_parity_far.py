"""The parity gate on a window longer than validate.PARITY_SPAN: its cases run at most PARITY_SPAN tokens (a model
of n_ctx 8192 run whole needs gigabytes), and still reach the end of the window: the contract graph's last case
sits at positions n_ctx - 256 .. n_ctx - 1, the static-cache graph's decodes into a cache filled to n_ctx - 2. A
graph wrong only at the end of the window (its last position rows perturbed, or positions off by one there) is
refused on that case; the float64 reference widens one module at a time and equals a whole float64 copy."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch

from gptport import tokenizer as bpe
from gptport.config import ModelConfig
from gptport.errors import ValidationError
from gptport.export import exporter, validate
from gptport.export.tolerance import Tolerance
from gptport.runtime.engine import StepFn
from gptport.runtime.onnx_engine import load_cpu
from gptport.training.checkpoint import load_model
from gptport.training.model import GPT
from tests.conftest import build_model_dir

N_CTX = 320  # beyond PARITY_SPAN (256): the far cases start at position 64
FAR = f"at positions {N_CTX - validate.PARITY_SPAN}..{N_CTX - 1}"
STATIC_FAR = f"(1, {N_CTX - 2}) cached + 2 steps to position {N_CTX - 1}"


@pytest.fixture(scope="module")
def long_window(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path
                ) -> tuple[Path, Any, GPT]:
    """A model of n_ctx 320 exported to fp32 (contract, static-cache and append graphs), and its torch model."""
    out = build_model_dir(tmp_path_factory.mktemp("far") / "m", tokenizer_dir, corpus_file, steps=0, n_ctx=N_CTX)
    report = exporter.export(out, ["fp32"], optimize=False)
    model, _ = load_model(out, bpe.load(out))
    return out, report, model


def test_the_cases_are_capped_and_reach_the_end_of_the_window(long_window: tuple[Path, Any, GPT]) -> None:
    _, report, _ = long_window
    assert [r.case for r in report.parity] == ["(1, 1, 0)", "(1, 256, 0)", "(3, 7, 5) padded", f"(2, 1, 255) {FAR}"]
    assert [r.case for r in report.static_parity] == ["(1, 256) + 0 steps", "(3, 7) padded + 3 steps", STATIC_FAR]
    assert [r.case for r in report.append_parity][1] == "2 rows: 253 and 2, then 3 and 1"
    assert all(r.ok for r in report.parity + report.static_parity + report.append_parity)


def last_positions_perturbed(src: Path, dst: Path, rows: int = 4) -> None:
    """A copy of the graph at `src` whose position table (the (n_ctx, d_model) initializer) gives its last `rows`
    positions the rows of its first ones: wrong only at the end of the window."""
    proto = onnx.load(str(src))
    table = next(i for i in proto.graph.initializer if list(i.dims)[:1] == [N_CTX])
    arr = onnx.numpy_helper.to_array(table).copy()
    arr[-rows:] = arr[:rows]
    table.CopyFrom(onnx.numpy_helper.from_array(arr, table.name))
    onnx.save(proto, str(dst))


def refused_on(rows: list[validate.ParityRow], case: str) -> None:
    """Only the case `case` fails, and the refusal names it."""
    assert [r.case for r in rows if not r.ok] == [case]
    with pytest.raises(ValidationError, match=f"failed on case {re.escape(case)}: "):
        validate.refuse("parity", rows)


def test_a_contract_graph_wrong_at_the_end_of_the_window_is_refused(long_window: tuple[Path, Any, GPT],
                                                                   tmp_path: Path) -> None:
    out, _, model = long_window
    last_positions_perturbed(out / "model.onnx", tmp_path / "broken.onnx")
    refused_on(validate.parity(model, load_cpu(tmp_path / "broken.onnx").step(), Tolerance()), f"(2, 1, 255) {FAR}")


def test_a_static_graph_wrong_at_the_end_of_the_window_is_refused(long_window: tuple[Path, Any, GPT],
                                                                 tmp_path: Path) -> None:
    out, _, model = long_window
    last_positions_perturbed(out / "model.static.onnx", tmp_path / "broken.onnx")
    refused_on(validate.static_parity(model, load_cpu(tmp_path / "broken.onnx"), Tolerance()), STATIC_FAR)


def late_positions_off_by_one(step: StepFn) -> StepFn:
    """A graph that places the tokens of the window's last 8 positions one position early."""
    return lambda ids, mask, pos, past: step(ids, mask, np.where(pos >= N_CTX - 8, pos - 1, pos), past)


def test_rope_positions_wrong_at_the_end_of_the_window_are_refused() -> None:
    """RoPE's largest angles: a Llama-style model's contract graph checked against torch through a step that
    rotates the last positions by their neighbour's angle (torch's own step, so no graph is needed)."""
    from gptport.training.torch_engine import torch_step

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=300, n_ctx=N_CTX, d_model=64, n_layer=2, n_head=4, n_kv_head=2, pos_encoding="rope",
                      norm="rmsnorm", mlp="swiglu", bias=False, rope_theta=100000.0)
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(5.0)  # far from uniform logits
    assert all(r.ok for r in validate.parity(model, torch_step(model), Tolerance()))
    refused_on(validate.parity(model, late_positions_off_by_one(torch_step(model)), Tolerance()), f"(2, 1, 255) {FAR}")


@pytest.mark.parametrize("choices", [{}, {"pos_encoding": "rope", "norm": "rmsnorm", "mlp": "swiglu", "n_kv_head": 2,
                                       "tie_embeddings": False}])
def test_the_float64_reference_is_a_float64_copy_one_module_at_a_time(choices: dict[str, Any]) -> None:
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=100, n_ctx=32, d_model=64, n_layer=2, n_head=4, **choices)).eval()
    m64 = validate.float64_copy(model)
    ids = torch.randint(0, 100, (2, 9))
    with torch.no_grad():
        got, present = m64(ids)
        want, _ = copy.deepcopy(model).double()(ids)
    assert got.dtype == torch.float64 and present[0][0].dtype == torch.float64
    assert torch.equal(got, want)
    assert all(p.is_meta for p in m64.parameters())  # no float64 weights kept between calls
    assert all(not p.is_meta and p.dtype == torch.float32 for p in model.parameters())  # the model untouched
