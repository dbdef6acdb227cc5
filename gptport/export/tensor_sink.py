"""Where a graph's initializers go as the builder makes them: inline in the graph (a small model, one file), or
appended one tensor at a time to the graph's external data file (`<graph>.data`), so that no graph is ever held
whole in memory and none meets protobuf's 2 GB limit. Each tensor's bytes start at a multiple of ALIGN, which lets
onnxruntime map them from the file rather than copy them. No torch here."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
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

    def holds(self, names: Iterable[str]) -> bool:
        """Whether reuse() gives each of `names`."""
        ...

    def reuse(self, name: str) -> TensorProto | None:
        """The initializer `name` as an earlier graph of the same weights and scheme made it, its bytes copied
        from that graph's data file (ExternalSink's `earlier`); None: the builder makes it."""
        ...


class InlineSink:
    """Initializers inside the graph: what a small model's graphs are (one file each)."""

    def tensor(self, name: str, array: np.ndarray) -> TensorProto:
        return numpy_helper.from_array(np.asarray(array, order="C"), name)  # (a 0-d array stays 0-d)

    def chunked(self, name: str, dtype: np.dtype, shape: tuple[int, ...], chunks: Iterable[np.ndarray]
                ) -> TensorProto:
        whole = np.concatenate([np.ascontiguousarray(c, dtype=dtype).reshape(-1) for c in chunks])
        return self.tensor(name, whole.reshape(shape))

    def holds(self, names: Iterable[str]) -> bool:
        return False

    def reuse(self, name: str) -> TensorProto | None:
        return None


class ExternalSink:
    """Initializers of INLINE_BYTES or more appended to `data` (opened on first use), each at an offset that is a
    multiple of ALIGN; the graph records `location`, the data file's name beside it. A full disk is an
    ArtifactError naming the file. With `earlier` (what an earlier graph of the same weights and scheme wrote,
    unchanged since), the builder's weights of a name it made are copied from its file (reuse) rather than read,
    converted or quantized again: the static-cache graph after the contract graph. Each graph keeps a data file
    of its own (onnx refuses hard links, and either graph can be removed or replaced alone)."""

    def __init__(self, data: Path, location: str, progress: Callable[[int, int], None] | None = None,
                 earlier: Written | None = None) -> None:
        self.data, self.location, self.progress = data, location, progress
        self._file: BinaryIO | None = None
        self.written = 0  # bytes of the file so far (alignment padding included)
        self.tensors = 0  # tensors written to it so far
        self.made: dict[str, TensorProto] = {}  # every initializer made, by name (what a later graph reuses)
        self.earlier = earlier if earlier is not None and earlier.unchanged() else None

    def tensor(self, name: str, array: np.ndarray) -> TensorProto:
        array = np.asarray(array, order="C")
        if array.nbytes < INLINE_BYTES:
            self.made[name] = numpy_helper.from_array(array, name)
            return self.made[name]
        return self.chunked(name, array.dtype, array.shape, [array])

    def holds(self, names: Iterable[str]) -> bool:
        return self.earlier is not None and all(n in self.earlier.made for n in names)

    def reuse(self, name: str) -> TensorProto | None:
        made = self.earlier.made.get(name) if self.earlier is not None else None
        if made is None or made.data_location != TensorProto.EXTERNAL:
            return made
        assert self.earlier is not None
        where = {e.key: e.value for e in made.external_data}
        f = self._open()
        offset = -self.written % ALIGN + self.written
        self._write(f, b"\0" * (offset - self.written))
        f.flush()
        length = int(where["length"])
        try:
            with self.earlier.data.open("rb") as src:
                _copy(src, f, int(where["offset"]), length)
            f.seek(0, os.SEEK_END)  # the buffered writer's position after the kernel's copy
        except OSError as e:
            raise _disk_error(self.data, e) from e
        self.written += length
        proto = TensorProto()
        proto.CopyFrom(made)
        for entry in proto.external_data:
            if entry.key == "location":
                entry.value = self.location
            elif entry.key == "offset":
                entry.value = str(offset)
        return self._made(name, proto)

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
        proto = TensorProto(name=name, dims=list(shape),
                            data_type=onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
        proto.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.location), ("offset", str(offset)), ("length", str(length))):
            entry = proto.external_data.add()
            entry.key, entry.value = key, value
        return self._made(name, proto)

    def _made(self, name: str, proto: TensorProto) -> TensorProto:
        self.tensors += 1
        if self.progress is not None:
            self.progress(self.tensors, self.written)
        self.made[name] = proto
        return proto

    def written_data(self) -> Written | None:
        """What this sink's data file holds, for a later graph to reuse (None: it wrote no data file)."""
        if not self.data.is_file():
            return None
        return Written(self.data, _identity(self.data), dict(self.made))

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
            if self.data.is_symlink() or self.data.is_file():  # a new file: never truncate one reused from
                self.data.unlink()
            self._file = self.data.open("wb")
        return self._file

    def _write(self, f: BinaryIO, data: bytes | memoryview) -> None:
        try:
            f.write(data)
        except OSError as e:
            raise _disk_error(self.data, e) from e
        self.written += len(data)


@dataclass(frozen=True)
class Written:
    """A graph's data file as an ExternalSink left it: its path, identity (device, inode, size, mtime) and the
    initializers made, by name."""

    data: Path
    identity: tuple[int, int, int, int]
    made: dict[str, TensorProto]

    def unchanged(self) -> bool:
        """Whether the file is still the one written (not renamed, removed or written again since)."""
        try:
            return _identity(self.data) == self.identity
        except OSError:
            return False


def _identity(path: Path) -> tuple[int, int, int, int]:
    st = path.stat()
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _copy(src: BinaryIO, dst: BinaryIO, offset: int, length: int) -> None:
    """`length` bytes of `src` from `offset` appended to `dst` (flushed): in the kernel where it can
    (copy_file_range: no user-space copy, a shared extent on a filesystem that has them)."""
    out, done = dst.fileno(), 0
    while done < length:
        try:
            n = os.copy_file_range(src.fileno(), out, length - done, offset + done)
        except (AttributeError, OSError):  # no such call here, or not across these files: read and write
            n = 0
        if not n:
            src.seek(offset + done)
            block = src.read(min(length - done, 1 << 26))
            if not block:
                raise OSError(errno.EIO, f"{src.name}: shorter than its graph says")
            n = os.write(out, block)
        done += n


def _disk_error(path: Path, e: OSError) -> ArtifactError:
    if e.errno == errno.ENOSPC:
        return ArtifactError(f"{path}: the disk is full ({e.strerror}); nothing was written")
    return ArtifactError(f"{path}: cannot write ({e.strerror or e})")


def data_name(graph: Path) -> str:
    """The external data file's name of the graph at `graph` (`model.onnx` -> `model.onnx.data`)."""
    return graph.name + ".data"
