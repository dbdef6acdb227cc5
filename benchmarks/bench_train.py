"""Training quality in a fixed wall time: the `tiny` preset on tinyshakespeare for 5 minutes on the CPU.

Goal (issue 3): validation bits per byte <= 2.5 (nanoGPT's published CPU run: 1.88 nats/char,
about 2.71 bits per byte, in ~3 minutes). Runs the CLI as a user would, then reads logs/train.jsonl.
Writes benchmarks/results/train.json.

    python benchmarks/bench_train.py [--minutes 5] [--vocab-size 1024] [--set key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = HERE / "work" / "train"
RESULTS = HERE / "results"


def gptport(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "gptport.cli.main", *args], check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--vocab-size", type=int, default=1024)
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--set", dest="sets", action="append", default=[])
    ap.add_argument("--corpus", type=Path,
                    default=HERE.parent.parent / "shared" / "corpora" / "tinyshakespeare.txt")
    ap.add_argument("--out", type=Path, default=RESULTS / "train.json")
    args = ap.parse_args()

    shutil.rmtree(WORK, ignore_errors=True)
    gptport("train-tokenizer", str(args.corpus), "--vocab-size", str(args.vocab_size), "--out", str(WORK))
    t0 = time.perf_counter()
    sets = [x for s in args.sets for x in ("--set", s)]
    gptport("train", str(args.corpus), "--model-dir", str(WORK), "--preset", args.preset,
            "--minutes", str(args.minutes), *sets)
    wall = time.perf_counter() - t0
    records = [json.loads(line) for line in (WORK / "logs" / "train.jsonl").read_text().splitlines()]
    last = records[-1]
    config = json.loads((WORK / "config.json").read_text())
    trainer = json.loads((WORK / "trainer.json").read_text())
    import torch

    result = {
        "benchmark": "tiny preset on tinyshakespeare, fixed wall time, CPU",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "torch_threads": torch.get_num_threads(),
                    "cpu_capability": torch.backends.cpu.get_cpu_capability()},
        "versions": {"torch": torch.__version__},
        "goal": "val_bpb <= 2.5 within 5 minutes (nanoGPT CPU reference: ~2.71 bpb)",
        "minutes": args.minutes, "vocab_size": args.vocab_size, "preset": args.preset, "sets": args.sets,
        "model": config["model"], "n_params": config["n_params"], "train": trainer["train"],
        "final": last, "best_val_bpb": min(r["val_bpb"] for r in records),
        "wall_s_including_tokenization": round(wall, 1),
        "evals": records,
    }
    RESULTS.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"final val_bpb {last['val_bpb']:.4f} (best {result['best_val_bpb']:.4f}) at step {last['step']}, "
          f"{last['tokens_per_s']:,.0f} tok/s; wrote {args.out}")


if __name__ == "__main__":
    main()
