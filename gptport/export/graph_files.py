"""The graph files export writes: their metadata (what each was made from, whether it was gated), saving
(external data beyond 2 GB), the static-cache graphs from the weights, and the removal of an earlier
export's graphs of other weights."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx

from gptport import __version__, contract, provenance
from gptport.config import model_config_to_dict
from gptport.errors import ArtifactError, ValidationError
from gptport.export import gqa_graph, scatter_graph
from gptport.runtime.onnx_engine import file_metadata
from gptport.training.checkpoint import ModelCard
from gptport.training.model import GPT

TWO_GB = 2 * 1024**3


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


def save(proto: onnx.ModelProto, path: Path, meta: dict[str, str]) -> None:
    """Write `proto` with `meta` as metadata_props to `path` (external data beyond 2 GB)."""
    onnx.helper.set_model_props(proto, meta)
    if proto.ByteSize() > TWO_GB:
        onnx.save_model(proto, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                        location=path.name.removeprefix(".").split(".tmp-")[0] + ".data")
    else:
        onnx.save_model(proto, str(path))


def remove_stale(model_dir: Path, sources: Mapping[str, str], written: set[Path]) -> dict[Path, str]:
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


def save_static(model: GPT, card: ModelCard, path: Path, sources: Mapping[str, str] | None = None,
                cache: str = contract.CACHE_STATIC) -> None:
    """The fp32 static-cache graph (gqa_graph.py) of the model's weights, or with `cache` append its multi-row
    append twin (scatter_graph.py), with its metadata, at `path`."""
    weights = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    build = scatter_graph.build if cache == contract.CACHE_APPEND else gqa_graph.build
    save(build(card.model, weights), path, metadata(card, "fp32", cache, sources))


def set_metadata(path: Path, meta: dict[str, str]) -> None:
    """Replace the metadata_props of the graph at `path`."""
    proto = onnx.load(str(path), load_external_data=False)
    del proto.metadata_props[:]
    onnx.helper.set_model_props(proto, meta)
    onnx.save_model(proto, str(path))


def size_ratio(proto: onnx.ModelProto, model: GPT) -> float:
    """Bytes of the graph's weights over the bytes of the model's parameters (tied ones once): 1.0
    when every weight is stored once. (The file adds the graph itself: a few KiB.)"""
    n_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    stored = sum(len(i.raw_data) or onnx.numpy_helper.to_array(i).nbytes for i in proto.graph.initializer)
    return stored / n_bytes


def untie_folded_head(proto: onnx.ModelProto) -> None:
    """Store the tied embedding once after onnxruntime's transformer optimizer, which folds the head's
    Transpose(embedding) into a second copy of the embedding; in the latter
    case the copy is dropped and a Transpose node, which onnxruntime folds when it loads, takes its place."""
    graph = proto.graph
    inits = {i.name: i for i in graph.initializer}
    head = next((n for n in graph.node if n.op_type == "MatMul" and set(n.output) & set(contract.HEADS)), None)
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
