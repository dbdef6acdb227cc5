"""Training on torchrun: real ranks (2, Gloo on the CPU, rendezvous on 127.0.0.1 at a port the OS
picks), the tiny preset at a small shape, a handful of steps. Equivalence with one process, exact
resume, rank 0 alone writing, the validation all-reduce, stopping, a killed rank, bad input."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from gptport.config import TrainConfig
from gptport.errors import UsageError
from gptport.training import distributed
from gptport.training import shards as data
from gptport.training.checkpoint import read_resume_state
from tests.support.cli import assert_one_line_error, gptport
from tests.training.test_train import SHAPE, losses, start_until_eval

pytestmark = pytest.mark.skipif(not torch.distributed.is_gloo_available(), reason="torch built without Gloo")
TIMEOUT = 240  # seconds for one torchrun run: bounded, far above the ~10 s one takes
# Writes are logged per rank by an audit hook that every rank's interpreter loads (sitecustomize).
AUDIT_HOOK = '''
import os, sys
_watch, _log = os.environ.get("GPTPORT_TEST_WATCH"), os.environ.get("GPTPORT_TEST_WRITES")
def _hook(event, args):
    if event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            mode is None and isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR))
        paths = [path] if writing else []
    elif event in ("os.rename", "os.remove", "os.mkdir"):
        paths = [args[0]]
    else:
        return
    for p in paths:
        if isinstance(p, (str, os.PathLike)) and os.fspath(p).startswith(_watch):
            with open(_log + "." + os.environ.get("RANK", "-"), "a") as f:
                f.write(event + " " + os.fspath(p) + "\\n")
if _watch and _log and os.environ.get("RANK") is not None:
    sys.addaudithook(_hook)
'''


def run_ranks(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`gptport train … --nproc-per-node 2`: torchrun's launcher starts the ranks."""
    full = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    full.pop("GPTPORT_DEBUG", None)
    cmd = [sys.executable, "-m", "gptport.cli.main", "train", *args, "--nproc-per-node", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=full, timeout=TIMEOUT, check=False)
    if SIGABRT_AT_START in r.stderr and "step " not in r.stderr:
        # A known intermittent fault, not yet fixed: on a loaded machine a rank now and then
        # dies by SIGABRT before its first step, printing nothing (2 of ~50 runs here, none outside pytest).
        # Such a run did no work, so it is run once more, saying so; any other failure stands.
        print(f"run_ranks: a rank aborted at start; running once more\n{r.stderr}", file=sys.stderr)
        r = subprocess.run(cmd, capture_output=True, text=True, env=full, timeout=TIMEOUT, check=False)
    return r


SIGABRT_AT_START = "failed first (killed by SIGABRT)"


def weights(d: Path) -> dict[str, torch.Tensor]:
    return load_file(str(d / "model.safetensors"))


def max_delta(a: Path, b: Path) -> float:
    wa, wb = weights(a), weights(b)
    assert set(wa) == set(wb)
    return max(float((wa[k] - wb[k]).abs().max()) for k in wa)


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path
            ) -> tuple[Path, Path, Path, subprocess.CompletedProcess[str]]:
    """2 ranks × batch 4 × accum 1 and 1 process × batch 4 × accum 2, 6 steps each, same seed;
    the 2-rank run's writes are logged per rank. Returns (ranks dir, single dir, writes log, result)."""
    root = tmp_path_factory.mktemp("ddp")
    ranks, single = root / "ranks", root / "single"
    for d in (ranks, single):
        shutil.copytree(tokenizer_dir, d)
    hook_dir = root / "hook"
    hook_dir.mkdir()
    (hook_dir / "sitecustomize.py").write_text(AUDIT_HOOK)
    writes = root / "writes"
    common = [str(corpus_file), "--steps", "6", "--eval-every", "3", "--lr", "1e-2", "--set", "warmup_steps=2",
              *SHAPE]
    env = {"PYTHONPATH": os.pathsep.join([str(hook_dir), os.environ.get("PYTHONPATH", "")]),
           "GPTPORT_TEST_WATCH": str(ranks), "GPTPORT_TEST_WRITES": str(writes)}
    r = run_ranks(*common, "--model-dir", str(ranks), env=env)
    assert r.returncode == 0, r.stderr
    s = gptport("train", *common, "--model-dir", str(single), "--grad-accum", "2")
    assert s.returncode == 0, s.stderr
    return ranks, single, writes, r


def test_two_ranks_end_with_the_weights_of_one_process_with_grad_accum_2(ddp_run: tuple) -> None:
    ranks, single, _, r = ddp_run
    assert "backend gloo" in r.stderr and "global batch 4 × 1 × 2 = 8" in r.stderr
    assert max_delta(ranks, single) <= 1e-5
    # training moved the weights: a wrong data order or gradient scale could not pass for lack of it
    assert losses(single)[0][2] - losses(single)[-1][2] > 0.05
    assert read_resume_state(ranks)["world_size"] == 2


def test_llama_tiny_on_two_ranks_ends_with_the_weights_of_one_process(tmp_path: Path, tokenizer_dir: Path,
                                                                      corpus_file: Path) -> None:
    """The llama-tiny preset (RoPE, RMSNorm, SwiGLU, 4 query heads over 2 key/value heads, untied head) under
    torchrun: its gradients all-reduced like a GPT's, config.json records the choices."""
    ranks, single = tmp_path / "ranks", tmp_path / "single"
    for d in (ranks, single):
        shutil.copytree(tokenizer_dir, d)
    common = [str(corpus_file), "--preset", "llama-tiny", "--steps", "4", "--eval-every", "2", "--lr", "1e-2",
              "--set", "warmup_steps=1", *SHAPE, "--set", "n_head=4"]
    r = run_ranks(*common, "--model-dir", str(ranks))
    assert r.returncode == 0, r.stderr
    assert "global batch 4 × 1 × 2 = 8" in r.stderr
    s = gptport("train", *common, "--model-dir", str(single), "--grad-accum", "2")
    assert s.returncode == 0, s.stderr
    assert max_delta(ranks, single) <= 1e-5
    assert abs(losses(ranks)[-1][2] - losses(single)[-1][2]) <= 1e-5
    model = json.loads((ranks / "config.json").read_text())["model"]
    assert (model["pos_encoding"], model["norm"], model["mlp"], model["n_head"], model["n_kv_head"],
            model["tie_embeddings"]) == ("rope", "rmsnorm", "swiglu", 4, 2, False)
    assert losses(single)[0][2] - losses(single)[-1][2] > 0.01  # training moved the weights


def test_validation_and_training_loss_are_the_single_process_figures(ddp_run: tuple) -> None:
    ranks, single, _, _ = ddp_run
    (a_step, a_train, a_val), (b_step, b_train, b_val) = losses(ranks)[-1], losses(single)[-1]
    assert a_step == b_step == 6
    # each rank evaluates half of the windows; without the all-reduce the figure is one half's
    assert abs(a_val - b_val) <= 1e-5 and abs(a_train - b_train) <= 1e-5


def test_rank_zero_alone_writes_and_reports(ddp_run: tuple) -> None:
    ranks, _, writes, r = ddp_run
    rank0 = Path(str(writes) + ".0").read_text()
    assert "model.safetensors" in rank0 and "optimizer.safetensors" in rank0 and "train.jsonl" in rank0
    assert "train.bin" in rank0  # rank 0 tokenized
    assert not Path(str(writes) + ".1").exists(), Path(str(writes) + ".1").read_text()
    assert len(losses(ranks)) == 2  # one line per eval, not one per rank
    assert sum(line.startswith("step ") for line in r.stderr.splitlines()) == 2
    assert r.stderr.count("Data: wrote shards") == 1 and r.stderr.count("done: step 6") == 1


def test_two_rank_resume_continues_exactly(tmp_path: Path, tokenizer_dir: Path, corpus_file: Path) -> None:
    """Stopped at step 4 and resumed on 2 ranks, the run ends where an unbroken one does. Dropout is on,
    so rank 1's own RNG state must come back too."""
    straight, split = tmp_path / "straight", tmp_path / "split"
    for d in (straight, split):
        shutil.copytree(tokenizer_dir, d)
    common = [str(corpus_file), "--eval-every", "2", "--set", "dropout=0.1", "--lr", "1e-2",
              "--set", "warmup_steps=2", *SHAPE]
    assert (r := run_ranks(*common, "--model-dir", str(straight), "--steps", "8")).returncode == 0, r.stderr
    r = run_ranks(*common, "--model-dir", str(split), "--steps", "4", "--schedule-steps", "8")
    assert r.returncode == 0, r.stderr
    with safe_open(str(split / "optimizer.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert {"rng.torch", "rng.torch.1"} <= keys
    r = run_ranks(*common, "--model-dir", str(split), "--steps", "8", "--schedule-steps", "8", "--resume")
    assert r.returncode == 0, r.stderr
    a, b = weights(straight), weights(split)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert losses(straight)[-1] == losses(split)[-1]


def test_resume_on_another_world_size_is_refused_or_restarts_the_data(ddp_run: tuple, tmp_path: Path,
                                                                     corpus_file: Path) -> None:
    ranks, _, _, _ = ddp_run
    d = tmp_path / "m"
    shutil.copytree(ranks, d)
    args = ["train", str(corpus_file), "--model-dir", str(d), "--steps", "8", "--eval-every", "2", *SHAPE,
            "--resume"]
    assert_one_line_error(gptport(*args), 2, "on 1 rank(s)", "trained on 2", "--allow-world-size-change")
    before = read_resume_state(d)
    r = gptport(*args, "--allow-world-size-change")
    assert r.returncode == 0, r.stderr
    after = read_resume_state(d)
    assert after["step"] == 8 and after.get("world_size", 1) == 1
    assert after["param_groups"][0]["lr"] != before["param_groups"][0]["lr"]  # the schedule went on


def test_data_order_depends_on_world_times_accum_only() -> None:
    tokens = np.arange(10_000, dtype=np.uint16)

    def step(world: int, accum: int) -> list[np.ndarray]:
        rngs = [np.random.default_rng(7) for _ in range(world)]
        out: list[np.ndarray] = []
        for rank, rng in enumerate(rngs):
            batches = data.step_batches(tokens, 16, 4, rng, world * accum, range(rank * accum, (rank + 1) * accum))
            assert len(batches) == accum
            out += [x for x, _ in batches]
        assert len({json.dumps(r.bit_generator.state) for r in rngs}) == 1  # generators stay equal
        return out

    one, two, four = step(1, 4), step(2, 2), step(4, 1)
    for a, b, c in zip(one, two, four, strict=True):
        assert np.array_equal(a, b) and np.array_equal(a, c)
    assert not np.array_equal(one[0], one[1])  # each rank reads a different part
    rng = np.random.default_rng(7)  # one process draws as sample_batch always did
    assert np.array_equal(one[0], data.sample_batch(tokens, 16, 4, rng)[0])


def test_global_batch_and_world_size_checks() -> None:
    tcfg = TrainConfig(batch_size=4, global_batch=16)
    assert distributed.resolve_accum(tcfg, 2).grad_accum == 2
    assert distributed.resolve_accum(tcfg, 4).grad_accum == 1
    with pytest.raises(UsageError, match=r"--global-batch 16 is not a multiple of --batch-size 4 × world size 3"):
        distributed.resolve_accum(tcfg, 3)
    distributed.check_world(2, 2, False, "m")
    distributed.check_world(2, 3, True, "m")
    with pytest.raises(UsageError, match="on 3 rank.*trained on 2"):
        distributed.check_world(2, 3, False, "m")
    argv = distributed.torchrun_argv(2, ["train", "c.txt", "--nproc-per-node", "2", "--nproc-per-node=3", "-x"])
    assert argv[-5:] == ["-m", "gptport", "train", "c.txt", "-x"] and "127.0.0.1:0" in argv


def test_cli_global_batch_errors(tmp_path: Path, tokenizer_dir: Path, corpus_file: Path) -> None:
    d = tmp_path / "m"
    shutil.copytree(tokenizer_dir, d)
    base = ["train", str(corpus_file), "--model-dir", str(d), "--steps", "2", *SHAPE]
    assert_one_line_error(gptport(*base, "--global-batch", "6"), 2, "--global-batch 6", "world size 1")
    assert_one_line_error(gptport(*base, "--global-batch", "8", "--grad-accum", "2"), 2, "not both")
    assert_one_line_error(gptport(*base, "--nproc-per-node", "0"), 2, "--nproc-per-node must be at least 1")


@pytest.mark.slow
def test_bad_input_on_ranks_is_one_line_naming_the_rank(tmp_path: Path, tokenizer_dir: Path,
                                                        corpus_file: Path) -> None:
    """A world size that --global-batch does not divide; a rank whose machine lacks the model directory
    (each rank runs in a directory of its own, as on two machines)."""
    d = tmp_path / "m"
    shutil.copytree(tokenizer_dir, d)
    r = run_ranks(str(corpus_file), "--model-dir", str(d), "--steps", "2", *SHAPE, "--global-batch", "12")
    assert r.returncode == 2, r.stderr
    # every rank finds it; whichever fails first, torchrun stops the other, perhaps before it prints
    assert re.search(r"^gptport: error: rank [01] of 2: --global-batch 12 is not a multiple of --batch-size 4 × "
                     r"world size 2", r.stderr, re.M), r.stderr
    assert "[rank0]" not in r.stderr and "[rank1]" not in r.stderr  # no worker traceback
    assert r.stderr.strip().splitlines()[-1].startswith("gptport: error: rank ")
    for rank in (0, 1):
        (tmp_path / f"host{rank}").mkdir()
    shutil.copytree(tokenizer_dir, tmp_path / "host0" / "m")
    script = tmp_path / "rank.sh"
    script.write_text(f'cd "{tmp_path}/host$LOCAL_RANK" && exec "{sys.executable}" -m gptport train '
                      f'"{corpus_file}" --model-dir m --steps 2 {" ".join(SHAPE)}\n')
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--no-python", "sh", str(script)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert r.returncode != 0
    line = next(x for x in r.stderr.splitlines() if x.startswith("gptport: error:"))
    assert line.startswith("gptport: error: rank 1 of 2: ") and "no tokenizer.json" in line, r.stderr
    assert "rank      : 1" in r.stderr  # torchrun's summary names it as well


def _rank_pid(launcher: int, rank: int, deadline: float) -> int:
    """The pid of a rank among torchrun's children (Linux /proc)."""
    while time.time() < deadline:
        children = Path(f"/proc/{launcher}/task/{launcher}/children").read_text().split()
        for pid in children:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if f"RANK={rank}".encode() in f.read().split(b"\0"):
                    return int(pid)
        time.sleep(0.1)
    raise AssertionError(f"rank {rank} not found")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the ranks through Linux /proc")
def test_sigterm_on_one_rank_stops_all_after_a_checkpoint_and_a_killed_rank_fails_the_run(
        tmp_path: Path, tokenizer_dir: Path, corpus_file: Path) -> None:
    d = tmp_path / "m"
    shutil.copytree(tokenizer_dir, d)
    args = [sys.executable, "-m", "gptport.cli.main", "train", str(corpus_file), "--model-dir", str(d),
            "--steps", "100000", "--eval-every", "5", *SHAPE, "--nproc-per-node", "2"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = start_until_eval(args, 10)
    os.kill(_rank_pid(proc.pid, 1, time.time() + 30), signal.SIGTERM)  # rank 1, not rank 0 or the launcher
    _, rest = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, rest
    assert "interrupted" in rest and "Traceback" not in rest
    step = json.loads((d / "trainer.json").read_text())["step"]
    assert step >= 10 and json.loads((d / "config.json").read_text())["step"] == step

    proc = subprocess.Popen([*args, "--resume"], stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + TIMEOUT
    while read_resume_state(d)["step"] < step + 10 and time.time() < deadline:
        time.sleep(0.05)
    os.kill(_rank_pid(proc.pid, 1, deadline), signal.SIGKILL)  # no chance to save
    t0 = time.time()
    _, rest = proc.communicate(timeout=TIMEOUT)
    assert time.time() - t0 < 60  # the others do not wait for their collectives' timeout
    assert proc.returncode == 1
    assert rest.strip().splitlines()[-1] == ("gptport: error: rank 1 of 2 failed first (killed by SIGKILL); "
                                             "torchrun stopped the others"), rest
    saved = read_resume_state(d)["step"]
    assert saved >= step + 10 and saved % 5 == 0
    r = run_ranks(str(corpus_file), "--model-dir", str(d), "--steps", str(saved + 5), "--eval-every", "5",
                  *SHAPE, "--resume")
    assert r.returncode == 0, r.stderr
    assert read_resume_state(d)["step"] == saved + 5


@pytest.mark.slow
def test_ctrl_c_in_a_terminal_stops_every_rank_after_one_checkpoint(tmp_path: Path, tokenizer_dir: Path,
                                                                    corpus_file: Path) -> None:
    """A terminal's Ctrl-C: SIGINT to the whole process group (the launcher and both ranks)."""
    model_dir = tmp_path / "m"
    shutil.copytree(tokenizer_dir, model_dir)
    args = [sys.executable, "-m", "gptport.cli.main", "train", str(corpus_file), "--model-dir", str(model_dir),
            "--steps", "100000", "--eval-every", "5", *SHAPE, "--nproc-per-node", "2"]
    proc = start_until_eval(args, 10, new_session=True)
    os.killpg(proc.pid, signal.SIGINT)
    _, rest = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 130, rest
    assert "interrupted: checkpoint saved at step" in rest and "[rank" not in rest
    assert rest.strip().splitlines()[-1].startswith("gptport: error: interrupted (SIGINT)")
    step = json.loads((model_dir / "trainer.json").read_text())["step"]
    assert step >= 10 and json.loads((model_dir / "config.json").read_text())["step"] == step
    assert read_resume_state(model_dir)["step"] == step


@pytest.mark.slow
def test_bf16_autocast_and_compile_run_under_ddp(tmp_path: Path, tokenizer_dir: Path, corpus_file: Path) -> None:
    """--compile and autocast=bf16 under DDP take effect, not only get recorded. Compiled: Dynamo compiled graphs
    in each rank (the trainer records its count per rank). bf16: the training loss, which comes from the compiled
    forward, is the eager bf16 run's (compiling moves it by float32 rounding at most: ~1e-7 here) and is off the
    fp32 run's (by ~3e-5 here, at this tiny model's near-uniform logits) far more than that."""
    def train(name: str, *extra: str) -> Path:
        d = tmp_path / name
        shutil.copytree(tokenizer_dir, d)
        r = run_ranks(str(corpus_file), "--model-dir", str(d), "--steps", "2", "--eval-every", "2", *SHAPE, *extra)
        assert r.returncode == 0, r.stderr
        assert len(losses(d)) == 1 and np.isfinite(losses(d)[0][1])
        return d

    both = train("bf16-compiled", "--set", "autocast=bf16", "--compile")
    state = read_resume_state(both)
    assert state["train"]["compile"] is True and state["train"]["autocast"] == "bf16"
    assert len(state["compiled_graphs"]) == 2 and min(state["compiled_graphs"]) >= 1, state["compiled_graphs"]
    train_loss = {name: losses(d)[0][1] for name, d in [("bf16-compiled", both),
                                                         ("bf16", train("bf16", "--set", "autocast=bf16")),
                                                         ("fp32", train("fp32", "--set", "autocast=fp32"))]}
    off_fp32 = abs(train_loss["bf16-compiled"] - train_loss["fp32"])
    off_bf16 = abs(train_loss["bf16-compiled"] - train_loss["bf16"])
    assert off_fp32 > 2e-6 and off_fp32 > 10 * off_bf16, train_loss
