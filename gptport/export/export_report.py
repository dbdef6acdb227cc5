"""What `gptport export` wrote and measured (ExportReport, for the CLI's tables), and its --precision list."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from gptport import contract
from gptport.errors import UsageError
from gptport.export import kv_quant, validate
from gptport.export.ort_format import OrtRow


@dataclass
class ExportReport:
    """What export wrote and measured, for the CLI's tables."""

    files: dict[str, Path] = field(default_factory=dict)
    parity: list[validate.ParityRow] = field(default_factory=list)
    greedy_tokens: int = 0
    parity_of: str = "fp32"  # what report.parity checked: the fp32 graph, or "the first 2 layers" (a slice)
    gates: list[validate.GateRow] = field(default_factory=list)  # every scheme tried, in order
    not_applied: list[tuple[str, str, str]] = field(default_factory=list)  # (variant, scheme, why) not tried
    schemes: dict[str, str] = field(default_factory=dict)  # written variant ("int8", "int8 static") -> scheme
    gated: bool = True  # False: the variants were written with --no-gate, unchecked
    heldout: str = ""  # the text the gate scored (validate.Heldout.source), when a variant was gated
    sampled: bool = False  # that text was the model's own samples (--gate-on-sampled-text)
    removed: dict[Path, str] = field(default_factory=dict)  # an earlier export's graphs this one did not
    # rewrite -> why: a variant that missed its gate this time, or a graph of other weights (provenance.stale)
    static_parity: list[validate.ParityRow] = field(default_factory=list)
    static_skipped: str = ""  # why no static-cache graph was written, when one could not be
    append_parity: list[validate.ParityRow] = field(default_factory=list)  # the multi-row append graph's
    fused: dict[str, int] = field(default_factory=dict)
    size_ratio: float = 0.0
    genai: Path | None = None
    ort: list[OrtRow] = field(default_factory=list)  # export --ort-format: the .ort files and their checks
    kv_gates: list[kv_quant.KvGateRow] = field(default_factory=list)  # --kv-dtype int8: every scale kind tried

    @property
    def precisions(self) -> list[str]:
        """The precisions written, each once in the order written: "int8" and "int8 static" are one."""
        return list(dict.fromkeys(label.split()[0] for label in self.files))


def parse_precisions(text: str) -> list[str]:
    """'int8,fp32' -> ['fp32', 'int8']: each once, fp32 first where asked (the exporter adds it where the variants
    need it: exporter.export)."""
    asked = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in asked if p not in contract.PRECISIONS]
    if bad or not asked:
        raise UsageError(f"--precision {text!r}: unknown {', '.join(bad) or 'empty'}; choose from "
                         f"{', '.join(contract.PRECISIONS)}")
    return sorted(dict.fromkeys(asked), key=lambda p: p != "fp32")
