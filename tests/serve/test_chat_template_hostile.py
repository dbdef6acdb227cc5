"""A model's chat template is a stranger's code: one that loops for hours, recurses, allocates gigabytes or renders
megabytes is stopped by the render's bounds (serve/template_worker.py: a child process with a time limit, a capped
address space and an output limit) and the request refused with a 400 naming 'messages' and the bound; the same
renderer then renders a normal conversation, and a real server keeps serving."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gptport.serve.api_error import ApiError
from gptport.serve.chat import renderer
from gptport.serve.template_worker import MAX_OUTPUT, TIMEOUT_S
from gptport.tokenizer import HF_CONFIG_FILE
from tests.support.serving import Served, assert_error, serve, wait_idle

GUARD = "{% if messages[0]['content'] == 'attack' %}"  # the hostile part runs for one message only
ECHO = "{% else %}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}<|assistant|>{% endif %}"
ANY = ("MiB", "took longer than", "characters")  # which bound a memory bomb meets first depends on the machine
# each hostile template and the bounds that may stop it
HOSTILE = {
    "nested loops": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                     (f"took longer than {TIMEOUT_S:g} s",)),
    "recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", ("recursion limit",)),
    "a string times 10**10": ("{{ 'x' * 10**10 }}", ANY),
    "a string doubled in a loop": ("{% set ns = namespace(s='x') %}{% for i in range(64) %}"
                                   "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}", ANY),
    "a filter's width": ("{{ 'x'|center(10**10) }}", ANY),
    "a format's width": ("{{ '{:>99999999}'.format(1) }}", (f"passed {MAX_OUTPUT:,} characters",)),
    "megabytes of output": ("{% for i in range(100000) %}{{ range(1000)|join }}{% endfor %}",
                            (f"passed {MAX_OUTPUT:,} characters",)),
}
NORMAL = [{"role": "user", "content": "hi"}]
ATTACK = [{"role": "user", "content": "attack"}]


def template_dir(tmp_path: Path, hostile: str) -> Path:
    (tmp_path / HF_CONFIG_FILE).write_text(json.dumps({"chat_template": GUARD + hostile + ECHO}), encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_template_is_stopped_and_the_next_render_works(case: str, tmp_path: Path) -> None:
    hostile, bounds = HOSTILE[case]
    render, _ = renderer(template_dir(tmp_path, hostile))
    t0 = time.monotonic()
    with pytest.raises(ApiError) as e:
        render(ATTACK, None)
    assert time.monotonic() - t0 < 60  # loose: a hang fails, a slow machine does not
    assert (e.value.status, e.value.param, e.value.code) == (400, "messages", "template_error")
    assert "the chat template was stopped" in e.value.message, e.value.message
    assert any(bound in e.value.message for bound in bounds), e.value.message
    assert render(NORMAL, None)[0] == "<|user|>hi\n<|assistant|>"


def test_a_template_that_refuses_is_still_its_own_words(tmp_path: Path) -> None:
    render, _ = renderer(template_dir(tmp_path, "{{ raise_exception('no attacks') }}"))
    with pytest.raises(ApiError) as e:
        render(ATTACK, None)
    assert e.value.message == "'messages': the chat template refused them (no attacks)"


@pytest.fixture(scope="module")
def server(trained_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    model = tmp_path_factory.mktemp("hostile_template") / "m"
    shutil.copytree(trained_dir, model)
    config = json.loads((model / HF_CONFIG_FILE).read_text(encoding="utf-8"))
    config["chat_template"] = GUARD + HOSTILE["nested loops"][0] + ECHO
    (model / HF_CONFIG_FILE).write_text(json.dumps(config), encoding="utf-8")
    with serve(model, model.parent / "serve.log", "--slots", "2") as s:
        yield s


def test_the_server_refuses_the_render_and_keeps_serving(server: Served) -> None:
    err = assert_error(*server.post("/v1/chat/completions", {"messages": ATTACK, "max_tokens": 2}), 400, "messages")
    assert f"took longer than {TIMEOUT_S:g} s" in err["message"], err
    status, body = server.post("/v1/chat/completions", {"messages": NORMAL, "max_tokens": 2})
    assert status == 200, body
    assert server.post("/v1/completions", {"prompt": "ka", "max_tokens": 2})[0] == 200
    wait_idle(server, 10)
    assert server.proc.poll() is None
