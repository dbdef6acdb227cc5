"""GET /tokenizer_info, as vLLM serves it: the model directory's tokenizer_config.json (its plain JSON
values) with the keys clients read always present: `tokenizer_class`, `bos_token`, `eos_token` and
`pad_token` (null where the directory names none; eos defaults to the end-of-text token),
`chat_template` (the one chat_template.py renders, from chat_template.jinja or tokenizer_config.json; null: gptport's
plain template) and `model_max_length` (the served context, n_ctx).
No torch here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gptport.errors import ArtifactError
from gptport.serve.api.chat_template import template_sources
from gptport.tokenizer import EOT, HF_CONFIG_FILE

KEYS = ("tokenizer_class", "bos_token", "eos_token", "pad_token", "chat_template", "model_max_length")


def tokenizer_info(model_dir: Path, n_ctx: int) -> dict[str, Any]:
    """The answer of GET /tokenizer_info for this model directory, served with `n_ctx` positions."""
    path = model_dir / HF_CONFIG_FILE
    config: dict[str, Any] = {}
    if path.is_file():
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ArtifactError(f"{path}: not valid JSON ({e})") from e
        config = loaded if isinstance(loaded, dict) else {}
    template = template_sources(model_dir, config)[0].get("default")
    return {**config, "tokenizer_class": str(config.get("tokenizer_class") or "GPT2Tokenizer"),
            "bos_token": _token(config.get("bos_token")), "eos_token": _token(config.get("eos_token")) or EOT,
            "pad_token": _token(config.get("pad_token")),
            "chat_template": template or None,
            "model_max_length": n_ctx}


def _token(value: Any) -> str | None:
    """A special token's text: a string, or transformers' AddedToken form {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None
