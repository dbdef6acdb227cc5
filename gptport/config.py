"""ModelConfig and TrainConfig, the presets, and their JSON/TOML round trip. No torch here."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from gptport.errors import ArtifactError, UsageError
from gptport.paths import CONFIG

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PRESETS_DIR = Path(__file__).parent / "presets"
PosEncoding = Literal["learned", "sinusoidal"]
Gelu = Literal["tanh", "exact"]


@dataclass(frozen=True)
class ModelConfig:
    """The GPT's shape. Defaults are GPT-2's choices where GPT-2 made one."""

    vocab_size: int
    n_ctx: int = 256  # longest sequence the positions cover
    d_model: int = 384
    n_layer: int = 6
    n_head: int = 6
    d_ff: int = 0  # 0 means 4 * d_model, the classic width
    dropout: float = 0.0  # small models on small corpora overfit late; 0 is right for short runs
    bias: bool = True  # GPT-2 has biases in Linear and LayerNorm
    pos_encoding: PosEncoding = "learned"
    tie_embeddings: bool = True  # the head reuses the token embedding: fewer parameters, better at small scale
    ln_eps: float = 1e-5
    gelu: Gelu = "tanh"  # GPT-2's approximation; "exact" is erf-based

    def __post_init__(self) -> None:
        if self.d_ff == 0:
            object.__setattr__(self, "d_ff", 4 * self.d_model)
        self.validate()

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def validate(self) -> None:
        """Refuse shapes the model cannot have, naming the field."""
        positive = ("vocab_size", "n_ctx", "d_model", "n_layer", "n_head", "d_ff")
        for name in positive:
            if getattr(self, name) <= 0:
                raise UsageError(f"model.{name} must be positive, not {getattr(self, name)}")
        if self.d_model % self.n_head:
            raise UsageError(f"model.d_model ({self.d_model}) must be divisible by model.n_head ({self.n_head})")
        if self.pos_encoding == "sinusoidal" and self.d_model % 2:
            raise UsageError("model.d_model must be even for sinusoidal positions")
        if self.pos_encoding not in ("learned", "sinusoidal"):
            raise UsageError(f"model.pos_encoding must be 'learned' or 'sinusoidal', not {self.pos_encoding!r}")
        if self.gelu not in ("tanh", "exact"):
            raise UsageError(f"model.gelu must be 'tanh' or 'exact', not {self.gelu!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise UsageError(f"model.dropout must be in [0, 1), not {self.dropout}")

    def n_params(self) -> int:
        """Parameter count, tied weights counted once."""
        d, f, v = self.d_model, self.d_ff, self.vocab_size
        b = 1 if self.bias else 0
        per_layer = (3 * d * d + 3 * d * b) + (d * d + d * b) + (d * f + f * b) + (f * d + d * b) + 2 * (d + d * b)
        emb = v * d + (self.n_ctx * d if self.pos_encoding == "learned" else 0)
        head = 0 if self.tie_embeddings else v * d
        return emb + self.n_layer * per_layer + (d + d * b) + head


@dataclass(frozen=True)
class TrainConfig:
    """How to train. Defaults suit the `small` preset on one GPU; presets override them."""

    steps: int = 2000
    minutes: float = 0.0  # > 0: train for this wall time instead of a number of steps
    schedule_steps: int = 0  # horizon of the LR schedule; 0 means `steps`
    batch_size: int = 32
    grad_accum: int = 1  # micro-batches per optimizer step on each rank
    global_batch: int = 0  # > 0: sequences per optimizer step over all ranks; sets grad_accum
    lr: float = 1e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * this
    warmup_steps: int = 100
    weight_decay: float = 0.1  # on matrices and embeddings only
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 200
    eval_batches: int = 20
    checkpoint_every: int = 0  # steps between checkpoints; 0 means eval_every
    val_fraction: float = 0.1
    seed: int = 1337
    device: str = "auto"
    compile: bool = False
    autocast: str = "auto"  # auto: bf16 where native (CUDA from Ampere on, CPUs with AVX512-BF16/AMX); else fp32
    threads: int = 0  # torch intra-op threads on the CPU; 0 leaves torch's default

    def validate(self) -> None:
        for name in ("steps", "batch_size", "grad_accum", "eval_every", "eval_batches"):
            if getattr(self, name) <= 0:
                raise UsageError(f"--{name.replace('_', '-')} must be positive, not {getattr(self, name)}")
        if self.global_batch < 0:
            raise UsageError(f"--global-batch must be positive, not {self.global_batch}")
        if self.lr <= 0:
            raise UsageError(f"--lr must be positive, not {self.lr}")
        if not 0.0 < self.val_fraction < 0.5:
            raise UsageError(f"--val-fraction must be in (0, 0.5), not {self.val_fraction}")
        if self.minutes < 0:
            raise UsageError(f"--minutes must be positive, not {self.minutes}")
        if self.autocast not in ("auto", "bf16", "fp32"):
            raise UsageError(f"train.autocast must be auto, bf16 or fp32, not {self.autocast!r}")
        if self.device not in ("auto", "cpu", "cuda", "mps"):
            raise UsageError(f"--device must be auto, cpu, cuda or mps, not {self.device!r}")


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


def _coerce(raw: str, current: Any, key: str) -> Any:
    """Parse a --set value to the type of the field it sets."""
    try:
        if isinstance(current, bool):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1")
        if isinstance(current, int):
            return int(raw)
        if isinstance(current, float):
            return float(raw)
    except ValueError:
        raise UsageError(f"--set {key}={raw}: expected a {type(current).__name__}") from None
    return raw


def apply_overrides(preset: Preset, overrides: list[str]) -> Preset:
    """Apply `--set key=value` (key as `model.d_model`, `train.lr`, or a bare field name)."""
    model, train = dict(preset.model), dict(preset.train)
    model_defaults = {f.name: f.default for f in fields(ModelConfig)}
    train_defaults = {f.name: f.default for f in fields(TrainConfig)}
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise UsageError(f"--set {item!r}: expected key=value")
        section, _, name = key.rpartition(".")
        if section in ("", "model") and name in model_defaults and name != "vocab_size":
            model[name] = _coerce(raw, model.get(name, model_defaults[name]), key)
        elif section in ("", "train") and name in train_defaults:
            train[name] = _coerce(raw, train.get(name, train_defaults[name]), key)
        else:
            raise UsageError(f"--set {key}: unknown setting; model keys: "
                             f"{', '.join(k for k in model_defaults if k != 'vocab_size')}")
    return replace(preset, model=model, train=train)


def model_config_to_dict(cfg: ModelConfig) -> dict[str, Any]:
    return asdict(cfg)


# the JSON types each ModelConfig field takes (bool is no int here; a float field takes an int)
_JSON_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "int": ((int,), "an integer"), "float": ((int, float), "a number"), "bool": ((bool,), "true or false"),
    "PosEncoding": ((str,), "a string"), "Gelu": ((str,), "a string")}


def model_config_from_dict(data: Mapping[str, Any], where: str = CONFIG) -> ModelConfig:
    """A ModelConfig from a JSON object (config.json's "model", a graph's gptport.config metadata), or an
    ArtifactError naming `where`: no vocab_size, a value of the wrong type, a shape the model cannot have."""
    if not isinstance(data, Mapping):
        raise ArtifactError(f"{where}: the model config is not a JSON object")
    known = {f.name: str(f.type) for f in fields(ModelConfig)}
    missing = {"vocab_size"} - set(data)
    if missing:
        raise ArtifactError(f"{where}: model has no {', '.join(sorted(missing))}")
    values = {k: v for k, v in data.items() if k in known}
    for name, value in values.items():
        kinds, words = _JSON_TYPES[known[name]]
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise ArtifactError(f"{where}: invalid model config (model.{name} must be {words}, not {value!r})")
        if known[name] == "float":
            values[name] = float(value)
    try:
        return ModelConfig(**values)
    except UsageError as e:
        raise ArtifactError(f"{where}: invalid model config ({e})") from e


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path`, or an ArtifactError naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ArtifactError(f"{path}: missing") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ArtifactError(f"{path}: expected a JSON object")
    return data
