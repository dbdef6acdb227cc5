"""Speculative decoding (runtime/speculative.py): greedy output is the plain decoder's token for token
whatever the drafts, sampled output follows the target's distribution (chi-square), seeded runs repeat,
and the CLI's --draft / --prompt-lookup / --tokenizer-from."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptport.runtime.choice import GraphChoice, RunOptions
from gptport.runtime.generate import generate
from gptport.runtime.loader import open_model
from gptport.runtime.sampling import Sampling, probs
from gptport.runtime.speculative import Drafts, LookupDrafter, ModelDrafter, SpecStats, speculate
from gptport.serve.engine.drafting import Drafting
from gptport.serve.engine.events import Observer
from gptport.serve.engine.scheduler import Choice
from tests.conftest import SYLLABLES, build_model_dir, make_text
from tests.serve.engine.test_slots import Run
from tests.support.serving import free_port, serve


@pytest.fixture(scope="module")
def draft_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path) -> Path:
    """A weaker model with the same tokenizer: one layer, 20 steps; fp32, and int8 (ungated: 20 steps leave
    near-ties that int8 flips) for --draft-precision."""
    from gptport.export import exporter

    out = build_model_dir(tmp_path_factory.mktemp("draft") / "d", tokenizer_dir, corpus_file, steps=20, n_ctx=96,
                          d_model=32, n_layer=1, n_head=2)
    exporter.export(out, ["fp32", "int8"], gate=False)
    return out


@pytest.fixture(scope="module")
def models(trained_dir: Path, draft_dir: Path) -> tuple[Any, Any]:
    choice, one = GraphChoice.parse(precision="fp32"), RunOptions.parse(provider="cpu", threads=1)
    return open_model(trained_dir, choice, one), open_model(draft_dir, choice, one)


class WrongDrafter(ModelDrafter):
    """The target drafting for itself, every draft then moved to the next token id: always rejected."""

    def propose(self, seq: Sequence[int], k: int, sampling: Sampling, rng: np.random.Generator,
                counts: Counter[int] | None = None) -> Drafts:
        drafts, dists = super().propose(seq, k, sampling, rng, counts)
        vocab = self.slots.vocab_size
        return [(t + 1) % vocab for t in drafts], dists


def drafter(kind: str, target: Any, draft: Any) -> Any:
    return {"self": lambda: ModelDrafter(target.engine), "draft": lambda: ModelDrafter(draft.engine),
            "wrong": lambda: WrongDrafter(target.engine), "lookup": lambda: LookupDrafter(3),
            "none": lambda: None}[kind]()


words = st.lists(st.sampled_from(SYLLABLES), min_size=1, max_size=40).map(" ".join)
PENALTIES = {"none": Sampling(), "repetition": Sampling(repetition_penalty=1.3),
             "presence": Sampling(presence_penalty=1.5), "frequency": Sampling(frequency_penalty=0.4, min_p=0.3)}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=words, kind=st.sampled_from(["self", "draft", "wrong", "lookup", "none"]),
       k=st.sampled_from([None, 1, 2, 3, 5]), new=st.integers(1, 150), overflow=st.sampled_from(["slide", "stop"]),
       penalty=st.sampled_from(list(PENALTIES)))
def test_greedy_output_is_the_plain_decoders(models: tuple[Any, Any], text: str, kind: str, k: int | None, new: int,
                                              overflow: str, penalty: str) -> None:
    """Any drafter, any K, outputs that slide past n_ctx (96) or stop there, with and without a repetition,
    presence or frequency penalty (verified with the counts as of each position): the same tokens and the
    same finish reason as generate()."""
    target, draft = models
    greedy = PENALTIES[penalty]
    prompt = target.tok.encode(text + " " + text)  # said twice: prompt lookup finds matches
    plain = generate(target.engine, [prompt], new, greedy, target.tok.eot_id, overflow=overflow)[0]  # type: ignore[arg-type]
    stats = SpecStats()
    got = speculate(target.engine, drafter(kind, target, draft), prompt, new, greedy, target.tok.eot_id,
                    overflow=overflow, k=k, stats=stats)  # type: ignore[arg-type]
    assert got.new_ids == plain.new_ids
    assert got.finish_reason == plain.finish_reason
    assert stats.tokens >= len(got.new_ids)
    if kind == "self":  # the target agrees with itself: every draft stands
        assert stats.accepted == stats.drafted
    if kind == "wrong":
        assert stats.accepted == 0


def test_drafts_cut_the_target_steps(models: tuple[Any, Any]) -> None:
    """The target drafting for itself: every draft stands, fewer steps than tokens; a draft that is always
    wrong costs a step per token, like plain decoding."""
    target, _ = models
    prompt = target.tok.encode("ka to ri men sol")
    for kind, many in (("self", True), ("wrong", False)):
        stats = SpecStats()
        row = speculate(target.engine, drafter(kind, target, None), prompt, 60, Sampling(), -1, k=4, stats=stats)
        assert len(row.new_ids) == 60
        assert (stats.steps <= 60 // 5 + 1) if many else (stats.steps == 60)


def chi_square_critical(df: int, z: float = 3.09) -> float:
    """The chi-square value exceeded with probability ~0.001 (Wilson-Hilferty; z is the normal quantile)."""
    c = 2.0 / (9.0 * df)
    return df * (1.0 - c + z * np.sqrt(c)) ** 3


@pytest.mark.parametrize("kind", ["draft", "lookup"])
def test_sampled_tokens_follow_the_targets_distribution(models: tuple[Any, Any], kind: str) -> None:
    """The first new token, decided by accepting or replacing one draft, over 3,000 seeds: its counts fit
    the target's own next-token distribution (chi-square, p > 0.001); the draft's distribution is far from
    it, so a rule that kept drafts too often would show."""
    target, draft = models
    prompt = target.tok.encode("ka to ri men sol ve")
    if kind == "lookup":  # its first two tokens again at the end: lookup drafts the third
        prompt = prompt + prompt[:2]
    sampling = Sampling(temperature=1.0)
    p = probs(target.engine.step(last_only=True)(np.array([prompt]), np.ones((1, len(prompt)), dtype=np.int64),
                                                 np.arange(len(prompt))[None], target.engine.empty_past(1))[0][0, -1],
              sampling)
    if kind == "draft":
        q = probs(draft.engine.step(last_only=True)(np.array([prompt]), np.ones((1, len(prompt)), dtype=np.int64),
                                                    np.arange(len(prompt))[None], draft.engine.empty_past(1))[0][0, -1],
                  sampling)
    else:
        drafts, _ = LookupDrafter(3).propose(prompt, 1, sampling, np.random.default_rng(0))
        assert drafts, "the prompt repeats itself: lookup has a draft"
        q = np.zeros_like(p)
        q[drafts[0]] = 1.0
    assert 0.5 * np.abs(p - q).sum() > 0.1  # the test has power: drafts alone would give another distribution
    n = 3000
    counts = np.zeros_like(p)
    for seed in range(n):
        row = speculate(target.engine, drafter(kind, target, draft), prompt, 2, Sampling(temperature=1.0, seed=seed),
                        -1, k=1)
        counts[row.new_ids[0]] += 1
    expected = p * n
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    keep = exp > 0
    chi2 = float((((obs - exp) ** 2)[keep] / exp[keep]).sum())
    df = int(keep.sum()) - 1
    assert chi2 < chi_square_critical(df), (chi2, df)


def test_seeded_sampling_repeats(models: tuple[Any, Any]) -> None:
    target, draft = models
    prompt = target.tok.encode("men sol ve qua")
    sampling = Sampling(temperature=0.9, top_k=40, top_p=0.95, seed=7)
    runs = [speculate(target.engine, ModelDrafter(draft.engine), prompt, 80, sampling, -1).new_ids for _ in range(2)]
    assert runs[0] == runs[1]
    other = speculate(target.engine, ModelDrafter(draft.engine), prompt, 80, Sampling(temperature=0.9, seed=8), -1)
    assert other.new_ids != runs[0]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gptport.cli.main", *args], capture_output=True, text=True,
                          timeout=300)


def test_cli_draft_and_lookup_give_the_plain_text(trained_dir: Path, draft_dir: Path) -> None:
    base = ["generate", str(trained_dir), "ka to ri ka to ri", "--max-new-tokens", "40", "--json"]
    plain = json.loads(cli(*base).stdout)
    for extra in (["--draft", str(draft_dir)], ["--draft", str(draft_dir), "--draft-tokens", "3"],
                  ["--draft", str(draft_dir), "--draft-precision", "int8"], ["--prompt-lookup", "3"]):
        run = cli(*base, *extra)
        assert run.returncode == 0, run.stderr
        got = json.loads(run.stdout)
        assert got["token_ids"] == plain["token_ids"], extra
        assert got["drafted"] >= got["accepted"] >= 0
        assert "tokens per step" in run.stderr
        if "--draft-precision" in extra:  # the int8 draft drafts, and the line says which ran
            assert got["drafted"] > 0 and "draft model, int8" in run.stderr, run.stderr


@pytest.fixture(scope="module")
def other_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model whose tokenizer is another one (trained on other text)."""
    from gptport import tokenizer as bpe
    from gptport.corpus import CorpusReader, resolve_sources
    from gptport.export import exporter

    root = tmp_path_factory.mktemp("othertok")
    corpus = root / "c.txt"
    corpus.write_text(make_text(400, seed=5), encoding="utf-8")
    tok_dir = root / "tok"
    tok, report = bpe.train(CorpusReader(resolve_sources([corpus])), 300)
    bpe.save(tok, tok_dir, report, force=True)
    out = build_model_dir(root / "m", tok_dir, corpus, steps=0, n_ctx=96)
    exporter.export(out, ["fp32"])
    return out


def test_cli_refusals(trained_dir: Path, draft_dir: Path, other_tokenizer_dir: Path) -> None:
    """One line naming what is wrong, exit code 2, no traceback."""
    from gptport import tokenizer as bpe

    ours, theirs = bpe.load(trained_dir).sha256, bpe.load(other_tokenizer_dir).sha256
    cases = [
        (["--draft", str(other_tokenizer_dir)], [ours, theirs, "--tokenizer-from"]),
        (["--draft", str(draft_dir), "--prompt-lookup", "3"], ["one way of drafting"]),
        (["--draft-tokens", "3"], ["--draft-tokens needs --draft"]),
        (["--draft-precision", "int8"], ["--draft-precision needs --draft"]),
        (["--draft-threads", "1"], ["--draft-threads needs --draft"]),
        (["--draft", str(draft_dir), "--draft-threads", "-1"], ["--draft-threads must be 0"]),
        (["--draft", str(draft_dir), "--draft-tokens", "0"], ["--draft-tokens must be at least 1"]),
        (["--prompt-lookup", "1"], ["--prompt-lookup must be at least 2"]),
        (["--draft", str(draft_dir), "--regex", "[a-z]+"], ["output constraint"]),
        (["--draft", str(draft_dir), "--kv-cache", "concat"], ["static-cache graph"]),
    ]
    for extra, words_ in cases:
        run = cli("generate", str(trained_dir), "ka", *extra)
        assert run.returncode == 2, (extra, run.stderr)
        assert "Traceback" not in run.stderr
        for w in words_:
            assert w in run.stderr, (extra, w, run.stderr)


@pytest.mark.slow
def test_train_tokenizer_from(tmp_path: Path, trained_dir: Path, corpus_file: Path, other_tokenizer_dir: Path) -> None:
    """--tokenizer-from copies the target's tokenizer into a new model directory and trains there; a directory
    that holds another tokenizer is refused, naming both."""
    from gptport import tokenizer as bpe

    out = tmp_path / "draft"
    small = ["--preset", "tiny", "--steps", "2", "--set", "d_model=32", "--set", "n_layer=1", "--set", "n_head=2",
             "--set", "n_ctx=32", "--device", "cpu", "--no-compile"]
    run = cli("train", str(corpus_file), "--model-dir", str(out), "--tokenizer-from", str(trained_dir), *small)
    assert run.returncode == 0, run.stderr
    assert bpe.load(out).sha256 == bpe.load(trained_dir).sha256
    assert (out / "model.safetensors").exists()
    run = cli("train", str(corpus_file), "--model-dir", str(other_tokenizer_dir), "--tokenizer-from", str(trained_dir),
              *small)
    assert run.returncode == 1 and "already holds another tokenizer" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


def test_bench_draft_rows(tmp_path: Path, trained_dir: Path, draft_dir: Path, other_tokenizer_dir: Path) -> None:
    """`bench --draft`: a speculative row beside the plain one, with its acceptance, tokens per step and
    decode speed over plain; a draft with another tokenizer is refused naming both."""
    out = tmp_path / "bench.json"
    run = cli("bench", str(trained_dir), "--draft", str(trained_dir), "--no-torch-baseline", "--repeat", "1",
              "--warmup", "0", "--gen-len", "24", "--prompt-len", "8", "--threads", "1", "--json", str(out))
    assert run.returncode == 0, run.stderr
    rows = json.loads(out.read_text())["rows"]
    drafted = [r for r in rows if r["draft"]]
    plain = [r for r in rows if not r["draft"] and r["kv_cache"] == "static"]
    assert len(drafted) == 1 and len(plain) == 1
    row = drafted[0]
    assert row["acceptance"] == 1.0  # the target drafting for itself
    assert row["draft_precision"] == row["precision"] == "fp32"  # the draft follows the row's precision
    assert row["tokens_per_step"] > 1.5 and row["decode_tok_s"] > 0 and row["speedup_vs_plain"] > 0
    assert "tokens per step" in run.stderr
    run = cli("bench", str(trained_dir), "--draft", str(other_tokenizer_dir), "--no-torch-baseline")
    assert run.returncode == 2 and "--tokenizer-from" in run.stderr and "Traceback" not in run.stderr


class Counting(Observer):
    """An observer that counts the scheduler's drafts."""

    def __init__(self) -> None:
        self.drafted = self.accepted = 0

    def drafts(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted


@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_scheduler_drafts_alone_and_greedy_tokens_stay(models: tuple[Any, Any], data: st.DataObject) -> None:
    """Continuous batching with a drafter (serve --draft): greedy requests (some with a repetition, presence
    or frequency penalty) arriving at hypothesis-chosen iterations, some running into the context, get what
    generate() gives each alone, token for token;
    drafting ran (it does while one row decodes) and fixed or adaptive K changes nothing."""
    target, draft = models
    vocab, n_ctx = target.tok.vocab_size, target.engine.n_ctx
    n = data.draw(st.integers(1, 4))
    prompts = [data.draw(st.lists(st.integers(1, vocab - 1), min_size=1, max_size=n_ctx)) for _ in range(n)]
    max_tokens = [data.draw(st.integers(1, n_ctx + 10)) for _ in range(n)]
    arrivals = [0, *(data.draw(st.integers(0, 120)) for _ in range(n - 1))]
    kind = data.draw(st.sampled_from(["draft", "lookup"]))
    counting = Counting()
    drafter = ModelDrafter(draft.engine) if kind == "draft" else LookupDrafter(3)
    run = Run(target, 4, drafting=Drafting(drafter, data.draw(st.sampled_from([None, 1, 3]))), observer=counting)
    samplings = [PENALTIES[data.draw(st.sampled_from(list(PENALTIES)))] for _ in range(n)]
    choices = [Choice(p, m, s, ignore_eos=True, out=i)
               for i, (p, m, s) in enumerate(zip(prompts, max_tokens, samplings, strict=True))]
    for it in range(max(arrivals) + 1):
        run.s.submit([c for c, a in zip(choices, arrivals, strict=True) if a == it])
        run.step()
    run.until_idle()
    for c, p, m in zip(choices, prompts, max_tokens, strict=True):
        room = n_ctx + 1 - len(p)
        alone = generate(target.engine, [p], m, c.sampling, -1, overflow="stop")[0]
        assert len(c.new_ids) == min(m, room), (len(p), m)
        assert c.new_ids == alone.new_ids[:len(c.new_ids)], (len(p), m, kind)
    if kind == "draft" and any(min(m, n_ctx + 1 - len(p)) > 3 for p, m in zip(prompts, max_tokens, strict=True)):
        assert counting.drafted > 0


def test_serve_draft_gives_the_plain_text(tmp_path: Path, trained_dir: Path, draft_dir: Path,
                                          other_tokenizer_dir: Path) -> None:
    """`gptport serve --draft`: a lone greedy request gets generate's text, and /metrics counts the drafts;
    bad drafting options are refused in one line."""
    plain = json.loads(cli("generate", str(trained_dir), "ka to ri ka to ri", "--max-new-tokens", "40",
                           "--json").stdout)
    for extra in (["--draft", str(draft_dir), "--draft-precision", "int8"],
                  ["--prompt-lookup", "3", "--draft-tokens", "2"]):
        with serve(trained_dir, tmp_path / "serve.log", "--slots", "2", *extra) as server:
            status, body = server.post("/v1/completions", {"prompt": "ka to ri ka to ri", "max_tokens": 40,
                                                           "temperature": 0})
            assert status == 200, body
            assert body["choices"][0]["text"] == plain["text"], extra
            assert body["usage"]["completion_tokens"] == len(plain["token_ids"])
            assert server.metric("gptport_draft_tokens_total") >= server.metric("gptport_draft_accepted_tokens_total")
            if extra[0] == "--draft":  # a model always drafts; a lookup drafts only where an n-gram recurs
                assert server.metric("gptport_draft_tokens_total") > 0
        log = (tmp_path / "serve.log").read_text()
        assert "drafts " in log
        if extra[0] == "--draft":  # the startup line names the draft's variant
            assert f"drafts from {draft_dir} (int8, k adaptive, 1 thread)" in log, log
    for extra, code, words in ((["--draft-tokens", "3"], 2, "needs --draft"),
                               (["--draft-precision", "int8"], 2, "--draft-precision needs --draft"),
                               (["--draft-threads", "2"], 2, "--draft-threads needs --draft"),
                               (["--draft", str(trained_dir), "--draft-precision", "int4"], 1, "model.int4.onnx"),
                               (["--draft", str(draft_dir), "--prompt-lookup", "3"], 2, "one way of drafting"),
                               (["--prompt-lookup", "1"], 2, "--prompt-lookup must be at least"),
                               (["--draft", str(other_tokenizer_dir)], 1, "--tokenizer-from")):
        run = cli("serve", str(trained_dir), "--port", str(free_port()), *extra)
        assert run.returncode == code and words in run.stderr and "Traceback" not in run.stderr, (extra, run.stderr)


def lookup_reference(seq: list[int], n: int, k: int) -> list[int]:
    """Prompt lookup written plainly: for n-gram sizes n..2, the latest earlier occurrence of the last
    `size` tokens, and the k tokens after it."""
    L = len(seq)
    for size in range(min(n, L - 1), 1, -1):
        tail = seq[L - size:]
        for j in range(L - 2, size - 2, -1):
            if seq[j - size + 1:j + 1] == tail:
                return seq[j + 1:j + 1 + k]
    return []


@settings(max_examples=300, deadline=None, derandomize=True)
@given(seq=st.one_of(st.lists(st.integers(0, 3), min_size=1, max_size=80),  # repeats: > LOOKUP_SCAN occurrences
                     st.lists(st.integers(0, 40), min_size=1, max_size=80)),
       n=st.integers(2, 5), k=st.integers(1, 8))
def test_lookup_drafts_the_latest_longest_match(seq: list[int], n: int, k: int) -> None:
    for given_as in (seq, tuple(seq), np.array(seq, dtype=np.int64)):
        drafts, dists = LookupDrafter(n).propose(given_as, k, Sampling(), np.random.default_rng(0))  # type: ignore[arg-type]
        assert drafts == lookup_reference(seq, n, k) and dists == [None] * len(drafts)
        assert all(type(t) is int for t in drafts)
