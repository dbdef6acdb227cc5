"""Classic GPT against the Llama family's choices at equal parameters and equal minutes: held-out bits per byte.

classic is the `tiny` preset (learned positions, LayerNorm, GELU, 4 heads each with its own keys and values,
biases, head tied to the embedding); modern is `llama-tiny` (RoPE, RMSNorm, SwiGLU, 4 query heads over 2
key/value heads, no biases, untied head), within 1% of classic's parameters (both counts are in the table). A
round is one seed: both train with `gptport train --minutes` on the corpus with one tokenizer and one
validation split, on the same fixed torch threads, the order alternating round by round; after each run
`gptport eval` (torch engine, the same threads) scores the whole validation split (the last 10% of the token
stream, which no run trains on) in sliding windows: the held-out bits per byte compared.

The minutes are counted by `--clock`: `cpu` (the default) is the trainer's CPU seconds over its threads, the
wall time of an idle machine, so each run gets the same compute however loaded the shared host is (the
threads wait passively, OMP_WAIT_POLICY=PASSIVE, so a thread waiting for a descheduled partner does not
spin its budget away); `wall` is the wall clock. Each run's share of the CPU (its processes' CPU seconds over
threads × wall seconds) is recorded beside its steps. With --lock, each run takes that file's lock (flock)
and gives it back when done, so that benchmarks of others run between this one's runs, never during them.
Goal: modern reaches lower held-out bits per byte than classic.

    python -m benchmarks.train.modern_vs_classic --corpus ../shared/corpora/tinyshakespeare.txt --minutes 2.5 \\
        --seeds 1,2
    python -m benchmarks.train.modern_vs_classic ... --seeds 3,4 --append benchmarks/results/<the file>.json

--append adds the new rounds to a results file written by the same settings (one run split into invocations).
--modern-set / --classic-set change one side (`--modern-set lr=3e-3`, a lever tried on one side only).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, results
from benchmarks.harness.models import SHAKESPEARE, WORK
from benchmarks.harness.models import cli as gptport
from benchmarks.harness.run import Round, Run

HERE = WORK / "modern_vs_classic"
NAMES = ("classic", "modern")
GOAL = "modern reaches lower held-out bits per byte than classic at equal parameters and equal minutes"
SAME = ("corpus", "minutes", "clock", "vocab_size", "threads", "classic", "modern", "classic_sets", "modern_sets",
        "omp_wait_policy")


def prepare(corpus: Path, vocab_size: int) -> tuple[Path, Path]:
    """The tokenizer and token shards every run copies (one validation split for all), and the validation
    split's text for `gptport eval`."""
    from gptport import tokenizer as bpe
    from gptport.corpus import CorpusReader, resolve_sources
    from gptport.training import shards

    base, held_out = HERE / "base", HERE / "held_out.txt"
    shutil.rmtree(HERE, ignore_errors=True)
    gptport("train-tokenizer", str(corpus), "--vocab-size", str(vocab_size), "--out", str(base))
    tok = bpe.load(base)
    data = shards.prepare(base, CorpusReader(resolve_sources([str(corpus)])), tok, 0.1)
    text = tok.decode(int(t) for t in data.val).replace("<|endoftext|>", "")
    held_out.write_text(text, encoding="utf-8")
    return base, held_out


def child_cpu_s() -> float:
    """CPU seconds (user + system) of this process's finished children so far."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


class Lock:
    """An exclusive flock of a file, taken and given back explicitly; does nothing without a path."""

    def __init__(self, path: Path | None) -> None:
        self.file = open(path, "a") if path else None  # noqa: SIM115 - held for the run, closed at exit

    def acquire(self) -> None:
        if self.file:
            fcntl.flock(self.file, fcntl.LOCK_EX)

    def release(self) -> None:
        if self.file:
            fcntl.flock(self.file, fcntl.LOCK_UN)


def train_one(name: str, seed: int, args: argparse.Namespace, base: Path, held_out: Path) -> dict[str, Any]:
    """One run of `name` for --minutes with `seed`, then the eval of the validation split."""
    d = HERE / f"{name}-seed{seed}"
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(base, d)
    preset, sets = (args.classic, args.classic_sets) if name == "classic" else (args.modern, args.modern_sets)
    cpu0, t0 = child_cpu_s(), time.perf_counter()
    gptport("train", str(args.corpus), "--model-dir", str(d), "--preset", preset, "--minutes", str(args.minutes),
            "--seed", str(seed), "--threads", str(args.threads), "--device", "cpu", "--set", f"clock={args.clock}",
            *[x for s in sets for x in ("--set", s)])
    wall, cpu = time.perf_counter() - t0, child_cpu_s() - cpu0
    evals = [json.loads(line) for line in (d / "logs" / "train.jsonl").read_text().splitlines()]
    config = json.loads((d / "config.json").read_text())
    t1 = time.perf_counter()
    scored = json.loads(gptport("eval", str(d), str(held_out), "--engine", "torch", "--threads", str(args.threads),
                                "--json", capture=True))
    last = evals[-1]
    out = {"preset": preset, "sets": sets, "n_params": config["n_params"], "seed": seed,
           "held_out_bpb": scored["bits_per_byte"], "held_out_tokens": scored["tokens"],
           "trainer_val_bpb": last["val_bpb"], "step": last["step"], "train_s": last["elapsed_s"],
           "tokens_per_s": statistics.median(r["tokens_per_s"] for r in evals), "wall_s": round(wall, 1),
           "cpu_share": round(cpu / (args.threads * wall), 3), "eval_s": round(time.perf_counter() - t1, 1),
           "model": config["model"], "evals": evals}
    print(f"  {name:<8} seed {seed}: held-out bpb {out['held_out_bpb']:.4f} (trainer's {last['val_bpb']:.4f}) "
          f"after {last['step']} steps, {out['tokens_per_s']:,.0f} tok/s, cpu share {out['cpu_share']:.2f}",
          file=sys.stderr, flush=True)
    return out


def run_settings(args: argparse.Namespace) -> dict[str, Any]:
    """What the results file records of the options: the corpus by its name; the seeds are the rounds'."""
    out = cli.settings(args, goal=GOAL) | {"corpus": args.corpus.name}
    return {k: v for k, v in out.items() if k not in ("seeds", "append", "lock")}


def appended(path: Path, args: argparse.Namespace, run: Run) -> None:
    """The rounds of an earlier invocation, put back into `run` (so the order keeps alternating); its
    settings must be this one's."""
    doc = results.read(path)
    if doc["benchmark"] != results.benchmark_name(__spec__):
        raise SystemExit(f"--append {path}: a results file of {doc['benchmark']}, not of this benchmark")
    mine = run_settings(args)
    differ = [k for k in SAME if doc["settings"].get(k) != mine[k]]
    if differ:
        raise SystemExit(f"--append {path}: its {differ[0]} was {doc['settings'].get(differ[0])!r}, "
                         f"this run's is {mine[differ[0]]!r}")
    done = {r["data"]["seed"] for r in doc["rounds"]}
    if done & set(args.seeds):
        raise SystemExit(f"--append {path}: seed {min(done & set(args.seeds))} is in it already")
    for r in doc["rounds"]:
        run.rounds.append(Round(r["index"], {}, r["data"], r["probe"]))
    run.judge()


def rows(run: Run) -> list[dict[str, Any]]:
    """Per model over the kept rounds; then each kept round's pair."""
    kept = [r for r in run.kept() if all(n in r.data for n in NAMES)]
    classic_params = kept[0].data["classic"]["n_params"]
    out = []
    for name in NAMES:
        runs = [r.data[name] for r in kept]
        bpb = [x["held_out_bpb"] for x in runs]
        out.append({"table": "held-out bits per byte, median over the kept seeds", "model": name,
                    "preset": runs[0]["preset"], "sets": " ".join(runs[0]["sets"]) or None,
                    "n_params": runs[0]["n_params"], "params_vs_classic": runs[0]["n_params"] / classic_params,
                    "seeds": len(runs), "held_out_bpb": statistics.median(bpb),
                    "held_out_bpb_sd": statistics.stdev(bpb) if len(bpb) > 1 else None,
                    "trainer_val_bpb": statistics.median(x["trainer_val_bpb"] for x in runs),
                    "steps": statistics.median(x["step"] for x in runs),
                    "train_tok_s": statistics.median(x["tokens_per_s"] for x in runs),
                    "cpu_share": statistics.median(x["cpu_share"] for x in runs)})
    diffs = [r.data["modern"]["held_out_bpb"] - r.data["classic"]["held_out_bpb"] for r in kept]
    out.append({"table": "modern against classic", "seeds": len(kept), "modern_bpb": out[1]["held_out_bpb"],
                "classic_bpb": out[0]["held_out_bpb"], "modern_over_classic": out[1]["held_out_bpb"]
                / out[0]["held_out_bpb"], "median_modern_minus_classic": statistics.median(diffs),
                "modern_lower_in": f"{sum(d < 0 for d in diffs)} of {len(diffs)} seeds"})
    for r in kept:
        c, m = r.data["classic"], r.data["modern"]
        out.append({"table": "each kept seed", "round": r.index + 1, "seed": r.data["seed"],
                    "first": r.data["first"], "classic_bpb": c["held_out_bpb"], "modern_bpb": m["held_out_bpb"],
                    "modern_minus_classic": m["held_out_bpb"] - c["held_out_bpb"], "classic_steps": c["step"],
                    "modern_steps": m["step"], "classic_cpu_share": c["cpu_share"],
                    "modern_cpu_share": m["cpu_share"]})
    return out


def report(table: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    """The table printed; the verdict as notes for the results file."""
    per_model = [r for r in table if "model" in r]
    pairs = [r for r in table if "round" in r]
    print(f"\n{args.minutes:g} minutes ({args.clock} clock) each, {args.threads} torch threads, "
          f"corpus {args.corpus.name}")
    print(f"{'model':<8} {'preset':<11} {'params':>10} {'held-out bpb':>13} {'sd':>7} {'steps':>6} {'tok/s':>8}")
    for r in per_model:
        sd = "" if r["held_out_bpb_sd"] is None else f"{r['held_out_bpb_sd']:.4f}"
        print(f"{r['model']:<8} {r['preset']:<11} {r['n_params']:>10,} {r['held_out_bpb']:>13.4f} {sd:>7} "
              f"{r['steps']:>6.0f} {r['train_tok_s']:>8,.0f}")
    for p in pairs:
        print(f"seed {p['seed']} (round {p['round']}, {p['first']} first): classic {p['classic_bpb']:.4f}  "
              f"modern {p['modern_bpb']:.4f}  modern - classic {p['modern_minus_classic']:+.4f}")
    wins = sum(p["modern_minus_classic"] < 0 for p in pairs)
    diff = next(r for r in table if r["table"] == "modern against classic")["median_modern_minus_classic"]
    verdict = (f"modern lower in {wins} of {len(pairs)} kept seeds; median modern - classic {diff:+.4f} bpb "
               f"({'met' if wins == len(pairs) else 'not met'}: {GOAL})")
    print(verdict)
    return [verdict]


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--corpus", type=Path, default=SHAKESPEARE, help="the training text (default: "
                    "../shared/corpora/tinyshakespeare.txt beside the repository)")
    ap.add_argument("--minutes", type=float, default=2.5, help="wall minutes of training per run")
    ap.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 3],
                    help="comma-separated: one round per seed")
    ap.add_argument("--vocab-size", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of every run and eval")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu", help="what the minutes count")
    ap.add_argument("--omp-wait-policy", choices=("PASSIVE", "ACTIVE"), default="PASSIVE",
                    help="OMP_WAIT_POLICY of the runs")
    ap.add_argument("--lock", type=Path, help="a lock file each run holds (flock) while it trains and evaluates")
    ap.add_argument("--classic", default="tiny", help="the classic preset")
    ap.add_argument("--modern", default="llama-tiny", help="the modern preset")
    ap.add_argument("--classic-set", dest="classic_sets", action="append", default=[], help="key=value")
    ap.add_argument("--modern-set", dest="modern_sets", action="append", default=[], help="key=value")
    ap.add_argument("--append", type=Path, help="a results file of this benchmark to add the rounds to")
    args = ap.parse_args()
    if not args.corpus.is_file():
        raise SystemExit(f"--corpus {args.corpus}: no such file")
    os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy  # the children's
    run = Run()
    if args.append:
        appended(args.append, args, run)
    base, held_out = prepare(args.corpus, args.vocab_size)
    lock = Lock(args.lock)
    for seed in args.seeds:
        lock.acquire()  # the round's probes and each run under the lock, given back between the runs
        try:
            with run.round() as rnd:
                names = rnd.order(NAMES)
                rnd.data |= {"seed": seed, "first": names[0]}
                for i, name in enumerate(names):
                    if i:
                        lock.release()
                        lock.acquire()
                    rnd.data[name] = train_one(name, seed, args, base, held_out)
        finally:
            lock.release()
    table = rows(run)
    notes = report(table, args)
    doc = results.document(results.benchmark_name(__spec__), run, table, run_settings(args), label=args.label,
                           notes=notes, details={"torch_threads": args.threads,
                                                 "held_out_bytes": held_out.stat().st_size})
    path = results.write(doc, args.results)
    if args.append and args.append.resolve() != path.resolve():
        args.append.unlink()


if __name__ == "__main__":
    main()
