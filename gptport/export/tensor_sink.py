"""Where a graph's initializers go as the builder makes them: inline in the graph (a small model, one file), or
appended one tensor at a time to the graph's external data file (`<graph>.data`), so that no graph is ever held
whole in memory and none meets protobuf's 2 GB limit. Each tensor's bytes start at a multiple of ALIGN, which lets
onnxruntime map them from the file rather than copy them. No torch here."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO, Protocol

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from gptport.errors import ArtifactError

ALIGN = 64 * 1024  # onnxruntime maps external data whose offset is a multiple of the allocation granularity
INLINE_BYTES = 1024  # smaller tensors stay in the graph (onnx's own size_threshold): shapes, norms' gammas
EXTERNAL_FROM_BYTES = 2**30  # a model's float32 weights past this go to external data, checked layer by layer:
#                               SmolLM2-135M (538 MB) is held in torch and gated, Qwen2.5-0.5B (1.8 GiB) is not


class Sink(Protocol):
    """What the builder hands each initializer to."""

    def tensor(self, name: str, array: np.ndarray) -> TensorProto:
        """The initializer `name` holding `array`."""
        ...

    def chunked(self, name: str, dtype: np.dtype, shape: tuple[int, ...], chunks: Iterable[np.ndarray]
                ) -> TensorProto:
        """The initializer `name` of `shape` whose bytes are `chunks` in order (rows of it, made one at a time)."""
        ...


class InlineSink:
    """Initializers inside the graph: what a small model's graphs are (one file each)."""

    def tensor(self, name: str, array: np.ndarray) -> TensorProto:
        return numpy_helper.from_array(np.asarray(array, order="C"), name)  # (a 0-d array stays 0-d)

    def chunked(self, name: str, dtype: np.dtype, shape: tuple[int, ...], chunks: Iterable[np.ndarray]
                ) -> TensorProto:
        whole = np.concatenate([np.ascontiguousarray(c, dtype=dtype).reshape(-1) for c in chunks])
        return self.tensor(name, whole.reshape(shape))


class ExternalSink:
    """Initializers of INLINE_BYTES or more appended to `data` (opened on first use), each at an offset that is a
    multiple of ALIGN; the graph records `location`, the data file's name beside it. A full disk is an
    ArtifactError naming the file."""

    def __init__(self, data: Path, location: str, progress: Callable[[int, int], None] | None = None) -> None:
        self.data, self.location, self.progress = data, location, progress
        self._file: BinaryIO | None = None
        self.written = 0  # bytes of the file so far (alignment padding included)
        self.tensors = 0  # tensors written to it so far

    def tensor(self, name: str, array: np.ndarray) -> TensorProto:
        array = np.asarray(array, order="C")
        if array.nbytes < INLINE_BYTES:
            return numpy_helper.from_array(array, name)
        return self.chunked(name, array.dtype, array.shape, [array])

    def chunked(self, name: str, dtype: np.dtype, shape: tuple[int, ...], chunks: Iterable[np.ndarray]
                ) -> TensorProto:
        f = self._open()
        offset = -self.written % ALIGN + self.written
        self._write(f, b"\0" * (offset - self.written))
        length = 0
        for chunk in chunks:
            data = np.ascontiguousarray(chunk, dtype=dtype)
            self._write(f, memoryview(data).cast("B"))
            length += data.nbytes
        expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if length != expected:
            raise ValueError(f"{name}: {length} bytes written, its shape {shape} holds {expected}")
        self.tensors += 1
        if self.progress is not None:
            self.progress(self.tensors, self.written)
        proto = TensorProto(name=name, dims=list(shape),
                            data_type=onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
        proto.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", str(offset)), ("length", str(length))):
            entry = proto.external_data.add()
            entry.key, entry.value = key, value
        return proto

    def close(self) -> None:
        """Flush the data file to disk (before the graph that points at it is written)."""
        if self._file is not None:
            try:
                self._file.flush()
                os.fsync(self._file.fileno())
            except OSError as e:
                raise _disk_error(self.data, e) from e
            finally:
                self._file.close()
                self._file = None

    def _open(self) -> BinaryIO:
        if self._file is None:
            self._file = self.data.open("wb")
        return self._file

    def _write(self, f: BinaryIO, data: bytes | memoryview) -> None:
        try:
            f.write(data)
        except OSError as e:
            raise _disk_error(self.data, e) from e
        self.written += len(data)


def _disk_error(path: Path, e: OSError) -> ArtifactError:
    if e.errno == errno.ENOSPC:
        return ArtifactError(f"{path}: the disk is full ({e.strerror}); nothing was written")
    return ArtifactError(f"{path}: cannot write ({e.strerror or e})")


def data_name(graph: Path) -> str:
    """The external data file's name of the graph at `graph` (`model.onnx` -> `model.onnx.data`)."""
    return graph.name + ".data"
