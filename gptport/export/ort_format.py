"""`gptport export --ort-format`: ONNX Runtime's own format (`.ort`), what onnxruntime Mobile and the
minimal builds load, beside each contract graph, plus the `required_operators.config` a custom minimal
build is made from (onnxruntime's own tools). The file records the optimization level it was saved at and
the onnxruntime version that wrote it (an `.ort` file of one version does not load in another: the
runtime refuses such a file in one line, runtime/ort_file.py). Each file is checked like every graph:
fp32 against its `.onnx` (logits and each layer's cache within ORT_TOL of their magnitude on the parity
cases, greedy tokens equal),
a quantized one through the accuracy gate."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gptport import atomic, contract, paths
from gptport.errors import UsageError, ValidationError
from gptport.export import validate
from gptport.export.tolerance import Tolerance, cache_quantities, compare, worst
from gptport.runtime import external_data
from gptport.runtime.onnx_engine import OnnxModel, load_cpu
from gptport.runtime.ort_file import META_LEVEL, META_RUNTIME
from gptport.training.model import GPT

# "basic" keeps the graph portable (constant folding and redundant-node removal only): "extended" and
# "all" bake in onnxruntime's CPU fusions (FusedMatMul, SkipLayerNormalization...) and, with NCHWc,
# x86 layouts that a phone's build may lack.
LEVELS = ("basic", "extended", "all")
# an fp32 .ort file against its .onnx: one runtime on both sides, but "extended" and "all" fuse other
# kernels in, so the bound is the export gate's (tolerance.py), relative to each quantity's magnitude
ORT_TOL = Tolerance()


@dataclass(frozen=True)
class OrtRow:
    """One .ort file written: its source graph and how it was checked."""

    path: Path
    source: Path
    level: str
    check: str  # "parity max |Δ| 3e-07, greedy 96 tokens" or the gate's figures


def write(source: Path, target: Path, level: str) -> None:
    """`source` (a gptport .onnx graph) saved by onnxruntime in its ORT format at `target` (the caller's
    temporary name), optimized at `level`, with the level and onnxruntime's version added to the graph's
    metadata."""
    import onnx
    import onnxruntime as ort

    if level not in LEVELS:
        raise UsageError(f"--ort-level {level!r} is unknown; choose from {', '.join(LEVELS)}")
    external_data.check(source)  # onnx.load reads its external data
    proto = onnx.load(str(source))
    meta = {p.key: p.value for p in proto.metadata_props}
    del proto.metadata_props[:]
    onnx.helper.set_model_props(proto, {**meta, META_LEVEL: level, META_RUNTIME: ort.__version__})
    tagged = atomic.temp_name(target.with_suffix(".onnx"))
    try:
        onnx.save_model(proto, str(tagged))
        so = ort.SessionOptions()
        so.graph_optimization_level = {"basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                       "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                                       "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[level]
        so.add_session_config_entry("session.save_model_format", "ORT")
        so.optimized_model_filepath = str(target)
        ort.InferenceSession(str(tagged), so, providers=["CPUExecutionProvider"])
    finally:
        tagged.unlink(missing_ok=True)

def check_fp32(model: GPT, onnx_graph: OnnxModel, ort_graph: OnnxModel, prompts: list[list[int]]) -> str:
    """The .ort file against its .onnx on the parity cases (the logits and each layer's cache within ORT_TOL),
    then greedy decoding against torch; raises ValidationError naming the file, the case and the quantity."""
    want_step, got_step = onnx_graph.step(), ort_graph.step()
    worst_diff = 0.0
    for name, ids, mask, pos, past in validate.cases(model, np.random.default_rng(0)):
        want_logits, want_present = want_step(ids, mask, pos, [p.astype(np.float32) for p in past])
        got_logits, got_present = got_step(ids, mask, pos, [p.astype(np.float32) for p in past])
        checks = [compare(validate.LOGITS, got_logits, want_logits, ORT_TOL)]
        checks += [compare(q, g, w, ORT_TOL) for q, g, w in zip(cache_quantities(model.cfg.n_layer), got_present,
                                                                want_present, strict=True)]
        bad = worst(checks)
        if not bad.ok:
            raise ValidationError(f"{ort_graph.path}: case {name} differs from {onnx_graph.path.name}: "
                                  f"{bad.describe()}; try --ort-level basic")
        worst_diff = max(worst_diff, *(c.diff for c in checks))
    n = validate.greedy_match(model, ort_graph, prompts)
    return f"max |Δ| vs .onnx {worst_diff:.1e}, greedy {n} tokens = torch"


def write_all(model_dir: Path, sources: Sequence[tuple[str, Path]], model: GPT, prompts: list[list[int]],
              windows: np.ndarray | None, level: str, say: Callable[[str], None] = lambda m: None) -> list[OrtRow]:
    """An .ort file beside each (precision, contract graph) of `sources`, checked, then the minimal build's
    operator config of them all. Nothing is left behind for a file that fails its check."""
    from onnxruntime.tools.ort_format_model.utils import create_config_from_models

    rows: list[OrtRow] = []
    for precision, source in sources:
        target = model_dir / contract.ort_file(precision)
        say(f"writing {target.name} (ORT format, level {level})")
        staged = target.with_name(f".{target.stem}.checking.ort")  # onnxruntime knows the format by its suffix
        write(source, staged, level)
        try:
            graph = load_cpu(staged)
            if precision == "fp32":
                check = check_fp32(model, load_cpu(source), graph, prompts)
            elif windows is not None:
                gate = validate.gate(model, graph, windows, f"{precision} ort")
                if not gate.ok:
                    raise ValidationError(f"{target}: top-1 agreement {gate.top1:.2%} with fp32 torch is below the "
                                          f"gate; try --ort-level basic")
                check = f"gate: top-1 {gate.top1:.2%}, mean KL {gate.mean_kl:.2e}"
            else:
                check = "unchecked (--no-gate)"
            os.replace(staged, target)
        finally:
            staged.unlink(missing_ok=True)
        rows.append(OrtRow(target, source, level, check))
    if rows:
        logging.getLogger("ort_format_model.utils").setLevel(logging.WARNING)  # its "Created config" line
        create_config_from_models([r.path for r in rows], model_dir / paths.REQUIRED_OPERATORS,
                                  enable_type_reduction=False)
    return rows
