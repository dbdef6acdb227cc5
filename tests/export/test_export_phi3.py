"""Phi-3 (partial rotary, LongRoPE) and SmolLM3 (layers without rope) imported from tiny random transformers models
go through `gptport export` (every gate), and generation on each graph (the contract graph, the static-cache graph
with its multi-row append twin) gives transformers' greedy tokens from generate(), on a prompt that crosses
LongRoPE's original context while decoding and one that starts past it, alone and in one batch (the factors are
chosen per row). The graphs' rotation is onnx's operators
(rope_graph.py): the static graph hands GroupQueryAttention q and k rotated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest

from gptport.runtime.choice import GraphChoice
from gptport.runtime.generate import generate
from gptport.runtime.loader import open_model
from gptport.runtime.sampling import Sampling
from tests.arch.hf_tiny import hf_greedy, hf_model, make
from tests.arch.test_phi3 import phi3_config
from tests.arch.test_smollm3 import SHAPE
from tests.export.test_hf_llama import hf_tokenizer_dir  # noqa: F401  (the fixture)
from tests.support.cli import gptport

pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")

PROMPTS = {"phi3": [[5, 17, 200, 3], list(range(30, 50))], "smollm3": [[5, 17, 200, 3, 9]]}


@pytest.fixture(scope="module", params=["phi3", "smollm3"])
def exported(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
             hf_tokenizer_dir: Path) -> tuple[str, Path, Path]:  # noqa: F811
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "phi3":
        hf_dir = make("Phi3Config", "Phi3ForCausalLM", root / "hf", hf_tokenizer_dir, **phi3_config())
    else:
        hf_dir = make("SmolLM3Config", "SmolLM3ForCausalLM", root / "hf", hf_tokenizer_dir,
                      no_rope_layers=[1, 0, 0, 1], **SHAPE)
    out = root / "m"
    r = gptport("import-hf", str(hf_dir), "--out", str(out))
    assert r.returncode == 0, r.stderr
    r = gptport("export", str(out), "--precision", "fp32", "--gate-on-sampled-text")
    assert r.returncode == 0, r.stderr
    return request.param, hf_dir, out


def test_export_writes_every_graph_through_the_gates(exported: tuple[str, Path, Path]) -> None:
    _, _, out = exported
    for name in ("model.onnx", "model.static.onnx", "model.append.onnx"):
        assert (out / name).is_file()
    static = onnx.load(str(out / "model.static.onnx"), load_external_data=False)
    gqa = [n for n in static.graph.node if n.op_type == "GroupQueryAttention"]
    assert gqa and all(a.name != "do_rotary" or a.i == 0 for n in gqa for a in n.attribute)


@pytest.mark.parametrize("cache", ["concat", "static"])
def test_generate_on_the_graphs_gives_transformers_greedy_tokens(exported: tuple[str, Path, Path],
                                                                cache: str) -> None:
    family, hf_dir, out = exported
    engine: Any = open_model(out, GraphChoice.parse(cache=cache)).engine
    hf = hf_model(hf_dir)
    wants = [hf_greedy(hf, prompt, 20) for prompt in PROMPTS[family]]
    for prompt, want in zip(PROMPTS[family], wants, strict=True):
        assert generate(engine, [prompt], 20, Sampling(), eot_id=-1)[0].new_ids == want, (family, cache, prompt)
    together = generate(engine, PROMPTS[family], 20, Sampling(), eot_id=-1)  # one batch: LongRoPE's set per row
    assert [r.new_ids for r in together] == wants


def test_export_hf_round_trips(exported: tuple[str, Path, Path], tmp_path: Path) -> None:
    """export-hf writes the family's class (Phi-3's fused qkv_proj and gate_up_proj back), transformers loads it and
    gives the source's logits; import-hf of it gives the same config.json model and weights."""
    import json

    import torch
    from safetensors.numpy import load_file

    family, hf_dir, out = exported
    back = tmp_path / "hf_back"
    r = gptport("export-hf", str(out), "--out", str(back))
    assert r.returncode == 0, r.stderr
    written = json.loads((back / "config.json").read_text())
    assert written["architectures"] == json.loads((hf_dir / "config.json").read_text())["architectures"]
    ids = torch.randint(0, 400, (2, 40), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(hf_model(back)(ids).logits, hf_model(hf_dir)(ids).logits)
    again = tmp_path / "m2"
    assert gptport("import-hf", str(back), "--out", str(again)).returncode == 0
    model = [json.loads((d / "config.json").read_text())["model"] for d in (out, again)]
    assert model[0] == model[1]
    first, second = load_file(str(out / "model.safetensors")), load_file(str(again / "model.safetensors"))
    assert first.keys() == second.keys() and all((first[k] == second[k]).all() for k in first)
