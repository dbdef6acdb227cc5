"""bench and eval: the measurements and their schema, perplexity that agrees across engines."""

from __future__ import annotations

import csv
import json
import math
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from gptport import tokenizer as bpe
from gptport.cli.common import open_engine
from gptport.errors import UsageError
from gptport.runtime import bench, host_measures
from gptport.runtime.evaluate import evaluate
from gptport.runtime.loader import open_model
from gptport.runtime.providers import probe
from gptport.training.checkpoint import load_model
from gptport.training.torch_engine import open_torch
from tests.conftest import make_text
from tests.support.cli import assert_one_line_error, gptport

ROW_KEYS = {"engine", "provider", "precision", "batch", "prompt_len", "gen_len", "prefill_tok_s", "decode_tok_s",
            "ttft_ms", "latency_ms_p50", "latency_ms_p90", "latency_ms_p99", "speedup_vs_torch",
            "bandwidth_fraction", "peak_rss_mb", "samples", "kv_cache"}
# only a --draft plan fills these
DRAFT_KEYS = ["draft", "draft_precision", "acceptance", "tokens_per_step", "speedup_vs_plain"]


def fp32_bytes_per_step(model_dir: Path) -> int:
    """What one decode step of the fp32 model reads, from the torch model's parameters (the tied head
    once): every weight but the position table, of which a step reads one row."""
    model, _ = load_model(model_dir, bpe.load(model_dir))
    assert model.cfg.pos_encoding == "learned" and model.cfg.tie_embeddings
    return 4 * (sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel())


def test_weight_bytes_skip_the_tables_a_step_only_gathers_from(trained_dir: Path) -> None:
    want = fp32_bytes_per_step(trained_dir)
    for graph in ("model.onnx", "model.static.onnx"):  # the graphs add a few small constants (shapes, axes)
        assert host_measures.weight_bytes_per_token(trained_dir / graph) == pytest.approx(want, rel=2e-3), graph
    int8 = host_measures.weight_bytes_per_token(trained_dir / "model.int8.onnx")
    # A byte per weight and a float scale per block, the head quantized too: 1/4 of fp32 and a little; up
    # to 1/2 here, where d_model 64 is shorter than the 128-weight block, which MatMulNBits pads out.
    assert 0.25 < int8 / want < 0.5


def test_bandwidth_probe_agrees_with_a_plain_numpy_timing() -> None:
    """The probe's figure against one measured here another way: the best of five float64 sums over a
    128 MiB array (beyond the caches), one thread like the probe's; within a factor of 3 either way."""
    buf = np.ones((128 << 20) // 8, dtype=np.float64)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    ours = buf.nbytes / best
    probed = host_measures.measure_bandwidth(threads=1, mib=128, tries=2)
    assert ours / 3 < probed < ours * 3, (probed / 1e9, ours / 1e9)


def test_run_measures_onnx_and_torch_rows(trained_dir: Path) -> None:
    plan = bench.BenchPlan(providers=("cpu", "tensorrt"), precisions=("fp32", "int8", "int4"), batches=(1, 2),
                           prompt_lens=(8,), gen_len=6, repeat=2, warmup=1, threads=1, probe_mib=64)
    result = bench.run(trained_dir, plan, open_torch=open_torch)
    assert {"machine", "versions", "rows"} <= set(result)
    machine_gb_s = result["machine"]["memory_read_gb_s"]
    ok = [r for r in result["rows"] if not r["error"]]
    assert {(r["engine"], r["precision"], r["batch"]) for r in ok} == {
        ("onnx", "fp32", 1), ("onnx", "fp32", 2), ("onnx", "int8", 1), ("onnx", "int8", 2),
        ("torch", "fp32", 1), ("torch", "fp32", 2)}
    fp32_bytes = fp32_bytes_per_step(trained_dir)
    torch_rows = {r["batch"]: r for r in ok if r["engine"] == "torch"}
    for r in ok:
        assert ROW_KEYS <= set(r) and r["samples"] == 2 and r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0
        assert r["latency_ms_p50"] <= r["latency_ms_p90"] <= r["latency_ms_p99"]
        assert r["kv_cache"] == ("static" if r["engine"] == "onnx" else "-")  # auto: the static graph on the CPU
        if r["engine"] == "onnx":
            # no field of the schema left unmeasured, but the draft ones of a plan without --draft
            assert [k for k, v in r.items() if v is None] == ["error", *DRAFT_KEYS]
            assert r["providers_ran"][0] == "CPUExecutionProvider"
            assert r["speedup_vs_torch"] == pytest.approx(r["decode_tok_s"] / torch_rows[r["batch"]]["decode_tok_s"])
            if r["precision"] == "fp32":
                assert r["weight_bytes_per_token"] == pytest.approx(fp32_bytes, rel=2e-3)
            else:
                assert 0.25 < r["weight_bytes_per_token"] / fp32_bytes < 0.5  # as in the test above
            # the row's own bandwidth, probed around its runs: the same machine as the run's first probe
            assert machine_gb_s / 3 < r["bandwidth_gb_s"] < machine_gb_s * 3
            # the weights are read once per decode step, whatever the batch: steps/s = tok/s / batch
            read = r["weight_bytes_per_token"] * r["decode_tok_s"] / r["batch"]
            assert r["bandwidth_fraction"] * r["bandwidth_gb_s"] * 1e9 == pytest.approx(read, rel=1e-6)
    errors = {(r["provider"], r["precision"]) for r in result["rows"] if r["error"]}
    assert ("cpu", "int4") in errors  # not exported: a row that says why, not a crash
    assert probe("tensorrt").ok or ("tensorrt", "fp32") in errors


def test_cli_bench_writes_json_csv_and_plot(trained_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "b"
    r = gptport("bench", str(trained_dir), "--prompt-len", "8", "--gen-len", "4", "--repeat", "1",
                "--json", f"{out}.json", "--csv", f"{out}.csv", "--plot", f"{out}.png")
    assert r.returncode == 0, r.stderr
    data = json.loads(Path(f"{out}.json").read_text())
    assert ROW_KEYS <= set(data["rows"][0])
    with open(f"{out}.csv") as f:
        assert len(list(csv.DictReader(f))) == len(data["rows"])
    assert Path(f"{out}.png").read_bytes()[:4] == b"\x89PNG"
    assert "decode tok/s" in r.stderr
    assert_one_line_error(gptport("bench", str(trained_dir), "--batch", "0"), 2, "--batch")


@pytest.fixture(scope="module")
def heldout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("heldout") / "heldout.txt"
    path.write_text(make_text(120, seed=99))
    return path


def test_eval_onnx_and_torch_agree(trained_dir: Path, heldout: Path) -> None:
    text = heldout.read_text()
    onnx_result = evaluate(open_model(trained_dir).engine, bpe.load(trained_dir), text, stride=48)
    torch_result = evaluate(open_torch(trained_dir).engine, bpe.load(trained_dir), text, stride=48)
    assert abs(onnx_result.perplexity / torch_result.perplexity - 1) < 1e-3
    assert onnx_result.bytes == len(text.encode("utf-8"))
    assert onnx_result.tokens == len(bpe.load(trained_dir).encode(text))
    assert math.isclose(onnx_result.bits_per_byte,
                        onnx_result.nats_per_token * onnx_result.tokens / onnx_result.bytes / math.log(2))
    assert onnx_result.perplexity < bpe.load(trained_dir).vocab_size  # the model learned something


def test_eval_scores_the_models_next_token_cross_entropy(trained_dir: Path) -> None:
    """Within one window (a text shorter than n_ctx), evaluate's nats per token are the torch model's mean
    cross-entropy of each token given those before it (the first given EOT), computed here directly; bits
    per byte divide their sum by ln 2 and the text's UTF-8 bytes."""
    import torch

    tok = bpe.load(trained_dir)
    text = make_text(4, seed=7)
    ids = [tok.eot_id, *tok.encode(text)]
    assert len(ids) - 1 <= 96  # one window of trained_dir's n_ctx
    model, _ = load_model(trained_dir, tok)
    with torch.no_grad():
        logits = model(torch.tensor([ids[:-1]]))[0][0].double()
    want = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:])).item()
    each = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].numpy()
    for engine in ("onnx", "torch"):
        got = evaluate(open_engine(trained_dir, engine).engine, tok, text, per_token=True)
        assert got.tokens == len(ids) - 1 and abs(got.nats_per_token - want) < 1e-4, (engine, got, want)
        assert got.bits_per_byte == pytest.approx(want * (len(ids) - 1) / math.log(2) / len(text.encode()),
                                                  rel=1e-4), engine
        assert list(got.token_ids) == ids[1:] and np.abs(np.array(got.token_logprobs) - each).max() < 1e-4, engine
    assert evaluate(open_engine(trained_dir, "onnx").engine, tok, text).token_logprobs == ()  # only when asked


def test_stride_covers_every_token_once(trained_dir: Path, heldout: Path) -> None:
    text = heldout.read_text()
    engine, tok = open_model(trained_dir).engine, bpe.load(trained_dir)
    results = [evaluate(engine, tok, text, stride=s) for s in (96, 32, 1)]
    assert {r.tokens for r in results} == {len(tok.encode(text))}  # each text token, once, whatever the stride
    assert {r.bytes for r in results} == {len(text.encode("utf-8"))}
    n = results[0].tokens  # a first window of n_ctx = 96 tokens, then `stride` new tokens per window
    assert [r.windows for r in results] == [1 + math.ceil((n - 96) / s) for s in (96, 32, 1)]
    assert results[2].nats_per_token <= results[0].nats_per_token + 0.05  # more context never hurts much
    with pytest.raises(UsageError, match="--stride"):
        evaluate(engine, tok, text, stride=97)


def test_cli_eval_json_and_variants(trained_dir: Path, heldout: Path, tmp_path: Path) -> None:
    r = gptport("eval", str(trained_dir), str(heldout), "--json")
    assert r.returncode == 0, r.stderr
    fp32 = json.loads(r.stdout)
    assert {"perplexity", "bits_per_byte", "tokens", "bytes"} <= set(fp32)
    r = gptport("eval", str(trained_dir), str(heldout), "--json", "--precision", "fp32,int8,fp16")
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["precision"] for row in rows] == ["fp32", "int8", "fp16"] and rows[0] == fp32
    int8 = rows[1]
    assert int8["precision"] == "int8" and abs(int8["perplexity"] / fp32["perplexity"] - 1) < 0.05
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert_one_line_error(gptport("eval", str(trained_dir), str(empty)), 1, "empty")
    copy = tmp_path / "m"
    shutil.copytree(trained_dir, copy)
    assert_one_line_error(gptport("eval", str(copy), str(heldout), "--stride", "0"), 2, "--stride")


def test_cli_eval_tokens_prints_each_tokens_log_probability(trained_dir: Path, heldout: Path) -> None:
    """--tokens adds each scored token (id, text, natural-log probability) to --json's line; over several
    windows too, each text token once, summing to the reported nats."""
    r = gptport("eval", str(trained_dir), str(heldout), "--json", "--tokens", "--stride", "32")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    tok = bpe.load(trained_dir)
    assert out["windows"] > 1 and [t["id"] for t in out["token_logprobs"]] == tok.encode(heldout.read_text())
    assert all(t["text"] == tok.decode([t["id"]]) and t["logprob"] <= 0 for t in out["token_logprobs"])
    total = -sum(t["logprob"] for t in out["token_logprobs"])
    assert total == pytest.approx(out["nats_per_token"] * out["tokens"], rel=1e-9)
    assert_one_line_error(gptport("eval", str(trained_dir), str(heldout), "--tokens"), 2, "--tokens needs --json")


@pytest.mark.slow
def test_demo_runs_the_whole_pipeline(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    r = gptport("demo", "--out", str(out), "--minutes", "0.15", "--vocab-size", "1024")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("def ") and len(r.stdout) > 10
    for needle in ("1/6 corpus", "not UTF-8", "2/6 tokenizer", "4/6 export", "6/6 bench", "gptport demo:",
                   "bits per byte", "decode"):
        assert needle in r.stderr, needle
    assert "not run" not in r.stderr, r.stderr[-3000:]  # every graph export wrote is benchmarked
    assert (out / "model.onnx").exists() and (out / "model.safetensors").exists()
    assert_one_line_error(gptport("demo", "--out", str(out), "--minutes", "0.1"), 1, "--force")
