"""torch -> ONNX: the fp32 graph under the I/O contract (gptport/contract.py), validated against the
torch model before it is renamed into place, then the requested variants."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx
import torch
from torch.export import Dim

from gptport import __version__, atomic, contract, genai, gqa_graph, provenance, validate, variants
from gptport import tokenizer as bpe
from gptport.checkpoint import ModelCard, load_model
from gptport.config import model_config_to_dict
from gptport.errors import ArtifactError, UsageError, ValidationError
from gptport.model import GPT
from gptport.onnx_engine import file_metadata, load_cpu

TWO_GB = 2 * 1024**3
STATIC_PRECISIONS = ("fp32", "int8", "int4")  # GroupQueryAttention on the CPU runs float32


@dataclass
class ExportReport:
    """What export wrote and measured, for the CLI's tables."""

    files: dict[str, Path] = field(default_factory=dict)
    parity: list[validate.ParityRow] = field(default_factory=list)
    greedy_tokens: int = 0
    gates: list[validate.GateRow] = field(default_factory=list)  # every scheme tried, in order
    schemes: dict[str, str] = field(default_factory=dict)  # written variant ("int8", "int8 static") -> scheme
    gated: bool = True  # False: the variants were written with --no-gate, unchecked
    heldout: str = ""  # the text the gate scored (validate.Heldout.source), when a variant was gated
    sampled: bool = False  # that text was the model's own samples (--gate-on-sampled-text)
    removed: dict[Path, str] = field(default_factory=dict)  # an earlier export's graphs this one did not
    # rewrite -> why: a variant that missed its gate this time, or a graph of other weights (provenance.stale)
    static_parity: list[validate.ParityRow] = field(default_factory=list)
    static_skipped: str = ""  # why no static-cache graph was written, when one could not be
    fused: dict[str, int] = field(default_factory=dict)
    size_ratio: float = 0.0
    genai: Path | None = None


def parse_precisions(text: str) -> list[str]:
    """'fp32,int8' -> ['fp32', 'int8']; fp32 always comes first (the variants are made from it)."""
    asked = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in asked if p not in contract.PRECISIONS]
    if bad or not asked:
        raise UsageError(f"--precision {text!r}: unknown {', '.join(bad) or 'empty'}; choose from "
                         f"{', '.join(contract.PRECISIONS)}")
    return ["fp32", *[p for p in dict.fromkeys(asked) if p != "fp32"]]


def metadata(card: ModelCard, precision: str, cache: str = contract.CACHE_CONCAT,
             sources: Mapping[str, str] | None = None, gated: bool = True, gate_text: str = "") -> dict[str, str]:
    """A graph's metadata_props: its config, precision, cache layout and contract, the sha256 of the
    tokenizer, weights and config.json it was made from, and whether it passed its accuracy check
    (`gated`; a variant's held-out text in `gate_text`). `sources` (provenance.sources, which export
    hashes once): without it, those of the card's directory."""
    if sources is None:
        sources = provenance.sources(card.model_dir) if card.model_dir is not None else {}
    gate = {contract.META_GATE_TEXT: gate_text} if gated and gate_text else {}
    return {contract.META_CONFIG: json.dumps(model_config_to_dict(card.model)),
            contract.META_TOKENIZER: card.tokenizer_sha256, contract.META_PRECISION: precision,
            contract.META_VERSION: __version__, contract.META_CONTRACT: contract.CONTRACT_VERSION,
            contract.META_CACHE: cache, **sources, contract.META_GATED: "true" if gated else "false", **gate}


@contextlib.contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The exporter logs and warns about things that are not the user's concern (torchvision ops...)."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def to_onnx(model: GPT, opset: int) -> onnx.ModelProto:
    """Export with torch.export's dynamic shapes; batch, sequence and past traced at values >= 2."""
    cfg = model.cfg
    B, T, P = 2, 3, min(4, max(2, cfg.n_ctx - 3))
    ids = torch.randint(0, cfg.vocab_size, (B, T))
    mask = torch.ones(B, P + T, dtype=torch.long)
    pos = torch.arange(P, P + T).expand(B, T).contiguous()
    past = [(torch.zeros(B, cfg.n_head, P, cfg.head_dim), torch.zeros(B, cfg.n_head, P, cfg.head_dim))
            for _ in range(cfg.n_layer)]
    batch, seq = Dim(contract.BATCH), Dim(contract.SEQUENCE)
    past_len, total = Dim(contract.PAST), Dim(contract.TOTAL)
    shapes = ({0: batch, 1: seq}, {0: batch, 1: total}, {0: batch, 1: seq},
              [({0: batch, 2: past_len}, {0: batch, 2: past_len}) for _ in range(cfg.n_layer)])
    with _quiet_exporter():
        program = torch.onnx.export(
            model, (ids, mask, pos, past), dynamic_shapes=shapes, dynamo=True, opset_version=opset,
            input_names=contract.input_names(cfg.n_layer), output_names=contract.output_names(cfg.n_layer),
            optimize=True, verbose=False)
    proto = program.model_proto
    _name_total_dims(proto)
    if cfg.tie_embeddings:
        _untie_folded_head(proto)
    return proto


def _name_total_dims(proto: onnx.ModelProto) -> None:
    """The exporter names present's length 'past_sequence + sequence'; the contract says total_sequence."""
    for value in [*proto.graph.input, *proto.graph.output]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param.replace(" ", "") in (f"{contract.PAST}+{contract.SEQUENCE}",
                                                  f"{contract.SEQUENCE}+{contract.PAST}"):
                dim.dim_param = contract.TOTAL


def _untie_folded_head(proto: onnx.ModelProto) -> None:
    """Store the tied embedding once. The exporter either reads the head as Transpose(embedding)
    (stored once already) or folds that transpose into a second copy of the embedding; in the latter
    case the copy is dropped and a Transpose node, which onnxruntime folds when it loads, takes its place."""
    graph = proto.graph
    inits = {i.name: i for i in graph.initializer}
    head = next((n for n in graph.node if contract.LOGITS in n.output and n.op_type == "MatMul"), None)
    gather = next((n for n in graph.node if n.op_type == "Gather" and n.input[1] == contract.INPUT_IDS), None)
    if head is None or gather is None or gather.input[0] not in inits:
        raise ValidationError("export: unexpected graph (no head MatMul or token Gather); cannot check tied weights")
    if head.input[1] not in inits:
        return  # computed from the embedding: stored once
    folded = onnx.numpy_helper.to_array(inits[head.input[1]])
    wte = onnx.numpy_helper.to_array(inits[gather.input[0]])
    if folded.shape != wte.T.shape or not np.array_equal(folded, wte.T):
        return
    graph.initializer.remove(inits[head.input[1]])
    transpose = onnx.helper.make_node("Transpose", [gather.input[0]], [head.input[1]], perm=[1, 0],
                                      name="tied_head_transpose")
    graph.node.insert(list(graph.node).index(head), transpose)


def save(proto: onnx.ModelProto, path: Path, meta: dict[str, str]) -> None:
    """Write `proto` with `meta` as metadata_props to `path` (external data beyond 2 GB)."""
    onnx.helper.set_model_props(proto, meta)
    if proto.ByteSize() > TWO_GB:
        onnx.save_model(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name.removeprefix(".").split(".tmp-")[0] + ".data")
    else:
        onnx.save_model(proto, str(path))


def export(
    model_dir: Path,
    precisions: Sequence[str] = ("fp32",),
    optimize: bool = True,
    static: bool = True,
    opset: int = 18,
    atol: float = 1e-4,
    force: bool = False,
    say: Callable[[str], None] = lambda msg: None,
    gate: bool = True,
    heldout: Path | None = None,
    sampled_text: bool = False,
) -> ExportReport:
    """Export, validate and write model.onnx and the variants asked for. Nothing is written for a
    precision whose checks fail; every file is renamed into place only after it passed. With
    `optimize` (the default: it decodes faster), model.onnx is the graph fused by onnxruntime's
    transformer optimizer; the variants are made from the plain graph, which quantizes better. With
    `static` (the default), the static-cache graphs of fp32, int8 and int4 are written beside them
    (gqa_graph.py: the CPU's fastest decoding), checked the same way. Every graph records the sha256 of
    the weights and config.json it was made from; after the export, the graphs in `model_dir` of other
    weights are removed (listed in report.removed).

    The variants' gate scores `heldout` (a text file), else data/val.bin, else, only with
    `sampled_text`, the model's own samples; with none of them a variant is refused before anything is
    written. Without `gate` (untrained weights cannot pass it: speed measurements) the variants are
    written unchecked with the first scheme of their ladder and record gptport.gated = false."""
    if opset < 18:
        raise UsageError(f"--opset {opset}: the exporter needs opset 18 or later")
    if not gate and (heldout is not None or sampled_text):
        raise UsageError("--no-gate writes the variants unchecked; --heldout and --gate-on-sampled-text choose the "
                         "gate's text: give one or the other")
    tok = bpe.load(model_dir)
    sources = provenance.sources(model_dir)  # before loading: a file replaced meanwhile fails the check
    model, card = load_model(model_dir, tok)
    targets = {p: model_dir / contract.onnx_file(p) for p in precisions}
    report = ExportReport(gated=gate)
    report.static_skipped = gqa_graph.unsupported(card.model) if static else ""
    static_targets = {p: model_dir / contract.onnx_file(p, contract.CACHE_STATIC)
                      for p in precisions if static and not report.static_skipped and p in STATIC_PRECISIONS}
    existing = [str(p) for p in [*targets.values(), *static_targets.values()] if p.exists()]
    if existing and not force:
        raise ArtifactError(f"{', '.join(existing)} already exist(s); pass --force to replace")
    text = validate.heldout(model_dir, model, tok, heldout, sampled_text) if gate and len(precisions) > 1 else None
    if text is not None:
        report.heldout, report.sampled = text.source, text.sampled
    say("exporting fp32 graph (torch.export)")
    proto = to_onnx(model, opset)
    fp32_tmp = atomic.temp_name(targets["fp32"])
    try:
        report.size_ratio = _size_ratio(proto, model)
        save(proto, fp32_tmp, metadata(card, "fp32", sources=sources))
        if report.size_ratio > 1.01:
            raise ValidationError(f"export: model.onnx holds {report.size_ratio:.3f}x the parameter bytes "
                                  "(a weight is stored twice); not written")
        say("checking fp32 graph: onnx.checker, onnxruntime, parity, greedy decoding")
        onnx.checker.check_model(str(fp32_tmp), full_check=True)
        onnx_model = load_cpu(fp32_tmp)
        report.parity = validate.parity(model, onnx_model.step(), atol=atol)
        bad = [r for r in report.parity if not r.ok]
        if bad:
            raise ValidationError(f"export: fp32 parity failed on case {bad[0].case}: max |Δ logits| "
                                  f"{bad[0].max_logits:.2e} (atol {atol:g}), max |Δ present| {bad[0].max_present:.2e}")
        prompts = validate.prompts(model_dir, tok, card.model.n_ctx)
        report.greedy_tokens = validate.greedy_match(model, onnx_model, prompts)
        pending = {"fp32": fp32_tmp}
        if optimize:  # model.onnx gets the fused graph; the variants are made from the plain one
            say("optimizing with onnxruntime's transformer optimizer")
            optimized, report.fused = variants.optimize(fp32_tmp, card.model)
            proto = onnx.load(str(optimized))
            optimized.unlink()
            if card.model.tie_embeddings:
                _untie_folded_head(proto)  # the optimizer folds the head's transpose again
            if _size_ratio(proto, model) > 1.01:
                raise ValidationError("export: the optimized graph stores a weight twice; not written")
            pending["fp32"] = atomic.temp_name(targets["fp32"])
            save(proto, pending["fp32"], metadata(card, "fp32", sources=sources))
            validate.check_again(model, load_cpu(pending["fp32"]), atol, "optimized fp32")
        windows = text.windows if text is not None else None
        for precision in precisions[1:]:
            say(f"making the {precision} variant")
            tmp = _gated_variant(model, card, precision, fp32_tmp, targets[precision], windows, report,
                                 variants.LADDER.get(precision, ("",)), sources=sources)
            if tmp is not None:
                pending[precision] = tmp
        written = {p: targets[p] for p in pending}
        if static_targets:
            static_pending = _static_graphs(model, card, static_targets, pending, windows, prompts, atol,
                                            report, say, sources)
            pending.update({f"{p} static": tmp for p, tmp in static_pending.items()})
            written.update({f"{p} static": static_targets[p] for p in static_pending})
        for key, tmp in pending.items():
            os.replace(tmp, written[key])
            report.files[key] = written[key]
        for path in [*targets.values(), *static_targets.values()]:  # a variant that missed its gate this time
            if path.exists() and path not in written.values():
                path.unlink()
                report.removed[path] = "an earlier export's; this one did not pass its gate"
        report.removed.update(_remove_stale(model_dir, sources, set(written.values())))
        report.genai = genai.write(model_dir, card.model, card.eot_id)
        hf_tokenizer = model_dir / bpe.HF_CONFIG_FILE
        if not hf_tokenizer.exists():  # directories from before tokenizer_config.json was written
            atomic.write_text(hf_tokenizer, json.dumps(bpe.hf_config(tok), indent=2) + "\n")
    finally:
        for p in model_dir.glob(".model*.tmp-*"):
            p.unlink(missing_ok=True)
    return report


def _remove_stale(model_dir: Path, sources: Mapping[str, str], written: set[Path]) -> dict[Path, str]:
    """Remove every graph of `model_dir` that export may write (each precision, both cache layouts), that
    this export did not write and whose metadata records other `sources` (provenance.stale), with its
    external data; a file gptport did not write is left alone. Returns path -> why."""
    removed = {}
    for path in (model_dir / name for name in contract.graph_files()):
        if path in written or not path.is_file():
            continue
        try:
            meta = file_metadata(path)
        except ArtifactError:
            continue
        why = provenance.stale(meta, sources) if contract.META_CONFIG in meta else ""
        if why:
            path.unlink()
            path.with_name(path.name + ".data").unlink(missing_ok=True)
            removed[path] = why
    return removed


def _static_graphs(model: GPT, card: ModelCard, targets: dict[str, Path], pending: dict[str, Path],
                   windows: np.ndarray | None, prompts: list[list[int]], atol: float, report: ExportReport,
                   say: Callable[[str], None], sources: Mapping[str, str]) -> dict[str, Path]:
    """The static-cache graphs (temporary files) of the precisions in `targets` whose contract graph
    passed: fp32 built from the weights and checked like model.onnx, int8/int4 quantized from it,
    starting with the scheme their contract twin shipped, and gated again."""
    say("building the static-cache graph (GroupQueryAttention, cache preallocated at n_ctx)")
    out = {"fp32": atomic.temp_name(targets["fp32"])}
    save_static(model, card, out["fp32"], sources)
    onnx.checker.check_model(str(out["fp32"]), full_check=True)
    engine = load_cpu(out["fp32"])
    report.static_parity = validate.static_parity(model, engine, atol)
    bad = [r for r in report.static_parity if not r.ok]
    if bad:
        raise ValidationError(f"export: static-cache graph parity failed on case {bad[0].case}: max |Δ logits| "
                              f"{bad[0].max_logits:.2e} (atol {atol:g}), max |Δ present| {bad[0].max_present:.2e}")
    validate.greedy_match(model, engine, prompts)
    for precision in [p for p in targets if p != "fp32" and p in pending]:
        say(f"making the {precision} static-cache variant")
        ladder = variants.LADDER[precision]
        tmp = _gated_variant(model, card, precision, out["fp32"], targets[precision], windows, report,
                             ladder[ladder.index(report.schemes[precision]):], contract.CACHE_STATIC, sources)
        if tmp is not None:
            out[precision] = tmp
    return out


def save_static(model: GPT, card: ModelCard, path: Path, sources: Mapping[str, str] | None = None) -> None:
    """The fp32 static-cache graph (gqa_graph.py) of the model's weights, with its metadata, at `path`."""
    weights = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    proto = gqa_graph.build(card.model, weights)
    save(proto, path, metadata(card, "fp32", contract.CACHE_STATIC, sources))


def _gated_variant(model: GPT, card: ModelCard, precision: str, fp32: Path, target: Path,
                   windows: np.ndarray | None, report: ExportReport, schemes: Sequence[str],
                   cache: str = contract.CACHE_CONCAT, sources: Mapping[str, str] | None = None) -> Path | None:
    """The `precision` variant of the graph at `fp32`, under a temporary name next to `target`, made
    with the first of `schemes` that passes the accuracy gate on `windows` (each try recorded in
    `report`); None, and nothing left behind, if none does. Without `windows` (--no-gate): the first
    scheme, unchecked, recorded as ungated."""
    tmp = atomic.temp_name(target)
    label = precision if cache == contract.CACHE_CONCAT else f"{precision} {cache}"
    if windows is None:
        variants.make(precision, fp32, tmp, card.model, schemes[0])
        set_metadata(tmp, metadata(card, precision, cache, sources, gated=False))
        report.schemes[label] = schemes[0]
        return tmp
    for scheme in schemes:
        variants.make(precision, fp32, tmp, card.model, scheme)
        set_metadata(tmp, metadata(card, precision, cache, sources, gate_text=report.heldout))
        gate = replace(validate.gate(model, load_cpu(tmp), windows, label), scheme=scheme)
        report.gates.append(gate)
        if gate.ok:
            report.schemes[label] = scheme
            return tmp
    tmp.unlink(missing_ok=True)
    return None


def set_metadata(path: Path, meta: dict[str, str]) -> None:
    """Replace the metadata_props of the graph at `path`."""
    proto = onnx.load(str(path), load_external_data=False)
    del proto.metadata_props[:]
    onnx.helper.set_model_props(proto, meta)
    onnx.save_model(proto, str(path))


def _size_ratio(proto: onnx.ModelProto, model: GPT) -> float:
    """Bytes of the graph's weights over the bytes of the model's parameters (tied ones once): 1.0
    when every weight is stored once. (The file adds the graph itself: a few KiB.)"""
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    stored = sum(len(i.raw_data) or onnx.numpy_helper.to_array(i).nbytes for i in proto.graph.initializer)
    return stored / n_bytes
