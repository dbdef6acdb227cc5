"""Chat messages to prompt text: the model directory's chat template when tokenizer_config.json has
one (rendered with Jinja2 in a sandbox, as transformers does), else gptport's plain template:

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
is a "Tool: {content}" block. A Jinja template receives `tools` (the request's list) and the
messages with their `tool_calls` and `tool_call_id`, and `raise_exception(message)` as transformers
gives it; a template that refuses the messages is a 400 naming `messages`. No torch here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gptport.errors import ArtifactError
from gptport.serve.api_error import ApiError
from gptport.serve.tools import Tools, plain_block
from gptport.tokenizer import EOT, HF_CONFIG_FILE

Messages = list[dict[str, Any]]
Renderer = Callable[[Messages, Tools | None], tuple[str, list[str]]]
PLAIN_STOPS = ["\n\nUser:"]


def plain(messages: Messages, tools: Tools | None = None) -> tuple[str, list[str]]:
    """gptport's template (above) and its stop string."""
    blocks = [f"{m['role'].capitalize()}: {m['content']}{m.get('tool_calls_text', '')}" for m in messages]
    if tools is not None:
        at = next((i for i, m in enumerate(messages) if m["role"] not in ("system", "developer")), len(messages))
        blocks.insert(at, plain_block(tools))
    return "\n\n".join([*blocks, "Assistant:"]), PLAIN_STOPS


def renderer(model_dir: Path) -> tuple[Renderer, str]:
    """The renderer for this model directory and a name for it (for the startup line)."""
    path = model_dir / HF_CONFIG_FILE
    if not path.is_file():
        return plain, "plain"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path}: not valid JSON ({e})") from e
    source = config.get("chat_template") if isinstance(config, dict) else None
    if not isinstance(source, str) or not source:
        return plain, "plain"
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(source)
    except TemplateError as e:
        raise ArtifactError(f"{path}: chat_template does not compile ({e})") from e
    bos, eos = config.get("bos_token") or EOT, config.get("eos_token") or EOT

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def render(messages: Messages, tools: Tools | None = None) -> tuple[str, list[str]]:
        given = [{k: v for k, v in m.items() if k != "tool_calls_text"} for m in messages]
        try:
            text = template.render(messages=given, tools=tools.raw if tools is not None else None,
                                   add_generation_prompt=True, bos_token=bos, eos_token=eos,
                                   raise_exception=raise_exception)
        except TemplateError as e:
            raise ApiError(400, f"'messages': the chat template refused them ({e})", "messages",
                           "template_error") from e
        return text, []

    return render, f"{HF_CONFIG_FILE} chat_template"
