"""`gptport export`: torch -> ONNX with a KV cache, checked against torch, plus variants."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gptport.cli import options as opt
from gptport.cli.common import Force, ModelDir, err, human_bytes
from gptport.errors import UsageError
from gptport.export.agreement import TIE_NATS
from gptport.export.tolerance import ATOL, RTOL, Tolerance

if TYPE_CHECKING:
    from rich.table import Table

    from gptport.export.validate import ParityRow

EXAMPLES = """Examples:

  gptport export models/mymodel

  gptport export models/mymodel --precision fp32,int8,int4 --force

  gptport export models/mymodel --precision fp32,fp16 --optimize

  gptport export models/imported --precision fp32,int8 --heldout heldout.txt

  gptport export models/random --precision fp32,int8,int4 --no-gate   # speed only: unchecked variants

  gptport export models/mymodel --precision fp32,fp16 --cuda   # + the graphs CUDA decodes with (CUDA graphs)
"""


def export(
    model_dir: ModelDir,
    precision: opt.ExportPrecisions = "fp32",
    optimize: Annotated[bool, typer.Option("--optimize/--no-optimize", help="Fuse LayerNorm and GELU with "
                                           "onnxruntime's transformer optimizer (faster; --no-optimize keeps "
                                           "standard ONNX ops only).")] = True,
    static: Annotated[bool, typer.Option("--static/--no-static", help="Also write the static-cache graphs "
                                         "(model.static.onnx, model.int8.static.onnx, ...): the CPU's fastest "
                                         "decoding, onnxruntime-only.")] = True,
    opset: Annotated[int, typer.Option(help="ONNX opset (18 or later).")] = 18,
    rtol: Annotated[float, typer.Option(help="Parity gate: each quantity compared with torch (the logits, each "
                                        "layer's keys and values) may differ by rtol times its magnitude (its "
                                        "largest |x|) plus --atol.")] = RTOL,
    atol: Annotated[float, typer.Option(help="Parity gate: the absolute floor of each quantity's bound (for "
                                        "quantities near zero).")] = ATOL,
    force: Force = False,
    gate: Annotated[bool, typer.Option("--gate/--no-gate", help="Check each variant against fp32 torch on "
                                       "held-out text (top-1 ≥ 98%, a near-tie of torch's counting as agreement). "
                                       "--no-gate writes them unchecked, "
                                       "recorded as ungated (gptport.gated = false): for speed measurements "
                                       "on untrained weights, which cannot pass it.")] = True,
    heldout: Annotated[Path | None, typer.Option("--heldout", metavar="FILE", help="UTF-8 text the model was not "
                                                 "trained on, for the gate (default: the validation shard "
                                                 "data/val.bin).")] = None,
    gate_on_sampled_text: Annotated[bool, typer.Option("--gate-on-sampled-text", help="Without data/val.bin or "
                                                       "--heldout, gate on text the model samples itself "
                                                       "(weaker: its own likeliest text).")] = False,
    ort_format: Annotated[bool, typer.Option("--ort-format", help="Also write each graph in ONNX Runtime's format "
                                             "(model.ort, ...: onnxruntime Mobile and minimal builds) and "
                                             "required_operators.config, checked against the .onnx.")] = False,
    ort_level: Annotated[str, typer.Option("--ort-level", help="Optimization saved into the .ort files: basic "
                                           "(portable), extended or all (onnxruntime's CPU fusions and layouts "
                                           "baked in).")] = "basic",
    kv_dtype: opt.ExportKvDtype = "float32",
    cuda: Annotated[bool, typer.Option("--cuda", help="Also write the static-cache graphs the CUDA provider "
                                       "decodes with, replayed as CUDA graphs: model.decode.onnx (fp32: "
                                       "TensorScatter + Attention, checked against torch) and, with fp16 in "
                                       "--precision, model.fp16.static.onnx (float16 GroupQueryAttention, gated "
                                       "like the fp16 variant); each checked on the CPU.")] = False,
) -> None:
    """Export the trained model to ONNX (model.onnx and variants), validated against torch."""
    from rich.markup import escape
    from rich.table import Table

    from gptport.export import exporter

    precisions = exporter.parse_precisions(precision)
    for name, value in (("--rtol", rtol), ("--atol", atol)):
        if not math.isfinite(value) or value < 0:
            raise UsageError(f"{name} {value:g}: must be a finite number of at least 0")
    if rtol == 0 and atol == 0:
        raise UsageError("--rtol 0 --atol 0: a zero bound refuses every graph; give either a positive value")
    tol = Tolerance(rtol, atol)
    if cuda and not static:
        raise UsageError("--cuda --no-static: the CUDA graphs prefill with the multi-row append graph that the "
                         "static-cache graphs come with; drop --no-static")
    with err.status("exporting") as status:
        report = exporter.export(model_dir, precisions, optimize=optimize, static=static, opset=opset,
                                 tol=tol,
                                 force=force, say=lambda msg: status.update(msg), gate=gate, heldout=heldout,
                                 sampled_text=gate_on_sampled_text, ort_level=ort_level if ort_format else None,
                                 kv_dtype=kv_dtype)
    err.print(_parity_table(report.parity, "case (batch, seq, past)", f"{report.parity_of} parity against torch", tol))
    if report.static_parity:
        err.print(_parity_table(report.static_parity, "case (batch, prompt) + decode steps",
                                "static-cache graph (model.static.onnx) against torch", tol))
    if report.append_parity:
        err.print(_parity_table(report.append_parity, "case (rows: chunk sizes per step)",
                                "multi-row append graph (model.append.onnx) against torch", tol))
    if report.static_skipped:
        err.print(f"[yellow]no static-cache graph:[/] {report.static_skipped}; generate uses model.onnx")
    if report.greedy_tokens:
        err.print(f"greedy decoding: {report.greedy_tokens} tokens identical in torch and ONNX; "
                  f"weights stored {report.size_ratio:.3f}x the parameter bytes")
    if report.fused:
        err.print("fused operators: " + ", ".join(f"{k} {v}" for k, v in report.fused.items()))
    if report.gates:
        text = (f"on {report.heldout} (no held-out text; --gate-on-sampled-text)" if report.sampled
                else f"on held-out text ({escape(report.heldout)})")
        gates = Table("variant", "scheme", "top-1 agreement", "mean KL (nats)", "positions", "written",
                      title=f"variants against fp32 torch {text} (gate: top-1 ≥ 98%, a pick within "
                            f"{TIE_NATS:g} nats of torch's best agreeing; a scheme that misses it gives way to the "
                            "next)")
        for g in report.gates:
            gates.add_row(g.precision, g.scheme or "—", f"{g.top1:.2%}", f"{g.mean_kl:.2e}", str(g.positions),
                          "✓" if g.ok else "✗")
        err.print(gates)
    for label, scheme, why in report.not_applied:
        err.print(f"{label}: {scheme} not tried: {why}")
    if report.kv_gates:
        kv = Table("graph", "scales", "top-1 agreement", "bits/byte (float32 → int8 cache)", "positions",
                   "16-row step (float32 → int8 cache)", "passed",
                   title="int8 KV cache against the float32 cache, decoding the gate's text "
                         f"(gate: top-1 ≥ 98%, a pick within {TIE_NATS:g} nats of the float32 cache's best "
                         "agreeing, bits/byte within 1%; the faster passing kind is written)")
        for k in report.kv_gates:
            kv.add_row(k.label, k.kind.lower().replace("_", "-"), f"{k.top1:.2%}",
                       f"{k.bpb_fp32:.4f} → {k.bpb_int8:.4f} ({k.bpb_change:+.2%})", str(k.positions),
                       f"{k.step_ms_fp32:.2f} → {k.step_ms:.2f} ms", "✓" if k.ok else "✗")
        err.print(kv)
    if not report.gated and any(p != "fp32" for p in precisions):
        err.print("[yellow]warning:[/] --no-gate: the variants were written without the accuracy gate "
                  "(gptport.gated = false); generate, eval and bench will say so")
    for row in report.ort:
        err.print(f"{row.path.name} (level {row.level}, from {row.source.name}): {row.check}")
    for path in report.files.values():
        data = path.with_name(path.name + ".data")
        held = f" + {data.name} ({human_bytes(data.stat().st_size)})" if data.is_file() else ""
        err.print(f"wrote {path} ({human_bytes(path.stat().st_size)}){held}")
    for path, why in report.removed.items():
        err.print(f"removed {path} ({why})")
    if cuda:
        _cuda_graphs(model_dir, precisions, gate, heldout, gate_on_sampled_text, tol, force)
    failed = list(dict.fromkeys(g.precision for g in report.gates if g.precision not in report.schemes))
    failed += list(dict.fromkeys(k.label for k in report.kv_gates if k.label not in report.files))
    if failed:
        from gptport.errors import ValidationError

        raise ValidationError(f"variant(s) {', '.join(failed)} missed the accuracy gate and were not written")


def _cuda_graphs(model_dir: Path, precisions: list[str], gate: bool, heldout: Path | None, sampled: bool,
                 tol: Tolerance, force: bool) -> None:
    """export --cuda: the CUDA static-cache graphs written and checked after the others (cuda_export.py)."""
    from gptport.export import cuda_export

    with err.status("writing the CUDA static-cache graphs") as status:
        cuda = cuda_export.write(model_dir, precisions, gate, heldout, sampled, tol, force,
                                 say=lambda msg: status.update(msg))
    if cuda.decode_parity:
        err.print(_parity_table(cuda.decode_parity, "case (rows at lengths) + decode steps",
                                "decode graph (model.decode.onnx) against torch", tol))
    if cuda.gate is not None:
        g = cuda.gate
        err.print(f"fp16 static-cache graph against fp32 torch: top-1 {g.top1:.2%} of {g.positions} positions, "
                  f"mean KL {g.mean_kl:.2e} ({'passed' if g.ok else 'missed'} the gate)")
    for what, why in cuda.skipped.items():
        err.print(f"[yellow]no {what} graph:[/] {why}")
    for path in cuda.files.values():
        err.print(f"wrote {path} ({human_bytes(path.stat().st_size)})")
    if "fp16 static" in cuda.skipped and cuda.gate is not None and not cuda.gate.ok:
        from gptport.errors import ValidationError

        raise ValidationError("the fp16 static-cache graph missed the accuracy gate and was not written")


def _parity_table(rows: list[ParityRow], case: str, title: str, tol: Tolerance) -> Table:
    """A parity table: per case the largest differences, the quantity nearest its bound and how near."""
    from rich.table import Table

    table = Table(case, "max |Δ logits|", "max |Δ cache|", "nearest its bound (|Δ| / bound)", "top-1 agreement", "ok",
                  title=f"{title} (each quantity within {tol})")
    for r in rows:
        w = r.worst
        table.add_row(r.case, f"{r.max_logits:.2e}", f"{r.max_present:.2e}", f"{w.quantity} {w.ratio:.2f}",
                      f"{r.top1:.2%}", "✓" if r.ok else "✗")
    return table
