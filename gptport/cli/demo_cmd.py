"""`gptport demo`: the whole pipeline on a corpus every Python installation carries, with no network."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gptport import paths
from gptport.cli.common import err, human_bytes

if TYPE_CHECKING:
    from gptport.export.exporter import ExportReport
    from gptport.training.train import EvalRecord

EXAMPLES = """Examples:

  gptport demo

  gptport demo --out models/demo --minutes 2
"""
PROMPT = "def "


def demo(
    out: Annotated[Path, typer.Option(help="Model directory to create.")] = Path("models/demo"),
    minutes: Annotated[float, typer.Option(help="Training time (wall clock).")] = 4.0,
    vocab_size: Annotated[int, typer.Option(help="Tokenizer vocabulary size.")] = 4096,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing demo directory.")] = False,
) -> None:
    """Tokenizer, tiny GPT, ONNX export (fp32, int8), a sample and a short bench, on the standard
    library's own source files."""
    from gptport import tokenizer as bpe
    from gptport.cli.bench_cmd import open_torch, print_table
    from gptport.cli.train_cmd import prepare_with_progress, train_with_progress
    from gptport.config import ModelConfig, TrainConfig
    from gptport.corpus import CorpusReader, default_corpus
    from gptport.errors import InputError, UsageError
    from gptport.export import exporter
    from gptport.preset import load_preset
    from gptport.runtime import bench
    from gptport.runtime.generate import generate
    from gptport.runtime.loader import open_model
    from gptport.runtime.sampling import Sampling

    if minutes <= 0:
        raise UsageError(f"--minutes must be positive, not {minutes}")
    if (out / paths.TOKENIZER).exists() and not force:
        raise InputError(f"{out}: already holds a model; pass --force to replace it, or --out elsewhere")
    t_start = time.perf_counter()

    err.rule("1/6 corpus")
    sources, skipped = default_corpus()
    total = sum(s.size or 0 for s in sources)
    err.print(f"the standard library of Python {sys.version.split()[0]}: {len(sources)} files, "
              f"{human_bytes(total)}; skipped {skipped} that are not UTF-8")

    err.rule("2/6 tokenizer")
    with err.status(f"training a {vocab_size}-token BPE"):
        tok, report = bpe.train(CorpusReader(sources), vocab_size)
    for name in paths.TRAINED:
        (out / name).unlink(missing_ok=True)
    bpe.save(tok, out, report, force=True)
    err.print(f"{tok.vocab_size} tokens in {report.seconds:.1f} s, {report.bytes_per_token:.2f} bytes/token held out")

    err.rule("3/6 training (preset tiny)")
    preset = load_preset("tiny")
    cfg = ModelConfig(vocab_size=tok.vocab_size, **preset.model)
    tcfg = TrainConfig(**{**preset.train, "minutes": minutes})
    shards = prepare_with_progress(out, CorpusReader(sources), tok, tcfg.val_fraction)
    err.print(f"{cfg.n_params() / 1e6:.2f}M parameters, {minutes:g} minutes")
    records = train_with_progress(out, cfg, tcfg, shards, tok, resume=False)

    err.rule("4/6 export to ONNX (fp32, int8)")
    with err.status("exporting") as status:
        exported = exporter.export(out, ["fp32", "int8"], force=True, say=status.update)
    worst = max(r.max_logits for r in exported.parity)
    gates = {g.precision: g for g in exported.gates}
    err.print(f"parity: max |Δ logits| {worst:.1e} over {len(exported.parity)} cases; greedy decoding "
              f"identical for {exported.greedy_tokens} tokens; int8 top-1 agreement {gates['int8'].top1:.1%}"
              + ("" if gates["int8"].ok else " (below the 98% gate: not written)"))

    err.rule(f"5/6 a sample (cpu, fp32, prompt {PROMPT!r})")
    opened = open_model(out)
    ids = [tok.encode(PROMPT)]
    row = generate(opened.engine, ids, 120, Sampling(temperature=0.8, top_k=40, seed=0), tok.eot_id)[0]
    sys.stdout.write(PROMPT + tok.decode(row.new_ids) + "\n")
    sys.stdout.flush()

    err.rule("6/6 bench (batch 1, prompt 64, 64 new tokens)")
    plan = bench.BenchPlan(precisions=exported.precisions, prompt_lens=(min(64, cfg.n_ctx - 64),), gen_len=64,
                           repeat=2, warmup=1)
    with err.status("benchmarking") as status:
        result = bench.run(out, plan, say=status.update, open_torch=open_torch)
    print_table(result)
    _summary(out, records[-1] if records else None, exported, result, time.perf_counter() - t_start)


def _summary(out: Path, last: EvalRecord | None, exported: ExportReport, result: dict[str, Any],
             seconds: float) -> None:
    from rich.table import Table

    table = Table("", "", title=f"gptport demo: {out} in {seconds / 60:.1f} minutes")
    for name, path in exported.files.items():
        table.add_row(f"{name} model", f"{path.name}, {human_bytes(path.stat().st_size)}")
    table.add_row("weights", human_bytes((out / paths.WEIGHTS).stat().st_size))
    if last is not None:
        table.add_row("loss", f"train {last.train_loss:.3f}, validation {last.val_loss:.3f} nats/token "
                              f"(perplexity {last.val_ppl:.1f})")
        table.add_row("bits per byte", f"{last.val_bpb:.3f} on validation")
    table.add_row("parity", f"max |Δ logits| {max(r.max_logits for r in exported.parity):.1e} vs torch")
    for r in result["rows"]:
        if not r["error"]:
            vs = f", {r['speedup_vs_torch']:.2f}x torch" if r["speedup_vs_torch"] else ""
            table.add_row(f"{r['engine']} {r['provider']} {r['precision']}",
                          f"decode {r['decode_tok_s']:,.0f} tok/s{vs}, prefill {r['prefill_tok_s']:,.0f} tok/s")
    err.print(table)
    err.print(f"next: gptport generate {out} \"def \"  ·  gptport eval {out} FILE  ·  gptport bench {out}")
