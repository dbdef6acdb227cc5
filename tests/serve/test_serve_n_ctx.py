"""`gptport serve --n-ctx`: fewer positions a slot than the model's n_ctx (a smaller KV cache). The startup line
says it, a prompt longer than it is refused as OpenAI refuses one past the context, an answer stops at it, the
tokens are the ones `generate` gives; a value outside 2..n_ctx is refused in one line before anything loads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import openai
import pytest

from tests.support.serving import cli_generate, serve

N_CTX = 24  # the trained model's is 96
PROMPT = "to be or not to be"


@pytest.mark.parametrize(("value", "says"), [("1", "give at least 2 positions a slot"),
                                             ("97", "give 2 to the model's n_ctx, 96")])
def test_an_n_ctx_outside_the_model_is_refused_in_one_line(trained_dir: Path, value: str, says: str) -> None:
    r = subprocess.run([sys.executable, "-m", "gptport.cli.main", "serve", str(trained_dir), "--n-ctx", value],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"gptport: error: --n-ctx {value}: {says}"]


def test_slots_of_fewer_positions(trained_dir: Path, tmp_path: Path) -> None:
    with serve(trained_dir, tmp_path / "serve.log", "--n-ctx", str(N_CTX), "--slots", "2") as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=60)
        model = client.models.list().data[0].id
        short = client.completions.create(model=model, prompt=PROMPT, max_tokens=5, temperature=0)
        full = client.completions.create(model=model, prompt=PROMPT, max_tokens=200, temperature=0)
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model=model, prompt=" ".join([PROMPT] * 8), max_tokens=1)
        log = s.log.read_text()
    assert f"2 slots × n_ctx {N_CTX} (KV cache" in log
    assert short.choices[0].text == cli_generate(trained_dir, PROMPT, 5)
    assert full.choices[0].finish_reason == "length"
    # as at the model's own n_ctx: the last token comes from position n_ctx - 1's logits and is never cached
    assert full.usage.prompt_tokens + full.usage.completion_tokens == N_CTX + 1
    error = refused.value.body
    assert isinstance(error, dict) and error["code"] == "context_length_exceeded"
    assert f"longer than the model's context of {N_CTX} tokens" in error["message"]
