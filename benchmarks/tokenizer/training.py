"""Tokenizer training throughput: `gptport train-tokenizer` against the bare `tokenizers` trainer.

Both run as fresh processes on the same files, interleaved, `--repeat` times; the table shows medians,
and beside them the training alone timed in-process (gptport's API against `Tokenizer.train`), which
leaves out the ~60 ms a Python CLI spends starting (typer, rich).
Corpora: tinyshakespeare (from ../shared/corpora, or --shakespeare) and a >= 30 MB corpus of real text
assembled from this machine (the interpreter's standard-library sources, plus vim and perl docs where
present). Writes benchmarks/results/tokenizer.json.

    python benchmarks/bench_tokenizer.py [--repeat 3] [--vocab-size 8192]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from gptport.machine import describe

HERE = Path(__file__).resolve().parent
WORK = HERE / "work"
RESULTS = HERE / "results"
BIG_MIN_BYTES = 30_000_000

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


def big_corpus() -> Path:
    """Concatenate real text found on this machine into one UTF-8 file of at least 30 MB."""
    out = WORK / "big_corpus.txt"
    if out.exists() and out.stat().st_size >= BIG_MIN_BYTES:
        return out
    roots = [(Path(sysconfig.get_paths()["stdlib"]), "*.py"), (Path("/usr/share/vim"), "*.txt"),
             (Path("/usr/share/perl"), "*.pod")]
    WORK.mkdir(parents=True, exist_ok=True)
    total = 0
    with open(out, "wb") as f:
        for root, pattern in roots:
            for path in sorted(root.rglob(pattern)):
                if "site-packages" in path.parts or not path.is_file():
                    continue
                data = path.read_bytes()
                try:
                    data.decode("utf-8")
                except UnicodeDecodeError:
                    continue
                f.write(data + b"\n")
                total += len(data) + 1
    if total < BIG_MIN_BYTES:
        raise SystemExit(f"found only {total / 1e6:.1f} MB of text on this machine; need 30 MB")
    return out


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return time.perf_counter() - t0


def in_process(corpus: Path, vocab: int) -> dict[str, float]:
    """Training time alone, without process start-up: gptport's API against tokenizers' own."""
    from gptport import tokenizer as bpe
    from gptport.corpus import CorpusReader, resolve_sources

    t0 = time.perf_counter()
    tok, report = bpe.train(CorpusReader(resolve_sources([corpus])), vocab)
    bpe.save(tok, WORK / "tok_api", report, force=True)
    t1 = time.perf_counter()
    bare = bpe.new_backend()
    bare.train([str(corpus)], bpe.make_trainer(vocab, [bpe.EOT], 2, False))
    t2 = time.perf_counter()
    return {"gptport": t1 - t0, "bare_tokenizers": t2 - t1}


def measure(corpus: Path, vocab: int, repeat: int) -> dict[str, object]:
    gptport_cmd = [sys.executable, "-m", "gptport.cli.main", "train-tokenizer", str(corpus),
                   "--vocab-size", str(vocab), "--out", str(WORK / "tok"), "--force"]
    bare_cmd = [sys.executable, "-c", BARE, str(vocab), str(corpus)]
    runs: dict[str, list[float]] = {"gptport": [], "bare_tokenizers": []}
    api: dict[str, list[float]] = {"gptport": [], "bare_tokenizers": []}
    for _ in range(repeat):  # interleaved, so drift hits both alike
        runs["gptport"].append(timed(gptport_cmd))
        runs["bare_tokenizers"].append(timed(bare_cmd))
        for k, v in in_process(corpus, vocab).items():
            api[k].append(v)
    mb = corpus.stat().st_size / 1e6
    med = {k: statistics.median(v) for k, v in runs.items()}
    api_med = {k: statistics.median(v) for k, v in api.items()}
    return {
        "corpus": corpus.name, "mb": round(mb, 2), "vocab_size": vocab,
        "process_seconds": runs, "median_s": med,
        "mb_per_s": {k: round(mb / v, 2) for k, v in med.items()},
        "gptport_over_bare": round(med["gptport"] / med["bare_tokenizers"], 3),
        "in_process_seconds": api, "in_process_median_s": api_med,
        "in_process_gptport_over_bare": round(api_med["gptport"] / api_med["bare_tokenizers"], 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--shakespeare", type=Path,
                    default=HERE.parent.parent / "shared" / "corpora" / "tinyshakespeare.txt")
    args = ap.parse_args()
    corpora = [args.shakespeare, big_corpus()]
    rows = [measure(c, args.vocab_size, args.repeat) for c in corpora]
    print(f"{'corpus':<22}{'MB':>8}{'gptport MB/s':>15}{'bare MB/s':>12}{'time ratio':>12}"
          f"{'in-process ratio':>18}")
    for r in rows:
        print(f"{r['corpus']:<22}{r['mb']:>8}{r['mb_per_s']['gptport']:>15}"
              f"{r['mb_per_s']['bare_tokenizers']:>12}{r['gptport_over_bare']:>12}"
              f"{r['in_process_gptport_over_bare']:>18}")
    import tokenizers

    result = {
        "benchmark": "tokenizer training throughput",
        "machine": {**describe(), "python": platform.python_version()},
        "versions": {"tokenizers": tokenizers.__version__},
        "goal": "gptport within 10% of the bare tokenizers trainer (time ratio <= 1.10)",
        "rows": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "tokenizer.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS / 'tokenizer.json'}")


if __name__ == "__main__":
    main()
