"""Chat messages to prompt text: the model directory's chat template when it has one (chat_template.jinja,
as transformers >= 4.43 saves it, else tokenizer_config.json's chat_template), rendered as transformers'
apply_chat_template renders it (chat_env.py), else gptport's plain template:

    System: {content}

    User: {content}

    Assistant: {content}

    Assistant:

one block per message, role capitalised, a blank line between blocks, ending with "Assistant:" for
the reply; generation stops where the model starts a new "User:" block. With tools, a block after
the system messages offers them:

    Tools: call one by answering <tool_call>{"name": NAME, "arguments": {...}}</tool_call>
    {"name": ..., "description": ..., "parameters": {...}}      (one line per function)

an assistant's earlier calls are written back in that form after its content, and a tool's result
is a "Tool: {content}" block. A Jinja template receives what transformers gives it: the messages with
their `tool_calls` and `tool_call_id`, `tools` (the request's list), add_generation_prompt true, and the
special tokens of tokenizer_config.json (bos_token, eos_token, unk_token, pad_token); a template that
refuses the messages is a 400 naming `messages`. A template is a stranger's code: it renders in a child process
bounded in time, memory and output (template_worker.py, design record 0043), and a render past a bound is a 400
naming `messages` and the bound. No torch here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gptport.errors import ArtifactError
from gptport.paths import CHAT_TEMPLATE, CHAT_TEMPLATES_DIR
from gptport.serve.api.api_error import ApiError
from gptport.serve.api.template_worker import TemplateLimit, TemplateRefused, TemplateWorker
from gptport.serve.api.tools import Tools, plain_block
from gptport.tokenizer import HF_CONFIG_FILE

Messages = list[dict[str, Any]]
Renderer = Callable[[Messages, Tools | None], tuple[str, list[str]]]
PLAIN_STOPS = ["\n\nUser:"]
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")  # what tokenizer_config.json names


def plain(messages: Messages, tools: Tools | None = None) -> tuple[str, list[str]]:
    """gptport's template (above) and its stop string."""
    blocks = [f"{m['role'].capitalize()}: {m['content']}{m.get('tool_calls_text', '')}" for m in messages]
    if tools is not None:
        at = next((i for i, m in enumerate(messages) if m["role"] not in ("system", "developer")), len(messages))
        blocks.insert(at, plain_block(tools))
    return "\n\n".join([*blocks, "Assistant:"]), PLAIN_STOPS


def _tokenizer_config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / HF_CONFIG_FILE
    if not path.is_file():
        return {}
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path}: not valid JSON ({e})") from e
    return config if isinstance(config, dict) else {}


def template_sources(model_dir: Path, config: dict[str, Any]) -> tuple[dict[str, str], Path]:
    """The directory's chat templates by name ("default"; transformers' named ones, "tool_use" among them) and
    the file they come from: chat_template.jinja first (transformers reads it first; its named ones in
    additional_chat_templates/NAME.jinja), else tokenizer_config.json's chat_template, a string or a list of
    {name, template}. No template: an empty dict."""
    path = model_dir / CHAT_TEMPLATE
    if path.is_file():
        named = {p.stem: _read(p) for p in sorted((model_dir / CHAT_TEMPLATES_DIR).glob("*.jinja"))}
        text = _read(path)
        return ({**named, "default": text} if text else {}), path
    source, path = config.get("chat_template"), model_dir / HF_CONFIG_FILE
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in named.items()) or "default" not in named:
            raise ArtifactError(f"{path}: chat_template is a list, but not of {{name, template}} strings with a "
                                "'default' one")
        return named, path
    return ({"default": source} if isinstance(source, str) and source else {}), path


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ArtifactError(f"{path}: not valid UTF-8 at byte offset {e.start}") from None


def special_tokens(config: dict[str, Any]) -> dict[str, str]:
    """tokenizer_config.json's special tokens as text (a token written as an object gives its "content")."""
    out = {}
    for name in SPECIAL_TOKENS:
        value = config.get(name)
        text = value.get("content") if isinstance(value, dict) else value
        if isinstance(text, str):
            out[name] = text
    return out


def renderer(model_dir: Path) -> tuple[Renderer, str]:
    """The renderer for this model directory and a name for it (for the startup line)."""
    config = _tokenizer_config(model_dir)
    sources, path = template_sources(model_dir, config)
    if not sources:
        return plain, "plain"
    from jinja2 import TemplateError

    from gptport.serve.api.chat_env import environment

    env = environment()
    try:
        for text in sources.values():
            env.from_string(text)  # refused at startup, not at the first request
    except TemplateError as e:
        raise ArtifactError(f"{path}: chat_template does not compile ({e})") from e
    except RecursionError as e:  # the parser's own recursion: expressions nested a thousand deep
        raise ArtifactError(f"{path}: chat_template does not compile (it nests too deeply)") from e
    tokens = special_tokens(config)
    worker = TemplateWorker(sources)  # the child starts on the first render

    def render(messages: Messages, tools: Tools | None = None) -> tuple[str, list[str]]:
        given = [{k: v for k, v in m.items() if k != "tool_calls_text"} for m in messages]
        name = "tool_use" if tools is not None and "tool_use" in sources else "default"
        context = {**tokens, "messages": given, "tools": tools.raw if tools is not None else None,
                   "documents": None, "add_generation_prompt": True}
        try:
            text = worker.render(name, context)
        except TemplateRefused as e:
            raise ApiError(400, f"'messages': the chat template refused them ({e})", "messages",
                           "template_error") from e
        except TemplateLimit as e:
            raise ApiError(400, f"'messages': the chat template was stopped: {e}", "messages",
                           "template_error") from e
        return text, []

    return render, f"{path.name} chat_template" if path.name == HF_CONFIG_FILE else path.name
