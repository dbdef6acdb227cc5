"""Chat templates render in `gptport serve` as transformers' tokenizer.apply_chat_template renders them: a ChatML
template with tools in the manner of Qwen2.5 and SmolLM2 (tools and tool calls through tojson, namespaces, loop
controls) and a Llama 3.1/3.2-style one (the begin token, tojson(indent=4), raise_exception, strftime_now), for
messages with and without tools, an assistant's tool calls and tool results, from chat_template.jinja or
tokenizer_config.json (named templates too: tool_use when tools are given), through a chat request's own path
(protocol.chat_job). transformers reads the same directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gptport.serve.api.api_error import ApiError
from gptport.serve.api.chat_env import environment
from gptport.serve.api.chat_template import renderer
from gptport.serve.api.protocol import chat_job
from gptport.tokenizer import BPETokenizer

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")

CHATML = """{%- set ns = namespace(first_user=-1) %}
{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.first_user = loop.index0 %}{%- break %}{%- endif %}
{%- endfor %}
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}
    {%- else %}{{- 'You are SmolLM.' }}{%- endif %}
    {{- "\\n\\n# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- elif messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are SmolLM.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first %}{%- continue %}{%- endif %}
    {%- if message.role == "user" or message.role == "system"
           or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + ('' if loop.index0 != ns.first_user else ' first') + '\\n' }}
        {{- message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.index0 == 0 or messages[loop.index0 - 1].role != "tool" %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != "tool" %}{{- '<|im_end|>\\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

LLAMA3 = """{{- bos_token }}
{%- if not tools_in_user_message is defined %}{%- set tools_in_user_message = true %}{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}{%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}{%- set date_string = "26 Jul 2024" %}{%- endif %}
{%- endif %}
{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}{{- "Environment: ipython\\n" }}{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- if tools_in_user_message and not tools is none %}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
    {%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, respond with a JSON for a function call.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'
            + message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", "parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" + message.content + "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}
"""

TOOLS = [{"type": "function", "function": {
    "name": "compare", "description": "Is <b>a</b> < b & c? (café, 日本)",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}]
PLAIN = [{"role": "system", "content": "  Be brief & clear: <ok>.  "}, {"role": "user", "content": "Hello, café?"},
         {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "And now?"}]
CALLS = [{"role": "user", "content": "Is 1 < 2?"},
         {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
             "name": "compare", "arguments": '{"a": 1, "b": 2}'}}]},
         {"role": "tool", "tool_call_id": "call_1", "content": "true"}]
SPECIALS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}


def hf_dir(tmp_path: Path, tokenizer_dir: Path, template: str | dict[str, str], old_layout: bool = False) -> Path:
    """A tokenizer saved by transformers with `template` (chat_template.jinja, named ones in
    additional_chat_templates/), or written into tokenizer_config.json as transformers < 4.43 did, the special
    tokens as AddedToken objects."""
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for t in ["<|begin_of_text|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>"]])
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, **SPECIALS)
    fast.chat_template = template
    out = tmp_path / "tok"
    fast.save_pretrained(str(out))
    if old_layout:
        config = json.loads((out / "tokenizer_config.json").read_text())
        config["chat_template"] = template if isinstance(template, str) else [
            {"name": k, "template": v} for k, v in template.items()]
        config.update({k: {"content": v, "special": True, "lstrip": False, "rstrip": False, "normalized": False,
                           "single_word": False, "__type": "AddedToken"} for k, v in SPECIALS.items()})
        (out / "tokenizer_config.json").write_text(json.dumps(config))
        for p in [out / "chat_template.jinja", *(out / "additional_chat_templates").glob("*.jinja")]:
            p.unlink(missing_ok=True)
    return out


def theirs(path: Path, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    hf = transformers.AutoTokenizer.from_pretrained(str(path))
    return str(hf.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False))


def ours(path: Path, tok: BPETokenizer, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    render, _ = renderer(path)
    body: dict[str, Any] = {"messages": messages, **({"tools": tools} if tools else {})}
    job = chat_job(body, tok, 4096, 1, render)
    assert job.prompts == [tok.encode(job.prompt_texts[0])]
    return job.prompt_texts[0]


@pytest.mark.parametrize("old_layout", [False, True], ids=["chat_template.jinja", "tokenizer_config.json"])
@pytest.mark.parametrize("template", ["chatml", "llama3"])
@pytest.mark.parametrize("case", ["plain", "tools", "calls"])
def test_templates_render_as_transformers_renders_them(tmp_path: Path, tokenizer_dir: Path, tok: BPETokenizer,
                                                       old_layout: bool, template: str, case: str) -> None:
    path = hf_dir(tmp_path, tokenizer_dir, CHATML if template == "chatml" else LLAMA3, old_layout)
    messages = CALLS if case == "calls" else PLAIN
    tools = None if case == "plain" else TOOLS
    want = theirs(path, messages, tools)
    assert ours(path, tok, messages, tools) == want
    if tools:  # tojson as transformers': no HTML escaping, no ASCII escapes
        assert "Is <b>a</b> < b & c? (café, 日本)" in want
    if template == "llama3":
        assert want.startswith(SPECIALS["bos_token"]) and "Today Date: " in want


def test_named_templates_take_tool_use_with_tools(tmp_path: Path, tokenizer_dir: Path, tok: BPETokenizer) -> None:
    named = {"default": "D:{{ messages[-1]['content'] }}", "tool_use": "T:{{ tools | map(attribute='type') | list }}"}
    for old_layout in (False, True):
        path = hf_dir(tmp_path / str(old_layout), tokenizer_dir, named, old_layout)
        for tools in (None, TOOLS):
            assert ours(path, tok, PLAIN, tools) == theirs(path, PLAIN, tools)
        assert ours(path, tok, PLAIN, TOOLS) == "T:['function']"


def test_a_template_that_raises_is_a_400(tmp_path: Path, tokenizer_dir: Path, tok: BPETokenizer) -> None:
    path = hf_dir(tmp_path, tokenizer_dir, LLAMA3)
    two = [CALLS[0], {**CALLS[1], "tool_calls": CALLS[1]["tool_calls"] * 2}]
    with pytest.raises(ApiError) as e:
        ours(path, tok, two, None)
    assert e.value.status == 400 and "only supports single tool-calls" in e.value.message


def test_the_environment_is_transformers() -> None:
    env = environment()
    render = lambda source, **kw: env.from_string(source).render(**kw)  # noqa: E731
    assert render("{{ x | tojson }}", x={"a": "<é>"}) == '{"a": "<é>"}'
    assert render("{{ x | tojson(indent=2, sort_keys=true) }}", x={"b": 1, "a": 2}) == '{\n  "a": 2,\n  "b": 1\n}'
    assert render("{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}") == "012"
    assert render("{% generation %}kept{% endgeneration %}") == "kept"
    from jinja2.exceptions import SecurityError

    with pytest.raises(SecurityError):
        render("{% set ns = namespace(_x=1) %}")
