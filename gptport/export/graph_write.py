"""A built graph to its file: the builder's initializers streamed into the graph's own external data
(`<graph>.data`, tensor_sink.py) when the model is large, inline otherwise, then the graph itself (a few hundred
KiB without its weights) with its metadata; and a checked graph renamed into place with its data file. No torch
here."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import onnx

from gptport.export.tensor_sink import EXTERNAL_FROM_BYTES, ExternalSink, InlineSink, Sink, Written, data_name
from gptport.weights import shapes_of


def external(param_bytes: int) -> bool:
    """Whether a model whose float32 weights take `param_bytes` gets external data (default: past 1 GiB)."""
    limit = os.environ.get("GPTPORT_EXTERNAL_FROM_BYTES")
    return param_bytes > (int(limit) if limit else EXTERNAL_FROM_BYTES)


def write(path: Path, build: Callable[[Sink], onnx.ModelProto], meta: dict[str, str], outside: bool,
          progress: Callable[[int, int], None] | None = None, earlier: Written | None = None) -> Written | None:
    """The graph `build` makes, its initializers streamed into `path`'s data file when `outside` (`progress` told
    the tensors and bytes written after each; `earlier`: an earlier graph's data of the same weights and scheme,
    whose weights are copied rather than made again), written to `path` with `meta` as its metadata_props.
    Returns what its data file holds (None: its weights are inline), for a later graph to reuse."""
    if not outside:
        proto = build(InlineSink())
        onnx.helper.set_model_props(proto, meta)
        onnx.save_model(proto, str(path))
        return None
    sink = ExternalSink(path.with_name(data_name(path)), data_name(path), progress, earlier)
    proto = build(sink)
    sink.close()
    onnx.helper.set_model_props(proto, meta)
    onnx.save_model(proto, str(path))
    return sink.written_data()


def estimate(weights: Mapping[str, np.ndarray], precision: str, vocab_rows: int) -> int:
    """Bytes a graph of `precision` writes for `weights` (the builder's layout): float32 for fp32, the embeddings
    and norms; MatMulNBits' bits plus a float32 scale a block of 32 for the matrices of int8 and int4; fp16 half
    of fp32. An estimate for the disk check, within a few percent."""
    total, shapes = 0, shapes_of(weights)
    for name, shape in shapes.items():
        count = int(np.prod(shape))
        matrix = len(shape) == 2 and name != "wte.weight" and name != "wpe.weight"
        if precision in ("int8", "int4") and matrix:
            total += count * (8 if precision == "int8" else 4) // 8 + count // 32 * 4
        else:
            total += count * (2 if precision == "fp16" else 4)
    tied_head = "lm_head.weight" not in weights and precision in ("int8", "int4")
    return total + (vocab_rows * shapes["wte.weight"][1] if tied_head else 0)  # its own 8-bit matrix


def data_of(path: Path) -> Path | None:
    """The external data file the graph at `path` reads (None: its weights are inline)."""
    data = path.with_name(data_name(path))
    return data if data.is_file() else None


def place(tmp: Path, final: Path) -> None:
    """The checked graph at `tmp` renamed to `final`, its data file (if any) to final's, the graph's
    references rewritten to that name; a data file an earlier export left beside `final` is removed."""
    data = data_of(tmp)
    old = final.with_name(data_name(final))
    if data is None:
        os.replace(tmp, final)
        old.unlink(missing_ok=True)
        return
    proto = onnx.load(str(tmp), load_external_data=False)
    for init in proto.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                entry.value = old.name
    onnx.save_model(proto, str(tmp))
    os.replace(data, old)
    os.replace(tmp, final)


def weight_bytes(path: Path) -> int:
    """Bytes of the graph's initializers: inline and external alike."""
    proto = onnx.load(str(path), load_external_data=False)
    total = 0
    for init in proto.graph.initializer:
        lengths = [int(e.value) for e in init.external_data if e.key == "length"]
        total += lengths[0] if lengths else len(init.raw_data) or onnx.numpy_helper.to_array(init).nbytes
    return total
