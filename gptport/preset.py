"""Presets (gptport/presets/*.toml: a model shape and training settings by name, or a TOML file of the user's) and
`--set key=value` over them, each key and value checked against ModelConfig's and TrainConfig's fields. No torch
here."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from gptport.config import ModelConfig, TrainConfig, field_types
from gptport.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PRESETS_DIR = Path(__file__).parent / "presets"


@dataclass(frozen=True)
class Preset:
    """A named starting point: model shape (vocab_size comes from the tokenizer) and training settings."""

    name: str
    model: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.toml"))


def load_preset(name_or_path: str) -> Preset:
    """A preset by name (tiny, small, gpt2-124m) or from a TOML file with [model] and [train] tables."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PRESETS_DIR / f"{name_or_path}.toml"
        if not path.is_file():
            raise UsageError(f"--preset {name_or_path!r} is unknown; choose one of {', '.join(preset_names())} "
                             "or give a .toml file")
    if not path.is_file():
        raise UsageError(f"--preset {name_or_path}: no such file")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: not valid TOML ({e})") from e
    unknown = set(data) - {"model", "train"}
    if unknown:
        raise UsageError(f"{path}: unknown table(s) {', '.join(sorted(unknown))}; expected [model] and [train]")
    preset = Preset(path.stem, dict(data.get("model", {})), dict(data.get("train", {})))
    _check_keys(preset.model, ModelConfig, f"{path} [model]")
    _check_keys(preset.train, TrainConfig, f"{path} [train]")
    return preset


def _check_keys(values: dict[str, Any], cls: type, where: str) -> None:
    known = {f.name for f in fields(cls)}
    bad = sorted(set(values) - known)
    if bad:
        raise UsageError(f"{where}: unknown key(s) {', '.join(bad)}")


def _coerce(raw: str, kind: str, key: str) -> Any:
    """Parse a --set value to the declared type `kind` of the field it sets."""
    try:
        if kind == "bool":
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1")
        if kind == "int":
            return int(raw)
        if kind == "int | None":
            return None if raw.lower() in ("none", "") else int(raw)
        if kind == "float":
            return float(raw)
        if kind == "tuple[int, ...]":
            return tuple(int(x) for x in raw.split(",") if x.strip())
        if kind == "tuple[float, ...]":
            return tuple(float(x) for x in raw.split(",") if x.strip())
    except ValueError:
        words = {"int": "an integer", "float": "a number", "bool": "true or false",
                 "int | None": "an integer or none", "tuple[int, ...]": "comma-separated integers",
                 "tuple[float, ...]": "comma-separated numbers"}
        raise UsageError(f"--set {key}={raw}: expected {words.get(kind, 'a ' + kind)}") from None
    return raw


def apply_overrides(preset: Preset, overrides: list[str]) -> Preset:
    """Apply `--set key=value` (key as `model.d_model`, `train.lr`, or a bare field name)."""
    model, train = dict(preset.model), dict(preset.train)
    model_kinds, train_kinds = field_types(ModelConfig), field_types(TrainConfig)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise UsageError(f"--set {item!r}: expected key=value")
        section, _, name = key.rpartition(".")
        if section in ("", "model") and name in model_kinds and name != "vocab_size":
            model[name] = _coerce(raw, model_kinds[name], key)
        elif section in ("", "train") and name in train_kinds:
            train[name] = _coerce(raw, train_kinds[name], key)
        elif name == "vocab_size":
            raise UsageError(f"--set {key}: the vocabulary is the tokenizer's (train-tokenizer --vocab-size)")
        else:
            raise UsageError(f"--set {key}: unknown setting; model keys: "
                             f"{', '.join(k for k in model_kinds if k != 'vocab_size')}")
    return replace(preset, model=model, train=train)


def refuse_inert(cfg: ModelConfig, overrides: list[str]) -> None:
    """Refuse a `--set` of a model key that `cfg`'s other choices leave without effect, naming both."""
    inert = cfg.inert()
    for item in overrides:
        name = item.partition("=")[0].rpartition(".")[2]
        if name in inert:
            raise UsageError(f"--set {item}: has no effect, {inert[name]}")
