"""A graph proves where it came from: the weights and config.json it records are checked when it is
opened, its contract version too, and export removes the graphs of earlier weights."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import onnx
import pytest

from gptport import contract, provenance
from gptport import tokenizer as bpe
from gptport.cli.common import open_engine
from gptport.errors import ArtifactError
from gptport.export import exporter
from gptport.runtime import bench
from gptport.runtime.choice import GraphChoice
from gptport.runtime.generate import generate
from gptport.runtime.loader import open_model
from gptport.runtime.onnx_engine import file_metadata, load_cpu
from gptport.runtime.sampling import Sampling
from tests.conftest import build_model_dir
from tests.support.cli import assert_one_line_error, gptport

ALL = ["fp32", "int8", "int4", "fp16"]


@pytest.fixture(scope="module")
def exported_all(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path, corpus_file: Path) -> Path:
    """A tiny model trained a little, exported to every precision (the ones that pass their gate)."""
    out = build_model_dir(tmp_path_factory.mktemp("provenance") / "m", tokenizer_dir, corpus_file, steps=40)
    exporter.export(out, ALL)
    return out


def copy(src: Path, dst: Path, *ignore: str) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(*ignore) if ignore else None)
    return dst


def graphs(d: Path) -> set[str]:
    return {name for name in contract.graph_files() if (d / name).exists()}


def greedy(d: Path, engine: str = "onnx", cache: str = "auto", precision: str = "fp32") -> list[int]:
    opened = open_engine(d, engine, GraphChoice.parse(precision=precision, cache=cache))
    ids = [opened.tok.encode("ka to ri men")]
    return generate(opened.engine, ids, 12, Sampling(), eot_id=-1)[0].new_ids


def train_more(d: Path, corpus: Path, steps: int) -> None:
    """Resume the directory's training for `steps` more steps (new model.safetensors and config.json)."""
    from gptport.config import TrainConfig
    from gptport.corpus import CorpusReader, resolve_sources
    from gptport.training import shards as data
    from gptport.training.checkpoint import read_card
    from gptport.training.train import Trainer

    tok, card = bpe.load(d), read_card(d)
    tcfg = TrainConfig(steps=card.step + steps, batch_size=16, lr=3e-3, warmup_steps=5, eval_every=steps,
                       eval_batches=2, device="cpu", seed=0)
    shards = data.prepare(d, CorpusReader(resolve_sources([corpus])), tok, 0.1)
    Trainer(d, card.model, tcfg, shards, tok, bpe.token_bytes(tok), resume=True).run()


def test_every_graph_records_the_weights_and_config_it_was_made_from(exported_all: Path) -> None:
    weights = provenance.file_digest(exported_all / "model.safetensors")
    config = provenance.file_digest(exported_all / "config.json")
    assert {"model.onnx", "model.static.onnx", "model.int8.onnx", "model.fp16.onnx"} <= graphs(exported_all)
    for name in graphs(exported_all):
        meta = file_metadata(exported_all / name)
        assert meta[contract.META_WEIGHTS] == weights and meta[contract.META_CONFIG_SHA] == config, name


def test_a_graph_of_other_weights_is_refused_everywhere(tmp_path: Path, exported_all: Path) -> None:
    d = copy(exported_all, tmp_path / "m")
    weights = d / "model.safetensors"
    old = provenance.file_digest(weights)
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # the last byte of the last tensor: still a valid file, other weights
    weights.write_bytes(bytes(data))
    new = provenance.file_digest(weights)
    config = json.loads((d / "config.json").read_text())  # recorded as train records the weights it writes
    (d / "config.json").write_text(json.dumps({**config, provenance.WEIGHTS_SHA: new}))
    for precision, cache, name in (("fp32", "auto", "model.static.onnx"), ("fp32", "concat", "model.onnx"),
                                   ("int8", "auto", "model.int8.static.onnx"), ("fp16", "auto", "model.fp16.onnx")):
        with pytest.raises(ArtifactError) as e:
            open_model(d, GraphChoice.parse(precision=precision, cache=cache))
        msg = str(e.value)
        assert "\n" not in msg and str(d / name) in msg and old[:12] in msg and new[:12] in msg
        hint = "" if precision == "fp32" else f" --precision fp32,{precision}"
        assert f"`gptport export {d}{hint} --force`" in msg
    plan = bench.BenchPlan(precisions=("fp32", "int8"), prompt_lens=(4,), gen_len=2, repeat=1, warmup=0,
                           torch_baseline=False, probe_mib=8)
    rows = bench.run(d, plan)["rows"]
    assert [r["precision"] for r in rows] == ["fp32", "int8"]
    assert all("exported from other weights" in (r["error"] or "") for r in rows)
    assert_one_line_error(gptport("generate", str(d), "ka", "--precision", "int8", "--max-new-tokens", "2"), 1,
                           "model.int8.static.onnx", old[:12], new[:12],
                           f"gptport export {d} --precision fp32,int8 --force")
    assert_one_line_error(gptport("eval", str(d), "-", stdin="ka to ri men sol\n"), 1, "other weights")
    (d / "config.json").write_text((d / "config.json").read_text() + "\n")
    data[-1] ^= 1
    weights.write_bytes(bytes(data))  # the weights again, but not the config.json the graph was made from
    with pytest.raises(ArtifactError, match="exported from other config.json"):
        open_model(d)


def test_export_removes_the_graphs_of_earlier_weights(tmp_path: Path, exported_all: Path,
                                                      corpus_file: Path) -> None:
    """Export all precisions, train more, export fp32 only: each precision's generate
    is the new weights' or a clear error."""
    d = copy(exported_all, tmp_path / "m")
    before = graphs(d)
    assert {"model.int8.onnx", "model.int8.static.onnx", "model.fp16.onnx"} <= before
    train_more(d, corpus_file, 10)
    with pytest.raises(ArtifactError, match="exported from other weights"):
        open_model(d, GraphChoice.parse(precision="int8"))
    r = gptport("export", str(d), "--force")  # fp32 only
    assert r.returncode == 0, r.stderr
    fp32 = {"model.onnx", "model.static.onnx", "model.append.onnx"}  # what an fp32 export writes
    for name in before - fp32:
        assert f"removed {d / name} (exported from other weights" in r.stderr
    assert graphs(d) == fp32
    want = greedy(d, "torch")
    for cache in ("static", "concat"):
        assert greedy(d, cache=cache) == want
    for precision in ALL[1:]:
        hint = re.escape(f"missing; run `gptport export {d} --precision fp32,{precision}`")
        with pytest.raises(ArtifactError, match=hint):
            open_model(d, GraphChoice.parse(precision=precision))
    r = gptport("generate", str(d), "ka", "--precision", "int8", "--max-new-tokens", "2")
    assert_one_line_error(r, 1, "model.int8.onnx: missing", "--precision fp32,int8")


def test_export_keeps_the_graphs_of_the_same_weights(tmp_path: Path, exported_all: Path) -> None:
    d = copy(exported_all, tmp_path / "m")
    stale = d / "model.fp16.onnx"
    exporter.set_metadata(stale, {**file_metadata(stale), contract.META_WEIGHTS: "0" * 64})
    report = exporter.export(d, ["fp32"], optimize=False, static=False, force=True)
    assert list(report.files.values()) == [d / "model.onnx"]
    assert report.removed == {stale: f"exported from other weights: sha256 000000000000…, not "
                                     f"{provenance.file_digest(d / 'model.safetensors')[:12]}…"}
    assert graphs(d) == graphs(exported_all) - {"model.fp16.onnx"}


def test_a_graph_of_another_contract_or_tool_is_refused(tmp_path: Path, exported_all: Path) -> None:
    d = copy(exported_all, tmp_path / "m")
    graph = d / "model.onnx"
    exporter.set_metadata(graph, {**file_metadata(graph), contract.META_CONTRACT: "0"})
    for opening in (lambda: open_model(d, GraphChoice.parse(cache="concat")), lambda: load_cpu(graph)):
        with pytest.raises(ArtifactError) as e:
            opening()
        msg = str(e.value)
        assert str(graph) in msg and "contract 0" in msg and f"expects contract {contract.CONTRACT_VERSION}" in msg
        assert f"`gptport export {d} --force`" in msg
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    plain = onnx.helper.make_model(onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])],
                                                          "other", [x], [y]),
                                   opset_imports=[onnx.helper.make_opsetid("", 18)])
    plain.ir_version = 8
    onnx.save(plain, str(graph))
    assert_one_line_error(gptport("generate", str(d), "ka", "--kv-cache", "concat"), 1, str(graph),
                           "not a gptport graph", f"expected one written by `gptport export` under contract "
                                                  f"{contract.CONTRACT_VERSION}")


def test_a_directory_without_weights_still_opens(tmp_path: Path, exported_all: Path) -> None:
    d = copy(exported_all, tmp_path / "deploy", "*.safetensors", "data", "logs", "trainer.json")
    want = greedy(exported_all)
    assert greedy(d) == want and greedy(d, cache="concat") == want
    assert greedy(d, precision="int8") == greedy(exported_all, precision="int8")  # the same int8 graph
    r = gptport("generate", str(d), "ka to", "--max-new-tokens", "3")
    assert r.returncode == 0, r.stderr
    (d / "config.json").write_text((d / "config.json").read_text() + "\n")
    with pytest.raises(ArtifactError, match="exported from other config.json"):
        open_model(d)  # config.json, where there is one, is still compared
    (d / "config.json").unlink()
    assert greedy(d) == want


def test_the_digest_of_large_files_is_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(provenance, "CACHED_FROM", 0)
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"a" * 1000)
    real = provenance.file_digest
    assert provenance.digest(f) == real(f) and not (tmp_path / "digests.json").exists()  # just written: racy
    past = f.stat().st_mtime_ns - 10**10
    os.utime(f, ns=(past, past))
    assert provenance.digest(f) == real(f) and (tmp_path / "digests.json").exists()

    def no_hashing(path: Path) -> str:
        raise AssertionError(f"{path} hashed again")

    monkeypatch.setattr(provenance, "file_digest", no_hashing)
    assert provenance.digest(f) == real(f)  # from the cache
    f.write_bytes(b"b" * 1000)  # same size, new mtime
    monkeypatch.setattr(provenance, "file_digest", real)
    assert provenance.digest(f) == real(f) != hashlib.sha256(b"a" * 1000).hexdigest()
