"""An ONNX graph's external data kept inside the graph's directory: every tensor stored outside the .onnx file
names its file by a `location` relative to the graph, and a stranger's graph could name `../secret`, an absolute
path, or a symlink leading out. `check` refuses such a graph in one line naming it and the location, before
onnxruntime or onnx reads any of that data (onnxruntime 1.31 and onnx 1.23 refuse these too: this holds whatever
version is installed).

What it costs: a tensor's external data is named by a string entry whose key is the bytes `location`, so a graph
that holds none of them has no external data at all; those bytes are looked for first (a memory-mapped scan, about
3 GB/s). Only a graph that holds them is parsed, without its external data (a graph with external data is small:
its weights are elsewhere). No torch here."""

from __future__ import annotations

import mmap
import os
import posixpath
from collections.abc import Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from gptport.errors import ArtifactError, escaped, first_line

MARK = b"location"  # the key of the entry that names a tensor's external file


def mentions_external_data(path: Path) -> bool:
    """Whether the graph's bytes hold MARK at all (without it, no tensor of it has external data)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return False
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return mm.find(MARK) >= 0


def _tensors(graph: Any) -> Iterator[Any]:
    """Every TensorProto of a graph: initializers (sparse ones' values and indices), node attributes, and those of
    subgraphs (If, Loop, Scan bodies), depth first."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    for node in graph.node:
        yield from _attribute_tensors(node.attribute)


def _attribute_tensors(attributes: Any) -> Iterator[Any]:
    for a in attributes:
        if a.HasField("t"):
            yield a.t
        yield from a.tensors
        if a.HasField("sparse_tensor"):
            yield from (a.sparse_tensor.values, a.sparse_tensor.indices)
        for sub in (*([a.g] if a.HasField("g") else []), *a.graphs):
            yield from _tensors(sub)


def locations(path: Path) -> list[tuple[str, str]]:
    """(tensor name, location) of each tensor of the graph at `path` whose data lies in another file, read
    without that data."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        proto = onnx.load_model(str(path), load_external_data=False)
    except (onnx.onnx_cpp2py_export.checker.ValidationError, OSError, ValueError, DecodeError) as e:
        raise ArtifactError(f"{path}: not a readable ONNX file ({escaped(first_line(e))})") from e
    tensors = [*_tensors(proto.graph), *(t for f in proto.functions for n in f.node
                                         for t in _attribute_tensors(n.attribute))]
    found = []
    for t in tensors:
        entries = {e.key: e.value for e in t.external_data}
        if t.data_location == onnx.TensorProto.EXTERNAL or "location" in entries:
            found.append((t.name, entries.get("location", "")))
    return found


def outside(directory: Path, location: str) -> str:
    """Why `location` does not name a file inside `directory` ("" when it does): empty, absolute, with a `..`
    part, or leading out through a symlink."""
    if not location:
        return "the location is empty"
    if (PurePosixPath(location).is_absolute() or PureWindowsPath(location).is_absolute()
            or PureWindowsPath(location).drive):
        return "an absolute path"
    if posixpath.normpath(location.replace("\\", "/")).split("/")[0] == "..":
        return "it climbs out with `..`"
    if not (directory / location).resolve().is_relative_to(directory.resolve()):
        return "a symlink leads out"
    return ""


def check(path: Path) -> None:
    """Refuse the graph at `path` when a tensor's external data lies outside its directory, in one line naming
    the graph and the location; a graph that mentions no external data costs one scan of its bytes."""
    if path.suffix != ".onnx":
        return
    try:
        if not mentions_external_data(path):
            return
    except OSError as e:
        raise ArtifactError(f"{path}: unreadable ({e.strerror or first_line(e)})") from e
    for name, location in locations(path):
        why = outside(path.parent, location)
        if why:
            raise ArtifactError(f"{path}: the external data of tensor {escaped(name)}, {escaped(repr(location))}, "
                                f"lies outside the graph's directory ({why}); refusing to open it")
