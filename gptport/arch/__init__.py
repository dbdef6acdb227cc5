"""The architecture families gptport reads and writes, one small module each (gpt2.py, llama.py, qwen2.py, qwen3.py;
base.py holds what they share: design record 0047), found here by their FAMILIES: adding a family is a module. No
torch. Importers (import-hf, import-gguf) and writers (export-hf, export-gguf) look a family up here."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from typing import Any

from gptport.arch.base import Family


def _found() -> tuple[Family, ...]:
    out: list[Family] = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name not in ("base", "hf_rope", "hf_window", "values"):  # helpers, not families
            out += importlib.import_module(f"{__name__}.{info.name}").FAMILIES
    return tuple(out)


FAMILIES = _found()
BY_TYPE = {f.model_type: f for f in FAMILIES}  # config.json's model_type -> its family


def family(model_type: str) -> Family:
    """The family of a model_type gptport knows ("llama", "qwen2", ...)."""
    return BY_TYPE[model_type]


def from_hf(hf: Mapping[str, Any]) -> Family | None:
    """The family config.json declares by its model_type, else by its architectures; None for any other."""
    if hf.get("model_type") in BY_TYPE:
        return BY_TYPE[str(hf["model_type"])]
    archs = hf.get("architectures")
    return next((f for f in FAMILIES if isinstance(archs, list) and f.hf_class in archs), None)


def from_gguf(arch: str | None) -> Family | None:
    """The family a GGUF file's general.architecture is read as; None for any other."""
    return next((f for f in FAMILIES if f.gguf_arch is not None and f.gguf_arch == arch), None)


def hf_classes() -> list[str]:
    return [f.hf_class for f in FAMILIES]


def gguf_archs() -> list[str]:
    return [f.gguf_arch for f in FAMILIES if f.gguf_arch is not None]
