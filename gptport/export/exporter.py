"""The export: the fp32 graph under the I/O contract (torch_to_onnx.py), validated against the torch
model before it is renamed into place, then the requested variants and static-cache graphs. `export`
reads top to bottom as its steps; each graph it may write is a `Graph`, what they share a `_Job`."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx

from gptport import atomic, contract, provenance
from gptport import tokenizer as bpe
from gptport.errors import ArtifactError, UsageError, ValidationError
from gptport.export import append_check, calibration, genai, gqa_graph, heap, kv_quant, validate, variants
from gptport.export.export_report import ExportReport, parse_precisions
from gptport.export.graph_files import metadata, remove_stale, save, save_static, set_metadata, size_ratio
from gptport.export.ort_format import LEVELS as ORT_LEVELS
from gptport.export.ort_format import write_all
from gptport.export.tolerance import Tolerance
from gptport.export.torch_to_onnx import to_onnx, untie_folded_head
from gptport.runtime.engine import StepFn
from gptport.runtime.onnx_engine import load_cpu
from gptport.training.checkpoint import ModelCard, load_model
from gptport.training.model import GPT

__all__ = ["ExportReport", "Graph", "export", "metadata", "parse_precisions", "save", "save_static", "set_metadata"]

STATIC_PRECISIONS = ("fp32", "int8", "int4")  # GroupQueryAttention on the CPU runs float32
DEFAULT_TOL = Tolerance()  # the parity gate's bound of each quantity, relative to its magnitude (tolerance.py)


@dataclass(frozen=True)
class Graph:
    """One graph export writes: its precision, cache layout and file in the model directory."""

    precision: str
    cache: str
    path: Path

    @property
    def label(self) -> str:
        """"int8", "int8 static": its key in ExportReport.files and .schemes and its gate row's name."""
        return self.precision if self.cache == contract.CACHE_CONCAT else f"{self.precision} {self.cache}"


@dataclass
class _Job:
    """What the steps of one export share: the model, where its graphs go, and what has passed."""

    model_dir: Path
    tok: bpe.BPETokenizer
    model: GPT
    card: ModelCard
    sources: Mapping[str, str]  # provenance.sources, hashed once before the model was loaded
    tol: Tolerance
    say: Callable[[str], None]
    report: ExportReport
    graphs: list[Graph] = field(default_factory=list)  # every graph asked for, contract graphs first
    windows: np.ndarray | None = None  # the gate's held-out windows; None: --no-gate (or no variant)
    prompts: list[list[int]] = field(default_factory=list)  # of the greedy check
    plain: Path | None = None  # the unfused fp32 graph (temporary): what the variants are made from
    passed: dict[Graph, Path] = field(default_factory=dict)  # graph -> its checked temporary file
    float64: StepFn | None = None  # the model in float64 (validate.exact_step): made once, dropped after the last check
    ranges: variants.Ranges | None = None  # the activations' ranges a smoothing scheme needs: measured once

    def ranges_for(self, scheme: str) -> variants.Ranges | None:
        """The activations' ranges if `scheme` smooths (on every other gate window, measured on first use)."""
        known = variants.SCHEMES.get(scheme)  # "": fp16, which has no scheme
        if known is None or not known.smooth or self.windows is None:
            return None
        if self.ranges is None:
            self.say("measuring the activations' channel ranges for smoothing (every other gate window)")
            self.ranges = calibration.activation_ranges(self.model, self.windows[::2])
        return self.ranges

    def exact(self) -> StepFn:
        """The float64 reference every parity check measures torch's rounding against, made on first use."""
        if self.float64 is None:
            self.float64 = validate.exact_step(self.model)
        return self.float64

    def graph(self, precision: str, cache: str = contract.CACHE_CONCAT) -> Graph | None:
        return next((g for g in self.graphs if g.precision == precision and g.cache == cache), None)


def export(
    model_dir: Path,
    precisions: Sequence[str] = ("fp32",),
    optimize: bool = True,
    static: bool = True,
    opset: int = 18,
    tol: Tolerance = DEFAULT_TOL,
    force: bool = False,
    say: Callable[[str], None] = lambda msg: None,
    gate: bool = True,
    heldout: Path | None = None,
    sampled_text: bool = False,
    ort_level: str | None = None,
    kv_dtype: str = "float32",
) -> ExportReport:
    """Export, validate and write model.onnx and the variants asked for. The fp32 graphs' logits and each
    layer's keys and values must lie within `tol` of torch's, relative to each quantity's magnitude
    (tolerance.py). Nothing is written for a precision whose checks fail; every file is renamed into place
    only after it passed. With `optimize` (the default: it decodes faster), model.onnx is the graph fused by
    onnxruntime's transformer optimizer; the variants are made from the plain graph, which quantizes better.
    With `static` (the default), the static-cache graphs of fp32, int8 and int4 are written beside them
    (gqa_graph.py: the CPU's fastest decoding), checked the same way. Every graph records the sha256 of the
    weights and config.json it was made from; after the export, the graphs in `model_dir` of other weights
    are removed (listed in report.removed).

    The variants' gate scores `heldout` (a text file), else data/val.bin, else, only with
    `sampled_text`, the model's own samples; with none of them a variant is refused before anything is
    written. Without `gate` (untrained weights cannot pass it: speed measurements) the variants are
    written unchecked with the first scheme of their ladder and record gptport.gated = false. With
    `ort_level`, each contract graph is also written in ONNX Runtime's format (ort_format.py), checked.
    With `kv_dtype` int8, each static-cache graph also gets an int8-cache twin (kv_quant.py), its scales
    calibrated on the gate's text and gated against the float32 cache (with --no-gate: calibrated on
    the model's own samples, unchecked)."""
    _check_options(opset, gate, heldout, sampled_text)
    if kv_dtype not in contract.KV_DTYPES:
        raise UsageError(f"--kv-dtype {kv_dtype!r} is unknown; choose from {', '.join(contract.KV_DTYPES)}")
    if kv_dtype == "int8" and not static:
        raise UsageError("--kv-dtype int8 --no-static: the int8 cache is the static-cache graphs'; drop --no-static")
    if ort_level is not None and ort_level not in ORT_LEVELS:
        raise UsageError(f"--ort-level {ort_level!r} is unknown; choose from {', '.join(ORT_LEVELS)}")
    heap.return_large_blocks()  # a graph or session dropped goes back to the system (heap.py)
    job = _open(model_dir, gate, tol, say)
    _plan(job, precisions, static, force, kv_dtype)
    if gate and (len(precisions) > 1 or kv_dtype == "int8"):
        _gate_text(job, heldout, sampled_text)
    try:
        _check_fp32(job, opset)
        if optimize:
            _optimize_fp32(job)
        static_graphs = any(g.cache == contract.CACHE_STATIC for g in job.graphs)
        if static_graphs:
            _static_fp32(job)
            _append_graph(job)
        job.float64 = None  # the last parity check is done: free the float64 copy before the variants
        for g in job.graphs:
            if g.cache == contract.CACHE_CONCAT and g.precision != "fp32":
                job.say(f"making the {g.precision} variant")
                _variant(job, g, variants.LADDER.get(g.precision, ("",)))
        if static_graphs:
            _static_variants(job)
        if any(g.cache == contract.CACHE_STATIC_KV8 for g in job.graphs):
            _kv8_graphs(job)
        _rename_into_place(job)
        if ort_level is not None:
            _ort_files(job, ort_level)
        job.report.removed.update(remove_stale(model_dir, job.sources, set(job.report.files.values())))
        _side_files(job)
    finally:
        for p in model_dir.glob(".model*.tmp-*"):
            p.unlink(missing_ok=True)
    return job.report


def _check_options(opset: int, gate: bool, heldout: Path | None, sampled_text: bool) -> None:
    if opset < 18:
        raise UsageError(f"--opset {opset}: the exporter needs opset 18 or later")
    if not gate and (heldout is not None or sampled_text):
        raise UsageError("--no-gate writes the variants unchecked; --heldout and --gate-on-sampled-text choose the "
                         "gate's text: give one or the other")


def _open(model_dir: Path, gate: bool, tol: Tolerance, say: Callable[[str], None]) -> _Job:
    """The tokenizer, the hashes of the sources, then the model (a file replaced meanwhile fails the check); the
    job's say() frees what the last step left (heap.release) before it announces the next."""
    tok = bpe.load(model_dir)
    sources = provenance.sources(model_dir)
    model, card = load_model(model_dir, tok)

    def step(message: str) -> None:  # each step announced after what the last one left is freed
        heap.release()
        say(message)

    return _Job(model_dir, tok, model, card, sources, tol, step, ExportReport(gated=gate))


def _plan(job: _Job, precisions: Sequence[str], static: bool, force: bool, kv_dtype: str = "float32") -> None:
    """The graphs to write: each precision's contract graph, then the static-cache graphs where the model
    can have them (report.static_skipped says why not); refused if one exists and not `force`."""
    report = job.report
    job.graphs = [Graph(p, contract.CACHE_CONCAT, job.model_dir / contract.onnx_file(p)) for p in precisions]
    report.static_skipped = gqa_graph.unsupported(job.card.model) if static else ""
    if static and not report.static_skipped:
        job.graphs += [Graph(p, contract.CACHE_STATIC, job.model_dir / contract.onnx_file(p, contract.CACHE_STATIC))
                       for p in precisions if p in STATIC_PRECISIONS]
        append = contract.CACHE_APPEND  # its multi-row append twin (fp32, float32 cache)
        job.graphs.append(Graph("fp32", append, job.model_dir / contract.onnx_file("fp32", append)))
        if kv_dtype == "int8":
            job.graphs += [Graph(g.precision, contract.CACHE_STATIC_KV8,
                                 job.model_dir / contract.onnx_file(g.precision, contract.CACHE_STATIC_KV8))
                           for g in list(job.graphs) if g.cache == contract.CACHE_STATIC]
    elif kv_dtype == "int8":
        raise UsageError(f"--kv-dtype int8: this model has no static-cache graph ({report.static_skipped})")
    existing = [str(g.path) for g in job.graphs if g.path.exists()]
    if existing and not force:
        raise ArtifactError(f"{', '.join(existing)} already exist(s); pass --force to replace")


def _gate_text(job: _Job, heldout: Path | None, sampled_text: bool) -> None:
    """The held-out text the variants' gate scores (validate.heldout), before anything is written."""
    text = validate.heldout(job.model_dir, job.model, job.tok, heldout, sampled_text)
    job.report.heldout, job.report.sampled = text.source, text.sampled
    job.windows = text.windows


def _write_plain(job: _Job, opset: int) -> Path:
    """The graph torch.export gives, saved under a temporary name once every weight is found stored once (the
    graph in memory is freed on return: it is as large as the model)."""
    fp32 = job.graph("fp32")
    assert fp32 is not None  # parse_precisions puts fp32 first
    job.say("exporting fp32 graph (torch.export)")
    proto = to_onnx(job.model, opset)
    job.plain = atomic.temp_name(fp32.path)
    job.report.size_ratio = size_ratio(proto, job.model)
    save(proto, job.plain, metadata(job.card, "fp32", sources=job.sources))
    if job.report.size_ratio > 1.01:
        raise ValidationError(f"export: model.onnx holds {job.report.size_ratio:.3f}x the parameter bytes "
                              "(a weight is stored twice); not written")
    return job.plain


def _check_fp32(job: _Job, opset: int) -> None:
    """The exported graph, saved under a temporary name and checked: every weight stored once,
    onnx.checker, parity with torch, greedy decoding. It is model.onnx unless it is optimized."""
    fp32 = job.graph("fp32")
    assert fp32 is not None
    report, model, plain = job.report, job.model, _write_plain(job, opset)
    job.say("checking fp32 graph: onnx.checker, onnxruntime, parity, greedy decoding")
    onnx.checker.check_model(str(plain), full_check=True)
    onnx_model = load_cpu(plain)
    report.parity = validate.parity(model, onnx_model.step(), job.tol, exact=job.exact())
    validate.refuse("fp32 parity", report.parity)
    job.prompts = validate.prompts(job.model_dir, job.tok, job.card.model.n_ctx, config=job.card.model)
    report.greedy_tokens = validate.greedy_match(model, onnx_model, job.prompts)
    job.passed[fp32] = job.plain


def _optimize_fp32(job: _Job) -> None:
    """model.onnx becomes the graph fused by onnxruntime's transformer optimizer, checked again; the
    variants are still made from the plain graph, which quantizes better."""
    assert job.plain is not None
    fp32 = job.graph("fp32")
    assert fp32 is not None
    job.say("optimizing with onnxruntime's transformer optimizer")
    optimized, job.report.fused = variants.optimize(job.plain, job.card.model)
    heap.release()  # the optimizer leaves model-sized reference cycles
    proto = onnx.load(str(optimized))
    optimized.unlink()
    if job.card.model.tie_embeddings:
        untie_folded_head(proto)  # the optimizer folds the head's transpose again
    if size_ratio(proto, job.model) > 1.01:
        raise ValidationError("export: the optimized graph stores a weight twice; not written")
    job.passed[fp32] = atomic.temp_name(fp32.path)
    save(proto, job.passed[fp32], metadata(job.card, "fp32", sources=job.sources))
    del proto  # as large as the model: not kept while its session runs
    validate.check_again(job.model, load_cpu(job.passed[fp32]), job.tol, "optimized fp32", exact=job.exact())


def _static_fp32(job: _Job) -> None:
    """The fp32 static-cache graph, built from the weights and checked like model.onnx."""
    job.say("building the static-cache graph (GroupQueryAttention, cache preallocated at n_ctx)")
    fp32 = job.graph("fp32", contract.CACHE_STATIC)
    assert fp32 is not None
    tmp = atomic.temp_name(fp32.path)
    save_static(job.model, job.card, tmp, job.sources)
    onnx.checker.check_model(str(tmp), full_check=True)
    engine = load_cpu(tmp)
    job.report.static_parity = validate.static_parity(job.model, engine, job.tol, exact=job.exact())
    validate.refuse("static-cache graph parity", job.report.static_parity)
    validate.greedy_match(job.model, engine, job.prompts)
    job.passed[fp32] = tmp


def _static_variants(job: _Job) -> None:
    """The int8/int4 static-cache graphs of the precisions whose contract graph and fp32 static graph passed,
    quantized from the latter, starting with the scheme their contract twin shipped, and gated again."""
    fp32 = job.graph("fp32", contract.CACHE_STATIC)
    if fp32 not in job.passed:
        return
    for g in job.graphs:
        twin = job.graph(g.precision)
        if g.cache != contract.CACHE_STATIC or g.precision == "fp32" or twin not in job.passed:
            continue
        job.say(f"making the {g.precision} static-cache variant")
        ladder = variants.LADDER[g.precision]
        _variant(job, g, ladder[ladder.index(job.report.schemes[g.precision]):], source=job.passed[fp32])


def _append_graph(job: _Job) -> None:
    """The multi-row append graph (scatter_graph.py) beside the fp32 static-cache graph that passed, checked
    against torch on appends of uneven chunks to several rows of one cache (append_check.py)."""
    static, graph = job.graph("fp32", contract.CACHE_STATIC), job.graph("fp32", contract.CACHE_APPEND)
    if graph is None or static not in job.passed:
        return
    job.say("building the multi-row append graph (TensorScatter + Attention over the static cache's buffers)")
    tmp = atomic.temp_name(graph.path)
    save_static(job.model, job.card, tmp, job.sources, contract.CACHE_APPEND)
    onnx.checker.check_model(str(tmp), full_check=True)
    rows = append_check.append_parity(job.model, load_cpu(job.passed[static]), load_cpu(tmp).session, job.tol,
                                      exact=job.exact())
    job.report.append_parity = rows
    validate.refuse("multi-row append graph parity", rows)
    job.passed[graph] = tmp


def _kv8_graphs(job: _Job) -> None:
    """The int8-cache twin of each static-cache graph that passed (kv_quant.make), scales calibrated once
    on the fp32 static graph."""
    fp32 = job.graph("fp32", contract.CACHE_STATIC)
    if fp32 not in job.passed:
        return
    windows = job.windows if job.windows is not None else validate.sampled_windows(job.model)
    job.say("calibrating the int8 KV cache's scales")
    amax = kv_quant.calibrate(load_cpu(job.passed[fp32]), windows)
    for g in job.graphs:
        twin = job.graph(g.precision, contract.CACHE_STATIC)
        if g.cache == contract.CACHE_STATIC_KV8 and twin in job.passed:
            job.say(f"making the {g.precision} static-cache graph's int8 KV cache")
            made = kv_quant.make(g.label, job.passed[twin], g.path, amax, windows, bpe.token_bytes(job.tok),
                                 gated=job.windows is not None, rows=job.report.kv_gates)
            if made is not None:
                job.passed[g] = made


def _variant(job: _Job, graph: Graph, schemes: Sequence[str], source: Path | None = None) -> None:
    """The `graph` variant of the fp32 graph at `source` (the plain contract graph by default), under a
    temporary name, made with the first of `schemes` that passes the accuracy gate on job.windows (each
    try recorded in the report); nothing, and nothing left behind, if none does. Without windows
    (--no-gate): the first scheme that applies, unchecked, recorded as ungated."""
    fp32 = source or job.plain
    assert fp32 is not None
    report, card, tmp = job.report, job.card, atomic.temp_name(graph.path)
    if job.windows is None:
        scheme = next((s for s in schemes if _made(job, graph, fp32, tmp, s)), None)
        if scheme is None:  # the ladders end with a scheme every graph takes: not reached today
            job.say(f"{graph.label}: none of {', '.join(schemes)} applies to this model")
            return
        set_metadata(tmp, metadata(card, graph.precision, graph.cache, job.sources, gated=False))
        report.schemes[graph.label] = scheme
        job.passed[graph] = tmp
        return
    for scheme in schemes:
        if not _made(job, graph, fp32, tmp, scheme):
            continue
        set_metadata(tmp, metadata(card, graph.precision, graph.cache, job.sources, gate_text=report.heldout))
        gate = replace(validate.gate(job.model, load_cpu(tmp), job.windows, graph.label), scheme=scheme)
        report.gates.append(gate)
        if gate.ok:
            report.schemes[graph.label] = scheme
            job.passed[graph] = tmp
            return
    tmp.unlink(missing_ok=True)


def _made(job: _Job, graph: Graph, fp32: Path, tmp: Path, scheme: str) -> bool:
    """Whether `scheme` made the `graph` variant at `tmp`; where it does not apply, why is said and reported."""
    try:
        variants.make(graph.precision, fp32, tmp, job.card.model, scheme, job.ranges_for(scheme))
    except variants.NotApplicable as e:
        job.say(f"{graph.label}: {scheme} does not apply ({e})")
        job.report.not_applied.append((graph.label, scheme, str(e)))
        return False
    return True


def _rename_into_place(job: _Job) -> None:
    """Each graph that passed renamed into place (report.files); an earlier export's file of a graph
    that did not pass this time removed (report.removed)."""
    for g in job.graphs:  # contract graphs first, as _plan lists them
        if g in job.passed:
            os.replace(job.passed[g], g.path)
            job.report.files[g.label] = g.path
    for g in job.graphs:
        if g.path.exists() and g not in job.passed:
            g.path.unlink()
            job.report.removed[g.path] = "an earlier export's; this one did not pass its gate"


def _ort_files(job: _Job, level: str) -> None:
    """model.ort (and model.{precision}.ort) beside each contract graph written, with the operator config."""
    sources = [(g.precision, job.model_dir / contract.onnx_file(g.precision)) for g in job.graphs
               if g.cache == contract.CACHE_CONCAT and (job.model_dir / contract.onnx_file(g.precision)).is_file()]
    job.report.ort = write_all(job.model_dir, sources, job.model, job.prompts, job.windows, level, job.say)
    for row in job.report.ort:
        job.report.files[f"{row.path.name}"] = row.path


def _side_files(job: _Job) -> None:
    """genai_config.json, and tokenizer_config.json for directories from before it was written."""
    job.report.genai = genai.write(job.model_dir, job.card.model, job.card.eot_id)
    hf_tokenizer = job.model_dir / bpe.HF_CONFIG_FILE
    if not hf_tokenizer.exists():
        atomic.write_text(hf_tokenizer, json.dumps(bpe.hf_config(job.tok), indent=2) + "\n")

