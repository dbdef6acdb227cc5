"""A model directory's Jinja chat template (tokenizer_config.json): what it receives from a chat request
(tools, an assistant's tool_calls, a tool message's tool_call_id), a template that refuses the messages
(a 400 naming `messages` on both routes that render them), and a template that cannot be used."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gptport.errors import ArtifactError
from gptport.serve.api.api_error import ApiError
from gptport.serve.api.chat_template import plain, renderer
from gptport.serve.api.protocol import chat_job
from gptport.serve.api.tokenize import tokenize
from gptport.tokenizer import HF_CONFIG_FILE, BPETokenizer

# ChatML with tools, as model cards write theirs (transformers' trim_blocks: a newline after a tag goes)
TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %} {{ t['function']['name'] }}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' and not m.get('tool_call_id') %}{{ raise_exception('a tool message needs its "
    "tool_call_id') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}"
    "{% if m.get('tool_call_id') %} [{{ m['tool_call_id'] }}]{% endif %}{{ '\\n' }}{{ m['content'] }}"
    "{% for c in m.get('tool_calls') or [] %}<call id={{ c['id'] }}>{{ c['function']['name'] }}"
    "({{ c['function']['arguments'] }})</call>{% endfor %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
    {"type": "function", "function": {"name": "echo", "parameters": {"type": "object", "properties": {}}}}]
HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "What is 1 + 2?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "3"},
]
EXPECTED = (
    "<|im_start|>system\nTools: add echo<|im_end|>\n"
    "<|im_start|>system\nBe brief.<|im_end|>\n"
    "<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n"
    '<|im_start|>assistant\n<call id=call_1>add({"a": 1, "b": 2})</call><|im_end|>\n'
    "<|im_start|>tool [call_1]\n3<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def model_dir(tmp_path: Path, config: Any) -> Path:
    text = config if isinstance(config, str) else json.dumps(config)
    (tmp_path / HF_CONFIG_FILE).write_text(text, encoding="utf-8")
    return tmp_path


def test_the_template_receives_tools_and_the_tool_history(tmp_path: Path, tok: BPETokenizer) -> None:
    render, name = renderer(model_dir(tmp_path, {"chat_template": TEMPLATE}))
    assert name == f"{HF_CONFIG_FILE} chat_template"
    job = chat_job({"messages": HISTORY, "tools": TOOLS}, tok, 512, 4, render)
    assert job.prompt_texts == [EXPECTED]
    assert job.prompts == [tok.encode(EXPECTED)]
    assert job.tools is not None and job.spec is not None  # tool_choice auto: a reply may be a call
    out = tokenize({"messages": HISTORY, "tools": TOOLS}, tok, 512, render)
    assert out["tokens"] == tok.encode(EXPECTED)
    # tool_choice none: the template gets no tools, and nothing constrains the reply
    job = chat_job({"messages": HISTORY, "tools": TOOLS, "tool_choice": "none"}, tok, 512, 4, render)
    assert job.prompt_texts == [EXPECTED.removeprefix("<|im_start|>system\nTools: add echo<|im_end|>\n")]
    assert job.spec is None


def test_a_template_that_refuses_the_messages_is_a_400_on_both_routes(tmp_path: Path, tok: BPETokenizer) -> None:
    render, _ = renderer(model_dir(tmp_path, {"chat_template": TEMPLATE}))
    lost = [*HISTORY[:3], {"role": "tool", "content": "3"}]
    for call in (lambda: chat_job({"messages": lost}, tok, 512, 4, render),
                 lambda: tokenize({"messages": lost}, tok, 512, render)):
        with pytest.raises(ApiError) as e:
            call()
        assert e.value.status == 400 and e.value.param == "messages" and e.value.code == "template_error"
        assert "a tool message needs its tool_call_id" in e.value.message


@pytest.mark.parametrize("config, message", [
    ("{not json", "not valid JSON"),
    ({"chat_template": "{% for m in messages %}"}, "chat_template does not compile"),
])
def test_an_unusable_template_names_its_file(tmp_path: Path, config: Any, message: str) -> None:
    with pytest.raises(ArtifactError) as e:
        renderer(model_dir(tmp_path, config))
    assert str(tmp_path / HF_CONFIG_FILE) in str(e.value) and message in str(e.value)


@pytest.mark.parametrize("config", [{}, {"chat_template": ""}, {"eos_token": "<|endoftext|>"}])
def test_without_a_template_the_plain_one_renders(tmp_path: Path, config: Any) -> None:
    render, name = renderer(model_dir(tmp_path, config))
    assert (render, name) == (plain, "plain")
