"""What clients other than OpenAI's send, against a real `gptport serve` (with an API key): many stop
sequences (lm-evaluation-harness sends 9 for HumanEval), up to 20 log-probability alternatives (OpenAI's
bound), vLLM's GET /tokenizer_info, several served model names (vLLM's --served-model-name)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gptport.errors import UsageError
from gptport.serve.api.shapes import MAX_STOP_BYTES, MAX_STOPS
from gptport.serve.api.tokenizer_info import tokenizer_info
from gptport.serve.names import served_names
from gptport.serve.settings import Settings
from tests.support.serving import Served, assert_error, events, serve, streamed_text

BASE = {"prompt": "ka to", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
KEY = {"Authorization": "Bearer k"}


@pytest.fixture(scope="module")
def server(trained_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve(trained_dir, tmp_path_factory.mktemp("compat") / "serve.log", "--slots", "2", "--api-key", "k",
               "--served-model-name", "gpt-a, gpt-b", "--served-model-name", "gpt-c") as s:
        yield s


def completion(server: Served, **body: Any) -> dict[str, Any]:
    status, out = server.post("/v1/completions", {**BASE, **body}, KEY)
    assert status == 200, out
    return out


def test_many_stop_sequences_cut_at_the_first_generated(server: Served) -> None:
    full = completion(server)["choices"][0]["text"]
    assert len(full) > 8
    humaneval = ["\nclass", "\ndef", "\n#", "\n@", "\nprint", "\nif", "\n```", "<file_sep>", full[5:8]]
    cut = full.index(full[5:8])
    r = completion(server, stop=humaneval)["choices"][0]
    assert (r["text"], r["finish_reason"]) == (full[:cut], "stop")
    assert streamed_text(events(server, "/v1/completions", {**BASE, "stop": humaneval}, KEY)) == full[:cut]
    many = [f"never{i}" for i in range(MAX_STOPS - 1)] + [full[5:8]]
    assert completion(server, stop=many)["choices"][0]["text"] == full[:cut]
    unseen = completion(server, stop=["#" * (MAX_STOP_BYTES // 2)] * 2)["choices"][0]  # exactly the byte bound
    assert (unseen["text"], unseen["finish_reason"]) == (full, "length")


def test_stop_bounds_are_400s_naming_stop(server: Served) -> None:
    for stop, words in ([str(i) for i in range(MAX_STOPS + 1)], f"at most {MAX_STOPS} stop sequences, not 257"), \
            (["é" * (MAX_STOP_BYTES // 2), "x"], f"at most {MAX_STOP_BYTES} bytes of stop sequences together"), \
            ("y" * (MAX_STOP_BYTES + 1), f"not {MAX_STOP_BYTES + 1}"):
        err = assert_error(*server.post("/v1/completions", {**BASE, "stop": stop}, KEY), 400, "stop")
        assert words in err["message"]
        assert_error(*server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "ka"}],
                                                           "stop": stop}, KEY), 400, "stop")


def test_twenty_log_probability_alternatives(server: Served) -> None:
    msgs = [{"role": "user", "content": "ka to"}]
    status, r = server.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "temperature": 0,
                                                     "logprobs": True, "top_logprobs": 20, "ignore_eos": True}, KEY)
    assert status == 200, r
    content = r["choices"][0]["logprobs"]["content"]
    assert len(content) == 4 and all(len(t["top_logprobs"]) == 20 for t in content)
    for t in content:
        values = [a["logprob"] for a in t["top_logprobs"]]
        assert values == sorted(values, reverse=True) and t["logprob"] >= values[-1]
    top = completion(server, max_tokens=4, logprobs=20)["choices"][0]["logprobs"]["top_logprobs"]
    assert len(top) == 4 and all(len(alts) == 20 or any("\ufffd" in a for a in alts) for alts in top)
    assert_error(*server.post("/v1/chat/completions", {"messages": msgs, "logprobs": True, "top_logprobs": 21}, KEY),
                 400, "top_logprobs")
    assert_error(*server.post("/v1/completions", {**BASE, "logprobs": 21}, KEY), 400, "logprobs")


def test_tokenizer_info(server: Served, trained_dir: Path) -> None:
    assert_error(*server.get("/tokenizer_info"), 401)
    status, info = server.get("/tokenizer_info", KEY)
    assert status == 200, info
    n_ctx = server.post("/tokenize", {"prompt": "ka"}, KEY)[1]["max_model_len"]
    assert info["model_max_length"] == n_ctx > 0
    eot = "<|endoftext|>"
    assert (info["tokenizer_class"], info["eos_token"], info["bos_token"]) == ("GPT2Tokenizer", eot, eot)
    assert info["pad_token"] is None and info["chat_template"] is None  # the plain template


def test_tokenizer_info_of_a_directory(tmp_path: Path) -> None:
    """A template and transformers' AddedToken form are read; a directory without a config gets the defaults."""
    assert tokenizer_info(tmp_path, 64) == {"tokenizer_class": "GPT2Tokenizer", "bos_token": None,
                                            "eos_token": "<|endoftext|>", "pad_token": None, "chat_template": None,
                                            "model_max_length": 64}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": "{{ messages[0].content }}",
        "eos_token": {"content": "</s>", "special": True}, "pad_token": "<pad>", "add_bos_token": False}))
    info = tokenizer_info(tmp_path, 128)
    assert info == {"tokenizer_class": "PreTrainedTokenizerFast", "chat_template": "{{ messages[0].content }}",
                    "eos_token": "</s>", "bos_token": None, "pad_token": "<pad>", "add_bos_token": False,
                    "model_max_length": 128}


def test_every_served_name_is_answered_and_echoed(server: Served) -> None:
    """/v1/models lists each name, the first first; a request's model is echoed in its response (the first name
    when it gives none); a name not served is the usual 404."""
    status, listed = server.get("/v1/models", KEY)
    assert status == 200 and [m["id"] for m in listed["data"]] == ["gpt-a", "gpt-b", "gpt-c"]
    for name in ("gpt-a", "gpt-c"):
        assert server.get(f"/v1/models/{name}", KEY)[1]["id"] == name
    assert completion(server, max_tokens=2)["model"] == "gpt-a"
    assert completion(server, max_tokens=2, model="gpt-b")["model"] == "gpt-b"
    chat = {"model": "gpt-c", "messages": [{"role": "user", "content": "ka"}], "max_tokens": 2}
    assert server.post("/v1/chat/completions", chat, KEY)[1]["model"] == "gpt-c"
    assert {c["model"] for c in events(server, "/v1/chat/completions", chat, KEY)[:-1]} == {"gpt-c"}
    assert server.post("/tokenize", {"model": "gpt-b", "prompt": "ka"}, KEY)[0] == 200
    err = assert_error(*server.post("/v1/completions", {**BASE, "model": "gpt-d"}, KEY), 404, "model")
    assert err["code"] == "model_not_found" and "'gpt-a' (also 'gpt-b', 'gpt-c')" in err["message"]
    assert_error(*server.get("/v1/models/gpt-d", KEY), 404, "model")


def test_served_names_are_checked(tmp_path: Path) -> None:
    assert served_names(None, "dir") == ("dir",)
    assert served_names(["a,b", " c "], "dir") == ("a", "b", "c")
    for values, words in ((["a,,b"], "name 2 is empty"), (["a", "b,a"], "'a' is given twice")):
        with pytest.raises(UsageError, match=words):
            served_names(values, "dir")
    from gptport.serve.ray.ray_app import settings_dict  # what a Ray replica is built from keeps the names

    travelled = settings_dict(Settings(tmp_path, model_name="a", aliases=("b", "c")))
    assert (travelled["model_name"], travelled["aliases"]) == ("a", ("b", "c"))
