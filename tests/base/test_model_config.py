"""The typed ModelConfig read from JSON: config.json's "model" and a graph's gptport.config metadata.
A value of the wrong type or a shape the model cannot have is refused in one line naming the file."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import onnx
import pytest

from gptport import contract
from gptport.config import ModelConfig, model_config_from_dict
from gptport.errors import ArtifactError
from gptport.runtime import onnx_engine
from gptport.training.checkpoint import read_card

GOOD = {"vocab_size": 512, "n_ctx": 64, "d_model": 64, "n_layer": 2, "n_head": 4}
BAD = [  # (change to GOOD, the field the error names)
    ({"d_model": "64"}, "model.d_model must be an integer"),
    ({"n_layer": 2.0}, "model.n_layer must be an integer"),
    ({"vocab_size": True}, "model.vocab_size must be an integer"),
    ({"bias": 1}, "model.bias must be true or false"),
    ({"pos_encoding": 3}, "model.pos_encoding must be a string"),
    ({"ln_eps": "1e-5"}, "model.ln_eps must be a number"),
    ({"n_head": 0}, "model.n_head must be positive"),
    ({"n_head": 5}, "must be divisible by model.n_head"),
    ({"gelu": "relu"}, "model.gelu must be 'tanh' or 'exact'"),
    ({"vocab_size": None}, "model.vocab_size must be an integer"),
]


GRAPH_BAD = [*BAD[:3], *BAD[6:8]]


def _ids(cases: list[tuple[dict[str, Any], str]]) -> list[str]:
    return [json.dumps(change) for change, _ in cases]


@pytest.mark.parametrize(("change", "says"), BAD, ids=_ids(BAD))
def test_a_bad_model_config_is_refused_naming_the_file(change: dict[str, Any], says: str) -> None:
    with pytest.raises(ArtifactError) as e:
        model_config_from_dict({**GOOD, **change}, "x/config.json")
    assert str(e.value).startswith("x/config.json: invalid model config (") and says in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_vocab_size_and_not_an_object_are_refused() -> None:
    with pytest.raises(ArtifactError, match=r"^x/config.json: model has no vocab_size$"):
        model_config_from_dict({k: v for k, v in GOOD.items() if k != "vocab_size"}, "x/config.json")
    with pytest.raises(ArtifactError, match=r"^x/config.json: the model config is not a JSON object$"):
        model_config_from_dict([1, 2], "x/config.json")  # type: ignore[arg-type]


def test_a_good_config_reads_typed() -> None:
    """JSON's integers in float fields become floats (an ONNX attribute of LayerNormalization's epsilon
    must be a float); unknown keys are ignored; head_dim follows."""
    cfg = model_config_from_dict({**GOOD, "ln_eps": 0, "dropout": 0, "extra": "ignored"})
    assert cfg == ModelConfig(vocab_size=512, n_ctx=64, d_model=64, n_layer=2, n_head=4, ln_eps=0.0)
    assert isinstance(cfg.ln_eps, float) and isinstance(cfg.dropout, float) and cfg.head_dim == 16


def test_an_engine_holds_the_config_it_was_exported_from(trained_dir: Path) -> None:
    """OnnxModel.config is the typed ModelConfig of the model directory's config.json."""
    for cache in (contract.CACHE_CONCAT, contract.CACHE_STATIC):
        engine = onnx_engine.load_cpu(trained_dir / contract.onnx_file("fp32", cache))
        assert isinstance(engine.config, ModelConfig)
        assert engine.config == read_card(trained_dir).model


def _with_config(src: Path, dst: Path, config: Any) -> Path:
    """A copy of the graph at `src`, at `dst`, its gptport.config metadata replaced by `config` (JSON)."""
    proto = onnx.load(str(src))
    for prop in proto.metadata_props:
        if prop.key == contract.META_CONFIG:
            prop.value = config if isinstance(config, str) else json.dumps(config)
    onnx.save(proto, str(dst))
    return dst


@pytest.mark.parametrize(("change", "says"), GRAPH_BAD, ids=_ids(GRAPH_BAD))
def test_a_graph_with_a_bad_recorded_config_is_refused_naming_it(trained_dir: Path, tmp_path: Path,
                                                                  change: dict[str, Any], says: str) -> None:
    src = trained_dir / contract.onnx_file("fp32")
    recorded = json.loads(onnx_engine.file_metadata(src)[contract.META_CONFIG])
    graph = _with_config(src, tmp_path / "model.onnx", {**recorded, **change})
    with pytest.raises(ArtifactError) as e:
        onnx_engine.load_cpu(graph)
    assert str(e.value).startswith(f"{graph}: its {contract.META_CONFIG} metadata: invalid model config (")
    assert says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("config", ["[1, 2]", "{not json"])
def test_a_graph_whose_recorded_config_is_no_object_is_refused(trained_dir: Path, tmp_path: Path, config: str) -> None:
    graph = _with_config(trained_dir / contract.onnx_file("fp32"), tmp_path / "model.onnx", config)
    says = "is not valid JSON" if config.startswith("{") else ": the model config is not a JSON object"
    with pytest.raises(ArtifactError, match=rf"^{re.escape(str(graph))}: its {contract.META_CONFIG} metadata ?{says}"):
        onnx_engine.load_cpu(graph)


def test_generate_says_one_line(trained_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Through the CLI: exit 1, one line on stderr naming the graph, no traceback."""
    from gptport.cli.main import main

    model_dir = tmp_path / "m"
    shutil.copytree(trained_dir, model_dir)
    graph = model_dir / contract.onnx_file("fp32")
    recorded = json.loads(onnx_engine.file_metadata(graph)[contract.META_CONFIG])
    _with_config(graph, graph, {**recorded, "n_head": "4"})
    with pytest.raises(SystemExit) as e:
        main(["generate", str(model_dir), "the", "--kv-cache", "concat", "--max-new-tokens", "2"])
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.count("\n") == 1, err
    assert f"{graph}: its {contract.META_CONFIG} metadata: invalid model config (model.n_head" in err, err
