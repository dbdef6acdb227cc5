"""Reading config.json's values: a number by key, refused naming the key; ModelConfig's refusal said with the
file's own keys. Shared by base.py and the readers it calls (hf_rope.py, hf_window.py)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gptport.errors import InputError, UsageError


def number(hf: Mapping[str, Any], key: str, where: Path, default: Any = None, kind: type = int,
           positive: bool = False) -> Any:
    """config.json's `key` (or `default` when absent or null) as an int or a float, refused naming the key (and
    refused when not above 0, where `positive`)."""
    value = hf.get(key)
    if value is None:
        value = default
    if value is None:
        raise InputError(f"{where}: no {key}")
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise InputError(f"{where}: {key} must be {'a number' if kind is float else 'an integer'}, not {value!r:.40}")
    if positive and not value > 0:
        raise InputError(f"{where}: {key} must be positive, not {value}")
    return kind(value)


def refused(e: UsageError, keys: Mapping[str, str], where: Path) -> InputError:
    """ModelConfig's refusal of a config.json's shape, said with the file's own keys (`keys`: ModelConfig's
    field -> config.json's key): "num_hidden_layers must be at most 4,096", not "model.n_layer ..."."""
    return InputError(f"{where}: " + re.sub(r"model\.(\w+)", lambda m: keys.get(m[1], m[0]), str(e)))
