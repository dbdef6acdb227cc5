"""Training quality in a fixed wall time: the `tiny` preset on tinyshakespeare for 5 minutes on the CPU.

Goal: validation bits per byte <= 2.5 (nanoGPT's published CPU run: 1.88 nats/char, about 2.71 bits per
byte, in ~3 minutes). Runs the CLI as a user would, then reads logs/train.jsonl. One round.

With --ddp, instead: the same training on 2 torchrun ranks × 1 thread against 1 process × 2 threads with
--grad-accum 2 (the same global batch, the same examples in the same order), for --steps steps each, in
one round: tokens/s and the time to reach the single process's final validation loss (label ddp).

    python -m benchmarks.train.fixed_time [--minutes 5] [--vocab-size 1024] [--set key=value ...]
    python -m benchmarks.train.fixed_time --ddp [--steps 120]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, results
from benchmarks.harness.models import SHAKESPEARE, WORK
from benchmarks.harness.models import cli as gptport
from benchmarks.harness.run import Run

TRAIN = WORK / "train"
DDP_RUNS = {"1 process × 2 threads, grad_accum 2": ["--threads", "2", "--grad-accum", "2"],
            "2 ranks × 1 thread (Gloo), grad_accum 1": ["--threads", "1", "--grad-accum", "1", "--nproc-per-node", "2"]}


def records(d: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (d / "logs" / "train.jsonl").read_text().splitlines()]


def ddp_rows(args: argparse.Namespace, run: Run) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """2 ranks × 1 thread against 1 process × 2 threads, the same global batch and data order."""
    shutil.rmtree(TRAIN, ignore_errors=True)
    gptport("train-tokenizer", str(args.corpus), "--vocab-size", str(args.vocab_size), "--out", str(TRAIN / "tok"))
    sets = [x for s in args.sets for x in ("--set", s)]
    common = [str(args.corpus), "--preset", args.preset, "--steps", str(args.steps), "--eval-every",
              str(max(1, args.steps // 6)), *sets]
    rows = []
    with run.round() as rnd:
        for i, (name, extra) in enumerate(DDP_RUNS.items()):
            d = TRAIN / f"run{i}"
            shutil.copytree(TRAIN / "tok", d)
            t0 = time.perf_counter()
            gptport("train", *common, "--model-dir", str(d), *extra)  # shards made by each run, before its clock
            wall = time.perf_counter() - t0  # with start-up (imports, rendezvous) and tokenizing
            evals = records(d)
            rnd.data[name] = {"evals": evals}
            rows.append({"run": name, "tokens_per_s_median": statistics.median(r["tokens_per_s"] for r in evals[1:]
                                                                                or evals),
                         "final_val_loss": evals[-1]["val_loss"], "elapsed_s": evals[-1]["elapsed_s"],
                         "wall_s_with_startup": round(wall, 1)})
    target = rows[0]["final_val_loss"] + 1e-4
    for row in rows:
        row["s_to_target_val_loss"] = next((r["elapsed_s"] for r in run.rounds[-1].data[row["run"]]["evals"]
                                            if r["val_loss"] <= target), None)
    summary = {"target_val_loss": target,
               "ratio_tokens_per_s": rows[1]["tokens_per_s_median"] / rows[0]["tokens_per_s_median"]}
    print(f"{args.preset} preset, {args.steps} steps, target val loss {target:.4f}")
    for row in rows:
        print(f"{row['run']:<42} {row['tokens_per_s_median']:>10,.0f} tok/s  val loss {row['final_val_loss']:.4f}  "
              f"{row['s_to_target_val_loss']} s to target")
    print(f"2 ranks / 1 process tokens/s: {summary['ratio_tokens_per_s']:.2f}x")
    return rows, summary


def fixed_time(args: argparse.Namespace, run: Run) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    shutil.rmtree(TRAIN, ignore_errors=True)
    gptport("train-tokenizer", str(args.corpus), "--vocab-size", str(args.vocab_size), "--out", str(TRAIN))
    sets = [x for s in args.sets for x in ("--set", s)]
    with run.round() as rnd:
        t0 = time.perf_counter()
        gptport("train", str(args.corpus), "--model-dir", str(TRAIN), "--preset", args.preset,
                "--minutes", str(args.minutes), *sets)
        wall = time.perf_counter() - t0
        evals = records(TRAIN)
        rnd.data["evals"] = evals
    last = evals[-1]
    config = json.loads((TRAIN / "config.json").read_text())
    trainer = json.loads((TRAIN / "trainer.json").read_text())
    import torch

    row = {"preset": args.preset, "n_params": config["n_params"], "minutes": args.minutes, "step": last["step"],
           "final_val_bpb": last["val_bpb"], "best_val_bpb": min(r["val_bpb"] for r in evals),
           "val_loss": last["val_loss"], "tokens_per_s": last["tokens_per_s"],
           "wall_s_including_tokenization": round(wall, 1)}
    details = {"model": config["model"], "train": trainer["train"], "final": last,
               "torch_threads": torch.get_num_threads(), "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    print(f"final val_bpb {last['val_bpb']:.4f} (best {row['best_val_bpb']:.4f}) at step {last['step']}, "
          f"{last['tokens_per_s']:,.0f} tok/s")
    return [row], details


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--vocab-size", type=int, default=1024)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--corpus", type=Path, default=SHAKESPEARE)
    ap.add_argument("--ddp", action="store_true", help="2 ranks x 1 thread vs 1 process x 2 threads")
    ap.add_argument("--steps", type=int, default=120, help="steps of each --ddp run")
    args = ap.parse_args()
    if not args.corpus.is_file():
        raise SystemExit(f"--corpus {args.corpus}: no such file")
    run = Run()
    rows, details = ddp_rows(args, run) if args.ddp else fixed_time(args, run)
    goal = ("the same loss in less time on 2 ranks" if args.ddp else
            "val_bpb <= 2.5 within 5 minutes (nanoGPT CPU reference: ~2.71 bpb)")
    results.write(results.document(results.benchmark_name(__spec__), run, rows, cli.settings(args, goal=goal),
                                   label=args.label or ("ddp" if args.ddp else ""), details=details), args.results)


if __name__ == "__main__":
    main()
