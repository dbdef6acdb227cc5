"""A cache of torch -> ONNX traces, on where GPTPORT_TRACE_CACHE names a folder: the graph `to_onnx` gives for
a model is stored under a key of everything the trace depends on (the weights' names, dtypes, shapes and bytes,
the config, the opset, the rewrite rules, gptport's own source and the versions of torch, onnxscript, onnx_ir and
onnx), and a later export of the same model reads it instead of tracing again (design record 0041). Off by
default; the test suite turns it on for its session, where one seeded model is exported by many tests."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import onnx
import torch

from gptport.atomic import atomic_path
from gptport.training.model import GPT

ENV = "GPTPORT_TRACE_CACHE"
PROTO_LIMIT = 2**31 - 2**26  # protobuf's 2 GiB, with room: a larger graph is traced each time, not stored
PACKAGES = ("torch", "onnxscript", "onnx_ir", "onnx")


def folder() -> Path | None:
    """The cache's folder, or None where GPTPORT_TRACE_CACHE is unset or empty."""
    value = os.environ.get(ENV, "").strip()
    return Path(value) if value else None


@cache
def source_digest() -> str:
    """sha256 of gptport's own source files (the model's code and the exporter's among them)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "?"
    return out


def key(model: GPT, opset: int, rules: str) -> str:
    """The hex sha256 naming `model`'s trace at `opset` tidied by the rule set named `rules`."""
    h = hashlib.sha256()
    head = {"class": f"{type(model).__module__}.{type(model).__qualname__}", "config": asdict(model.cfg),
            "training": model.training, "opset": opset, "source": source_digest(), "versions": _versions(),
            "rules": rules}
    h.update(json.dumps(head, sort_keys=True, default=str).encode())
    for name, tensor in model.state_dict().items():  # (...) each parameter and persistent buffer, in order
        t = tensor.detach().contiguous().cpu()
        h.update(f"\0{name}\0{t.dtype}\0{tuple(t.shape)}\0".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def traced(model: GPT, opset: int, rules: str | None, trace: Callable[[], onnx.ModelProto]) -> onnx.ModelProto:
    """`trace()`'s graph of `model`, read from the cache where it holds it, else traced and stored there (by a
    temporary name renamed into place, so processes sharing the folder never read half a file). `rules` names
    the rewrite rules `trace` tidies with; None (rules of the caller's own) is traced each time."""
    where = folder()
    if where is None or rules is None:
        return trace()
    path = where / f"{key(model, opset, rules)}.onnx"
    if path.is_file():
        return onnx.load_model(str(path), load_external_data=False)
    proto = trace()
    if proto.ByteSize() < PROTO_LIMIT:
        where.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.write_bytes(proto.SerializeToString())
    return proto
