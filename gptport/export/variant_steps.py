"""The quantized variants an export writes, each under a temporary name and gated before exporter.py renames it
into place: the contract graphs' int8/int4/fp16 (the first rung of a precision's ladder that passes), their
static-cache twins (from the rung the contract twin shipped) and the int8-cache twins (kv_quant.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from gptport import atomic, contract, specials
from gptport import tokenizer as bpe
from gptport.errors import UsageError
from gptport.export import kv_quant, layer_gate, validate, variants
from gptport.export.export_job import Graph, Job
from gptport.export.graph_files import metadata, set_metadata
from gptport.export.tensor_sink import data_name
from gptport.runtime.onnx_engine import load_cpu


def static_variants(job: Job) -> None:
    """The int8/int4 static-cache graphs of the precisions whose contract graph and fp32 static graph passed,
    quantized from the latter (a large model's: built from the weights, with or without an fp32 static graph),
    starting with the scheme their contract twin shipped, and gated again."""
    fp32 = job.graph("fp32", contract.CACHE_STATIC)
    if fp32 not in job.passed and job.model is not None:
        return
    source = job.passed.get(fp32) if fp32 is not None else None  # None: a large model's, all built (direct)
    for g in job.graphs:
        twin = job.graph(g.precision)
        if g.cache != contract.CACHE_STATIC or g.precision == "fp32" or twin not in job.passed:
            continue
        job.say(f"making the {g.precision} static-cache variant")
        ladder = variants.LADDER[g.precision]
        variant(job, g, ladder[ladder.index(job.report.schemes[g.precision]):], source=source)


def kv8_graphs(job: Job) -> None:
    """The int8-cache twin of each static-cache graph that passed (kv_quant.make), scales calibrated once
    on the fp32 static graph, or for a model checked layer by layer on the torch model run layer by layer."""
    fp32 = job.graph("fp32", contract.CACHE_STATIC)
    if fp32 not in job.passed and job.model is not None:
        return
    windows = calibration_windows(job)
    job.say(f"calibrating the int8 KV cache's scales on {len(windows)} windows of {windows.shape[1]} tokens"
            + (", the torch model run layer by layer" if job.model is None else ""))
    if job.model is None:
        amax = kv_quant.calibrate_layers(job.card.model, job.weights, windows)
    else:
        amax = kv_quant.calibrate(load_cpu(job.passed[fp32]), windows)
    for g in job.graphs:
        twin = job.graph(g.precision, contract.CACHE_STATIC)
        if g.cache == contract.CACHE_STATIC_KV8 and twin in job.passed:
            job.say(f"making the {g.precision} static-cache graph's int8 KV cache")
            made = kv_quant.make(g.label, job.passed[twin], g.path, amax, windows, bpe.token_bytes(job.tok),
                                 gated=job.windows is not None, rows=job.report.kv_gates, say=job.tell)
            if made is not None:
                job.passed[g] = made


def calibration_windows(job: Job) -> np.ndarray:
    """The int8 cache's calibration text (N, T): the gate's windows; without them (--no-gate) the model's own
    samples, or for a model not held in torch the validation shard's windows, else seeded random tokens (said)."""
    if job.windows is not None:
        return job.windows
    if job.model is not None:
        return validate.sampled_windows(job.model)
    cfg = job.card.model
    try:
        return validate.heldout(job.model_dir, None, job.tok, cfg=cfg).windows
    except UsageError as e:
        job.say(f"calibrating on seeded random tokens: {str(e).split(';')[0]}")
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (8, min(cfg.n_ctx, validate.SAMPLED_WINDOW)))
    start = specials.start_ids(cfg)
    ids[:, :len(start)] = start
    return ids


def variant(job: Job, graph: Graph, schemes: Sequence[str], source: Path | None = None) -> None:
    """The `graph` variant of the fp32 graph at `source` (the plain contract graph by default), under a
    temporary name, made with the first of `schemes` that passes the accuracy gate on job.windows (each
    try recorded in the report); nothing, and nothing left behind, if none does. Without windows
    (--no-gate): the first scheme that applies, unchecked, recorded as ungated."""
    fp32 = source or job.plain  # None: a model checked by slice, whose variants are all built (variants.direct)
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
        gate = replace(_gate(job, graph, tmp), scheme=scheme)
        report.gates.append(gate)
        if gate.ok:
            report.schemes[graph.label] = scheme
            job.passed[graph] = tmp
            return
    tmp.unlink(missing_ok=True)
    tmp.with_name(data_name(tmp)).unlink(missing_ok=True)


def _gate(job: Job, graph: Graph, tmp: Path) -> validate.GateRow:
    """The gate's row of the variant at `tmp`: against the torch model held whole (validate.gate), or, for a model
    checked layer by layer, against its logits made layer by layer, the variant run in pieces (layer_gate.py)."""
    assert job.windows is not None
    if job.model is not None:
        return validate.gate(job.model, load_cpu(tmp), job.windows, graph.label)
    return layer_gate.gate(job.reference(), tmp, job.taps[f"{graph.precision} {graph.cache}"], job.card.model,
                           job.weights, graph.cache == contract.CACHE_STATIC, graph.label)


def _made(job: Job, graph: Graph, fp32: Path | None, tmp: Path, scheme: str) -> bool:
    """Whether `scheme` made the `graph` variant at `tmp`; where it does not apply, why is said and reported. fp16
    and a scheme the builder can write (variants.direct) are built from the weights; the others are made from the
    fp32 graph at `fp32`, in memory, which a model of external data does not take."""
    nbits = variants.direct(scheme) if graph.precision in variants.LADDER else None
    try:
        if nbits is not None or graph.precision == "fp16":
            job.build(graph.cache, tmp, graph.precision, nbits, gated=False)
            return True
        if job.outside or fp32 is None:
            raise variants.NotApplicable("it quantizes a graph in memory, and this model's graphs are too large")
        variants.make(graph.precision, fp32, tmp, job.card.model, scheme, job.ranges_for(scheme))
    except variants.NotApplicable as e:
        job.say(f"{graph.label}: {scheme} does not apply ({e})")
        job.report.not_applied.append((graph.label, scheme, str(e)))
        return False
    return True
