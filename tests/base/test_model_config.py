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
from gptport.config import ModelConfig, model_config_from_dict, model_config_to_dict
from gptport.errors import ArtifactError, UsageError
from gptport.preset import Preset, apply_overrides
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


# a graph's recorded config spells out n_kv_head (4) and head_dim (16), so 5 heads break the grouping first
GRAPH_BAD = [*BAD[:3], BAD[6], ({"n_head": 5}, "model.n_head (5) must be a multiple of model.n_kv_head (4)")]


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
    must be a float); head_dim, n_kv_head and d_ff follow from the shape when not given."""
    cfg = model_config_from_dict({**GOOD, "ln_eps": 0, "dropout": 0, "rope_theta": 500000})
    assert cfg == ModelConfig(vocab_size=512, n_ctx=64, d_model=64, n_layer=2, n_head=4, ln_eps=0.0,
                              rope_theta=500000.0)
    assert isinstance(cfg.ln_eps, float) and isinstance(cfg.dropout, float) and isinstance(cfg.rope_theta, float)
    assert (cfg.head_dim, cfg.n_kv_head, cfg.d_ff) == (16, 4, 256)


def test_an_unknown_key_is_refused_naming_it_and_the_file() -> None:
    """Format 1 dropped keys it did not know; a key gptport does not know now stops the read."""
    with pytest.raises(ArtifactError) as e:
        model_config_from_dict({**GOOD, "rope_thetta": 10000.0}, "x/config.json")
    assert str(e.value).startswith("x/config.json: unknown model config key 'rope_thetta'")
    assert "\n" not in str(e.value)


FORMAT_1 = {"vocab_size": 512, "n_ctx": 64, "d_model": 64, "n_layer": 2, "n_head": 4, "d_ff": 256, "dropout": 0.0,
            "bias": True, "pos_encoding": "learned", "tie_embeddings": True, "ln_eps": 1e-05, "gelu": "tanh"}


def test_a_format_1_config_reads_as_gpt2_with_every_new_key_at_its_default() -> None:
    """config.json's "model" as gptport wrote it before the Llama family's keys: the same model."""
    cfg = model_config_from_dict(FORMAT_1)
    assert cfg == ModelConfig(vocab_size=512, n_ctx=64, d_model=64, n_layer=2, n_head=4)
    assert (cfg.n_kv_head, cfg.head_dim, cfg.norm, cfg.mlp, cfg.pos_encoding) == (4, 16, "layernorm", "gelu", "learned")
    assert (cfg.has_qkv_bias, cfg.has_out_bias, cfg.has_mlp_bias, cfg.qk_norm) == (True, True, True, False)
    assert (cfg.bos_id, cfg.add_bos, cfg.eos_ids) == (None, False, ())
    assert model_config_from_dict({**FORMAT_1, "bias": False}).has_qkv_bias is False


LLAMA = {**GOOD, "n_kv_head": 2, "norm": "rmsnorm", "mlp": "swiglu", "pos_encoding": "rope", "bias": False,
         "tie_embeddings": False, "rope_scaling": "llama3", "rope_factor": 8.0, "rope_theta": 500000.0,
         "bos_id": 1, "add_bos": True, "eos_ids": [3, 2, 3]}


def test_the_llama_keys_round_trip_through_json() -> None:
    cfg = model_config_from_dict(LLAMA)
    assert cfg.eos_ids == (2, 3) and cfg.d_ff == 192 and cfg.kv_width == 32  # a set; 8/3 d_model, to 64
    again = model_config_from_dict(json.loads(json.dumps(model_config_to_dict(cfg))))
    assert again == cfg and model_config_to_dict(again)["eos_ids"] == [2, 3]


LLAMA_BAD = [
    ({"n_kv_head": 3}, "model.n_head (4) must be a multiple of model.n_kv_head (3)"),
    ({"norm": "batchnorm"}, "model.norm must be 'layernorm' or 'rmsnorm'"),
    ({"mlp": "reglu"}, "model.mlp must be 'gelu', 'swiglu' or 'geglu'"),
    ({"rope_scaling": "yarn"}, "model.rope_scaling must be 'none', 'linear', 'llama3' or 'longrope'"),
    ({"rope_high_freq_factor": 1.0}, "model.rope_high_freq_factor (1.0) must exceed"),
    ({"head_dim": 15}, "model.head_dim must be even for rope positions"),
    ({"eos_ids": [2, 512]}, "model.eos_ids: token 512 is outside the vocabulary"),
    ({"eos_ids": [2, "3"]}, "model.eos_ids must be a list of integers"),
    ({"bos_id": None}, "model.add_bos is true but model.bos_id is not set"),
    ({"qk_norm": "yes"}, "model.qk_norm must be true or false"),
]


@pytest.mark.parametrize(("change", "says"), LLAMA_BAD, ids=_ids(LLAMA_BAD))
def test_a_bad_llama_config_is_refused_naming_the_field(change: dict[str, Any], says: str) -> None:
    with pytest.raises(ArtifactError) as e:
        model_config_from_dict({**LLAMA, **change}, "x/config.json")
    assert str(e.value).startswith("x/config.json: invalid model config (") and says in str(e.value)


def test_head_dim_may_make_the_heads_wider_than_d_model() -> None:
    """Qwen3's shapes: 4 heads of 32 over d_model 64 (n_head * head_dim != d_model)."""
    cfg = model_config_from_dict({**LLAMA, "head_dim": 32, "qk_norm": True})
    assert (cfg.q_width, cfg.kv_width) == (128, 64)


def test_set_parses_each_new_key_by_its_type() -> None:
    preset = apply_overrides(Preset("x"), ["n_kv_head=2", "model.norm=rmsnorm", "eos_ids=7,3", "bos_id=none",
                                           "add_bos=false", "rope_theta=5e5", "qk_norm=1"])
    assert preset.model == {"n_kv_head": 2, "norm": "rmsnorm", "eos_ids": (7, 3), "bos_id": None, "add_bos": False,
                            "rope_theta": 500000.0, "qk_norm": True}
    for bad, says in (("eos_ids=1,x", "expected comma-separated integers"), ("bos_id=x", "an integer or none")):
        with pytest.raises(UsageError, match=says):
            apply_overrides(Preset("x"), [bad])


def test_config_json_of_a_newer_format_is_refused(tmp_path: Path) -> None:
    card = {"format": "gptport-model", "format_version": 4, "model": GOOD, "tokenizer_sha256": "0", "eot_id": 0}
    (tmp_path / "config.json").write_text(json.dumps(card))
    with pytest.raises(ArtifactError, match=r"config.json: format_version 4 is not one this gptport reads \(1, 2, 3\)"):
        read_card(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**card, "format_version": 1, "model": FORMAT_1}))
    assert read_card(tmp_path).model == model_config_from_dict(FORMAT_1)


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
