"""Generation: batches give what each prompt gives alone, onnx matches torch, stops and overflow, the CLI."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from gptport import tokenizer as bpe
from gptport.cli.common import open_engine
from gptport.errors import ArtifactError, UsageError
from gptport.runtime.choice import GraphChoice
from gptport.runtime.generate import generate
from gptport.runtime.loader import encode_prompts, graph_path, open_model
from gptport.runtime.sampling import Sampling
from tests.support.cli import assert_one_line_error, gptport

PROMPTS = ["ka to ri", "the men sol ve qua lin dor", "日本"]


@pytest.fixture(scope="module")
def prompt_ids(trained_dir: Path) -> list[list[int]]:
    tok = bpe.load(trained_dir)
    return [tok.encode(p) for p in PROMPTS]


CACHES = pytest.mark.parametrize("cache", ["static", "concat"])


def run(model_dir: Path, ids: list[list[int]], n: int = 64, engine: str = "onnx", cache: str = "auto",
        **kw: object) -> list[list[int]]:
    opened = open_engine(model_dir, engine, GraphChoice.parse(cache=cache))
    sampling = Sampling(**kw)  # type: ignore[arg-type]
    return [r.new_ids for r in generate(opened.engine, ids, n, sampling, eot_id=-1)]


@CACHES
def test_batch_gives_what_each_prompt_gives_alone(trained_dir: Path, prompt_ids: list[list[int]], cache: str) -> None:
    batched = run(trained_dir, prompt_ids, n=48, cache=cache)
    alone = [run(trained_dir, [p], n=48, cache=cache)[0] for p in prompt_ids]
    assert batched == alone
    sampled = run(trained_dir, prompt_ids, n=48, cache=cache, temperature=0.9, top_k=20, seed=5)
    assert sampled == [run(trained_dir, [p], n=48, cache=cache, temperature=0.9, top_k=20, seed=5)[0]
                       for p in prompt_ids]
    assert sampled != batched


@CACHES
def test_onnx_and_torch_engines_give_identical_greedy_tokens(trained_dir: Path, prompt_ids: list[list[int]],
                                                             cache: str) -> None:
    onnx_batched = run(trained_dir, prompt_ids, 64, cache=cache)
    assert onnx_batched == run(trained_dir, prompt_ids, 64, engine="torch")
    for p, want in zip(prompt_ids, onnx_batched, strict=True):
        assert run(trained_dir, [p], 64, engine="torch")[0] == want
        assert run(trained_dir, [p], 64, cache=cache)[0] == want
    assert all(len(x) == 64 for x in onnx_batched)


def test_auto_takes_the_static_cache_graph_on_the_cpu(trained_dir: Path, tmp_path: Path) -> None:
    assert open_model(trained_dir).cache == "static"
    assert open_model(trained_dir, GraphChoice.parse(precision="int8")).cache == "static"
    assert open_model(trained_dir,
                      GraphChoice.parse(precision="fp16")).cache == "concat"  # no static fp16 graph is exported
    assert graph_path(trained_dir, GraphChoice.parse("fp32"), "cuda").name == "model.onnx"
    d = tmp_path / "m"
    shutil.copytree(trained_dir, d, ignore=shutil.ignore_patterns("*.static.onnx"))
    assert open_model(d).cache == "concat"
    with pytest.raises(ArtifactError, match="model.static.onnx: missing"):
        graph_path(d, GraphChoice.parse("fp32", "static"), "cpu")
    with pytest.raises(UsageError, match="--kv-cache 'ring'"):
        graph_path(d, GraphChoice.parse("fp32", "ring"), "cpu")


@CACHES
def test_context_overflow_slides_or_stops(trained_dir: Path, prompt_ids: list[list[int]], cache: str) -> None:
    opened = open_model(trained_dir, GraphChoice.parse(cache=cache))
    n_ctx = opened.engine.n_ctx
    slid = generate(opened.engine, prompt_ids[:1], n_ctx + 20, Sampling(), eot_id=-1)[0]
    assert len(slid.new_ids) == n_ctx + 20 and slid.finish_reason == "length"
    stopped = generate(opened.engine, prompt_ids[:1], n_ctx + 20, Sampling(), eot_id=-1, overflow="stop")[0]
    assert stopped.finish_reason == "context"
    # the model saw n_ctx tokens; the last new token is its prediction from that full window
    assert len(stopped.prompt_ids) + len(stopped.new_ids) == n_ctx + 1
    assert stopped.new_ids == slid.new_ids[: len(stopped.new_ids)]
    # after the slide, each token is the greedy choice of a plain torch forward (no cache) over the sequence
    # from the slide's start: the most recent n_ctx // 2 tokens when the window was full, and those since
    from gptport.training.checkpoint import load_model

    model, _ = load_model(trained_dir, bpe.load(trained_dir))
    seq = slid.prompt_ids + slid.new_ids
    full = n_ctx + 1  # the sequence's length when the slide came
    for j in range(full, len(seq)):  # 20 more tokens: the window (n_ctx // 2 = 48 tokens, then more) stays < n_ctx
        with torch.no_grad():
            logits = model(torch.tensor([seq[full - n_ctx // 2:j]]))[0][0, -1]
        assert logits[seq[j]] >= logits.max() - 1e-4, f"token {j}: not the greedy choice of the slid window"


def test_eot_and_stop_callback_end_a_row(trained_dir: Path, prompt_ids: list[list[int]]) -> None:
    opened = open_model(trained_dir)
    first = run(trained_dir, prompt_ids[:1], 8)[0]
    eot = generate(opened.engine, prompt_ids[:1], 8, Sampling(), eot_id=first[3])[0]
    assert eot.new_ids == first[: first.index(first[3])] and eot.finish_reason == "eot"
    stopped = generate(opened.engine, prompt_ids, 8, Sampling(), eot_id=-1, on_token=lambda row, tok: row == 1)
    assert [r.finish_reason for r in stopped] == ["length", "stop", "length"]
    assert len(stopped[1].new_ids) == 1


def test_prompt_truncation(tok: bpe.BPETokenizer) -> None:
    warnings: list[str] = []
    ids = encode_prompts(tok, ["ka " * 200, ""], n_ctx=32, warn=warnings.append)
    assert len(ids[0]) == 32 and ids[1] == [tok.eot_id] and "kept its last 32" in warnings[0]


def test_cli_streams_and_prints_json(trained_dir: Path) -> None:
    r = gptport("generate", str(trained_dir), PROMPTS[0], "--max-new-tokens", "20")
    assert r.returncode == 0, r.stderr
    tok = bpe.load(trained_dir)
    want = tok.decode(run(trained_dir, [tok.encode(PROMPTS[0])], 20)[0])
    assert r.stdout == want + "\n"
    r = gptport("generate", str(trained_dir), *PROMPTS, "--max-new-tokens", "12", "--json", "--temperature", "0.7")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["prompt"] for row in rows] == PROMPTS
    for row in rows:
        assert {"prompt", "text", "token_ids", "prefill_ms", "decode_tok_s"} <= set(row)
        assert tok.decode(row["token_ids"]) == row["text"] and row["provider"] == "cpu"


def test_cli_sampling_penalties(trained_dir: Path, prompt_ids: list[list[int]]) -> None:
    """--presence-penalty, --frequency-penalty and --min-p give generate()'s tokens with those settings, the
    same seed the same tokens; --presence-penalty 2 changes a greedy output that repeats."""
    args = ("--max-new-tokens", "24", "--json", "--presence-penalty", "2", "--frequency-penalty", "0.5")
    r = gptport("generate", str(trained_dir), PROMPTS[0], *args)
    assert r.returncode == 0, r.stderr
    want = run(trained_dir, prompt_ids[:1], 24, presence_penalty=2.0, frequency_penalty=0.5)[0]
    got = json.loads(r.stdout)["token_ids"]
    assert got == want[:len(got)] and got != run(trained_dir, prompt_ids[:1], len(got))[0]
    sampled = ("generate", str(trained_dir), PROMPTS[0], *args, "--temperature", "1", "--min-p", "0.1", "--seed", "4")
    first, again = gptport(*sampled), gptport(*sampled)
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["token_ids"] == json.loads(again.stdout)["token_ids"]


def test_cli_stop_string(trained_dir: Path) -> None:
    tok = bpe.load(trained_dir)
    full = tok.decode(run(trained_dir, [tok.encode(PROMPTS[1])], 30)[0])
    stop = full.strip()[3:6]
    r = gptport("generate", str(trained_dir), PROMPTS[1], "--max-new-tokens", "30", "--stop", stop)
    assert r.returncode == 0, r.stderr
    assert r.stdout == full[: full.index(stop)] + "\n"


def test_generate_runs_without_torch(trained_dir: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "blocker" / "torch"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('torch is blocked for this test')\n")
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(blocker.parent)}
    cmd = [sys.executable, "-c", "import torch"]
    assert subprocess.run(cmd, env=env, capture_output=True).returncode != 0
    r = subprocess.run([sys.executable, "-m", "gptport.cli.main", "generate", str(trained_dir), PROMPTS[0],
                        "--max-new-tokens", "10", "--precision", "int8"], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    r = subprocess.run([sys.executable, "-m", "gptport.cli.main", "generate", str(trained_dir), "x", "--engine",
                        "torch"], env=env, capture_output=True, text=True)
    assert r.returncode == 2 and "needs PyTorch" in r.stderr


def test_cli_bad_input(trained_dir: Path, tmp_path: Path) -> None:
    d = str(trained_dir)
    assert_one_line_error(gptport("generate", d, "x", "--top-p", "0"), 2, "--top-p")
    assert_one_line_error(gptport("generate", d, "x", "--temperature", "-1"), 2, "--temperature")
    assert_one_line_error(gptport("generate", d, "x", "--top-k", "-3"), 2, "--top-k")
    for option, wrong in (("--presence-penalty", "2.5"), ("--frequency-penalty", "-3"), ("--min-p", "1.5"),
                          ("--min-p", "-0.1")):
        assert_one_line_error(gptport("generate", d, "x", option, wrong), 2, option, wrong)
    assert_one_line_error(gptport("generate", d, "x", "--provider", "tpu"), 2, "--provider 'tpu'")
    assert_one_line_error(gptport("generate", d, "x", "--precision", "int4"), 1, "model.int4.onnx", "export")
    assert_one_line_error(gptport("generate", d), 2, "no prompt")
    empty = tmp_path / "prompts.txt"
    empty.write_text("\n  \n")
    assert_one_line_error(gptport("generate", d, "--file", str(empty)), 1, "empty prompt file")
    assert_one_line_error(gptport("generate", d, "ka " * 200, "--no-truncate"), 1, "longer than the model's n_ctx")
    r = gptport("generate", d, "ka " * 200, "--max-new-tokens", "3")
    assert r.returncode == 0 and "kept its last 96" in r.stderr
    other = tmp_path / "other"
    shutil.copytree(trained_dir, other)
    (other / "tokenizer_meta.json").unlink()
    (other / "tokenizer.json").write_text((other / "tokenizer.json").read_text() + "\n")
    assert_one_line_error(gptport("generate", str(other), "x"), 1, "does not match the model")


def test_fallback_reports_and_goes_on(trained_dir: Path) -> None:
    from gptport.runtime.providers import probe

    if probe("cuda").ok:
        pytest.skip("this machine runs the CUDA provider: there is nothing to fall back from")
    r = gptport("generate", str(trained_dir), "x", "--provider", "cuda", "--max-new-tokens", "3")
    assert r.returncode == 1 and "--provider cuda:" in r.stderr and "--fallback" in r.stderr
    r = gptport("generate", str(trained_dir), "x", "--provider", "cuda", "--fallback", "--max-new-tokens", "3")
    assert r.returncode == 0, r.stderr
    assert "falling back to cpu" in r.stderr and "onnx cpu fp32" in r.stderr
    np.testing.assert_equal(len(r.stdout) > 0, True)
