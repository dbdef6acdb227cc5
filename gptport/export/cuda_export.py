"""export --cuda: the static-cache graphs the CUDA provider decodes with (cuda_graphs.py), written beside
the graphs `export` wrote and checked on the CPU before each is renamed into place:
- model.decode.onnx (fp32, TensorScatter + Attention-24): parity with torch on decode steps of rows at
  different lengths (decode_check.py), the bound of the static-cache graphs;
- model.fp16.static.onnx (float16 GroupQueryAttention), with fp16 in --precision: the fp16 variant's
  accuracy gate (top-1 agreement with fp32 torch on held-out text), on the CPU provider, whose
  GroupQueryAttention runs float16 too; with --no-gate written unchecked and marked so.
The multi-row append graph (model.append.onnx, written by export with the static-cache graphs) does the
fp32 prefills on CUDA: it must be there."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from gptport import atomic, contract, provenance
from gptport import tokenizer as bpe
from gptport.errors import ArtifactError
from gptport.export import cuda_graphs, decode_check, gqa_graph, validate
from gptport.export.exporter import metadata, save, set_metadata
from gptport.export.tolerance import Tolerance
from gptport.runtime.onnx_engine import load_cpu
from gptport.training.checkpoint import ModelCard, load_model
from gptport.training.model import GPT

DEFAULT_TOL = Tolerance()  # the parity bound of every fp32 graph export writes (tolerance.py)


@dataclass
class CudaReport:
    """What export --cuda wrote and measured."""

    files: dict[str, Path] = field(default_factory=dict)  # "fp32 decode", "fp16 static" -> path
    decode_parity: list[validate.ParityRow] = field(default_factory=list)
    gate: validate.GateRow | None = None  # the fp16 static-cache graph's; None when ungated or not made
    skipped: dict[str, str] = field(default_factory=dict)  # graph -> why it was not written


def write(model_dir: Path, precisions: Sequence[str], gate: bool = True, heldout: Path | None = None,
          sampled_text: bool = False, tol: Tolerance = DEFAULT_TOL, force: bool = False,
          say: Callable[[str], None] = lambda m: None) -> CudaReport:
    """Write and check the CUDA static-cache graphs of `model_dir` (fp32's decode graph; fp16's static-cache
    graph when fp16 is among `precisions`). An existing file is replaced only with `force`."""
    report = CudaReport()
    tok = bpe.load(model_dir)
    sources = provenance.sources(model_dir)
    model, card = load_model(model_dir, tok)
    weights = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}  # gptport's names
    config = card.model
    decode = model_dir / contract.onnx_file("fp32", contract.CACHE_DECODE)
    half = model_dir / contract.onnx_file("fp16", contract.CACHE_STATIC)
    targets = [decode] + ([half] if "fp16" in precisions else [])
    existing = [str(p) for p in targets if p.exists()]
    if existing and not force:
        raise ArtifactError(f"{', '.join(existing)} already exist(s); pass --force to replace")
    why = cuda_graphs.unsupported(config)
    append = model_dir / contract.onnx_file("fp32", contract.CACHE_APPEND)
    if not why and not append.is_file():
        why = f"{append} is missing (its prefills): export without --no-static first"
    if why:
        report.skipped["fp32 decode"] = why
    else:
        say("building the decode graph (TensorScatter + Attention, one token per row) and checking it on the CPU")
        tmp = atomic.temp_name(decode)
        save(cuda_graphs.build_decode(config, weights), tmp, metadata(card, "fp32", contract.CACHE_DECODE, sources))
        try:
            onnx.checker.check_model(str(tmp), full_check=True)
            report.decode_parity = decode_check.decode_parity(model, load_cpu(tmp).session, tol)
            validate.refuse("decode graph parity", report.decode_parity)
            os.replace(tmp, decode)
        finally:
            tmp.unlink(missing_ok=True)
        report.files["fp32 decode"] = decode
    if "fp16" in precisions:
        _fp16_static(report, model_dir, model, card, weights, half, gate, heldout, sampled_text, sources, say)
    return report


def _fp16_static(report: CudaReport, model_dir: Path, model: GPT, card: ModelCard, weights: dict[str, Any],
                 half: Path, gate: bool, heldout: Path | None, sampled_text: bool, sources: dict[str, str],
                 say: Callable[[str], None]) -> None:
    """model.fp16.static.onnx from the model's weights, gated like the fp16 variant (or marked ungated)."""
    why = gqa_graph.unsupported(card.model) or cuda_graphs.unchecked(card.model)
    if why:
        report.skipped["fp16 static"] = why
        return
    say("making the fp16 static-cache graph (float16 GroupQueryAttention)")
    tmp = atomic.temp_name(half)
    try:
        cuda_graphs.fp16_static(card.model, weights, tmp)
        if not gate:
            set_metadata(tmp, metadata(card, "fp16", contract.CACHE_STATIC, sources, gated=False))
        else:
            text = validate.heldout(model_dir, model, bpe.load(model_dir), heldout, sampled_text)
            set_metadata(tmp, metadata(card, "fp16", contract.CACHE_STATIC, sources, gate_text=text.source))
            report.gate = validate.gate(model, load_cpu(tmp), text.windows, "fp16 static")
            if not report.gate.ok:
                report.skipped["fp16 static"] = (f"its gate failed: top-1 {report.gate.top1:.1%} of "
                                                 f"{report.gate.positions} positions")
                return
        os.replace(tmp, half)
        report.files["fp16 static"] = half
    finally:
        tmp.unlink(missing_ok=True)
