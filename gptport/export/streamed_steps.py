"""The export steps of a model too large to hold in torch (graph_write.external): its graphs checked against the
torch model run layer by layer (layer_check.py), never the whole model at once.

- With fp32 asked, the fp32 contract graph itself is checked layer by layer and by greedy decoding, and the
  static-cache graph against the same reference.
- Without it (int8 / int4 alone), no fp32 graph of the model is written at all: the builder is checked
  on a slice of it, the fp32 contract graph of its first SLICE_LAYERS layers with its embeddings, final norm and
  head (every operator and every shape the full graph has, one layer apart), against the reference cut the same
  way.
The variants are gated layer by layer (layer_gate.py); with --no-gate each quantized graph (built by the checked
code) instead runs in pieces through a prompt and a few steps on its own cache (decodes()), an int8 cache's too.
The multi-row append graph is checked layer by layer too (append_layers.py), the int8 cache's scales calibrated on
the torch model run layer by layer (kv_quant.calibrate_layers). What needs the whole torch model or whole graphs
(the gate's text sampled from it, the int8 cache's gate where it does not fit) is refused with its reason; so are
.ort files, which cannot keep weights outside."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from gptport import atomic, contract
from gptport.config import ModelConfig
from gptport.errors import UsageError, ValidationError
from gptport.export import append_layers, chunked, contract_graph, graph_write, kv_quant, layer_check, validate
from gptport.export.export_job import Job
from gptport.weights import shapes_of

SLICE_LAYERS = 2  # layers of the slice the builder is checked on when no fp32 graph is written
RUNTIME_BYTES = 2**29  # torch's and onnxruntime's own, imported
DECODE_TOKENS = 4  # steps each quantized graph decodes on its own cache


def refuse_options(job: Job, sampled_text: bool, kv_dtype: str, ort_level: str | None, gate: bool = False,
                   available: int | None = None) -> None:
    """What a model checked layer by layer cannot have, refused before anything is written: the gate's text sampled
    from the model runs the whole torch model (the variants' gate itself runs layer by layer: layer_gate.py); with
    `gate`, the int8 cache's gate runs the fp32 static graph and its int8-cache twin whole, with caches of n_ctx
    (kv_gate_bytes), where that fits in memory (`available`, default /proc/meminfo's); the .ort format holds no
    external data."""
    size = f"{job.model_dir}: {job.weights_bytes() / 2**30:.1f} GiB of float32 weights"
    if sampled_text:
        raise UsageError(f"{size}; --gate-on-sampled-text samples the whole torch model: pass --heldout FILE (or "
                         "--no-gate)")
    available = _mem_available() if available is None else available
    if kv_dtype == "int8" and gate and available is not None and kv_gate_bytes(job) > available:
        raise UsageError(f"{size}; the int8 KV cache's gate runs whole graphs with caches of n_ctx: about "
                         f"{kv_gate_bytes(job) / 2**30:.1f} GiB of memory, {available / 2**30:.1f} GiB is free: pass "
                         "--no-gate to write it unchecked (its scales calibrated layer by layer)")
    if ort_level is not None:
        raise UsageError(f"{size}; --ort-format: an .ort file holds every weight inside it (onnxruntime copies the "
                         "external data in, writes none past 2 GiB, and reads one whole into memory, about 3x its "
                         "size, where an .onnx graph's external data is mapped): use the .onnx graphs")


def kv_gate_bytes(job: Job) -> int:
    """Memory the int8 cache's gate takes (kv_quant.make): the fp32 static graph's weights (mapped once for both
    sessions, though the int8-cache graph holds a copy of its data), twice for safety, and its decode step's caches of
    n_ctx, float32 and int8, for the larger of the gate's rows and step_ms's."""
    cfg = job.card.model
    rows = max(kv_quant.STEP_ROWS, len(job.windows) if job.windows is not None else 0)
    cache = 2 * cfg.n_layer * rows * cfg.n_kv_head * cfg.n_ctx * cfg.head_dim
    return 2 * job.weights_bytes() + cache * (4 + 1) + RUNTIME_BYTES


def check_memory(job: Job, available: int | None = None) -> None:
    """The memory a large export needs at its peak (two copies of its largest tensor in float32: read, then
    transposed or quantized, or mapped and packed by onnxruntime; a check's piece; the runtimes' own) against what
    the machine has available (/proc/meminfo's MemAvailable, or `available`), refused in one line before anything is
    written. Not checked where the system does not say."""
    if available is None:
        available = _mem_available()
    if available is None:
        return
    largest = max(4 * int(np.prod(shape)) for shape in shapes_of(job.weights).values())
    need = 2 * largest + chunked.CHUNK_BYTES + RUNTIME_BYTES
    if need > available:
        raise UsageError(f"{job.model_dir}: exporting it needs about {need / 2**30:.1f} GiB of memory (its largest "
                         f"tensor is {largest / 2**30:.1f} GiB in float32), and {available / 2**30:.1f} GiB is free")


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            line = next((x for x in f if x.startswith("MemAvailable:")), None)
    except OSError:
        return None
    return int(line.split()[1]) * 1024 if line else None


def check_fp32(job: Job, plain: Path) -> None:
    """The fp32 contract graph against the torch model run layer by layer (layer_check.py), with greedy decoding in
    the same opening of its pieces."""
    fp32 = job.graph("fp32")
    assert fp32 is not None
    cfg, taps = job.card.model, job.taps[f"fp32 {contract.CACHE_CONCAT}"]
    job.checked = layer_check.cases(cfg)
    job.chosen = _chosen(job, cfg)
    job.say("checking the fp32 graph layer by layer, in pieces")
    job.report.parity, job.report.greedy_tokens = layer_check.check_contract(plain, taps, cfg, job.weights, job.tol,
                                                                             job.checked, job.chosen)
    validate.refuse("fp32 parity", job.report.parity)
    job.passed[fp32] = plain


def check_slice(job: Job) -> None:
    """No fp32 graph asked: the builder's fp32 contract graph of the model's first SLICE_LAYERS layers (with its
    embeddings, final norm and head) checked against the reference cut the same way, then removed."""
    cfg = replace(job.card.model, n_layer=min(SLICE_LAYERS, job.card.model.n_layer))
    job.say(f"checking the builder on the model's first {cfg.n_layer} layers (fp32, layer by layer)")
    tmp, taps = atomic.temp_name(job.model_dir / "model.slice.onnx"), list[str]()
    try:
        graph_write.write(tmp, lambda sink: contract_graph.build(cfg, job.weights, sink, opset=job.opset,
                                                                 residuals=taps), {}, True)
        job.report.parity_of = f"the builder's fp32 graph of the first {cfg.n_layer} layers:"
        job.report.parity, job.report.greedy_tokens = layer_check.check_contract(
            tmp, taps, cfg, job.weights, job.tol, layer_check.cases(cfg), _chosen(job, cfg))
        validate.refuse(f"fp32 parity of the first {cfg.n_layer} layers", job.report.parity)
    finally:
        tmp.unlink(missing_ok=True)
        tmp.with_name(tmp.name + ".data").unlink(missing_ok=True)


def check_static(job: Job, path: Path) -> None:
    """The fp32 static-cache graph's logits against the reference's of the contract graph's check, with the greedy
    steps in the same opening of its pieces; its cache sized to the checks' short texts, not n_ctx (805 MB a row at
    Qwen2.5-0.5B's 32k)."""
    cfg, taps = job.card.model, job.taps[f"fp32 {contract.CACHE_STATIC}"]
    assert job.chosen is not None  # check_fp32 ran
    job.report.static_parity, _ = layer_check.check_static(path, taps, cfg, job.weights, job.checked, job.tol,
                                                           job.chosen)
    validate.refuse("static-cache graph parity", job.report.static_parity)


def check_append(job: Job, path: Path) -> None:
    """The multi-row append graph against the reference run layer by layer (append_layers.py): append_check's
    cases of uneven chunks in several rows, at the lengths of the contract graph's check."""
    job.say("checking the multi-row append graph layer by layer, in pieces")
    taps = job.taps[f"fp32 {contract.CACHE_APPEND}"]
    job.report.append_parity = append_layers.check(path, taps, job.card.model, job.weights, job.tol)
    validate.refuse("multi-row append graph parity", job.report.append_parity)


def decodes(job: Job) -> None:
    """Each quantized graph (fp16, int8, int4, an int8 cache) run in pieces (chunked.py, a layer's weights at a
    time) over the first prompt and DECODE_TOKENS steps on its own cache; one whose logits are not all finite is not
    written (a ValidationError naming it)."""
    cfg, prompt = job.card.model, job.prompts[0]
    steps = [prompt[j % len(prompt)] for j in range(DECODE_TOKENS)]  # any tokens: what is checked is the running
    for g, path in list(job.passed.items()):
        if g.precision == "fp32" and g.cache != contract.CACHE_STATIC_KV8:
            continue
        job.say(f"decoding with the {g.label} graph, in pieces")
        static = g.cache in (contract.CACHE_STATIC, contract.CACHE_STATIC_KV8)  # an int8 cache: its twin's taps
        logits = layer_check.decode(path, job.taps[f"{g.precision} {contract.CACHE_STATIC if static else g.cache}"],
                                    cfg, job.weights, static, prompt, steps)
        if not all(np.isfinite(x).all() for x in logits):
            raise ValidationError(f"export: the {g.label} graph's logits are not all finite")


def _chosen(job: Job, cfg: ModelConfig) -> layer_check.Greedy:
    """The greedy check's prompt (job.prompts' first) and the reference's greedy tokens after it, for the model
    `cfg`."""
    job.prompts = validate.prompts(job.model_dir, job.tok, job.card.model.n_ctx, config=job.card.model)
    n = min(layer_check.GREEDY_STEPS, cfg.n_ctx - len(job.prompts[0]))
    job.say(f"the reference's greedy continuation ({n} tokens, the model read layer by layer once each)")
    return layer_check.Greedy(job.prompts[0], layer_check.reference_greedy(cfg, job.weights, job.prompts[0], n))
