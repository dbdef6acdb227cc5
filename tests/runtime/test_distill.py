"""`gptport distill-corpus` (runtime/distill.py): every sample is a corpus prompt continued by the model's
own greedy tokens, one document each for training; bad options are refused in one line, and nothing is
left half-written."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

from gptport import tokenizer as bpe
from gptport.corpus import resolve_sources
from gptport.runtime.choice import GraphChoice, RunOptions
from gptport.runtime.distill import draw_prompts
from gptport.runtime.generate import generate
from gptport.runtime.loader import open_model
from gptport.runtime.sampling import Sampling

EOT_LINE = "\n" + bpe.EOT + "\n"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gptport.cli.main", *args], capture_output=True, text=True,
                          timeout=300)


def test_samples_are_corpus_prompts_continued_greedily(tmp_path: Path, trained_dir: Path, corpus_file: Path) -> None:
    out = tmp_path / "sub" / "distill.txt"
    run = cli("distill-corpus", str(trained_dir), str(corpus_file), "--out", str(out), "--prompts", "10",
              "--prompt-tokens", "8", "--new-tokens", "24", "--batch", "4", "--seed", "3")
    assert run.returncode == 0, run.stderr
    assert "10 samples" in run.stderr
    text = out.read_text(encoding="utf-8")
    got = text.split(EOT_LINE)
    assert got[-1] == "" and len(got) == 11  # every sample ends with an <|endoftext|> line
    # the same draw and greedy decoding, in process: the file holds exactly these texts
    tok = bpe.load(trained_dir)
    prompts = draw_prompts(resolve_sources([corpus_file]), tok, 10, 8, random.Random(3))
    model = open_model(trained_dir, GraphChoice.parse(precision="fp32"), RunOptions.parse(provider="cpu", threads=1))
    rows = [r for lo in range(0, 10, 4) for r in generate(model.engine, prompts[lo:lo + 4], 24, Sampling(),
                                                          tok.eot_id, overflow="stop")]
    assert got[:-1] == [tok.decode([*p, *r.new_ids]) for p, r in zip(prompts, rows, strict=True)]
    corpus = corpus_file.read_text(encoding="utf-8")
    for p, r in zip(prompts, rows, strict=True):
        span = tok.decode(p)
        assert len(p) == 8 and (corpus.startswith(span) or "\n" + span in corpus)  # a span from a line start...
        assert 1 <= len(r.new_ids) <= 24
    # ...that training reads as one document per sample
    assert tok.encode(text).count(tok.eot_id) == 10


def test_sampled_samples_follow_the_seed(tmp_path: Path, trained_dir: Path, corpus_file: Path) -> None:
    """--temperature draws differ from greedy ones and repeat with the same --seed."""
    base = ["distill-corpus", str(trained_dir), str(corpus_file), "--prompts", "6", "--prompt-tokens", "6",
            "--new-tokens", "20"]
    outs = []
    for name, extra in (("g", []), ("s1", ["--temperature", "1.0"]), ("s2", ["--temperature", "1.0"])):
        run = cli(*base, "--out", str(tmp_path / f"{name}.txt"), *extra)
        assert run.returncode == 0, run.stderr
        outs.append((tmp_path / f"{name}.txt").read_text(encoding="utf-8"))
    assert outs[1] == outs[2] and outs[1] != outs[0]


def test_refusals_leave_nothing_behind(tmp_path: Path, trained_dir: Path, corpus_file: Path) -> None:
    """One line naming the fault, exit code 1 or 2, no traceback, no output file."""
    out = tmp_path / "d.txt"
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    existing = tmp_path / "existing.txt"
    existing.write_text("keep", encoding="utf-8")
    cases = [
        (["--out", str(out), "--prompts", "0"], 2, "--prompts must be at least 1"),
        (["--out", str(out), "--prompt-tokens", "50", "--new-tokens", "50"], 2, "n_ctx 96"),
        (["--out", str(out), "--batch", "0"], 2, "--batch must be at least 1"),
        (["--out", str(existing)], 1, "pass --force"),
        (["--out", str(tmp_path)], 1, "is a directory"),
    ]
    for extra, code, words in cases:
        run = cli("distill-corpus", str(trained_dir), str(corpus_file), *extra)
        assert run.returncode == code and words in run.stderr, (extra, run.stderr)
        assert "Traceback" not in run.stderr
    for corpus, code, words in ((str(empty), 1, "empty"), ("-", 2, "stdin"),
                                (str(tmp_path / "missing.txt"), 1, "no such file")):
        run = cli("distill-corpus", str(trained_dir), corpus, "--out", str(out))
        assert run.returncode == code and words in run.stderr, (corpus, run.stderr)
        assert "Traceback" not in run.stderr
    assert not out.exists() and existing.read_text(encoding="utf-8") == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt", "existing.txt"]  # no temporary left
