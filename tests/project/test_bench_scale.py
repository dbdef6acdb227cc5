"""benchmarks.export.scale's parts: the random-weight Hugging Face directories of real shapes (hf_shapes:
the names and shapes transformers builds from the same config, shards within their limit, seeded, refused in
one line when the disk is short), the launcher that measures a child's peak without its parent's
(rusage), and the benchmark end to end on `tiny` with gptport alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import numpy as np
import pytest

from benchmarks.export import scale
from benchmarks.harness import hf_shapes, results
from benchmarks.harness.rusage import measure

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("shape", list(hf_shapes.SHAPES))
def test_tensors_are_those_transformers_builds_from_the_config(shape: str) -> None:
    import torch
    import transformers

    config = transformers.AutoConfig.for_model(**hf_shapes.SHAPES[shape][0])
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    theirs = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        theirs.pop("lm_head.weight")
    assert dict(hf_shapes.tensors(hf_shapes.SHAPES[shape][0])) == theirs
    assert hf_shapes.parameters(shape) == sum(int(np.prod(s)) for s in theirs.values())


def test_real_shapes_have_their_published_sizes() -> None:
    assert hf_shapes.parameters("qwen2.5-0.5b") == 494_032_768
    assert hf_shapes.parameters("llama-3.2-1b") == 1_235_814_400
    assert hf_shapes.parameters("llama-3.1-8b") == 8_030_261_248
    parts = hf_shapes.shards(hf_shapes.tensors(hf_shapes.SHAPES["llama-3.1-8b"][0]))
    assert len(parts) == 9 and all(sum(hf_shapes.nbytes(s) for _, s in p) <= hf_shapes.SHARD_BYTES for p in parts)


def test_made_directory_loads_in_transformers_and_is_seeded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    import transformers

    monkeypatch.setattr(hf_shapes, "SHARD_BYTES", 70_000)  # several shards of the tiny shape
    monkeypatch.setattr(hf_shapes, "CHUNK", 1000)  # tensors drawn in several chunks
    a = hf_shapes.make("tiny", tmp_path / "a")
    index = json.loads((a / hf_shapes.INDEX).read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and all((a / s).stat().st_size <= 70_000 + 4096 for s in shards)
    assert [p.name for p in tmp_path.iterdir()] == ["a"]  # no temporary folder left
    model = transformers.AutoModelForCausalLM.from_pretrained(str(a))
    weights = dict(model.named_parameters())
    assert model.dtype == torch.bfloat16 and set(index["weight_map"]) == set(weights)
    assert torch.equal(weights["model.norm.weight"], torch.ones(64, dtype=torch.bfloat16))
    assert abs(float(weights["model.embed_tokens.weight"].detach().float().std()) - 0.02) < 0.002
    tok = transformers.AutoTokenizer.from_pretrained(str(a))
    config = hf_shapes.SHAPES["tiny"][0]
    assert len(tok) == 512 and tok("hi")["input_ids"][0] == config["bos_token_id"]
    assert tok.convert_tokens_to_ids("<|eot_id|>") in config["eos_token_id"]
    b = hf_shapes.make("tiny", tmp_path / "b")
    assert all((a / s).read_bytes() == (b / s).read_bytes() for s in shards)
    before = (a / shards[0]).stat().st_mtime_ns
    assert hf_shapes.make("tiny", a) == a and (a / shards[0]).stat().st_mtime_ns == before  # kept, not made anew


def test_a_short_disk_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(hf_shapes.shutil, "disk_usage", lambda _: usage(10**12, 10**12 - 10**9, 10**9))
    with pytest.raises(SystemExit, match=r"1\.0 GB free, the llama-3.1-8b directory needs 16\.2 GB"):
        hf_shapes.make("llama-3.1-8b", tmp_path / "big")
    assert list(tmp_path.iterdir()) == []


def test_a_child_peak_is_its_own_not_its_parents(tmp_path: Path) -> None:
    held = np.ones(2**27, dtype=np.float64)  # 1 GiB in this process: a direct child would report at least that
    small = measure([sys.executable, "-c", "pass"], tmp_path / "small.log")
    big = measure([sys.executable, "-c", "import numpy as np; a = np.ones(2**26); a += 1"], tmp_path / "big.log")
    assert held[-1] == 1.0
    assert small["exit"] == 0 and small["peak_rss_gib"] < 0.2
    assert 0.5 <= big["peak_rss_gib"] < 0.8 and big["cpu_s"] >= 0 and big["wall_s"] > 0
    failed = measure([sys.executable, "-c", "import sys; print('first'); sys.exit('the reason')"], tmp_path / "f.log")
    assert failed["exit"] == 1 and failed["error"] == "the reason"


def test_the_benchmark_runs_end_to_end_on_tiny(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "benchmarks.export.scale", "--shapes", "tiny", "--no-genai",
                          "--also-no-static", "--precisions", "fp32,int8", "--work", str(tmp_path / "work"),
                          "--results", str(tmp_path / "results")], cwd=ROOT, capture_output=True, text=True,
                         timeout=600, env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-2000:]
    [path] = (tmp_path / "results").glob("export-scale-*.json")
    doc = results.read(path)
    steps = {(r["tool"], r["step"]): r for r in doc["rows"] if r["table"] == "steps"}
    assert set(steps) == {("maker", "make"), ("gptport", "import-hf"), ("gptport", "export fp32,int8"),
                          (scale.NO_STATIC, "import-hf"), (scale.NO_STATIC, "export fp32,int8")}
    assert all(r["error"] is None and r["peak_rss_gib"] > 0 and r["files"] > 0 for r in steps.values())
    written = doc["rounds"][0]["data"]["gptport"]["export fp32,int8"]["files"]
    assert {"model.onnx", "model.int8.onnx", "model.static.onnx"} <= set(written)
    alone = doc["rounds"][0]["data"][scale.NO_STATIC]["export fp32,int8"]["files"]
    assert {"model.onnx", "model.int8.onnx"} <= set(alone) and not any("static" in f for f in alone)
    assert "| tiny | gptport | export fp32,int8 |" in run.stdout
    assert not (tmp_path / "work" / "tiny" / "gptport").exists()  # removed without --keep
    assert scale.goal_row("tiny", doc["rows"]) is None  # no goal for tiny
