"""The static cache on the CUDA provider (export --cuda's graphs): decode steps captured as CUDA graphs and
replayed give the numbers of the same steps run uncaptured, and the greedy tokens of the CPU provider's
static-cache graph (every row in fp32; two rows of three in fp16); greedy bursts (8 steps a run, replayed)
give the tokens of one step a run (every row in fp32, two of three in fp16); the serving slots' bucketed,
replayed decode steps give their uncaptured logits; `bench` and `generate --bursts 8` run. Each skips, saying
why, where the CUDA provider does not run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gptport import contract
from gptport.runtime import cuda_engine
from gptport.runtime.choice import GraphChoice, RunOptions
from gptport.runtime.engine import positions
from gptport.runtime.generate import generate
from gptport.runtime.loader import open_graph
from gptport.runtime.onnx_engine import load_cpu
from gptport.runtime.providers import probe
from gptport.runtime.sampling import Sampling
from tests.support.cuda_models import with_cuda_graphs

CUDA = probe("cuda")
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25]]
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not CUDA.ok, reason=f"CUDA provider does not run here: {CUDA.reason}")]


@pytest.fixture(scope="module")
def cuda_dir(trained_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return with_cuda_graphs(trained_dir, tmp_path_factory.mktemp("cuda") / "m")


def rows(engine: Any, steps: int) -> list[list[int]]:
    return [r.new_ids for r in generate(engine, PROMPTS, steps, Sampling(), -1)]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_replayed_steps_give_the_captured_numbers(cuda_dir: Path, precision: str) -> None:
    replayed = open_graph(cuda_dir, GraphChoice.parse(precision=precision), RunOptions.parse(provider="cuda"))
    plain = open_graph(cuda_dir, GraphChoice.parse(precision=precision),
                       RunOptions.parse(provider="cuda"), cuda_graph=False)
    assert isinstance(replayed, cuda_engine.DeviceModel) and replayed.graphs and not plain.graphs
    assert replayed.session.get_providers()[0] == "CUDAExecutionProvider"
    for _ in range(2):  # capture (after onnxruntime's warm-up runs), then replay
        assert rows(replayed, 40) == rows(plain, 40)
    step_a, step_b = replayed.step(last_only=True), plain.step(last_only=True)
    past_a, past_b = replayed.empty_past(3), plain.empty_past(3)
    ids, mask = np.array([[0, 5, 6], [7, 8, 9], [0, 0, 3]]), np.array([[0, 1, 1], [1, 1, 1], [0, 0, 1]])
    step_a(ids, mask, positions(mask), past_a)
    step_b(ids, mask, positions(mask), past_b)
    for tok in range(4, 10):
        mask = np.concatenate([mask, np.ones((3, 1), dtype=np.int64)], axis=1)
        new = (np.full((3, 1), tok), mask, positions(mask)[:, -1:])
        np.testing.assert_allclose(step_a(*new, past_a)[0], step_b(*new, past_b)[0],
                                   atol=1e-5 if precision == "fp32" else 1e-3)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_greedy_tokens_are_the_cpu_providers(cuda_dir: Path, precision: str) -> None:
    cpu = rows(load_cpu(cuda_dir / contract.onnx_file(precision, contract.CACHE_STATIC)), 40)
    gpu = rows(open_graph(cuda_dir, GraphChoice.parse(precision=precision), RunOptions.parse(provider="cuda")), 40)
    same = float(np.mean([a == b for a, b in zip(cpu, gpu, strict=True)]))
    assert same >= (1.0 if precision == "fp32" else 2 / 3)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_replayed_bursts_give_one_step_a_runs_tokens(cuda_dir: Path, precision: str) -> None:
    choice, cuda = GraphChoice.parse(precision=precision), RunOptions.parse(provider="cuda")
    bursting, stepping = open_graph(cuda_dir, choice, cuda), open_graph(cuda_dir, choice, cuda)
    assert isinstance(bursting, cuda_engine.DeviceModel) and bursting.graphs and stepping.bursts == 0
    bursting.bursts = cuda_engine.BURST_STEPS
    bursting.prepare_bursts()
    runs: list[int] = []
    inner = bursting.burst
    bursting.burst = lambda past, tokens: runs.append(len(tokens)) or inner(past, tokens)  # type: ignore[method-assign]
    for _ in range(2):  # capture, then replay (fp16: the steps inside a burst may take another kernel path)
        same = float(np.mean([a == b for a, b in zip(rows(bursting, 40), rows(stepping, 40), strict=True)]))
        assert same >= (1.0 if precision == "fp32" else 2 / 3)
    assert runs == [3] * 8  # 4 bursts of 8 a run, then 7 tokens one a run


def test_serving_slots_replay_each_bucket(cuda_dir: Path) -> None:
    replayed = open_graph(cuda_dir, GraphChoice.parse(precision="fp32"),
                          RunOptions.parse(provider="cuda")).device_slots(8)
    plain = open_graph(cuda_dir, GraphChoice.parse(precision="fp32"),
                       RunOptions.parse(provider="cuda"), cuda_graph=False).device_slots(8)
    rng = np.random.default_rng(0)
    for s in range(6):
        prompt = rng.integers(1, 200, 3 + s)
        np.testing.assert_allclose(replayed.append(s, prompt), plain.append(s, prompt), atol=1e-4)
    for busy in ([0], [0, 1], [0, 2, 3], [1, 4, 5], [5], [0, 1], [0, 2, 3]):  # buckets 1, 2, 4, 8, 8, 2, 4
        toks = rng.integers(1, 200, len(busy))
        np.testing.assert_allclose(replayed.decode(busy, toks), plain.decode(busy, toks), atol=1e-4)
    assert sorted(replayed.graph_ids) == [1, 2, 4, 8] and min(replayed.graph_ids.values()) > 0


def test_the_cli_bursts_on_cuda(cuda_dir: Path, tmp_path: Path) -> None:
    import json

    from tests.support.cli import gptport

    out = tmp_path / "bench.json"
    r = gptport("bench", str(cuda_dir), "--providers", "cuda", "--bursts", "8", "--no-torch-baseline", "--gen-len",
                "40", "--repeat", "1", "--json", str(out))
    assert r.returncode == 0, r.stderr
    [row] = json.loads(out.read_text())["rows"]
    assert row["bursts"] == 8 and row["error"] is None and row["decode_tok_s"] > 0
    runs = [gptport("generate", str(cuda_dir), "To be", "--provider", "cuda", "--json", "--max-new-tokens", "40",
                    *extra).stdout for extra in ([], ["--bursts", "8"])]
    texts = [json.loads(stdout)["token_ids"] for stdout in runs]
    assert texts[0] == texts[1]  # fp32: the tokens of one step a run
