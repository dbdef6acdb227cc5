"""A GGUF file read for import-gguf with the `gguf` package's reader (memory-mapped: a tensor is read when it is
dequantized, one at a time): its metadata as typed values, its tensors by name, each dequantized to float32 with
`gguf.quants.dequantize`. A file cut short is said to be truncated, naming the byte it lacks; a tensor type outside
TYPES is refused naming it. No torch."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from gptport.errors import ArtifactError, InputError, escaped

Q = gguf.GGMLQuantizationType
# The types import-gguf dequantizes: floats, llama.cpp's legacy block types, its k-quants (Q4_K_M and Q5_K_M
# files fall back to Q5_0 / Q5_1 / Q8_0 for rows that are no multiple of 256 values) and the i-quants that
# llama-quantize writes without an importance matrix (IQ3_XXS files hold none: they fall back to Q3_K and
# IQ4_NL). Each was read from a real file as transformers reads it (benchmarks.export.gguf_types); the i-quants
# of 1 and 2 bits, which need an importance matrix, and the ternary TQ types were not, and are refused.
TYPES = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K,
         Q.IQ4_NL, Q.IQ4_XS, Q.IQ3_S)


MAX_DIMS = 4  # GGML_MAX_DIMS: llama.cpp's tensors have at most four dimensions


class _Truncated(Exception):
    """The reader asked for bytes past the end of the file."""

    def __init__(self, end: int) -> None:
        super().__init__(end)
        self.end = end


class _Malformed(Exception):
    """What the file's header says cannot be: the reason, in words."""


class _Reader(gguf.GGUFReader):
    """GGUFReader, bounded by the file: no read past its end (its own reader returns a short array there, which
    fails later as a reshape or an index error that does not say why), no array nested in an array (llama.cpp
    writes none; the reader would recurse as deep as the file says), at most MAX_DIMS dimensions, and each
    tensor's size computed in Python's integers (numpy's product of uint64 dimensions wraps around: dimensions
    of 2**32 x 2**32 made an empty tensor), aligned, within the file and apart from every other tensor, all
    checked before a tensor's data is mapped. Every count the file gives is thus bounded by its size."""

    def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> Any:
        end = int(offset) + np.dtype(dtype).itemsize * int(count)
        if end > len(self.data):
            raise _Truncated(end)
        return super()._get(offset, dtype, count, override_order)

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> Any:
        if raw_type == gguf.GGUFValueType.ARRAY:
            item = int(self._get(orig_offs, np.uint32)[0])
            if item == gguf.GGUFValueType.ARRAY:
                raise _Malformed(f"an array of arrays at byte {orig_offs:,} (llama.cpp writes none)")
        return super()._get_field_parts(orig_offs, raw_type)

    def _get_tensor_info_field(self, orig_offs: int) -> Any:
        name_len = int(self._get(orig_offs, np.uint64)[0])
        n_dims = int(self._get(orig_offs + 8 + name_len, np.uint32)[0])
        if n_dims > MAX_DIMS:
            raise _Malformed(f"the tensor described at byte {orig_offs:,} has {n_dims:,} dimensions (at most "
                             f"{MAX_DIMS})")
        return super()._get_tensor_info_field(orig_offs)

    def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
        spans, names = [], set()
        for field in fields:
            _len, name_data, _n, dims, raw_dtype, offset = field.parts
            name = bytes(name_data).decode("utf-8", "backslashreplace")
            if name in names:
                raise _Malformed(f"tensor {name} is listed twice")
            names.add(name)
            try:
                qtype = gguf.GGMLQuantizationType(int(raw_dtype[0]))
                block, size = gguf.GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise _Malformed(f"tensor {name} has type {int(raw_dtype[0])}, which is no GGML type") from None
            if any(int(d) == 0 for d in dims):
                raise _Malformed(f"tensor {name} has a dimension of 0 ({[int(d) for d in dims]})")
            elements = math.prod(int(d) for d in dims)  # Python's integers: no wrap-around
            if elements % block:
                raise _Malformed(f"tensor {name} has {elements:,} values, no whole number of {qtype.name}'s blocks "
                                 f"of {block}")
            begin = start_offs + int(offset[0])
            end = begin + elements // block * size
            if int(offset[0]) % self.alignment:
                raise _Malformed(f"tensor {name}'s data offset {int(offset[0]):,} is not a multiple of the "
                                 f"alignment {self.alignment}")
            if end > len(self.data):
                raise _Truncated(end)
            spans.append((begin, end, name))
        spans.sort()
        for (_b, end, first), (begin, _e, second) in zip(spans, spans[1:], strict=False):
            if begin < end:
                raise _Malformed(f"tensors {first} and {second} overlap (at byte {begin:,})")
        super()._build_tensors(start_offs, fields)


class GGUFFile:
    """The metadata and the tensors of one GGUF file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if not path.is_file():
            raise InputError(f"{path}: no such file")
        try:
            self.reader = _Reader(path)
        except _Truncated as e:  # its header, or a tensor the header lists, reaches past the end
            raise ArtifactError(f"{path}: truncated: {path.stat().st_size:,} bytes, but what its header describes "
                                f"reaches byte {e.end:,}") from None
        except _Malformed as e:  # the file's own names are in the message: its control characters escaped
            raise ArtifactError(f"{path}: not a valid GGUF file: {escaped(str(e))}") from None
        except (ValueError, KeyError, IndexError, OverflowError, UnicodeDecodeError) as e:
            raise ArtifactError(f"{path}: not a GGUF file gptport can read ({escaped(str(e)).strip()})") from None
        self.tensors = {t.name: t for t in self.reader.tensors}

    @property
    def keys(self) -> list[str]:
        return list(self.reader.fields)

    def has(self, key: str) -> bool:
        return key in self.reader.fields

    def value(self, key: str, default: Any = None) -> Any:
        """The value of metadata `key` (a number, bool, string or list), or `default` when the file lacks it."""
        field = self.reader.fields.get(key)
        if field is None:
            return default
        try:
            return field.contents()
        except (ValueError, UnicodeDecodeError) as e:
            raise ArtifactError(f"{self.path}: metadata {escaped(key)} is unreadable ({escaped(str(e))})") from None

    def integer(self, key: str, default: int | None = None) -> int:
        value = self.value(key, default)
        if value is None:
            raise ArtifactError(f"{self.path}: no metadata {key}")
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ArtifactError(f"{self.path}: metadata {key} must be an integer, not {value!r}")
        return int(value)

    def number(self, key: str, default: float | None = None) -> float:
        """A float metadata value, as the shortest decimal of its float32 (1e-05, not 9.999999747e-06) when it
        is stored as float32, so that config.json reads as the model's config did."""
        field = self.reader.fields.get(key)
        value = self.value(key, default)
        if value is None:
            raise ArtifactError(f"{self.path}: no metadata {key}")
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise ArtifactError(f"{self.path}: metadata {key} must be a number, not {value!r}")
        if field is not None and field.types == [gguf.GGUFValueType.FLOAT32]:
            return float(str(np.float32(value)))
        return float(value)

    def text(self, key: str, default: str | None = None) -> str | None:
        value = self.value(key, default)
        if value is not None and not isinstance(value, str):
            raise ArtifactError(f"{self.path}: metadata {key} must be a string, not {value!r}")
        return value

    def strings(self, key: str) -> list[str] | None:
        value = self.value(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise ArtifactError(f"{self.path}: metadata {key} must be a list of strings")
        return value

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape as numpy has it: GGUF's dimensions reversed, (rows, columns) for a matrix."""
        return tuple(int(d) for d in reversed(self.tensors[name].shape.tolist()))

    def type_name(self, name: str) -> str:
        return self.tensors[name].tensor_type.name

    def check_types(self) -> None:
        """Refuse the first tensor of a type import-gguf does not dequantize, naming it and its type."""
        for t in self.reader.tensors:
            if t.tensor_type not in TYPES:
                raise InputError(f"{self.path}: tensor {escaped(t.name)} is {t.tensor_type.name}, a type gptport "
                                 f"does not import (it takes {', '.join(q.name for q in TYPES)})")

    def dequantize(self, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Tensor `name` (its rows start:stop) as float32 in numpy's shape, via gguf.quants.dequantize (an F32
        tensor: a read-only view of the mapped file)."""
        t = self.tensors[name]
        shape = self.shape(name)
        data = t.data if len(shape) < 2 else t.data[start:stop]
        try:
            out = gguf.quants.dequantize(data, t.tensor_type)
        except (NotImplementedError, ValueError) as e:
            raise InputError(f"{self.path}: tensor {escaped(name)} ({t.tensor_type.name}) cannot be dequantized "
                             f"({escaped(str(e))})") from None
        return np.ascontiguousarray(out, dtype=np.float32).reshape(-1, *shape[1:]) if len(shape) > 1 else out
