"""Greedy decode bursts (burst.py, DeviceModel.burst) on the CPU over host memory, the code CUDA runs: k steps
a run give the tokens of one step a run, for the fp32 decode graph and the fp16 GroupQueryAttention graph,
with an end token or a stop inside a burst, a token budget that is no multiple of k and a context too short
for a burst; bursts are asked for, their session made once per size; bench's timing loop bursts too;
sampling other than greedy never bursts; a graph that is not a one-token static-cache graph is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from gptport import contract
from gptport.runtime import burst, cuda_engine
from gptport.runtime.generate import generate
from gptport.runtime.onnx_engine import load_cpu
from gptport.runtime.sampling import Sampling

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25]]


def engine(model_dir: Path, precision: str, bursts: int) -> cuda_engine.DeviceModel:
    """The engine CUDA opens, on the CPU provider over host memory, `bursts` greedy steps a run."""
    path = cuda_engine.graph_path(model_dir, precision, required=True)
    assert path is not None
    twin = model_dir / contract.onnx_file("fp32", contract.CACHE_APPEND)
    model = cuda_engine.on_device(load_cpu(path), load_cpu(twin) if precision == "fp32" else None, cuda_graph=False)
    model.bursts = bursts
    model.prepare_bursts()  # generate would make it at its first greedy call
    return model


def counted(model: cuda_engine.DeviceModel) -> list[int]:
    """The batch of every burst `model` runs, recorded as they run."""
    calls: list[int] = []
    inner = model.burst

    def wrapped(past: Any, tokens: np.ndarray) -> np.ndarray:
        calls.append(len(tokens))
        return inner(past, tokens)

    model.burst = wrapped  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_bursts_give_the_tokens_of_one_step_a_run(cuda_dir: Path, precision: str) -> None:
    want = generate(engine(cuda_dir, precision, 0), PROMPTS, 21, Sampling(), -1)  # 21: no multiple of 8
    model = engine(cuda_dir, precision, 8)
    calls = counted(model)
    for _ in range(2):  # the second run reuses the slots and the burst's binding
        got = generate(model, PROMPTS, 21, Sampling(), -1)
        assert [g.new_ids for g in got] == [w.new_ids for w in want]
        assert all(len(g.new_ids) == 21 and g.finish_reason == "length" for g in got)
    assert calls == [3] * 4  # tokens 2-9 and 10-17 in each run; 18-21 one a run (fewer than 8 left)


def test_an_end_or_a_stop_inside_a_burst_ends_the_row_there(cuda_dir: Path) -> None:
    want = generate(engine(cuda_dir, "fp32", 0), PROMPTS, 30, Sampling(), -1)
    row = want[0].new_ids
    at = next(i for i in range(3, len(row)) if row[i] not in row[:i])  # its first time, inside a burst
    model = engine(cuda_dir, "fp32", 8)
    got = generate(model, PROMPTS[:1], 30, Sampling(), row[at])
    assert got[0].new_ids == row[:at] and got[0].finish_reason == "eot"
    stops = generate(model, PROMPTS[:1], 30, Sampling(), -1, on_token=lambda _, tok: tok == row[at])
    assert stops[0].new_ids == row[:at + 1] and stops[0].finish_reason == "stop"


def test_a_context_too_short_for_a_burst_steps_one_token_a_run(cuda_dir: Path) -> None:
    base = engine(cuda_dir, "fp16", 0)
    long = [list(range(3, 3 + base.n_ctx - 5))]  # room for 5 more positions: no burst of 8 fits
    want = generate(base, long, 10, Sampling(), -1, overflow="stop")
    model = engine(cuda_dir, "fp16", 8)
    calls = counted(model)
    got = generate(model, long, 10, Sampling(), -1, overflow="stop")
    assert calls == [] and got[0].new_ids == want[0].new_ids and got[0].finish_reason == "context"


def test_sampling_never_bursts(cuda_dir: Path) -> None:
    model = engine(cuda_dir, "fp32", 8)
    calls = counted(model)
    generate(model, PROMPTS, 12, Sampling(temperature=0.8, seed=3), -1)
    generate(model, PROMPTS, 12, Sampling(repetition_penalty=1.3), -1)
    assert calls == []


def test_a_graph_with_no_one_token_cache_is_refused(cuda_dir: Path) -> None:
    contract_graph = onnx.load(str(cuda_dir / "model.onnx"))
    with pytest.raises(ValueError, match="not a one-token static-cache graph: seqlens_k"):
        burst.unroll(contract_graph, 4)
    proto = burst.unroll(onnx.load(str(cuda_dir / contract.onnx_file("fp32", contract.CACHE_DECODE))), 3)
    outputs = [o.name for o in proto.graph.output]
    assert outputs[0] == burst.BURST_IDS and contract.LOGITS not in outputs
    assert sum(n.op_type == "ArgMax" for n in proto.graph.node) == 3


def test_bursts_are_asked_for_and_made_once_per_size(cuda_dir: Path) -> None:
    path = cuda_engine.graph_path(cuda_dir, "fp16", required=True)
    assert path is not None
    model = cuda_engine.on_device(load_cpu(path), None, cuda_graph=False)
    calls = counted(model)
    want = generate(model, PROMPTS, 30, Sampling(), -1)
    assert model.bursts == 0 and calls == []  # not asked for: one step a run
    past = model.empty_past(1)
    model.step(last_only=True)(np.array([[5, 6]]), np.ones((1, 2), dtype=np.int64), np.array([[0, 1]]), past)
    model.bursts = 4
    with pytest.raises(ValueError, match="no session for bursts of 4 steps: call prepare_bursts"):
        model.burst(past, np.array([7]))
    got = generate(model, PROMPTS, 30, Sampling(), -1)  # its session made here, before the first burst
    assert calls and [g.new_ids for g in got] == [w.new_ids for w in want]
    made = model._burster
    model.prepare_bursts()
    assert model._burster is made  # once per size
    model.bursts = 5
    again = generate(model, PROMPTS, 30, Sampling(), -1)
    assert model._burster is not None and model._burster[0] == 5
    assert [g.new_ids for g in again] == [w.new_ids for w in want]


def test_bench_times_bursts(cuda_dir: Path) -> None:
    from gptport.runtime.bench import time_generation

    model = engine(cuda_dir, "fp32", 8)
    calls = counted(model)
    _, _, steps = time_generation(model, model.config.vocab_size, 2, 16, 20, seed=0)
    assert len(steps) == 19 and calls == [2, 2] and all(s > 0 for s in steps)  # 8 + 8, then 3 one a run


def test_bench_run_says_which_rows_cannot_burst(cuda_dir: Path) -> None:
    from gptport.runtime import bench

    plan = bench.BenchPlan(providers=("cpu",), gen_len=4, repeat=1, warmup=0, torch_baseline=False, bursts=8,
                           probe_mib=8)
    rows = bench.run(cuda_dir, plan)["rows"]
    assert len(rows) == 1 and rows[0]["bursts"] == 8 and rows[0]["decode_tok_s"] is None  # not run, and why:
    assert "greedy bursts unroll export --cuda's graphs on --provider cuda; cpu opened model.static.onnx" in \
        rows[0]["error"]


@pytest.mark.parametrize(("args", "needles"), [
    (["bench", "--providers", "cpu", "--bursts", "8", "--no-torch-baseline"], ["--bursts 8", "has no cuda"]),
    (["bench", "--providers", "cuda", "--bursts", "1"], ["--bursts 1", "at least 2"]),
    (["generate", "hello", "--bursts", "8"], ["--bursts", "export --cuda's graphs on --provider cuda", "cpu"]),
    (["generate", "hello", "--bursts", "-2"], ["--bursts -2"]),
])
def test_the_cli_refuses_bursts_it_cannot_run(cuda_dir: Path, args: list[str], needles: list[str]) -> None:
    from tests.support.cli import assert_one_line_error, gptport

    assert_one_line_error(gptport(args[0], str(cuda_dir), *args[1:]), 2, *needles)


def test_generate_bursts_only_greedy_unconstrained_rows(cuda_dir: Path) -> None:
    from gptport.cli.generate_cmd import check_bursts
    from gptport.errors import UsageError

    model = engine(cuda_dir, "fp32", 0)
    check_bursts(8, model, "cuda", True, (None, None, None), (None, None))  # a device model, greedy: runs
    with pytest.raises(UsageError, match="sampling options"):
        check_bursts(8, model, "cuda", False, (None, None, None), (None, None))
    with pytest.raises(UsageError, match="a constraint"):
        check_bursts(8, model, "cuda", True, (None, "[a-z]+", None), (None, None))
    with pytest.raises(UsageError, match="speculative decoding"):
        check_bursts(8, model, "cuda", True, (None, None, None), (None, 3))
