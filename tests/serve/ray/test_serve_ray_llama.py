"""`gptport serve --ray` runs an imported Llama-family model: one replica on a local Ray cluster (loopback only)
answers a chat through the model's own template with transformers' greedy tokens, and Ctrl-C stops it."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.support.cli import gptport
from tests.support.hf_models import build, greedy
from tests.support.ray_cluster import needs_ray, ray_env
from tests.support.serving import Served, free_port, stop

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")

MESSAGES = [{"role": "user", "content": "ka to ri men sol?"}]


@needs_ray
@pytest.mark.slow
def test_a_llama_model_answers_a_chat_on_ray_serve(tmp_path: Path, tokenizer_dir: Path, corpus_file: Path) -> None:
    hf = build("qwen2", "chatml", tmp_path / "hf", tokenizer_dir, corpus_file)
    out = tmp_path / "m"
    for args in (("import-hf", str(hf.path), "--out", str(out)), ("export", str(out))):
        r = gptport(*args)
        assert r.returncode == 0, r.stderr
    text = hf.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    prompt = list(hf.tokenizer(text, add_special_tokens=False)["input_ids"])
    want = greedy(hf.model, prompt, 12)
    (tmp_path / "home").mkdir()
    ray_tmp = tempfile.mkdtemp(prefix="gptport-ray-")  # short: Ray's unix sockets live under it
    port, log = free_port(), tmp_path / "serve.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "gptport.cli.main", "serve", str(out), "--ray", "--replicas",
                                 "1", "--threads", "1", "--port", str(port)], stdout=sink, stderr=subprocess.STDOUT,
                                env=ray_env(tmp_path / "home", ray_tmp), start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not re.search(r"Ray cluster (\S+)", log.read_text(errors="replace")):
            assert proc.poll() is None, f"gptport serve --ray exited with {proc.returncode}: {log.read_text()}"
            assert time.monotonic() < deadline, f"gptport serve --ray did not come up: {log.read_text()}"
            time.sleep(0.2)
        served = Served(proc, f"http://127.0.0.1:{port}", log)
        status, reply = served.post("/v1/chat/completions", {"model": "m", "messages": MESSAGES, "max_tokens": 12,
                                                              "temperature": 0})
        assert status == 200, reply
        ends = {hf.stop_id, hf.tokenizer.eos_token_id}
        kept = want[:next((j for j, t in enumerate(want) if t in ends), len(want))]
        assert reply["choices"][0]["message"]["content"] == hf.tokenizer.decode(kept)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=90) == 0, log.read_text()
    finally:
        stop(proc, signal.SIGINT, 60, lambda: os.killpg(proc.pid, signal.SIGKILL))
        shutil.rmtree(ray_tmp, ignore_errors=True)
