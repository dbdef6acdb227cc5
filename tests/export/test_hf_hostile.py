"""Hostile Hugging Face directories for import-hf: an index naming shards that are not there (or outside the
directory), tensors the shards do not hold, a hostile shard, a config.json that is not JSON or whose sizes are
absurd (refused naming its own key, before anything is sized by it); each refused in one line naming the file,
nothing written. More bad configs: tests/export/test_hf_llama.py's BAD."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gptport.arch.gpt2 import GPT2_FAMILY
from gptport.errors import ArtifactError, GptportError, InputError
from gptport.export import hf, hf_files
from gptport.export.hf_files import INDEX
from tests.export.test_hf_llama import _vocab, hf_tokenizer_dir, make_hf  # noqa: F401 (a fixture)
from tests.support import safetensors_fuzz
from tests.support.cli import assert_one_line_error, gptport

GPT2 = {"model_type": "gpt2", "vocab_size": 300, "n_positions": 64, "n_embd": 64, "n_layer": 2, "n_head": 4}


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory, hf_tokenizer_dir: Path) -> Path:  # noqa: F811
    """A tiny Llama saved by transformers in shards, with model.safetensors.index.json."""
    out = make_hf("llama", tmp_path_factory.mktemp("sharded") / "hf", hf_tokenizer_dir, _vocab(hf_tokenizer_dir),
                  max_shard_size="100KB")
    assert (out / INDEX).is_file() and len(list(out.glob("*.safetensors"))) >= 2
    return out


def copy_of(sharded: Path, tmp_path: Path) -> Path:
    hf_dir = tmp_path / "hf"
    shutil.copytree(sharded, hf_dir)
    return hf_dir


def with_index(hf_dir: Path, change: Callable[[dict[str, str]], None]) -> None:
    index = json.loads((hf_dir / INDEX).read_text())
    change(index["weight_map"])
    (hf_dir / INDEX).write_text(json.dumps(index))


def _first(wm: dict[str, str]) -> str:
    """The first tensor of a shard that holds others too (the index still names that shard without it)."""
    return next(k for k in sorted(wm) if list(wm.values()).count(wm[k]) > 1)


INDEX_CASES: list[tuple[str, Callable[[dict[str, str]], None], str]] = [
    ("a missing shard", lambda wm: wm.update({_first(wm): "model-00009-of-00009.safetensors"}),
     "names shard model-00009-of-00009.safetensors, which is not in"),
    ("a shard up the tree", lambda wm: wm.update({_first(wm): "../secret.safetensors"}),
     "names shard ../secret.safetensors, which is not in"),
    ("an absolute shard", lambda wm: wm.update({_first(wm): "/etc/passwd"}),
     "names shard /etc/passwd, which is not in"),
    ("a shard that is no name", lambda wm: wm.update({_first(wm): 7}), "is 7, not a file name"),
    ("a tensor no shard holds", lambda wm: wm.update({"model.layers.9.mlp.up_proj.weight": wm[_first(wm)]}),
     "names tensor model.layers.9.mlp.up_proj.weight in model-0000"),
    ("a tensor the index leaves out", lambda wm: wm.pop(_first(wm)),
     "which model.safetensors.index.json does not name"),
]


@pytest.mark.parametrize(("case", "change", "says"), INDEX_CASES, ids=[c[0] for c in INDEX_CASES])
def test_an_index_that_lies_is_refused(case: str, change: Callable[[dict[str, str]], None], says: str, sharded: Path,
                                       tmp_path: Path) -> None:
    hf_dir = copy_of(sharded, tmp_path)
    (tmp_path / "secret.safetensors").write_bytes(safetensors_fuzz.seed_bytes())
    with_index(hf_dir, change)
    with pytest.raises(ArtifactError) as e:
        hf_files.read_headers(hf_dir)
    assert says in str(e.value) and "\n" not in str(e.value), (case, str(e.value))
    with pytest.raises(ArtifactError) as e:  # import-hf reads the headers so, before anything is written
        hf.import_hf(hf_dir, tmp_path / "out")
    assert says in str(e.value) and not (tmp_path / "out").exists()


def test_import_hf_refuses_a_hostile_shard_in_one_line_and_writes_nothing(sharded: Path, tmp_path: Path) -> None:
    """Through the CLI: exit 1, one stderr line naming the shard and what is wrong, no traceback, no --out."""
    hf_dir = copy_of(sharded, tmp_path)
    shard = sorted(hf_dir.glob("*.safetensors"))[-1]
    header, body = safetensors_fuzz.split(shard.read_bytes())
    name = sorted(k for k in header if k != "__metadata__")[-1]
    header[name]["data_offsets"] = [0, header[name]["data_offsets"][1] - header[name]["data_offsets"][0]]
    shard.write_bytes(safetensors_fuzz.joined(json.dumps(header).encode(), body))
    out = tmp_path / "out"
    r = gptport("import-hf", str(hf_dir), "--out", str(out))
    assert_one_line_error(r, 1, str(shard), "overlap")
    assert len(r.stderr.strip().splitlines()) == 1
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_import_hf_refuses_a_config_that_is_not_json(sharded: Path, tmp_path: Path) -> None:
    hf_dir = copy_of(sharded, tmp_path)
    (hf_dir / "config.json").write_text('{"model_type": "llama",')
    out = tmp_path / "out"
    r = gptport("import-hf", str(hf_dir), "--out", str(out))
    assert_one_line_error(r, 1, str(hf_dir / "config.json"), "not valid JSON (Expecting property name")
    assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()


LLAMA_CHANGES: list[tuple[str, dict[str, Any], str]] = [  # one key of a real config.json, what refusing it says
    ("vocab-2-40", {"vocab_size": 2**40}, "vocab_size must be at most 16,777,216, not 1,099,511,627,776"),
    ("vocab-float", {"vocab_size": 3e5}, "vocab_size must be an integer, not 300000.0"),
    ("vocab-bool", {"vocab_size": True}, "vocab_size must be an integer, not True"),
    ("zero-heads", {"num_attention_heads": 0}, "num_attention_heads must be positive, not 0"),
    ("zero-kv-heads", {"num_key_value_heads": 0}, "num_key_value_heads must be positive, not 0"),
    ("zero-head-dim", {"head_dim": 0}, "head_dim must be positive, not 0"),
    ("kv-not-dividing", {"num_key_value_heads": 3},
     "num_attention_heads (4) must be a multiple of num_key_value_heads (3)"),
    ("layers-1e9", {"num_hidden_layers": 10**9}, "num_hidden_layers must be at most 4,096, not 1,000,000,000"),
    ("context-2-40", {"max_position_embeddings": 2**40}, "max_position_embeddings must be at most 16,777,216"),
    ("negative-width", {"intermediate_size": -96}, "intermediate_size must be positive, not -96"),
    ("bool-layers", {"num_hidden_layers": True}, "num_hidden_layers must be an integer, not True"),
    ("bool-eps", {"rms_norm_eps": False}, "rms_norm_eps must be a number, not False"),
]


@pytest.mark.parametrize(("case", "change", "says"), LLAMA_CHANGES, ids=[c[0] for c in LLAMA_CHANGES])
def test_an_absurd_config_is_refused_by_its_own_key(case: str, change: dict[str, Any], says: str, sharded: Path,
                                                    tmp_path: Path) -> None:
    """import-hf itself: refused before a weight is read or a model built (nothing sized by the absurd value),
    named by config.json's key, not gptport's (model.n_layer); nothing written."""
    hf_dir = copy_of(sharded, tmp_path)
    config = json.loads((hf_dir / "config.json").read_text())
    (hf_dir / "config.json").write_text(json.dumps({**config, **change}))
    out = tmp_path / "out"
    with pytest.raises(GptportError) as e:
        hf.import_hf(hf_dir, out)
    message = str(e.value)
    assert message.startswith(f"{hf_dir / 'config.json'}: ") and says in message, (case, message)
    assert "model." not in message and "\n" not in message and not out.exists()


GPT2_CHANGES: list[tuple[str, dict[str, Any], str]] = [
    ("heads-not-dividing", {"n_embd": 66}, "n_embd (66) must be divisible by n_head (4)"),
    ("layers-1e9", {"n_layer": 10**9}, "n_layer must be at most 4,096, not 1,000,000,000"),
    ("float-width", {"n_embd": 64.0}, "n_embd must be an integer, not 64.0"),
    ("zero-inner", {"n_inner": 0}, "n_inner must be positive, not 0"),
    ("infinite-eps", {"layer_norm_epsilon": 1e400}, "layer_norm_epsilon must be a finite number >= 0, not inf"),
]


@pytest.mark.parametrize(("case", "change", "says"), GPT2_CHANGES, ids=[c[0] for c in GPT2_CHANGES])
def test_an_absurd_gpt2_config_is_refused_by_its_own_key(case: str, change: dict[str, Any], says: str) -> None:
    """GPT-2's config.json keys mapped to a ModelConfig (import-hf's GPT-2 path), ModelConfig's refusals said
    with GPT-2's key names."""
    where = Path("hf") / "config.json"
    assert GPT2_FAMILY.model_config(GPT2, 300, None, where).d_model == 64
    with pytest.raises(InputError) as e:
        GPT2_FAMILY.model_config({**GPT2, **change}, 300, None, where)
    assert str(e.value).startswith(f"{where}: ") and says in str(e.value) and "model." not in str(e.value), case
