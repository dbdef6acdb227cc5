"""Chat messages to prompt text: the model directory's chat template when tokenizer_config.json has
one (rendered with Jinja2 in a sandbox, as transformers does), else gptport's plain template:

    System: {content}

    User: {content}

    Assistant: {content}

    Assistant:

one block per message, role capitalised, a blank line between blocks, ending with "Assistant:" for
the reply; generation stops where the model starts a new "User:" block. No torch here.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from gptport.errors import ArtifactError
from gptport.tokenizer import EOT, HF_CONFIG_FILE

Messages = list[dict[str, str]]
Renderer = Callable[[Messages], tuple[str, list[str]]]
PLAIN_STOPS = ["\n\nUser:"]


def plain(messages: Messages) -> tuple[str, list[str]]:
    """gptport's template (above) and its stop string."""
    blocks = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
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

    def render(messages: Messages) -> tuple[str, list[str]]:
        return template.render(messages=messages, add_generation_prompt=True, bos_token=bos, eos_token=eos), []

    return render, f"{HF_CONFIG_FILE} chat_template"
