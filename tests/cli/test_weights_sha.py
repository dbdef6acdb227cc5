"""Weights that prove their integrity: config.json records the sha256 of model.safetensors, and
every reader of the weights (export, eval --engine torch, export-hf, export-gguf, train --resume) refuses
bytes that differ, in one line naming the file. The damage here is the one the damaged-file test could
miss: one low mantissa bit of a float32 flipped in place, so that every value stays finite, and the file's
size, inode and mtime kept (digests.json still holds the old sha256 under a matching key)."""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from gptport import paths, provenance
from tests.cli.test_damaged import STEPS, copy_of, digests, export_argv, run_cli, train_argv
from tests.conftest import build_model_dir

pytestmark = pytest.mark.slow

OLD_NS = 1_600_000_000 * 10**9  # an mtime far from "racy" (provenance.RACY_NS), so that digests.json caches


@pytest.fixture(scope="module")
def cache_every_digest() -> Iterator[None]:
    """digests.json caches the tiny weights too (as it does files of 1 MiB and more)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(provenance, "CACHED_FROM", 1)
        yield


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path,
              cache_every_digest: None) -> Path:
    """A trained model with its resume state and the fp32 graph, its weights' mtime set in the past."""
    from gptport.export import exporter

    out = build_model_dir(tmp_path_factory.mktemp("sha") / "m", tokenizer_dir, corpus_file, steps=STEPS)
    exporter.export(out, ["fp32"], static=False)
    os.utime(out / paths.WEIGHTS, ns=(OLD_NS, OLD_NS))
    return out


@pytest.fixture
def text_file(tmp_path: Path) -> Path:
    path = tmp_path / "heldout.txt"
    path.write_text("the quick brown fox jumps over the lazy dog\n" * 20, encoding="utf-8")
    return path


def flip_in_place(path: Path, keep_mtime: bool = True) -> tuple[str, str]:
    """Flip the lowest mantissa bit of the first float32 in the tensor data, writing in place (same
    inode and size) and, with `keep_mtime`, putting the mtime back; the old and new sha256."""
    before, st = provenance.file_digest(path), path.stat()
    with open(path, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        name = next(k for k, v in header.items() if k != "__metadata__" and v["dtype"] == "F32")
        where = 8 + n + header[name]["data_offsets"][0]  # little-endian: the mantissa's lowest byte first
        f.seek(where)
        (value,) = struct.unpack("<f", f.read(4))
        f.seek(where)
        f.write(bytes([struct.pack("<f", value)[0] ^ 1]))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = path.stat()
    assert (after.st_size, after.st_ino) == (st.st_size, st.st_ino)
    return before, provenance.file_digest(path)


def argvs(model_dir: Path, text: Path, corpus: Path, out: Path) -> dict[str, list[str]]:
    """Every command that reads model.safetensors."""
    return {
        "export": export_argv(model_dir),
        "eval": ["eval", str(model_dir), str(text), "--engine", "torch"],
        "export-hf": ["export-hf", str(model_dir), "--out", str(out / "hf")],
        "export-gguf": ["export-gguf", str(model_dir), "--out", str(out / "m.gguf")],
        "train": train_argv(model_dir, corpus),
    }


@pytest.mark.parametrize("name", ["export", "eval", "export-hf", "export-gguf", "train"])
def test_flipped_weights_fail_in_one_line(name: str, model_dir: Path, text_file: Path, corpus_file: Path,
                                          tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPTPORT_DEBUG", raising=False)
    with copy_of(model_dir, tmp_path_factory) as d:
        cached = json.loads((d / paths.DIGESTS).read_text())[paths.WEIGHTS]["sha256"]
        before, after = flip_in_place(d / paths.WEIGHTS)
        assert cached == before != after  # the cache still vouches for the old bytes
        files = digests(d)
        argv = argvs(d, text_file, corpus_file, tmp_path)[name]
        code, stderr = run_cli(argv)
        assert code == 1 and stderr.count("\n") == 1 and stderr.startswith("gptport:"), stderr
        assert f"{d / paths.WEIGHTS}: damaged" in stderr and paths.CONFIG in stderr, stderr
        assert after[:12] in stderr and before[:12] in stderr, stderr
        assert {k for k in files.keys() | digests(d).keys() if files.get(k) != digests(d).get(k)} <= {paths.DIGESTS}
        assert not (tmp_path / "hf").exists() and not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize("name", ["export", "eval", "export-hf", "export-gguf", "train"])
def test_intact_weights_pass(name: str, model_dir: Path, text_file: Path, corpus_file: Path, tmp_path: Path,
                             tmp_path_factory: pytest.TempPathFactory) -> None:
    with copy_of(model_dir, tmp_path_factory) as d:
        code, stderr = run_cli(argvs(d, text_file, corpus_file, tmp_path)[name])
        assert code == 0, stderr
        config = json.loads((d / paths.CONFIG).read_text())
        assert config[provenance.WEIGHTS_SHA] == provenance.file_digest(d / paths.WEIGHTS)
        assert provenance.WEIGHTS_PENDING not in config


def test_graph_readers_name_damaged_weights(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """generate reads the graph, not the weights: flipped weights whose mtime changed are refused as damaged
    (not as newer weights to export again); with size, mtime and inode kept, the graph, intact and proved
    by its own metadata, still runs (digests.json is believed where the weights are not read)."""
    with copy_of(model_dir, tmp_path_factory) as d:
        flip_in_place(d / paths.WEIGHTS, keep_mtime=False)
        code, stderr = run_cli(["generate", str(d), "the", "--max-new-tokens", "2"])
        assert code == 1 and f"{d / paths.WEIGHTS}: damaged" in stderr and stderr.count("\n") == 1, stderr
    with copy_of(model_dir, tmp_path_factory) as d:
        flip_in_place(d / paths.WEIGHTS)
        code, stderr = run_cli(["generate", str(d), "the", "--max-new-tokens", "2"])
        assert code == 0, stderr


def test_directory_without_recorded_sha_is_accepted(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A config.json written before weights recorded their sha256: not compared (its graphs record theirs)."""
    with copy_of(model_dir, tmp_path_factory) as d:
        config = json.loads((d / paths.CONFIG).read_text())
        del config[provenance.WEIGHTS_SHA]
        (d / paths.CONFIG).write_text(json.dumps(config))
        flip_in_place(d / paths.WEIGHTS)
        code, stderr = run_cli(export_argv(d))
        assert code == 0, stderr


def test_a_recorded_sha_that_is_not_one_names_config(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    with copy_of(model_dir, tmp_path_factory) as d:
        config = json.loads((d / paths.CONFIG).read_text())
        (d / paths.CONFIG).write_text(json.dumps({**config, provenance.WEIGHTS_SHA: "xyz"}))
        code, stderr = run_cli(export_argv(d))
        assert code == 1 and f"{d / paths.CONFIG}: {provenance.WEIGHTS_SHA} is not a sha256" in stderr, stderr


@pytest.mark.parametrize("crash", ["before_rename", "before_config"])
def test_checkpoint_is_consistent_at_every_crash(crash: str, model_dir: Path, tmp_path_factory: pytest.TempPathFactory,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """save_model stopped after config.json accepts the new weights' sha256 as pending (their rename fails),
    or after the rename (config.json's final write fails): either way the weights in place pass."""
    import torch

    from gptport import tokenizer as bpe
    from gptport.training import checkpoint

    class Crash(Exception):
        pass

    def fail(*args: object, **kwargs: object) -> None:
        raise Crash

    with copy_of(model_dir, tmp_path_factory) as d:
        tok = bpe.load(d)
        model, card = checkpoint.load_model(d, tok)
        with torch.no_grad():
            next(model.parameters()).add_(1.0)
        if crash == "before_rename":
            real = os.replace
            monkeypatch.setattr(os, "replace", lambda a, b: fail() if Path(b).name == paths.WEIGHTS else real(a, b))
        else:
            monkeypatch.setattr(checkpoint, "write_config", fail)
        with pytest.raises(Crash):
            checkpoint.save_model(d, model, card.model, tok, card.step + 1)
        monkeypatch.undo()
        accepted = provenance.recorded_weights(d)
        assert len(accepted) == 2 and provenance.file_digest(d / paths.WEIGHTS) in accepted
        provenance.check_weights(d)
        checkpoint.load_model(d, tok)
        checkpoint.save_model(d, model, card.model, tok, card.step + 1)  # the next checkpoint drops the pending one
        assert provenance.recorded_weights(d) == (provenance.file_digest(d / paths.WEIGHTS),)


def test_import_hf_records_the_sha(model_dir: Path, tmp_path: Path) -> None:
    """import-hf writes config.json recording the sha256 of the model.safetensors it writes, checked as train's."""
    hf, out = tmp_path / "hf", tmp_path / "imported"
    assert run_cli(["export-hf", str(model_dir), "--out", str(hf)])[0] == 0
    code, stderr = run_cli(["import-hf", str(hf), "--out", str(out)])
    assert code == 0, stderr
    config = json.loads((out / paths.CONFIG).read_text())
    assert config[provenance.WEIGHTS_SHA] == provenance.file_digest(out / paths.WEIGHTS)
    assert provenance.WEIGHTS_PENDING not in config and not list(out.glob(".import-*"))
    flip_in_place(out / paths.WEIGHTS)
    code, stderr = run_cli(["export-gguf", str(out)])
    assert code == 1 and f"{out / paths.WEIGHTS}: damaged" in stderr, stderr
