"""A model's chat template is a stranger's code: one that loops for hours, recurses, allocates gigabytes or renders
megabytes is stopped by the render's bounds (serve/api/template_worker.py: a child process with a time limit, a capped
address space and an output limit) and the request refused with a 400 naming 'messages' and the bound; the same
renderer then renders a normal conversation, a long legitimate one is not refused, compiling a template computes
nothing, the child is reaped, and a real server answers 400 then keeps serving (design record 0043)."""

from __future__ import annotations

import gc
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gptport.serve.api.api_error import ApiError
from gptport.serve.api.chat_template import renderer
from gptport.serve.api.template_worker import MAX_MEMORY, MAX_OUTPUT, TIMEOUT_S, TemplateLimit, TemplateWorker
from gptport.tokenizer import HF_CONFIG_FILE
from tests.support.serving import Served, assert_error, serve, wait_idle

GUARD = "{% if messages[0]['content'] == 'attack' %}"  # the hostile part runs for one message only
ECHO = "{% else %}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}<|assistant|>{% endif %}"
TIME = f"took longer than {TIMEOUT_S:g} s"
MEMORY = f"more than {MAX_MEMORY // 2**20:,} MiB"
OUTPUT = f"passed {MAX_OUTPUT:,} characters"
RECURSION = "recursed past Python's limit"
BOMB = (MEMORY, OUTPUT, TIME)  # which bound a memory bomb meets first depends on the machine
HOSTILE = {  # each hostile template and the bounds that may stop it
    "nested loops": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", (TIME,)),
    "a list the loop doubles": ("{% set ns = namespace(l=[0]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}"
                                "{% endfor %}{{ ns.l|length }}", BOMB),
    "a macro calling itself": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", (RECURSION,)),
    "a recursive loop": ("{% for x in [1, 2] recursive %}{{ loop([x, x]) }}{% endfor %}", (RECURSION,)),
    "a macro's fan-out": ("{% macro f(n) %}{% if n < 60 %}{{ f(n + 1) }}{{ f(n + 1) }}{% endif %}{% endmacro %}"
                          "{{ f(0) }}", (TIME,)),
    "'x' * 10**9": ("{{ 'x' * 10**9 }}", BOMB),
    "~ doubling in a loop": ("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                             "{% endfor %}{{ ns.s|length }}", BOMB),
    "center(10**9)": ("{{ 'x'|center(10**9) }}", BOMB),
    "center(1000000000), a literal": ("{{ 'x'|center(1000000000) }}", BOMB),
    "ljust(10**9)": ("{{ 'x'.ljust(10**9) }}", BOMB),
    "a format's width": ("{{ '{:>999999999}'.format(1) }}", BOMB),
    "a %-format's width": ("{{ '%999999999s'|format(1) }}", BOMB),
    "indent(10**9)": ("{{ 'a\\nb'|indent(10**9) }}", BOMB),
    "tojson's indent": ("{{ [[[[1]]]]|tojson(indent=300000000) }}", BOMB),
    "replace, squaring": ("{% set ns = namespace(s='xx') %}{% for i in range(40) %}"
                          "{% set ns.s = ns.s|replace('x', ns.s) %}{% endfor %}{{ ns.s|length }}", BOMB),
    "range(100000)|join, ten times": ("{% for i in range(10) %}{{ range(100000)|join }}{% endfor %}", (OUTPUT,)),
    "10 ** (10 ** 10)": ("{{ 10 ** (10 ** 10) }}", (TIME,)),  # one C call: no Python-level check stops it
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
    assert render(NORMAL, None)[0] == "<|user|>hi\n<|assistant|>"
    t0 = time.monotonic()
    with pytest.raises(ApiError) as e:
        render(ATTACK, None)
    assert time.monotonic() - t0 < 10 * TIMEOUT_S  # loose: a hang fails, a slow machine does not
    assert (e.value.status, e.value.param, e.value.code) == (400, "messages", "template_error")
    assert e.value.message.startswith("'messages': the chat template was stopped: "), e.value.message
    assert any(bound in e.value.message for bound in bounds), e.value.message
    assert render(NORMAL, None)[0] == "<|user|>hi\n<|assistant|>"


@pytest.mark.parametrize(("hostile", "words"), [
    ("{{ raise_exception('no attacks') }}", "(no attacks)"),
    ("{% set l = [0] %}{% for x in l %}{{ l.append(x) }}{% endfor %}", "unsafe"),  # the sandbox: no growing list
    ("{{ 1 / 0 }}", "(ZeroDivisionError: division by zero)"),  # an expression's own error: not a 500
    ("{{ range(10**6) }}", "MAX_RANGE"),
])
def test_a_template_that_refuses_is_still_its_own_words(tmp_path: Path, hostile: str, words: str) -> None:
    render, _ = renderer(template_dir(tmp_path, hostile))
    with pytest.raises(ApiError) as e:
        render(ATTACK, None)
    assert (e.value.status, e.value.param, e.value.code) == (400, "messages", "template_error")
    assert words in e.value.message, e.value.message
    assert render(NORMAL, None)[0] == "<|user|>hi\n<|assistant|>"


def test_a_long_conversation_is_not_refused_by_the_output_bound(tmp_path: Path) -> None:
    render, _ = renderer(template_dir(tmp_path, ""))
    long = [{"role": "user", "content": "y" * (MAX_OUTPUT // 2)}, {"role": "assistant", "content": "z" * MAX_OUTPUT}]
    text, _ = render(long, None)  # past MAX_OUTPUT, within twice the request
    assert len(text) > MAX_OUTPUT and text.endswith("z\n<|assistant|>")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_compiling_a_template_computes_nothing(tmp_path: Path) -> None:
    """Jinja folds constant expressions while it compiles; the server compiles the template at startup, in
    process, so `10 ** (10 ** 10)` (hours) or a 300 MB string would be computed there, unbounded."""
    code = ("import sys; from pathlib import Path; from gptport.serve.api.chat_template import renderer; "
            "renderer(Path(sys.argv[1])); "
            "print(next(line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM:')))")
    for i, hostile in enumerate(["{{ 10 ** (10 ** 10) }}", "{{ 'x'|center(300000000) }}", "{{ 'x' * 300000000 }}",
                                 "{% set s = 'x'|center(300000000) %}{{ s|length }}"]):
        (tmp_path / str(i)).mkdir()
        path = template_dir(tmp_path / str(i), hostile)
        done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (hostile, done.stderr[-2000:])
        assert int(done.stdout) < 200 * 2**10, (hostile, f"{int(done.stdout) >> 10} MiB")  # its peak RSS, in KiB


def _alive(pid: int) -> bool:
    """Whether `pid` is a running (not zombie) process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_the_child_is_replaced_after_a_bound_and_reaped_when_the_worker_goes() -> None:
    worker = TemplateWorker({"default": "{% if n %}{% for i in range(100000) %}{% for j in range(100000) %}"
                                        "{% endfor %}{% endfor %}{% endif %}{{ n }}"}, timeout=0.5)
    assert worker.render("default", {"n": 0}) == "0"
    first = worker.pid()
    assert first is not None and _alive(first)
    with pytest.raises(TemplateLimit, match="took longer than 0.5 s"):
        worker.render("default", {"n": 1})
    assert worker.pid() is None and not _alive(first)  # killed and reaped: no zombie
    assert worker.render("default", {"n": 0}) == "0"
    second = worker.pid()
    assert second is not None and second != first and _alive(second)
    del worker
    gc.collect()
    assert not _alive(second)


@pytest.fixture(scope="module")
def server(trained_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    model = tmp_path_factory.mktemp("hostile_template") / "m"
    shutil.copytree(trained_dir, model)
    (model / "chat_template.jinja").write_text(GUARD + HOSTILE["nested loops"][0] + ECHO, encoding="utf-8")
    with serve(model, model.parent / "serve.log", "--slots", "2") as s:
        yield s


def _zombies(pid: int) -> list[int]:
    """The zombie children of process `pid`."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if fields[0] == "Z" and int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_the_server_refuses_the_render_and_keeps_serving(server: Served) -> None:
    for _ in range(2):
        err = assert_error(*server.post("/v1/chat/completions", {"messages": ATTACK, "max_tokens": 2}), 400,
                           "messages")
        assert TIME in err["message"] and err["code"] == "template_error", err
        status, body = server.post("/v1/chat/completions", {"messages": NORMAL, "max_tokens": 2})
        assert status == 200, body
    assert assert_error(*server.post("/tokenize", {"messages": ATTACK}), 400, "messages")["code"] == "template_error"
    assert server.post("/v1/completions", {"prompt": "ka", "max_tokens": 2})[0] == 200
    wait_idle(server, 10)
    assert server.proc.poll() is None and _zombies(server.proc.pid) == []
