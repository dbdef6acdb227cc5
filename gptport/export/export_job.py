"""What the steps of one export share (exporter.py reads as those steps): each graph it may write, and the job
that carries the model, the gate's text and what has passed so far."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gptport import contract
from gptport import tokenizer as bpe
from gptport.export import calibration, validate, variants
from gptport.export.export_report import ExportReport
from gptport.export.tolerance import Tolerance
from gptport.runtime.engine import StepFn
from gptport.training.checkpoint import ModelCard
from gptport.training.model import GPT


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
