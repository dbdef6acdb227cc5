"""lm-evaluation-harness (lm-eval[api], the released package in the clients' venv) runs tasks of gptport's
own (tests/interop/lm_eval_*.yaml: a multiple-choice task and a generation task with six stop sequences, on
tiny local JSONL files beside them, no hub) against a real `gptport serve`, through `python -m lm_eval` unmodified, as
local-completions (its tokenizer read from the server: GET /tokenizer_info, POST /tokenize) and as
local-chat-completions. The loglikelihoods it logs are gptport's own: `gptport eval --json --tokens` of the
same text gives the same sum over each choice's tokens, within 1e-4; its generations are `gptport
generate`'s greedy text cut at the first stop."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gptport import tokenizer as bpe
from gptport.tokenizer import EOT
from tests.interop.clients_venv import client_env, clients_python, needs_clients
from tests.support.cli import gptport
from tests.support.serving import N_CTX, Served, cli_generate, serve

KEY, NAME = "k", "tiny"
HERE = Path(__file__).parent
TASK_FILES = [HERE / f"lm_eval_{task}.{ext}" for task in ("mc", "gen") for ext in ("yaml", "jsonl")]
GEN = yaml.safe_load((HERE / "lm_eval_gen.yaml").read_text(encoding="utf-8"))["generation_kwargs"]
pytestmark = needs_clients


@pytest.fixture(scope="module")
def python() -> Path:
    return clients_python()


@pytest.fixture(scope="module")
def server(python: Path, trained_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve(trained_dir, tmp_path_factory.mktemp("lm_eval") / "serve.log", "--slots", "2", "--api-key", KEY,
               "--served-model-name", NAME) as s:
        yield s


def lm_eval(python: Path, work: Path, model: str, model_args: str, tasks: str, *extra: str
            ) -> tuple[dict[str, list[dict[str, Any]]], str]:
    """`python -m lm_eval` in the clients' venv, from a folder of copies of the task files (their data paths are
    relative); each task's logged samples (--log_samples), and lm-eval's log."""
    (work / "tasks").mkdir()
    for path in TASK_FILES:
        shutil.copy(path, work / "tasks" / path.name)
    out = work / "out"
    r = subprocess.run([str(python), "-m", "lm_eval", "--model", model, "--model_args", model_args,
                        "--tasks", tasks, "--include_path", ".", "--output_path", str(out), "--log_samples", *extra],
                       cwd=work / "tasks", env=client_env(work, KEY), capture_output=True, text=True, timeout=600,
                       check=False)
    assert r.returncode == 0, f"lm_eval exited {r.returncode}:\n{r.stderr[-6000:]}"
    samples = {}
    for path in out.glob("*/samples_*.jsonl"):
        task = path.name.removeprefix("samples_").rsplit("_", 1)[0]
        samples[task] = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    return samples, r.stderr


def eval_logprobs(model_dir: Path, text: str, work: Path) -> list[float]:
    """`gptport eval --json --tokens` of `text`: each token's log-probability after <|endoftext|>."""
    path = work / "text.txt"
    path.write_text(text, encoding="utf-8")
    r = gptport("eval", str(model_dir), str(path), "--json", "--tokens")
    assert r.returncode == 0, r.stderr
    return [t["logprob"] for t in json.loads(r.stdout)["token_logprobs"]]


def cut(text: str, stops: list[str]) -> str:
    """`text` up to the first occurrence of any of `stops`."""
    return text[:min([text.find(s) for s in stops if s in text] or [len(text)])]


def test_local_completions_logprobs_are_gptports_own(python: Path, server: Served, trained_dir: Path,
                                                     tmp_path: Path) -> None:
    args = f"base_url={server.url}/v1/completions,model={NAME},max_length={N_CTX},auth_token={KEY}"
    samples, log = lm_eval(python, tmp_path, "local-completions", args, "gptport_mc,gptport_gen")
    assert "Using tokenizer remote" in log, "lm-eval did not take the server's tokenizer"
    tok = bpe.load(trained_dir)
    checked = 0
    for sample in samples["gptport_mc"]:
        for i, choice in enumerate(sample["arguments"].values()):
            context, continuation = choice["arg_0"], choice["arg_1"]
            assert context.startswith(EOT)
            text = context.removeprefix(EOT) + continuation
            n = len(tok.encode(context + continuation)) - len(tok.encode(context))  # lm-eval's split of the tokens
            want = sum(eval_logprobs(trained_dir, text, tmp_path)[-n:])
            got = float(sample["resps"][i][0][0])
            assert abs(got - want) < 1e-4, (text, n, got, want)
            checked += 1
    assert checked == 8  # 3 questions of 3, 3 and 2 choices
    stops = [*GEN["until"], EOT]  # lm-eval adds the end-of-text string it read from /tokenizer_info
    assert len(stops) > 4
    for sample in samples["gptport_gen"]:
        prompt = sample["doc"]["prompt"]
        want = cut(cli_generate(trained_dir, prompt, GEN["max_gen_toks"]), stops)
        assert sample["resps"][0][0] == want, prompt


def test_local_chat_completions_generates(python: Path, server: Served, tmp_path: Path) -> None:
    args = f"base_url={server.url}/v1/chat/completions,model={NAME}"
    samples, _ = lm_eval(python, tmp_path, "local-chat-completions", args, "gptport_gen", "--apply_chat_template")
    assert len(samples["gptport_gen"]) == 2
    for sample in samples["gptport_gen"]:
        # lm-eval's chat model sends OpenAI's four stops (its `stop[:4]`) and cuts nothing itself
        body = {"model": NAME, "messages": [{"role": "user", "content": sample["doc"]["prompt"]}],
                "max_tokens": GEN["max_gen_toks"], "temperature": 0, "stop": GEN["until"][:4]}
        status, out = server.post("/v1/chat/completions", body, {"Authorization": f"Bearer {KEY}"})
        assert status == 200, out
        assert sample["resps"][0][0] == out["choices"][0]["message"]["content"]
