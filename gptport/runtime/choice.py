"""Which graph of a model directory to open (GraphChoice) and how to run it (RunOptions): parsed once from
the CLI (gptport.cli.options) or a caller's settings, and passed whole to loader.open_graph/open_model.
The enums' values are the on-disk and command-line words (contract.py's constants)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TypeVar

from gptport import contract
from gptport.errors import UsageError


class Word(str, Enum):
    """A closed set of command-line words: each member is its word (str(), f-strings, JSON, file names)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


W = TypeVar("W", bound=Word)


class Precision(Word):
    """An exported variant (contract.PRECISIONS): its graph file's name part."""

    FP32 = "fp32"
    INT8 = "int8"
    INT4 = "int4"
    FP16 = "fp16"


class CacheLayout(Word):
    """--kv-cache: the static-cache graph, the contract graph (concat), or auto (loader.graph_path)."""

    AUTO = "auto"
    STATIC = contract.CACHE_STATIC
    CONCAT = contract.CACHE_CONCAT


class KvDtype(Word):
    """--kv-dtype: the cache's element type (contract.KV_DTYPES); int8 is the static graph's twin."""

    FLOAT32 = "float32"
    INT8 = "int8"


class GraphFormat(Word):
    """--graph-format: the .onnx graphs, or the .ort files of `export --ort-format`."""

    ONNX = "onnx"
    ORT = "ort"


class Spin(Word):
    """--spin: what onnxruntime's idle workers do (onnx_engine.session_options)."""

    ALWAYS = "always"
    STEP = "step"
    NEVER = "never"


assert tuple(Precision) == contract.PRECISIONS and tuple(KvDtype) == contract.KV_DTYPES


def _pick(kind: type[W], value: str, option: str, choose: str = "choose from") -> W:
    """`value` as a member of `kind`, or the one-line usage error naming `option`."""
    if value not in {m.value for m in kind}:
        raise UsageError(f"{option} {value!r} is unknown; {choose} {', '.join(kind)}")
    return kind(value)


@dataclass(frozen=True)
class GraphChoice:
    """Which graph file of a model directory to open (loader.graph_path): the variant, the cache layout,
    the cache's element type and the file format."""

    precision: Precision = Precision.FP32
    cache: CacheLayout = CacheLayout.AUTO
    kv_dtype: KvDtype = KvDtype.FLOAT32
    fmt: GraphFormat = GraphFormat.ONNX

    @classmethod
    def parse(cls, precision: str = "fp32", cache: str = "auto", kv_dtype: str = "float32",
              fmt: str = "onnx") -> GraphChoice:
        """The choice of these command-line words, each refused in one line naming its option."""
        kv = _pick(KvDtype, kv_dtype, "--kv-dtype")
        return cls(_pick(Precision, precision, "--precision"), _pick(CacheLayout, cache, "--kv-cache"), kv,
                   _pick(GraphFormat, fmt, "--graph-format"))


@dataclass(frozen=True)
class RunOptions:
    """How to run a graph: the execution provider (providers.py's names), CPU threads (0: onnxruntime's
    default), what idle workers do, and whether an unavailable provider falls back to the next."""

    provider: str = "cpu"
    threads: int = 0
    spin: Spin = Spin.ALWAYS
    fallback: bool = False

    @classmethod
    def parse(cls, provider: str = "cpu", threads: int = 0, spin: str = "always", fallback: bool = False
              ) -> RunOptions:
        """The options of these command-line words; --spin refused in one line when unknown."""
        return cls(provider, threads, _pick(Spin, spin, "--spin", "choose one of"), fallback)


DEFAULT_GRAPH = GraphChoice()  # fp32, auto cache layout, float32 cache, .onnx
DEFAULT_RUN = RunOptions()  # the CPU provider, onnxruntime's threads, workers that spin
