"""`gptport bench`: prefill and decode speed across providers and precisions, against torch."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gptport.cli import options as opt
from gptport.cli.common import ModelDir, err, open_engine

if TYPE_CHECKING:
    from gptport.runtime.loader import Opened

EXAMPLES = """Examples:

  gptport bench models/mymodel

  gptport bench models/mymodel --providers cpu,cuda,tensorrt --precisions fp32,int8,fp16 --batch 1,8

  gptport bench models/mymodel --prompt-len 64,512 --gen-len 128 --json bench.json --plot bench.png
"""


def _ints(text: str, option: str) -> list[int]:
    from gptport.errors import UsageError

    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{option} {text!r}: expected comma-separated integers") from None
    if not values or min(values) < 1:
        raise UsageError(f"{option} {text!r}: expected positive integers")
    return values


def bench(
    model_dir: ModelDir,
    providers: opt.BenchProviders = "cpu",
    precisions: opt.BenchPrecisions = "fp32",
    kv_cache: opt.BenchKvCaches = "auto",
    kv_dtype: opt.BenchKvDtypes = "float32",
    batch: Annotated[str, typer.Option(help="Comma-separated batch sizes.")] = "1",
    prompt_len: Annotated[str, typer.Option(help="Comma-separated prompt lengths (tokens).")] = "64",
    gen_len: Annotated[int, typer.Option(help="Tokens generated per run.")] = 128,
    repeat: Annotated[int, typer.Option(help="Measured runs per configuration.")] = 5,
    warmup: Annotated[int, typer.Option(help="Unmeasured runs first.")] = 1,
    threads: opt.BenchThreads = 0,
    torch_baseline: Annotated[bool, typer.Option("--torch-baseline/--no-torch-baseline",
                                                 help="Also run the torch model (needs the train extra).")] = True,
    json_path: Annotated[Path | None, typer.Option("--json", help="Write {machine, versions, rows} here.")] = None,
    csv_path: Annotated[Path | None, typer.Option("--csv", help="Write the rows here.")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Draw tokens/s per configuration (PNG).")] = None,
    draft: opt.BenchDraft = None,
    draft_tokens: opt.BenchDraftTokens = None,
    draft_precision: opt.BenchDraftPrecision = None,
    draft_threads: opt.DraftThreads = None,
    bursts: Annotated[int, typer.Option("--bursts", help="--provider cuda with export --cuda's graphs: greedy "
                                        "decode steps per run (each step's argmax feeds the next on the GPU, "
                                        "the host reads k tokens at once; latencies are then a burst's mean). "
                                        "0: one step a run.")] = 0,
) -> None:
    """Measure prefill and decode tokens/s, latency percentiles, memory, and the share of the memory
    bandwidth decoding uses."""
    import csv
    import json

    from rich.markup import escape

    from gptport import atomic
    from gptport.errors import UsageError
    from gptport.runtime import bench as measure
    from gptport.runtime.providers import check_name

    plan = measure.BenchPlan(
        providers=[check_name(p.strip()) for p in providers.split(",") if p.strip()],
        precisions=[p.strip() for p in precisions.split(",") if p.strip()],
        batches=_ints(batch, "--batch"), prompt_lens=_ints(prompt_len, "--prompt-len"),
        gen_len=gen_len, repeat=repeat, warmup=warmup, threads=threads, torch_baseline=torch_baseline,
        kv_caches=[c.strip() for c in kv_cache.split(",") if c.strip()], draft=draft, draft_tokens=draft_tokens,
        draft_precision=draft_precision, draft_threads=draft_threads, bursts=bursts,
        kv_dtypes=[k.strip() for k in kv_dtype.split(",") if k.strip()])
    if draft_tokens is not None and (draft is None or draft_tokens < 1):
        raise UsageError(f"--draft-tokens {draft_tokens}: needs --draft, and at least 1")
    if draft_precision is not None and draft is None:
        raise UsageError("--draft-precision needs --draft")
    check_bursts(bursts, plan.providers, draft is not None)
    from gptport.runtime.speculative import check_draft_threads

    check_draft_threads(draft_threads, draft)
    if draft is not None:
        from gptport import tokenizer as bpe
        from gptport.runtime.speculative import check_tokenizers

        check_tokenizers(model_dir, bpe.load(model_dir).sha256, draft, bpe.load(draft).sha256)
        if 1 not in plan.batches:
            raise UsageError(f"--draft: speculative rows run at batch 1; --batch {batch} has none")
    from gptport.runtime.choice import CacheLayout

    caches = [str(c) for c in CacheLayout]
    bad = [c for c in plan.kv_caches if c not in caches]
    if bad or not plan.kv_caches:
        raise UsageError(f"--kv-cache {kv_cache!r}: choose from {', '.join(caches)}")
    from gptport.contract import KV_DTYPES

    if not plan.kv_dtypes or any(k not in KV_DTYPES for k in plan.kv_dtypes):
        raise UsageError(f"--kv-dtype {kv_dtype!r}: choose from {', '.join(KV_DTYPES)}")
    if gen_len < 2 or repeat < 1 or warmup < 0:
        raise UsageError("--gen-len must be >= 2, --repeat >= 1 and --warmup >= 0")
    with err.status("benchmarking") as status:
        result = measure.run(model_dir, plan, say=lambda m: status.update(escape(m)),
                             warn=lambda m: err.print(f"[yellow]warning:[/] {escape(m)}"), open_torch=open_torch)
    print_table(result)
    if json_path:
        atomic.write_text(json_path, json.dumps(result, indent=2) + "\n")
        err.print(f"wrote {json_path}")
    if csv_path:
        with atomic.atomic_path(csv_path) as tmp, open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(result["rows"][0]) if result["rows"] else ["engine"])
            writer.writeheader()
            for row in result["rows"]:
                writer.writerow({k: (";".join(v) if isinstance(v, list) else v) for k, v in row.items()})
        err.print(f"wrote {csv_path}")
    if plot:
        _plot(result, plot)
        err.print(f"wrote {plot}")


def check_bursts(bursts: int, providers: list[str], draft: bool) -> None:
    """Refuse --bursts where no row could burst: a size below 0 or of 1, no cuda provider, a draft model."""
    from gptport.errors import UsageError
    from gptport.runtime.burst import check_burst_size

    check_burst_size(bursts)
    if bursts and "cuda" not in providers:
        raise UsageError(f"--bursts {bursts}: greedy bursts run on --provider cuda (export --cuda's graphs); "
                         f"--providers {','.join(providers)} has no cuda")
    if bursts and draft:
        raise UsageError("--bursts and --draft: speculative rows verify drafts a step at a time; choose one")


def _fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def print_table(result: dict) -> None:
    """The rows of a bench result (bench.run) as a table on stderr, then why each row that failed did not run;
    `gptport bench` and `gptport demo` print it."""
    from rich.markup import escape
    from rich.table import Table

    m = result["machine"]
    table = Table("engine", "provider", "prec", "cache", "batch", "prompt", "prefill tok/s", "decode tok/s", "ttft ms",
                  "p50/p90/p99 ms", "vs torch", "bandwidth", "RSS MB",
                  title=f"{m['cpu']}, {m['threads'] or 'default'} threads, {m['memory_read_gb_s']} GB/s read")
    for r in result["rows"]:
        if r["error"]:
            continue
        table.add_row(
            r["engine"] + ("+draft" if r.get("draft") else ""),
            r["provider"], r["precision"], r["kv_cache"] + (f" x{r['bursts']}" if r.get("bursts") else ""),
            str(r["batch"]), str(r["prompt_len"]), f"{_fmt(r['prefill_tok_s'])} ± {_fmt(r['prefill_tok_s_std'])}",
            f"{_fmt(r['decode_tok_s'])} ± {_fmt(r['decode_tok_s_std'])}", _fmt(r["ttft_ms"], ".1f"),
            f"{_fmt(r['latency_ms_p50'], '.2f')}/{_fmt(r['latency_ms_p90'], '.2f')}/{_fmt(r['latency_ms_p99'], '.2f')}",
            _fmt(r["speedup_vs_torch"], ".2f") + ("x" if r["speedup_vs_torch"] else ""),
            _fmt(r["bandwidth_fraction"], ".0%"), _fmt(r["peak_rss_mb"]))
    err.print(table)
    for r in result["rows"]:
        if r.get("draft") and not r["error"]:
            err.print(f"drafts from {r['draft']} ({r['draft_precision']} for {r['precision']}, prompt "
                      f"{r['prompt_len']}): acceptance "
                      f"{r['acceptance']:.0%}, {r['tokens_per_step']:.2f} tokens per step, decode "
                      f"{_fmt(r['speedup_vs_plain'], '.2f')}x plain")
    for r in result["rows"]:
        if r["error"]:
            what = f"{r['engine']} {r['provider']} {r['precision']} {r['kv_cache']}"
            err.print(f"[red]{what}: not run[/]: {escape(r['error'])}")


def _plot(result: dict, path: Path) -> None:
    from gptport.errors import UsageError

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError("--plot needs matplotlib (pip install 'gptport[plot]')") from None
    rows = [r for r in result["rows"] if not r["error"]]
    labels = [f"{r['engine']} {r['provider']} {r['precision']} {r['kv_cache']}\nb{r['batch']} p{r['prompt_len']}"
              for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(max(8, len(rows) * 1.2), 4.5))
    panels = ((axes[0], "decode_tok_s", "decode tokens/s"), (axes[1], "prefill_tok_s", "prefill tokens/s"))
    for ax, key, title in panels:
        ax.bar(range(len(rows)), [r[key] for r in rows], yerr=[r[key + "_std"] for r in rows], color="#4c72b0")
        ax.set_xticks(range(len(rows)), labels, fontsize=7, rotation=30, ha="right")
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def open_torch(model_dir: Path, provider: str, threads: int) -> Opened:
    """The torch baseline's engine (a missing PyTorch is the row's error, not the run's)."""
    return open_engine(model_dir, "torch", run=opt.run_options(provider, threads))
