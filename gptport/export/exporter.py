"""The export: the fp32 graph under the I/O contract (contract_graph.py), validated against the torch
model before it is renamed into place, then the requested variants and static-cache graphs. `export`
reads top to bottom as its steps; each graph it may write is a `Graph`, what they share a `Job`."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import onnx

from gptport import atomic, contract, provenance
from gptport import tokenizer as bpe
from gptport.errors import ArtifactError, UsageError, ValidationError
from gptport.export import (
    append_check,
    genai,
    gqa_graph,
    graph_write,
    heap,
    rope_graph,
    streamed_steps,
    validate,
    variant_steps,
    variants,
)
from gptport.export.export_job import Graph, Job
from gptport.export.export_report import ExportReport, parse_precisions
from gptport.export.graph_files import (
    metadata,
    remove_stale,
    save,
    save_static,
    set_metadata,
    size_ratio,
    untie_folded_head,
)
from gptport.export.model_read import expected_shapes
from gptport.export.ort_format import LEVELS as ORT_LEVELS
from gptport.export.ort_format import write_all
from gptport.export.step_memo import Memo
from gptport.export.tolerance import Tolerance
from gptport.model_card import check_tokenizer, read_card
from gptport.runtime import hugepages
from gptport.runtime.onnx_engine import load_cpu
from gptport.training.checkpoint import load_model
from gptport.training.torch_engine import torch_step
from gptport.weights import float32_bytes, open_weights

__all__ = ["ExportReport", "Graph", "export", "metadata", "parse_precisions", "save", "save_static", "set_metadata"]

STATIC_PRECISIONS = ("fp32", "int8", "int4")  # GroupQueryAttention on the CPU runs float32
DEFAULT_TOL = Tolerance()  # the parity gate's bound of each quantity, relative to its magnitude (tolerance.py)


@heap.settled()
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
    if kv_dtype == "int8" and rope_graph.outside(job.card.model):  # kv_quant's twin: made for fused rope only
        raise UsageError("--kv-dtype int8: no int8-cache graph yet for partial rotary, LongRoPE or layers without "
                         "rope (rotated outside GroupQueryAttention)")
    if job.model is None:
        gated = gate and any(p != "fp32" for p in precisions)
        streamed_steps.refuse_options(job, gated and sampled_text and heldout is None, kv_dtype, ort_level, gate)
        streamed_steps.check_memory(job)
    else:  # the variants of a model held in torch are checked against fp32's (and some made from its graph)
        precisions = ["fp32", *(p for p in precisions if p != "fp32")]
    _plan(job, precisions, static, force, kv_dtype)
    if gate and (any(p != "fp32" for p in precisions) or kv_dtype == "int8"):
        _gate_text(job, heldout, sampled_text)
    try:
        with hugepages.checks_only():  # the checks' sessions run a few steps each: not on huge pages
            if job.graph("fp32") is not None:
                _check_fp32(job, opset)
            else:
                streamed_steps.check_slice(job)
            if optimize and job.outside:
                job.say("not optimizing: the transformer optimizer holds the whole graph in memory")
            elif optimize:
                _optimize_fp32(job)
            job.memos = None  # the contract graph's parity cases are done: their references go
            static_graphs = any(g.cache == contract.CACHE_STATIC for g in job.graphs)
            if job.graph("fp32", contract.CACHE_STATIC) is not None:
                _static_fp32(job)
                _append_graph(job)
            job.float64 = None  # the last parity check is done: free the float64 copy before the variants
            for g in job.graphs:
                if g.cache == contract.CACHE_CONCAT and g.precision != "fp32":
                    job.say(f"making the {g.precision} variant")
                    variant_steps.variant(job, g, variants.LADDER.get(g.precision, ("",)))
            if static_graphs:
                variant_steps.static_variants(job)
            if any(g.cache == contract.CACHE_STATIC_KV8 for g in job.graphs):
                variant_steps.kv8_graphs(job)
            if job.model is None and job.windows is None:  # --no-gate: not gated, but run
                streamed_steps.decodes(job)
            _rename_into_place(job)
            if ort_level is not None:
                _ort_files(job, ort_level)
            job.report.removed.update(remove_stale(model_dir, job.sources, set(job.report.files.values())))
            _side_files(job)
    finally:
        if job.gate_reference is not None:
            job.gate_reference.close()
        for p in model_dir.glob(".model*.tmp-*"):
            p.unlink(missing_ok=True)
    return job.report


def _check_options(opset: int, gate: bool, heldout: Path | None, sampled_text: bool) -> None:
    if opset < 18:
        raise UsageError(f"--opset {opset}: the exporter needs opset 18 or later")
    if not gate and (heldout is not None or sampled_text):
        raise UsageError("--no-gate writes the variants unchecked; --heldout and --gate-on-sampled-text choose the "
                         "gate's text: give one or the other")


def _open(model_dir: Path, gate: bool, tol: Tolerance, say: Callable[[str], None]) -> Job:
    """The tokenizer, the hashes of the sources, the weights mapped and checked against config.json, then, for a
    model small enough (graph_write.external), the torch model (a file replaced meanwhile fails the check); a
    larger one is checked layer by layer (layer_check.py) and its weights are read tensor by tensor. The job's
    say() frees what the last step left (heap.release) before it announces the next."""
    tok = bpe.load(model_dir)
    sources = provenance.sources(model_dir)
    card = read_card(model_dir)
    check_tokenizer(card, tok, model_dir)
    weights = open_weights(model_dir)
    weights.check_shapes(expected_shapes(card.model))
    outside = graph_write.external(float32_bytes(weights))
    if outside:
        provenance.check_weights(model_dir)
        model = None
        say(f"{float32_bytes(weights) / 2**30:.1f} GiB of float32 weights: graphs written to external data, "
            "checked layer by layer")
    else:
        model, card = load_model(model_dir, tok)

    def step(message: str) -> None:  # each step announced after what the last one left is freed
        heap.release()
        say(message)

    return Job(model_dir, tok, model, card, sources, tol, step, ExportReport(gated=gate), weights=weights,
               outside=outside, tell=say)




def _plan(job: Job, precisions: Sequence[str], static: bool, force: bool, kv_dtype: str = "float32") -> None:
    """The graphs to write: each precision's contract graph, then the static-cache graphs where the model
    can have them (report.static_skipped says why not); refused if one exists and not `force`."""
    report = job.report
    job.graphs = [Graph(p, contract.CACHE_CONCAT, job.model_dir / contract.onnx_file(p)) for p in precisions]
    report.static_skipped = gqa_graph.unsupported(job.card.model) if static else ""
    if static and not report.static_skipped:
        job.graphs += [Graph(p, contract.CACHE_STATIC, job.model_dir / contract.onnx_file(p, contract.CACHE_STATIC))
                       for p in precisions if p in STATIC_PRECISIONS]
        append = contract.CACHE_APPEND  # its multi-row append twin (fp32, float32 cache)
        if "fp32" in precisions:
            job.graphs.append(Graph("fp32", append, job.model_dir / contract.onnx_file("fp32", append)))
        if kv_dtype == "int8":
            job.graphs += [Graph(g.precision, contract.CACHE_STATIC_KV8,
                                 job.model_dir / contract.onnx_file(g.precision, contract.CACHE_STATIC_KV8))
                           for g in list(job.graphs) if g.cache == contract.CACHE_STATIC]
    elif kv_dtype == "int8":
        raise UsageError(f"--kv-dtype int8: this model has no static-cache graph ({report.static_skipped})")
    cfg = job.card.model
    if kv_dtype == "int8" and cfg.sliding_window and cfg.window_layers:
        raise UsageError(f"--kv-dtype int8: this model has a sliding window of {cfg.sliding_window}, which the int8 "
                         "cache's GroupQueryAttention is not checked with; drop --kv-dtype int8")
    existing = [str(g.path) for g in job.graphs if g.path.exists()]
    if existing and not force:
        raise ArtifactError(f"{', '.join(existing)} already exist(s); pass --force to replace")
    _check_disk(job)


def _check_disk(job: Job) -> None:
    """The bytes the planned graphs will write (graph_write.estimate) against the model directory's free disk,
    before anything is written; the graphs this export replaces count as free."""
    need = sum(graph_write.estimate(job.weights, g.precision, job.card.model.vocab_size) for g in job.graphs)
    replaced = sum(p.stat().st_size for g in job.graphs for p in (g.path, g.path.with_name(g.path.name + ".data"))
                   if p.is_file())
    free = shutil.disk_usage(job.model_dir).free + replaced
    if need > free:
        raise UsageError(f"{job.model_dir}: export writes about {need / 2**30:.1f} GiB ({len(job.graphs)} graphs), "
                         f"and its disk has {free / 2**30:.1f} GiB free")


def _gate_text(job: Job, heldout: Path | None, sampled_text: bool) -> None:
    """The held-out text the variants' gate scores (validate.heldout), before anything is written."""
    text = validate.heldout(job.model_dir, job.model, job.tok, heldout, sampled_text, cfg=job.card.model)
    job.report.heldout, job.report.sampled = text.source, text.sampled
    job.windows = text.windows


def _write_plain(job: Job, opset: int) -> Path:
    """The contract graph written op by op from the weights (contract_graph.py) under a temporary name, once every
    weight is found stored once."""
    fp32 = job.graph("fp32")
    assert fp32 is not None  # parse_precisions puts fp32 first
    job.say("building the fp32 graph from the weights" + (" (external data)" if job.outside else ""))
    job.opset = opset
    job.plain = atomic.temp_name(fp32.path)
    job.build(contract.CACHE_CONCAT, job.plain)
    job.report.size_ratio = graph_write.weight_bytes(job.plain) / job.weights_bytes()
    if job.report.size_ratio > 1.01:
        raise ValidationError(f"export: model.onnx holds {job.report.size_ratio:.3f}x the parameter bytes "
                              "(a weight is stored twice); not written")
    return job.plain


def _check_fp32(job: Job, opset: int) -> None:
    """The exported graph, saved under a temporary name and checked: every weight stored once,
    onnx.checker, parity with torch, greedy decoding. It is model.onnx unless it is optimized."""
    fp32 = job.graph("fp32")
    assert fp32 is not None
    report, model, plain = job.report, job.model, _write_plain(job, opset)
    job.say("checking fp32 graph: onnx.checker, onnxruntime, parity, greedy decoding")
    onnx.checker.check_model(str(plain), full_check=True)
    if model is None:
        streamed_steps.check_fp32(job, plain)
        return
    onnx_model = load_cpu(plain)
    job.memos = (Memo(torch_step(model)), Memo(job.exact()))  # the optimized graph's check asks the same
    report.parity = validate.parity(model, onnx_model.step(), job.tol, exact=job.memos[1], ref=job.memos[0])
    validate.refuse("fp32 parity", report.parity)
    job.prompts = validate.prompts(job.model_dir, job.tok, job.card.model.n_ctx, config=job.card.model)
    job.greedy = validate.torch_greedy(model, job.prompts)  # the static-cache graph's check compares with it too
    report.greedy_tokens = validate.greedy_match(model, onnx_model, job.prompts, job.greedy)
    job.passed[fp32] = job.plain


def _optimize_fp32(job: Job) -> None:
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
    ref, exact = job.memos or (None, job.exact())
    validate.check_again(job.model, load_cpu(job.passed[fp32]), job.tol, "optimized fp32", exact=exact, ref=ref)


def _static_fp32(job: Job) -> None:
    """The fp32 static-cache graph, built from the weights and checked like model.onnx."""
    job.say("building the static-cache graph (GroupQueryAttention, cache preallocated at n_ctx)")
    fp32 = job.graph("fp32", contract.CACHE_STATIC)
    assert fp32 is not None
    tmp = atomic.temp_name(fp32.path)
    job.build(contract.CACHE_STATIC, tmp)
    onnx.checker.check_model(str(tmp), full_check=True)
    if job.model is None:
        streamed_steps.check_static(job, tmp)
        job.passed[fp32] = tmp
        return
    engine = load_cpu(tmp)
    job.report.static_parity = validate.static_parity(job.model, engine, job.tol, exact=job.exact())
    validate.refuse("static-cache graph parity", job.report.static_parity)
    validate.greedy_match(job.model, engine, job.prompts, job.greedy)
    job.passed[fp32] = tmp


def _append_graph(job: Job) -> None:
    """The multi-row append graph (scatter_graph.py) beside the fp32 static-cache graph that passed, checked
    against torch on appends of uneven chunks to several rows of one cache (append_check.py; a model past the line
    layer by layer: streamed_steps.check_append)."""
    static, graph = job.graph("fp32", contract.CACHE_STATIC), job.graph("fp32", contract.CACHE_APPEND)
    if graph is None or static not in job.passed:
        return
    job.say("building the multi-row append graph (TensorScatter + Attention over the static cache's buffers)")
    tmp = atomic.temp_name(graph.path)
    job.build(contract.CACHE_APPEND, tmp)
    onnx.checker.check_model(str(tmp), full_check=True)
    if job.model is None:
        streamed_steps.check_append(job, tmp)
        job.passed[graph] = tmp
        return
    rows = append_check.append_parity(job.model, load_cpu(job.passed[static]), load_cpu(tmp).session, job.tol,
                                      exact=job.exact())
    job.report.append_parity = rows
    validate.refuse("multi-row append graph parity", rows)
    job.passed[graph] = tmp


def _rename_into_place(job: Job) -> None:
    """Each graph that passed renamed into place (report.files); an earlier export's file of a graph
    that did not pass this time removed (report.removed)."""
    for g in job.graphs:  # contract graphs first, as _plan lists them
        if g in job.passed:
            graph_write.place(job.passed[g], g.path)
            job.report.files[g.label] = g.path
    for g in job.graphs:
        if g.path.exists() and g not in job.passed:
            g.path.unlink()
            g.path.with_name(g.path.name + ".data").unlink(missing_ok=True)
            job.report.removed[g.path] = "an earlier export's; this one did not pass its gate"


def _ort_files(job: Job, level: str) -> None:
    """model.ort (and model.{precision}.ort) beside each contract graph written, with the operator config."""
    sources = [(g.precision, job.model_dir / contract.onnx_file(g.precision)) for g in job.graphs
               if g.cache == contract.CACHE_CONCAT and (job.model_dir / contract.onnx_file(g.precision)).is_file()]
    job.report.ort = write_all(job.model_dir, sources, job.model, job.prompts, job.windows, level, job.say)
    for row in job.report.ort:
        job.report.files[f"{row.path.name}"] = row.path


def _side_files(job: Job) -> None:
    """genai_config.json, and tokenizer_config.json for directories from before it was written."""
    job.report.genai = genai.write(job.model_dir, job.card.model, job.card.eot_id)
    hf_tokenizer = job.model_dir / bpe.HF_CONFIG_FILE
    if not hf_tokenizer.exists():
        atomic.write_text(hf_tokenizer, json.dumps(bpe.hf_config(job.tok), indent=2) + "\n")

