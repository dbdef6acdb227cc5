"""Damaged files fail in one line: one file of a complete model directory is damaged
(truncated, bytes flipped, emptied, invalid or wrongly shaped JSON, removed), then `generate`, `eval`,
`export` and `train --resume` run through the CLI's entry point. Each either works or exits 1 with one
line naming the damaged file: never a traceback, never a hang, never a changed or half-written file.

The commands run in-process through `gptport.cli.main.main` (the console script's entry, with its error
boundary): an exception that escapes it fails the test, as a traceback would. One subprocess test
checks that the console script behaves the same. Export and train run only where the damaged file is
one they read (READS); test_unread_files_are_not_needed shows that they do not need the others."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import signal
import subprocess
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gptport import contract, paths, provenance
from gptport import tokenizer as bpe
from gptport.cli.main import main
from tests.conftest import build_model_dir, make_text

pytestmark = pytest.mark.slow

STEPS = 10
TIMEOUT_S = 120  # a command that takes longer has hung (the slowest, export, takes seconds)
GRAPH_OF = {contract.onnx_file(p, c): (p, c) for p, c in [  # the fixture's graphs: file -> precision, cache
    ("fp32", contract.CACHE_CONCAT), ("fp32", contract.CACHE_STATIC), ("int8", contract.CACHE_CONCAT),
    ("int8", contract.CACHE_STATIC), ("fp16", contract.CACHE_CONCAT)]}
GRAPHS = list(GRAPH_OF)
TRAIN_BIN, VAL_BIN, SHARD_META = (f"{paths.DATA_DIR}/{name}" for name in (paths.TRAIN_SHARD, paths.VAL_SHARD,
                                                                       paths.DATA_META))
SHARDS = [TRAIN_BIN, VAL_BIN, SHARD_META]
JSON_FILES = [paths.CONFIG, bpe.TOKENIZER_FILE, bpe.META_FILE, paths.TRAINER, paths.DIGESTS, paths.GENAI,
              SHARD_META]
FILES = [paths.CONFIG, bpe.TOKENIZER_FILE, bpe.META_FILE, paths.WEIGHTS, paths.OPTIMIZER, paths.TRAINER,
         paths.DIGESTS, paths.GENAI, *GRAPHS, *SHARDS]

# What each command reads besides its arguments (generate and eval: also the graph they open). The
# commands are run on a damage of these files only; test_unread_files_are_not_needed damages all others.
COMMON = {bpe.TOKENIZER_FILE, bpe.META_FILE, paths.CONFIG}
READS = {
    "generate": COMMON | {paths.WEIGHTS, paths.DIGESTS},  # weights: their sha256, against the graph's
    "eval": COMMON | {paths.WEIGHTS, paths.DIGESTS},
    "export": COMMON | {paths.WEIGHTS, VAL_BIN},  # (and the graphs' metadata, which may be damaged)
    "train": COMMON | {paths.WEIGHTS, paths.OPTIMIZER, *SHARDS},  # weights: their sha256, against config.json's
}
# What each command may write when it works (digests.json, a cache, always).
WRITES = {
    "generate": set(),
    "eval": set(),
    "export": {*contract.graph_files(), paths.GENAI, bpe.HF_CONFIG_FILE},
    "train": {paths.WEIGHTS, paths.CONFIG, paths.OPTIMIZER, paths.TRAINER, paths.LOG, *SHARDS},
}

BAD_JSON = ['{"model": ', "{", "not json", "\ufeff{}", "{'a': 1}", "\udcff"]  # the last: not UTF-8
WRONG_JSON = ["[]", "null", '"text"', "0", "{}", '{"model": [], "tokenizer_sha256": 1, "eot_id": "x"}',
              '{"sha256": 7, "step": "x", "state": {}}']


@dataclass(frozen=True)
class Damage:
    file: str  # relative to the model directory
    kind: str  # truncate | flip | empty | bad_json | wrong_json | remove
    keep: float = 0.5  # truncate: the share of bytes kept
    flips: tuple[tuple[float, int], ...] = ()  # flip: (where, xor mask) pairs
    text: str = ""  # bad_json / wrong_json: the new content

    def apply(self, model_dir: Path) -> None:
        path = model_dir / self.file
        data = path.read_bytes()
        if self.kind == "remove":
            path.unlink()
        elif self.kind == "empty":
            path.write_bytes(b"")
        elif self.kind == "truncate":
            path.write_bytes(data[:min(int(len(data) * self.keep), len(data) - 1)])
        elif self.kind == "flip":
            buf = bytearray(data)
            for where, mask in self.flips:
                buf[min(int(where * len(buf)), len(buf) - 1)] ^= mask
            path.write_bytes(bytes(buf))
        else:
            path.write_bytes(self.text.encode("utf-8", "surrogateescape"))


@st.composite
def damages(draw: st.DrawFn, file: str) -> Damage:
    kinds = ["truncate", "flip", "empty", "remove"] + (["bad_json", "wrong_json"] if file in JSON_FILES else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "truncate":
        return Damage(file, kind, keep=draw(st.floats(0.0, 0.999)))
    if kind == "flip":
        flips = draw(st.lists(st.tuples(st.floats(0.0, 0.999), st.integers(1, 255)), min_size=1, max_size=8))
        return Damage(file, kind, flips=tuple(flips))
    if kind in ("bad_json", "wrong_json"):
        return Damage(file, kind, text=draw(st.sampled_from(BAD_JSON if kind == "bad_json" else WRONG_JSON)))
    return Damage(file, kind)


def digests(model_dir: Path) -> dict[str, str]:
    """sha256 of every file under `model_dir`, by relative path."""
    return {p.relative_to(model_dir).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(model_dir.rglob("*")) if p.is_file()}


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    def hung(signum: int, frame: object) -> None:
        raise TimeoutError(f"no answer in {seconds} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_cli(argv: list[str]) -> tuple[int, str]:
    """`gptport ARGV` in this process: (exit code, stderr). An exception past the CLI's error boundary
    (a traceback for the user) fails the test with that traceback."""
    stderr = io.StringIO()
    code: int | str | None = 0
    try:
        with deadline(TIMEOUT_S), contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            main(argv)
    except SystemExit as e:
        code = e.code
    except BaseException:  # noqa: BLE001 - anything past the error boundary is the failure we look for
        pytest.fail(f"gptport {' '.join(argv)}: escaped the error boundary:\n{traceback.format_exc()}\n"
                    f"stderr:\n{stderr.getvalue()}")
    return int(code or 0), stderr.getvalue()


def commands(model_dir: Path, damaged: str, text: Path, corpus: Path) -> dict[str, list[str]]:
    """The command lines of each command that reads `damaged`; generate and eval open the damaged
    graph when it is one, the default graph otherwise (and run whatever the damage)."""
    precision, cache = GRAPH_OF.get(damaged, ("fp32", "auto"))
    out = {  # eval has no --kv-cache: it opens the static graph of a precision where there is one
        "generate": ["generate", str(model_dir), "the", "--max-new-tokens", "4", "--precision", precision,
                     "--kv-cache", cache],
        "eval": ["eval", str(model_dir), str(text), "--precision", precision],
        "export": export_argv(model_dir),
        "train": train_argv(model_dir, corpus),
    }
    return {name: argv for name, argv in out.items() if name in ("generate", "eval") or damaged in READS[name]}


def export_argv(model_dir: Path) -> list[str]:
    return ["export", str(model_dir), "--precision", "fp32", "--no-static", "--no-optimize", "--force"]


def train_argv(model_dir: Path, corpus: Path) -> list[str]:
    return ["train", str(corpus), "--model-dir", str(model_dir), "--resume", "--steps", str(STEPS + 2)]


def check_outcome(name: str, argv: list[str], damaged: str, before: dict[str, str], after: dict[str, str],
                  code: int, stderr: str) -> None:
    """Worked, or exit 1 with one line naming `damaged`; nothing changed but what the command writes."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    said = f"gptport {' '.join(argv)} (exit {code}):\n{stderr}"
    assert "Traceback" not in stderr, said
    assert code in (0, 1), said
    changed = {f for f in before.keys() | after.keys() if before.get(f) != after.get(f)} - {paths.DIGESTS}
    if code == 1:
        errors = [line for line in lines if line.startswith("gptport:")]
        assert len(errors) == 1 and lines[-1] == errors[0], said
        assert damaged in errors[0] or Path(damaged).name in errors[0], f"the error does not name {damaged}: {said}"
        assert not changed, f"failed, yet changed {sorted(changed)}: {said}"
    else:
        assert changed <= WRITES[name], f"changed {sorted(changed - WRITES[name])}, not its to write: {said}"


@pytest.fixture(scope="module")
def cache_every_digest() -> Iterator[None]:
    """digests.json caches every file's sha256 (not only those of 1 MiB and more), so that the tiny
    model's directory holds one to damage."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(provenance, "CACHED_FROM", 1)
        yield


@pytest.fixture(scope="module")
def complete_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path,
                 cache_every_digest: None) -> Path:
    """A model directory with every file: tokenizer, shards, weights, resume state, graphs of fp32 (both
    caches), int8 (both) and fp16, genai_config.json and digests.json."""
    from gptport.export import exporter

    out = build_model_dir(tmp_path_factory.mktemp("complete") / "m", tokenizer_dir, corpus_file, steps=STEPS)
    exporter.export(out, ["fp32", "int8", "fp16"])
    return out


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("text") / "heldout.txt"
    path.write_text(make_text(40, seed=5), encoding="utf-8")
    return path


@contextlib.contextmanager
def copy_of(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh copy of `model_dir` (mtimes kept), with digests.json written for its files."""
    root = tmp_path_factory.mktemp("damaged")
    out = root / "m"
    shutil.copytree(model_dir, out)
    for name in (paths.WEIGHTS, paths.CONFIG):
        provenance.digest(out / name)
    try:
        yield out
    finally:
        shutil.rmtree(root)


def run_checked(name: str, argv: list[str], model_dir: Path, damaged: str) -> int:
    before = digests(model_dir)
    code, stderr = run_cli(argv)
    check_outcome(name, argv, damaged, before, digests(model_dir), code, stderr)
    return code


def damage_and_run(damage: Damage, complete_dir: Path, text_file: Path, corpus_file: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> None:
    """Damage a fresh copy of `complete_dir`, then run each command that reads the damaged file, checked."""
    with copy_of(complete_dir, tmp_path_factory) as model_dir:
        damage.apply(model_dir)
        for name, argv in commands(model_dir, damage.file, text_file, corpus_file).items():
            run_checked(name, argv, model_dir, damage.file)


@pytest.mark.parametrize("file", FILES)  # every file, whatever hypothesis draws
@settings(max_examples=3, deadline=None, derandomize=True, phases=[Phase.generate],  # no shrinking: a failure
          # would rerun commands for minutes, and the examples are small as drawn
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_damaged_file_fails_in_one_line(file: str, data: st.DataObject, complete_dir: Path, text_file: Path,
                                        corpus_file: Path, tmp_path_factory: pytest.TempPathFactory,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPTPORT_DEBUG", raising=False)
    damage_and_run(data.draw(damages(file), label="damage"), complete_dir, text_file, corpus_file, tmp_path_factory)


ESCAPED_BEFORE = [  # damages that ended in a traceback before this test: each fixed where the file is read
    Damage(bpe.META_FILE, "bad_json", text="{"),  # JSONDecodeError
    Damage(bpe.META_FILE, "wrong_json", text="[]"),  # AttributeError
    Damage("model.int8.static.onnx", "truncate", keep=0.0),  # onnxruntime's InvalidArgument
    Damage(TRAIN_BIN, "empty"),  # np.memmap's ValueError
    Damage(VAL_BIN, "truncate", keep=0.5001),  # an odd number of bytes
    Damage(SHARD_META, "bad_json", text="\udcff"),  # UnicodeDecodeError
]


@pytest.mark.parametrize("damage", ESCAPED_BEFORE, ids=lambda d: f"{d.file}-{d.kind}")
def test_damages_that_escaped_before(damage: Damage, complete_dir: Path, text_file: Path, corpus_file: Path,
                                     tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPTPORT_DEBUG", raising=False)
    damage_and_run(damage, complete_dir, text_file, corpus_file, tmp_path_factory)


@pytest.mark.parametrize("name", ["export", "train"])
@pytest.mark.parametrize("kind", ["truncate", "flip", "empty", "remove"])
def test_unread_files_are_not_needed(name: str, kind: str, complete_dir: Path, corpus_file: Path,
                                     tmp_path_factory: pytest.TempPathFactory) -> None:
    """Export and train work with every file outside READS damaged at once: the property test may skip
    them there."""
    with copy_of(complete_dir, tmp_path_factory) as model_dir:
        unread = [f for f in FILES if f not in READS[name]]
        for f in unread:
            Damage(f, kind, flips=((0.0, 0xFF), (0.5, 0x55))).apply(model_dir)
        argv = export_argv(model_dir) if name == "export" else train_argv(model_dir, corpus_file)
        assert run_checked(name, argv, model_dir, "(none)") == 0


DAMAGED_JSON = [(bpe.META_FILE, "{"), (paths.CONFIG, "[]")]


@pytest.mark.parametrize(("file", "text"), DAMAGED_JSON)
def test_console_script_says_one_line(file: str, text: str, complete_dir: Path,
                                      tmp_path_factory: pytest.TempPathFactory) -> None:
    """The installed entry point, in its own process, ends the same way as main() in this one."""
    with copy_of(complete_dir, tmp_path_factory) as model_dir:
        (model_dir / file).write_text(text, encoding="utf-8")
        argv = ["generate", str(model_dir), "the", "--max-new-tokens", "2"]
        proc = subprocess.run([sys.executable, "-m", "gptport.cli.main", *argv], capture_output=True, text=True,
                              timeout=TIMEOUT_S, env={k: v for k, v in os.environ.items() if k != "GPTPORT_DEBUG"})
        code, stderr = run_cli(argv)
        assert (proc.returncode, proc.stderr.strip()) == (code, stderr.strip()) == (1, proc.stderr.strip())
        assert proc.stderr.count("\n") == 1 and file in proc.stderr, proc.stderr


def test_resume_state_not_json(complete_dir: Path, corpus_file: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """The training state inside optimizer.safetensors, damaged while the file still parses."""
    from safetensors.torch import load_file, save_file

    with copy_of(complete_dir, tmp_path_factory) as model_dir:
        path = model_dir / paths.OPTIMIZER
        save_file(load_file(str(path)), str(path), metadata={"state": '{"step": '})
        code, stderr = run_cli(train_argv(model_dir, corpus_file))
        assert code == 1 and stderr.count("\n") == 1 and paths.OPTIMIZER in stderr, stderr


def test_weights_with_nan(complete_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Weights holding NaN whose sha256 config.json records (a diverged run writes them so) are refused by
    name, not reported as a failed parity. (NaN written without it: tests/cli/test_weights_sha.py's damage.)"""
    import json

    import torch
    from safetensors.torch import load_file, save_file

    with copy_of(complete_dir, tmp_path_factory) as model_dir:
        path = model_dir / paths.WEIGHTS
        weights = load_file(str(path))
        name = next(iter(weights))
        weights[name].view(-1)[0] = torch.nan
        save_file(weights, str(path))
        config = json.loads((model_dir / paths.CONFIG).read_text())
        config[provenance.WEIGHTS_SHA] = provenance.file_digest(path)
        (model_dir / paths.CONFIG).write_text(json.dumps(config))
        before = digests(model_dir)
        code, stderr = run_cli(export_argv(model_dir))
        assert code == 1 and stderr.count("\n") == 1 and f"{paths.WEIGHTS}: {name} holds NaN" in stderr, stderr
        assert digests(model_dir) == before


def test_graph_config_disagrees_with_graph(complete_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A graph whose recorded config (n_layer) no longer fits its inputs: refused when opened, not an
    onnxruntime error at the first step."""
    import json

    import onnx

    with copy_of(complete_dir, tmp_path_factory) as model_dir:
        path = model_dir / contract.onnx_file("fp32")
        proto = onnx.load(str(path))
        for prop in proto.metadata_props:
            if prop.key == contract.META_CONFIG:
                prop.value = json.dumps({**json.loads(prop.value), "n_layer": 3})
        onnx.save(proto, str(path))
        code, stderr = run_cli(["generate", str(model_dir), "the", "--kv-cache", "concat"])
        assert code == 1 and stderr.count("\n") == 1 and f"{path}: its input names disagree" in stderr, stderr


def test_damaged_digest_cache_is_not_believed(complete_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A digests.json whose cached sha256 of the weights is wrong (its keys intact): the weights are
    hashed again before a graph is refused, and the cache is corrected."""
    import json

    with copy_of(complete_dir, tmp_path_factory) as model_dir:
        cache_path = model_dir / paths.DIGESTS
        cache = json.loads(cache_path.read_text())
        right = cache[paths.WEIGHTS]["sha256"]
        cache[paths.WEIGHTS]["sha256"] = ("0" if right[0] != "0" else "1") + right[1:]
        cache_path.write_text(json.dumps(cache))
        code, stderr = run_cli(["generate", str(model_dir), "the", "--max-new-tokens", "2"])
        assert code == 0, stderr
        assert json.loads(cache_path.read_text())[paths.WEIGHTS]["sha256"] == right
