"""Prefix caching over HTTP: a real `gptport serve` reuses a finished request's cache for a prompt that
starts the same way, says so in OpenAI's usage.prompt_tokens_details.cached_tokens and in /metrics, gives
the text it gives without reuse, and `--no-prefix-cache` turns it off."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from tests.support.serving import cli_generate, serve

HEAD = "to be or not to be that is the question whether tis nobler in the mind"


@pytest.mark.parametrize("flag", ["", "--no-prefix-cache"])
def test_a_shared_prefix_is_prefilled_once(trained_dir: Path, tmp_path: Path, flag: str) -> None:
    args = ["--slots", "3", *([flag] if flag else [])]
    with serve(trained_dir, tmp_path / "serve.log", *args) as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="x", max_retries=0, timeout=60)
        model = client.models.list().data[0].id
        first = client.completions.create(model=model, prompt=HEAD, max_tokens=4, temperature=0)
        assert first.usage.prompt_tokens_details.cached_tokens == 0
        texts, cached = [], []
        for tail in (" to suffer", " or to take arms"):
            r = client.completions.create(model=model, prompt=HEAD + tail, max_tokens=6, temperature=0)
            texts.append(r.choices[0].text)
            cached.append(r.usage.prompt_tokens_details.cached_tokens)
            assert 0 <= cached[-1] < r.usage.prompt_tokens
        counted = s.metric("gptport_prompt_tokens_cached_total")
        chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": HEAD}],
                                              max_tokens=3, temperature=0, n=3)  # prefilled once, copied twice
        copied = s.metric("gptport_prompt_tokens_cached_total") - counted
        copied -= chat.usage.prompt_tokens_details.cached_tokens
        assert len({c.message.content for c in chat.choices}) == 1
        log = (tmp_path / "serve.log").read_text()
    assert texts == [cli_generate(trained_dir, HEAD + tail, 6) for tail in (" to suffer", " or to take arms")]
    assert "MiB, resident)" in log  # a small cache is faulted in when the slots are made
    if flag:
        assert cached == [0, 0] and counted == 0 and copied == 0
        assert "prefix cache off (--no-prefix-cache)" in log
    else:
        assert min(cached) >= len(HEAD.split()) and counted >= sum(cached)  # the words' tokens at least
        assert copied == 2 * chat.usage.prompt_tokens
        assert "prefix cache on" in log
