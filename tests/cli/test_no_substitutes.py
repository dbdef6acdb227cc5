"""No silent substitutes: what was asked for runs, or the user is told what runs instead."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gptport.cli.common import open_engine
from gptport.errors import UsageError
from gptport.runtime import host_measures
from gptport.runtime.choice import RunOptions
from tests.support.cli import assert_one_line_error, gptport


def test_torch_engine_refuses_tensorrt(tokenizer_dir: Path) -> None:
    """torch has no TensorRT: --engine torch --provider tensorrt is an error, not torch on CUDA."""
    with pytest.raises(UsageError, match="--provider tensorrt: the torch engine runs on cpu or cuda only"):
        open_engine(tokenizer_dir, "torch", run=RunOptions.parse(provider="tensorrt"))
    assert_one_line_error(gptport("generate", str(tokenizer_dir), "hi", "--engine", "torch", "--provider",
                                   "tensorrt"), 2, "tensorrt", "--engine onnx")


@pytest.mark.parametrize(("native", "mode", "autocast", "notice"), [
    (True, "auto", True, ""),
    (False, "auto", False, ""),  # auto takes fp32 silently where bf16 is not native
    (True, "bf16", True, ""),
    (False, "bf16", True, "this CPU has no native bf16: torch emulates it"),
    (False, "fp32", False, ""),
])
def test_bf16_asked_without_native_bf16_says_so(monkeypatch: pytest.MonkeyPatch, native: bool, mode: str,
                                                autocast: bool, notice: str) -> None:
    import torch

    from gptport.training.train import make_autocast

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
    ctx, said = make_autocast(mode, torch.device("cpu"))
    assert isinstance(ctx, torch.autocast) == autocast
    assert (notice in said) if notice else said == ""


def test_bf16_where_torch_has_no_bf16_autocast_trains_fp32_and_says_so() -> None:
    import torch

    from gptport.training.train import make_autocast

    ctx, said = make_autocast("bf16", torch.device("mps"))  # a device object needs no MPS backend
    assert isinstance(ctx, contextlib.nullcontext) and "no bf16 autocast on mps" in said and "fp32" in said
    assert make_autocast("auto", torch.device("mps"))[1] == ""


def test_train_says_the_bf16_notice_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tokenizer_dir: Path,
                                        corpus_file: Path) -> None:
    import shutil

    import torch

    from gptport import tokenizer as bpe
    from gptport.config import ModelConfig, TrainConfig
    from gptport.corpus import CorpusReader, resolve_sources
    from gptport.training import shards as data
    from gptport.training.train import Hooks, Trainer

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    out = tmp_path / "m"
    shutil.copytree(tokenizer_dir, out)
    tok = bpe.load(out)
    cfg = ModelConfig(vocab_size=tok.vocab_size, n_ctx=16, d_model=32, n_layer=1, n_head=2)
    tcfg = TrainConfig(steps=2, batch_size=2, eval_every=2, eval_batches=1, warmup_steps=1, device="cpu",
                       autocast="bf16")
    shards = data.prepare(out, CorpusReader(resolve_sources([corpus_file])), tok, 0.1)
    notices: list[str] = []
    Trainer(out, cfg, tcfg, shards, tok, bpe.token_bytes(tok), hooks=Hooks(on_notice=notices.append)).run()
    assert len(notices) == 1 and "no native bf16" in notices[0]


@pytest.mark.parametrize(("platform", "ru_maxrss"), [("linux", 300 * 1024), ("darwin", 300 * 1024 * 1024),
                                                     ("freebsd14", 300 * 1024)])
def test_peak_rss_is_mb_on_every_platform(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, platform: str,
                                          ru_maxrss: int) -> None:
    """ru_maxrss counts bytes on macOS and KiB elsewhere: 300 MB either way."""
    import resource

    monkeypatch.setattr(sys, "platform", platform)
    assert host_measures.maxrss_mb(ru_maxrss) == 300.0
    monkeypatch.setattr(resource, "getrusage", lambda who: SimpleNamespace(ru_maxrss=ru_maxrss))
    assert host_measures.peak_rss_mb(status=str(tmp_path / "no-proc-status")) == 300.0  # no /proc: getrusage


def test_peak_rss_reads_linux_high_water_mark(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmPeak:\t 999999 kB\nVmHWM:\t  307200 kB\nVmRSS:\t 1024 kB\n")
    assert host_measures.peak_rss_mb(status=str(status)) == 300.0


def test_dynamic_int8_quantizes_every_matmul(tmp_path: Path, tokenizer_dir: Path, corpus_file: Path) -> None:
    """The one scheme besides MatMulNBits (the 'mixed' one of a dropped experiment is gone): every
    MatMul by a weight, the head's included, becomes an int8 MatMulInteger, and the graph still loads."""
    import onnx

    from gptport.export import exporter, variants
    from gptport.runtime.onnx_engine import load_cpu
    from tests.conftest import build_model_dir

    model_dir = build_model_dir(tmp_path / "m", tokenizer_dir, corpus_file, steps=0, n_layer=1)
    exporter.export(model_dir, ["fp32"], optimize=False, static=False)
    dst = tmp_path / "dynamic.onnx"
    variants.quantize(model_dir / "model.onnx", dst, variants.SCHEMES["dynamic-int8"])
    graph = onnx.load(str(dst)).graph
    weights = {i.name for i in graph.initializer}
    ops = [n.op_type for n in graph.node]
    assert not [n for n in graph.node if n.op_type == "MatMul" and n.input[1] in weights]  # only q·k, p·v stay
    assert ops.count("MatMulInteger") == 1 + 4  # the head; qkv, attention out, MLP up and down per layer
    assert load_cpu(dst).n_layer == 1
