"""A trained model directory with the CUDA static-cache graphs (export --cuda) beside the others, for the
tests of those graphs on the CPU (runtime, serve) and on a GPU."""

from __future__ import annotations

import shutil
from pathlib import Path


def with_cuda_graphs(trained_dir: Path, out: Path) -> Path:
    """A copy of `trained_dir` (exported fp32, int8, fp16) at `out` with model.decode.onnx and
    model.fp16.static.onnx written and checked (gated on its validation shard)."""
    from gptport.export import cuda_export

    shutil.copytree(trained_dir, out)
    report = cuda_export.write(out, ["fp32", "fp16"])
    assert not report.skipped, report.skipped
    return out
