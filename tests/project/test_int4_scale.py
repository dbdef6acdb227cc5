"""benchmarks.decode.int4_scale's figures from its rounds: medians, ratios to each reference, the bandwidth share
and issue 59's goals; and a lever's graph (benchmarks.harness.int4_models) built beside links to the model."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from benchmarks.decode.int4_scale import goal_rows, summarize
from benchmarks.harness import int4_models


def config(decode: float, prefill: float, nbytes: int, probe: float | None = None) -> dict[str, float]:
    out = {"decode_tok_s": decode, "prefill_tok_s": prefill, "bytes_per_token": nbytes}
    return out | ({"probe_gb_s": probe} if probe is not None else {})


def rounds() -> list[dict[str, dict[str, float]]]:
    return [{"gptport int4": config(30, 100, 300_000_000, 20), "gptport int4 b128": config(36, 110, 250_000_000, 22),
             "llama.cpp Q4_0": config(25, 200, 350_000_000), "llama.cpp Q4_K_M": config(20, 150, 400_000_000),
             "genai int4": config(24, 90, 320_000_000)},
            {"gptport int4": config(32, 100, 300_000_000, 18), "gptport int4 b128": config(40, 120, 250_000_000, 18),
             "llama.cpp Q4_0": config(26, 210, 350_000_000), "llama.cpp Q4_K_M": config(22, 150, 400_000_000),
             "genai int4": config(26, 80, 320_000_000)},
            {"gptport int4": config(31, 100, 300_000_000, 20), "gptport int4 b128": config(38, 130, 250_000_000, 20),
             "llama.cpp Q4_0": config(24, 190, 350_000_000), "llama.cpp Q4_K_M": config(21, 160, 400_000_000),
             "genai int4": config(25, 85, 320_000_000)}]


def test_medians_ratios_and_bandwidth_share() -> None:
    names = ["llama.cpp Q4_0", "gptport int4", "llama.cpp Q4_K_M", "gptport int4 b128", "genai int4"]
    listed = summarize("llama-3.2-1b", rounds(), names)
    assert [r["configuration"] for r in listed] == names  # in the order asked, not the rounds' own
    rows = {r["configuration"]: r for r in listed}
    ours = rows["gptport int4"]
    assert ours["decode_tok_s"] == 31 and ours["prefill_tok_s"] == 100
    assert ours["vs_q4_0"] == pytest.approx(31 / 25) and ours["vs_q4_k_m"] == pytest.approx(31 / 21)
    assert ours["vs_genai"] == pytest.approx(31 / 25)
    assert ours["vs_q4_0_rounds"] == [1.2, round(32 / 26, 3), round(31 / 24, 3)]
    # each round's probe: the median of gptport's probes in it (21, 18, 20 GB/s)
    assert ours["probe_gb_s"] == pytest.approx(20)
    shares = sorted(t * 300e6 / (b * 1e9) for t, b in ((30, 21), (32, 18), (31, 20)))
    assert ours["bandwidth_share"] == pytest.approx(shares[1])
    assert "vs_q4_0" not in rows["llama.cpp Q4_0"] and rows["genai int4"]["weight_mb_per_token"] == 320


def test_goals_judge_the_export_and_the_fastest() -> None:
    rows = summarize("llama-3.2-1b", rounds())
    goals = goal_rows("llama-3.2-1b", rows[::-1])  # the export's row found by its name
    assert [g["configuration"] for g in goals] == ["gptport int4", "gptport int4 b128"]
    export, fastest = goals
    assert export["vs_q4_0_met"] is True and export["vs_genai_met"] is True  # 1.24
    assert fastest["vs_q4_0"] == pytest.approx(38 / 25) and fastest["vs_q4_k_m_met"] is True
    assert export["bandwidth_met"] is False  # 31 tok/s x 0.3 GB of a 20 GB/s probe: 47%
    assert "bandwidth_met" not in goal_rows("qwen2.5-0.5b", summarize("qwen2.5-0.5b", rounds()))[0]


def test_a_lever_graph_is_built_beside_links_to_the_model(tmp_path: Path, tokenizer_dir: Path,
                                                          corpus_file: Path) -> None:
    from gptport.runtime.onnx_engine import load_cpu
    from tests.conftest import build_model_dir

    m = build_model_dir(tmp_path / "m", tokenizer_dir, corpus_file, steps=0, n_kv_head=2, pos_encoding="rope",
                        norm="rmsnorm", mlp="swiglu", bias=False)
    d = int4_models.lever_dir(m, tmp_path / "work", "b64-head4")
    assert (d / "config.json").is_symlink() and not [p.name for p in d.iterdir() if p.name.startswith(".")]
    proto = onnx.load(str(d / "model.int4.static.onnx"))
    nbits = [{a.name: a.i for a in n.attribute} for n in proto.graph.node if n.op_type == "MatMulNBits"]
    assert nbits and {(q["bits"], q["block_size"], q["accuracy_level"]) for q in nbits} == {(4, 64, 4)}  # the head too
    model = load_cpu(d / "model.int4.static.onnx")
    assert model.precision == "int4" and model.cache == "static"
    assert int4_models.lever_dir(m, tmp_path / "work", "b64-head4") == d  # kept: not built again
