"""Tokenizer training throughput: `gptport train-tokenizer` against the bare `tokenizers` trainer.

Both run as fresh processes on the same files, in rounds that alternate which goes first; the table
gives medians over the kept rounds, and beside them the training alone timed in-process (gptport's API
against `Tokenizer.train`), which leaves out the ~60 ms a Python CLI spends starting (typer, rich).
Corpora: tinyshakespeare (--shakespeare) and a >= 30 MB corpus of real text assembled from this machine
(the interpreter's standard-library sources, plus vim and perl docs where present). Goal: gptport within
10% of the bare trainer (time ratio <= 1.10).

    python -m benchmarks.tokenizer.training [--rounds 3] [--vocab-size 8192]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import cli, results
from benchmarks.harness.models import SHAKESPEARE, WORK, big_corpus
from benchmarks.harness.run import Round, Run

BARE = """
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=int(sys.argv[1]), min_frequency=2, show_progress=False,
                              special_tokens=["<|endoftext|>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train(sys.argv[2:], trainer)
assert tok.get_vocab_size() == int(sys.argv[1])
"""
ENGINES = ("gptport", "bare_tokenizers")


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - t0


def in_process(corpus: Path, vocab: int, engine: str) -> float:
    """Training time alone, without process start-up: gptport's API or tokenizers' own."""
    from gptport import tokenizer as bpe
    from gptport.corpus import CorpusReader, resolve_sources

    t0 = time.perf_counter()
    if engine == "gptport":
        tok, report = bpe.train(CorpusReader(resolve_sources([corpus])), vocab)
        bpe.save(tok, WORK / "tok_api", report, force=True)
    else:
        bpe.new_backend().train([str(corpus)], bpe.make_trainer(vocab, [bpe.EOT], 2, False))
    return time.perf_counter() - t0


def one_round(rnd: Round, corpus: Path, vocab: int) -> None:
    commands = {"gptport": [sys.executable, "-m", "gptport.cli.main", "train-tokenizer", str(corpus),
                            "--vocab-size", str(vocab), "--out", str(WORK / "tok"), "--force"],
                "bare_tokenizers": [sys.executable, "-c", BARE, str(vocab), str(corpus)]}
    for engine in rnd.order(ENGINES):
        rnd.data[engine] = {"process_s": timed(commands[engine]), "in_process_s": in_process(corpus, vocab, engine)}


def row(run: Run, corpus: Path, vocab: int) -> dict[str, Any]:
    mb = corpus.stat().st_size / 1e6
    med = {e: statistics.median(v["process_s"] for v in run.values(e, corpus=corpus.name)) for e in ENGINES}
    api = {e: statistics.median(v["in_process_s"] for v in run.values(e, corpus=corpus.name)) for e in ENGINES}
    return {"corpus": corpus.name, "mb": round(mb, 2), "vocab_size": vocab,
            "gptport_mb_s": mb / med["gptport"], "bare_mb_s": mb / med["bare_tokenizers"],
            "gptport_over_bare": med["gptport"] / med["bare_tokenizers"],
            "in_process_gptport_over_bare": api["gptport"] / api["bare_tokenizers"]}


def main() -> None:
    ap = cli.parser(__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--shakespeare", type=Path, default=SHAKESPEARE)
    args = ap.parse_args()
    if not args.shakespeare.is_file():
        raise SystemExit(f"--shakespeare {args.shakespeare}: no such file")
    import tokenizers

    WORK.mkdir(parents=True, exist_ok=True)
    corpora = [args.shakespeare, big_corpus()]
    run = Run()
    for corpus in corpora:
        for rnd in run.series(args.rounds, corpus=corpus.name):
            one_round(rnd, corpus, args.vocab_size)
    rows = [row(run, c, args.vocab_size) for c in corpora]
    print(f"{'corpus':<22}{'MB':>8}{'gptport MB/s':>15}{'bare MB/s':>12}{'time ratio':>12}{'in-process ratio':>18}")
    for r in rows:
        print(f"{r['corpus']:<22}{r['mb']:>8}{r['gptport_mb_s']:>15.2f}{r['bare_mb_s']:>12.2f}"
              f"{r['gptport_over_bare']:>12.3f}{r['in_process_gptport_over_bare']:>18.3f}")
    settings = cli.settings(args, goal="gptport within 10% of the bare tokenizers trainer (time ratio <= 1.10)")
    results.write(results.document(results.benchmark_name(__spec__), run, rows, settings, label=args.label,
                                   extra_versions={"tokenizers": tokenizers.__version__}), args.results)


if __name__ == "__main__":
    main()
