"""What the steps of one export share (exporter.py reads as those steps): each graph it may write, and the job
that carries the model, the gate's text and what has passed so far."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gptport import contract
from gptport import tokenizer as bpe
from gptport.export import (
    calibration,
    contract_graph,
    gqa_graph,
    graph_write,
    layer_check,
    layer_gate,
    scatter_graph,
    validate,
    variants,
)
from gptport.export.export_report import ExportReport
from gptport.export.graph_files import metadata
from gptport.export.nbits import NBits
from gptport.export.step_memo import Memo
from gptport.export.tensor_sink import Written
from gptport.export.tolerance import Tolerance
from gptport.runtime.engine import StepFn
from gptport.training.checkpoint import ModelCard
from gptport.training.model import GPT
from gptport.weights import float32_bytes


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
class Job:
    """What the steps of one export share: the model, where its graphs go, and what has passed."""

    model_dir: Path
    tok: bpe.BPETokenizer
    model: GPT | None  # None: a model checked layer by layer (layer_check.py), never held whole in torch
    card: ModelCard
    sources: Mapping[str, str]  # provenance.sources, hashed once before the model was loaded
    tol: Tolerance
    say: Callable[[str], None]
    report: ExportReport
    graphs: list[Graph] = field(default_factory=list)  # every graph asked for, contract graphs first
    windows: np.ndarray | None = None  # the gate's held-out windows; None: --no-gate (or no variant)
    prompts: list[list[int]] = field(default_factory=list)  # of the greedy check
    greedy: list[list[int]] | None = None  # torch's greedy tokens after `prompts` (validate.torch_greedy)
    memos: tuple[Memo, Memo] | None = None  # torch's and float64 torch's answers to the contract graph's cases
    plain: Path | None = None  # the unfused fp32 graph (temporary): what the variants are made from
    passed: dict[Graph, Path] = field(default_factory=dict)  # graph -> its checked temporary file
    float64: StepFn | None = None  # the model in float64 (validate.exact_step): made once, dropped after the last check
    ranges: variants.Ranges | None = None  # the activations' ranges a smoothing scheme needs: measured once
    samples: variants.Ranges | None = None  # the activations' sampled rows an AWQ scheme needs: drawn once
    weights: Mapping[str, np.ndarray] = field(default_factory=dict)  # gptport's names -> each tensor, read when asked
    outside: bool = False  # the graphs' weights go to external data (graph_write.external)
    opset: int = contract_graph.OPSET  # the contract graphs' default-domain opset (--opset)
    tell: Callable[[str], None] = lambda message: None  # progress within a step (say() without freeing first)
    taps: dict[str, list[str]] = field(default_factory=dict)  # "int4 static" -> its residual stream after each layer
    checked: list[layer_check.Case] = field(default_factory=list)  # the layer-by-layer check's cases, with logits
    chosen: layer_check.Greedy | None = None  # the greedy check's prompt and the reference's tokens after it
    written: dict[tuple[str, NBits | None], Written] = field(default_factory=dict)  # the contract graphs' data
    gate_reference: layer_gate.Reference | None = None  # torch's logits on `windows`, made layer by layer once

    def weights_bytes(self) -> int:
        """Bytes of the weights in float32 (a tied head once)."""
        return float32_bytes(self.weights)

    def build(self, cache: str, path: Path, precision: str = "fp32", nbits: NBits | None = None,
              gated: bool = True) -> None:
        """The graph of this cache layout written op by op from the weights to `path` (graph_write.write), its
        MatMul weights quantized by `nbits` when given (fp16: float16, contract_graph's `half`), with its metadata
        (`gated`: it will pass a gate); the names of its residual stream after each layer kept in
        taps["precision cache"] (layer_check.py cuts there)."""
        cfg, taps = self.card.model, self.taps.setdefault(f"{precision} {cache}", [])
        taps.clear()
        make = {contract.CACHE_CONCAT: lambda sink: contract_graph.build(cfg, self.weights, sink, nbits,
                                                                         opset=self.opset, residuals=taps,
                                                                         half=precision == "fp16"),
                contract.CACHE_STATIC: lambda sink: gqa_graph.build(cfg, self.weights, sink=sink, nbits=nbits,
                                                                    residuals=taps),
                contract.CACHE_APPEND: lambda sink: scatter_graph.build(cfg, self.weights, sink=sink, nbits=nbits,
                                                                          residuals=taps)}
        label, key = f"the {precision} {cache} graph", (precision, nbits)
        meta = metadata(self.card, precision, cache, self.sources, gated=gated)
        made = graph_write.write(path, make[cache], meta, self.outside,
                                 lambda k, n: self.tell(f"writing {label}: {k} tensors, {n / 2**30:.2f} GiB"),
                                 earlier=self.written.get(key) if cache != contract.CACHE_CONCAT else None)
        if cache == contract.CACHE_CONCAT and made is not None:  # its static-cache and append twins copy from it
            self.written[key] = made

    def ranges_for(self, scheme: str) -> variants.Ranges | None:
        """The activations' ranges if `scheme` smooths, their sampled rows if it is an AWQ scheme (on every other
        gate window, measured on first use)."""
        known = variants.SCHEMES.get(scheme)  # "": fp16, which has no scheme
        if known is None or not (known.smooth or known.awq) or self.windows is None:
            return None
        if known.awq:
            if self.samples is None:
                self.say("sampling the activations for AWQ's search (every other gate window)")
                self.samples = calibration.activation_samples(self.model, self.windows[::2])
            return self.samples
        if self.ranges is None:
            self.say("measuring the activations' channel ranges for smoothing (every other gate window)")
            self.ranges = calibration.activation_ranges(self.model, self.windows[::2])
        return self.ranges

    def reference(self) -> layer_gate.Reference:
        """torch's logits on the gate's windows for a model checked layer by layer, made on first use."""
        if self.gate_reference is None:
            assert self.windows is not None
            self.say(f"torch's logits on the gate's {len(self.windows)} windows, layer by layer")
            self.gate_reference = layer_gate.reference(self.model_dir, self.card.model, self.weights, self.windows)
        return self.gate_reference

    def exact(self) -> StepFn:
        """The float64 reference every parity check measures torch's rounding against, made on first use."""
        if self.float64 is None:
            self.float64 = validate.exact_step(self.model)
        return self.float64

    def graph(self, precision: str, cache: str = contract.CACHE_CONCAT) -> Graph | None:
        return next((g for g in self.graphs if g.precision == precision and g.cache == cache), None)
