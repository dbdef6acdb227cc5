"""Training: determinism, exact resume, checkpoint format, and the CLI's errors."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from gptport import tokenizer as bpe
from gptport.config import ModelConfig, TrainConfig
from gptport.corpus import CorpusReader, resolve_sources
from gptport.errors import UsageError
from gptport.training import shards as data
from gptport.training.checkpoint import read_resume_state
from gptport.training.train import Trainer, run_clock
from tests.support.cli import assert_one_line_error, gptport

SHAPE = ["--set", "n_ctx=32", "--set", "d_model=32", "--set", "n_layer=2", "--set", "n_head=2",
         "--set", "eval_batches=2", "--batch-size", "4", "--device", "cpu"]


@pytest.fixture()
def model_dir(tmp_path: Path, tokenizer_dir: Path) -> Path:
    out = tmp_path / "m"
    shutil.copytree(tokenizer_dir, out)
    return out


def make_trainer(model_dir: Path, corpus_file: Path, resume: bool = False, **train: object) -> Trainer:
    tok = bpe.load(model_dir)
    cfg = ModelConfig(vocab_size=tok.vocab_size, n_ctx=32, d_model=32, n_layer=2, n_head=2)
    tcfg = TrainConfig(**{"batch_size": 4, "eval_every": 4, "eval_batches": 2, "warmup_steps": 2,
                          "device": "cpu", "autocast": "fp32", **train})  # type: ignore[arg-type]
    shards = data.prepare(model_dir, CorpusReader(resolve_sources([corpus_file])), tok, 0.1)
    return Trainer(model_dir, cfg, tcfg, shards, tok, bpe.token_bytes(tok), resume=resume)


def losses(model_dir: Path) -> list[tuple[int, float, float]]:
    lines = (model_dir / "logs" / "train.jsonl").read_text().splitlines()
    return [(r["step"], r["train_loss"], r["val_loss"]) for r in map(json.loads, lines)]


def test_same_seed_gives_identical_losses_and_training_lowers_them(tmp_path: Path, tokenizer_dir: Path,
                                                                  corpus_file: Path) -> None:
    runs = []
    for name in ("a", "b"):
        d = tmp_path / name
        shutil.copytree(tokenizer_dir, d)
        make_trainer(d, corpus_file, steps=8, lr=1e-2).run()
        runs.append(losses(d))
    assert runs[0] == runs[1]
    (first_step, _, first), (last_step, _, last) = runs[0]
    assert (first_step, last_step) == (4, 8)
    # Measured with seed 0: ln(512) = 6.24 untrained (uniform), 5.68 after 4 steps, 5.20 after 8.
    assert first < math.log(bpe.load(tmp_path / "a").vocab_size) - 0.25
    assert last < first - 0.25


def test_resume_continues_exactly(tmp_path: Path, tokenizer_dir: Path, corpus_file: Path) -> None:
    straight, split = tmp_path / "straight", tmp_path / "split"
    for d in (straight, split):
        shutil.copytree(tokenizer_dir, d)
    make_trainer(straight, corpus_file, steps=12, eval_every=3).run()
    first = make_trainer(split, corpus_file, steps=6, schedule_steps=12, eval_every=3).run()
    assert first.step == 6
    # a kill after the resume file but before the rest: trainer.json and the published weights stale
    (split / "trainer.json").write_text('{"step": 3}')
    shutil.copy(straight / "model.safetensors", split / "model.safetensors")
    make_trainer(split, corpus_file, resume=True, steps=12, schedule_steps=12, eval_every=3).run()
    with (safe_open(str(straight / "model.safetensors"), "pt") as a,
          safe_open(str(split / "model.safetensors"), "pt") as b):
        assert set(a.keys()) == set(b.keys())
        for key in a.keys():
            assert torch.equal(a.get_tensor(key), b.get_tensor(key)), key
    assert losses(straight)[-1] == losses(split)[-1]


def test_the_cpu_clock_counts_this_process_s_work_not_sleep(model_dir: Path, corpus_file: Path) -> None:
    """clock=cpu: --minutes counts CPU seconds over torch threads, which a sleep does not advance and work
    does; a run trains until that much CPU time is spent, and --resume keeps the clock."""
    clock = run_clock("cpu")
    t0 = clock()
    time.sleep(0.3)
    slept = clock() - t0
    a = torch.randn(256, 256)
    for _ in range(50):
        a = torch.tanh(a @ a)
    assert slept < 0.1 and clock() - t0 - slept > 0
    result = make_trainer(model_dir, corpus_file, minutes=0.004, clock="cpu", eval_every=1000).run()
    state = read_resume_state(model_dir)
    assert state["train"]["clock"] == "cpu" and state["elapsed_s"] >= 0.24 and result.step >= 1
    assert json.loads((model_dir / "logs" / "train.jsonl").read_text().splitlines()[-1])["elapsed_s"] >= 0.24
    with pytest.raises(UsageError, match="train.clock must be wall or cpu, not 'gpu'"):
        TrainConfig(clock="gpu").validate()


def test_checkpoint_files(model_dir: Path, corpus_file: Path) -> None:
    make_trainer(model_dir, corpus_file, steps=4).run()
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "wte.weight" in keys and "lm_head.weight" not in keys  # tied weight stored once
    config = json.loads((model_dir / "config.json").read_text())
    assert config["tokenizer_sha256"] == bpe.load(model_dir).sha256
    assert config["step"] == 4 == json.loads((model_dir / "trainer.json").read_text())["step"]
    record = json.loads((model_dir / "logs" / "train.jsonl").read_text().splitlines()[-1])
    assert {"step", "train_loss", "val_loss", "val_ppl", "val_bpb", "tokens_per_s"} <= set(record)
    assert not [p for p in model_dir.iterdir() if p.name.startswith(".")]


def test_cli_trains_and_refuses_to_overwrite(model_dir: Path, corpus_file: Path) -> None:
    args = ["train", str(corpus_file), "--model-dir", str(model_dir), "--steps", "4", "--eval-every", "2", *SHAPE]
    r = gptport(*args)
    assert r.returncode == 0, r.stderr
    assert "bpb" in r.stderr and (model_dir / "model.safetensors").exists()
    assert_one_line_error(gptport(*args), 1, "already holds a trained model", "--resume")
    r = gptport(*args[:5], "6", *args[6:], "--resume")
    assert r.returncode == 0, r.stderr
    assert json.loads((model_dir / "config.json").read_text())["step"] == 6


def test_llama_tiny_trains_on_the_cpu(model_dir: Path, corpus_file: Path) -> None:
    """The llama-tiny preset (RMSNorm, SwiGLU, RoPE, 2 kv heads for 4, untied) trains in the same loop, its
    --set choices recorded in config.json; the loss falls and the cache it gives has n_kv_head heads."""
    from gptport.training.checkpoint import load_model

    args = ["train", str(corpus_file), "--model-dir", str(model_dir), "--preset", "llama-tiny", "--steps", "12",
            "--eval-every", "6", "--lr", "1e-2", "--set", "n_ctx=32", "--set", "d_model=32", "--set", "n_layer=2",
            "--set", "warmup_steps=2", "--set", "eval_batches=2", "--set", "qk_norm=true", "--set", "rope_theta=5e5",
            "--batch-size", "8", "--device", "cpu"]
    r = gptport(*args)
    assert r.returncode == 0, r.stderr
    assert ("vocab 512, rope positions, RMSNorm, SwiGLU, 2 key/value heads for 4 query heads, q/k norm, "
            "untied head)") in r.stderr  # the Model: line says the choices
    saved = json.loads((model_dir / "config.json").read_text())
    assert saved["format_version"] == 3
    assert {k: saved["model"][k] for k in ("norm", "mlp", "pos_encoding", "n_head", "n_kv_head", "head_dim",
                                            "tie_embeddings", "qk_norm", "rope_theta")} == {
        "norm": "rmsnorm", "mlp": "swiglu", "pos_encoding": "rope", "n_head": 4, "n_kv_head": 2, "head_dim": 8,
        "tie_embeddings": False, "qk_norm": True, "rope_theta": 500000.0}
    record = losses(model_dir)
    assert record[-1][2] < record[0][2] and all(math.isfinite(x) for row in record for x in row[1:])
    model, _ = load_model(model_dir, bpe.load(model_dir))
    with torch.no_grad():
        _, present = model(torch.tensor([[1, 2, 3]]))
    assert present[0][0].shape == (1, 2, 3, 8)  # (B, Hkv, T, hd)


def test_cli_bad_inputs(tmp_path: Path, model_dir: Path, corpus_file: Path) -> None:
    base = ["--steps", "2", *SHAPE]
    empty_dir = tmp_path / "no_tokenizer"
    empty_dir.mkdir()
    assert_one_line_error(gptport("train", str(corpus_file), "--model-dir", str(empty_dir), *base), 1,
                           "no tokenizer.json")
    short = tmp_path / "short.txt"
    short.write_text("too short\n")
    assert_one_line_error(gptport("train", str(short), "--model-dir", str(model_dir), *base), 1, "corpus too short")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"caf\xe9\n")
    assert_one_line_error(gptport("train", str(latin1), "--model-dir", str(model_dir), *base), 1,
                           "latin1.txt", "byte offset 3")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert_one_line_error(gptport("train", str(empty), "--model-dir", str(model_dir), *base), 1, "empty corpus")
    assert_one_line_error(gptport("train", str(corpus_file), "--model-dir", str(model_dir), *base,
                                   "--preset", "huge"), 2, "--preset 'huge'")
    assert_one_line_error(gptport("train", str(corpus_file), "--model-dir", str(model_dir), *base,
                                   "--set", "d_model=33"), 2, "divisible")
    assert not (model_dir / "model.safetensors").exists()


def start_until_eval(args: list[str], step: int, new_session: bool = False) -> subprocess.Popen[str]:
    """Start a training command and return once it has printed the eval of `step` or a later one."""
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            start_new_session=new_session)
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("step") and int(line.split()[1]) >= step:
            break
    return proc


@pytest.mark.slow
def test_ctrl_c_saves_and_kill_loses_at_most_one_interval(model_dir: Path, corpus_file: Path) -> None:
    args = [sys.executable, "-m", "gptport.cli.main", "train", str(corpus_file), "--model-dir", str(model_dir),
            "--steps", "100000", "--eval-every", "5", *SHAPE]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = start_until_eval(args, 10)
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=60)
    assert proc.returncode == 0, rest
    assert "interrupted" in rest and "Traceback" not in rest
    step = json.loads((model_dir / "trainer.json").read_text())["step"]
    assert step >= 10 and json.loads((model_dir / "config.json").read_text())["step"] == step

    proc = subprocess.Popen([*args, "--resume"], stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 60
    while read_resume_state(model_dir)["step"] < step + 10 and time.time() < deadline:
        time.sleep(0.05)
    proc.kill()  # SIGKILL: no chance to save
    proc.wait()
    saved = read_resume_state(model_dir)["step"]  # the authoritative resume point, whenever the kill came
    assert saved >= step + 10 and saved % 5 == 0
    r = gptport("train", str(corpus_file), "--model-dir", str(model_dir), "--steps", str(saved + 5),
                "--eval-every", "5", *SHAPE, "--resume")
    assert r.returncode == 0, r.stderr
    assert read_resume_state(model_dir)["step"] == saved + 5
