"""Interop: transformers loads gptport's tokenizer and GPT-2 exports; gptport imports transformers' GPT-2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from gptport import tokenizer as bpe
from gptport.export.genai import GENAI_FILE
from gptport.export.tolerance import Tolerance, compare
from gptport.training.checkpoint import load_model
from tests.conftest import build_model_dir
from tests.support.cli import assert_one_line_error, gptport

TEXTS = ["ka to ri 日本 🙂", "  spaces  and\ttabs\n", "<|endoftext|>after"]


def test_autotokenizer_loads_the_model_dir(trained_dir: Path) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(trained_dir))
    tok = bpe.load(trained_dir)
    assert hf.eos_token == "<|endoftext|>" and hf.eos_token_id == tok.eot_id
    for text in TEXTS:
        ids = hf(text, add_special_tokens=False)["input_ids"]
        assert ids == tok.encode(text)
        assert hf.decode(ids) == text


def test_export_writes_genai_config(trained_dir: Path) -> None:
    genai = json.loads((trained_dir / GENAI_FILE).read_text())
    decoder = genai["model"]["decoder"]
    assert decoder["filename"] == "model.onnx" and (trained_dir / decoder["filename"]).exists()
    assert decoder["inputs"]["past_key_names"] % 0 == "past_key_values.0.key"
    assert genai["model"]["eos_token_id"] == bpe.load(trained_dir).eot_id


def hf_logits(hf_dir: Path, ids: torch.Tensor) -> torch.Tensor:
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(str(hf_dir)).eval()
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("tied", [True, False])
def test_export_hf_gives_the_same_logits(tmp_path: Path, tokenizer_dir: Path, corpus_file: Path, tied: bool) -> None:
    d = build_model_dir(tmp_path / "m", tokenizer_dir, corpus_file, steps=20, tie_embeddings=tied)
    r = gptport("export-hf", str(d), "--out", str(tmp_path / "hf"))
    assert r.returncode == 0, r.stderr
    ids = torch.randint(0, 512, (2, 20))
    ours, _ = load_model(d, bpe.load(d))
    with torch.no_grad():
        want = ours(ids)[0]
    check = compare("logits", hf_logits(tmp_path / "hf", ids).numpy(), want.numpy(), Tolerance())
    assert check.ok, check.describe()


def test_export_hf_names_the_mismatch(tmp_path: Path, tokenizer_dir: Path, corpus_file: Path) -> None:
    d = build_model_dir(tmp_path / "m", tokenizer_dir, corpus_file, steps=0, pos_encoding="sinusoidal",
                        gelu="exact")
    assert_one_line_error(gptport("export-hf", str(d), "--out", str(tmp_path / "hf")), 1,
                           "not a GPT-2 architecture", "pos_encoding is 'sinusoidal'", "gelu is 'exact'")
    assert not (tmp_path / "hf").exists()


@pytest.fixture(scope="module")
def hf_gpt2(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    """A small random transformers GPT-2, saved locally with a tokenizer (no network)."""
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    out = tmp_path_factory.mktemp("hf_gpt2")
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=520, n_positions=64, n_embd=48, n_layer=2, n_head=4,
                        bos_token_id=0, eos_token_id=0)  # vocab padded past the tokenizer's 512
    GPT2LMHeadModel(config).save_pretrained(str(out), safe_serialization=True)
    GPT2TokenizerFast(tokenizer_file=str(tokenizer_dir / "tokenizer.json"), eos_token="<|endoftext|>").save_pretrained(
        str(out))
    return out


def test_import_hf_matches_transformers(hf_gpt2: Path, tmp_path: Path) -> None:
    out = tmp_path / "imported"
    r = gptport("import-hf", str(hf_gpt2), "--out", str(out))
    assert r.returncode == 0, r.stderr
    ids = torch.randint(0, 512, (2, 30))
    ours, card = load_model(out, bpe.load(out))
    with torch.no_grad():
        mine = ours(ids)[0]
    assert card.model.vocab_size == 512 and card.model.n_ctx == 64
    check = compare("logits", mine.numpy(), hf_logits(hf_gpt2, ids)[..., :512].numpy(), Tolerance())
    assert check.ok, check.describe()
    r = gptport("export", str(out), "--precision", "fp32")
    assert r.returncode == 0, r.stderr
    r = gptport("generate", str(out), "ka to", "--max-new-tokens", "5", "--json")
    assert r.returncode == 0 and len(json.loads(r.stdout)["token_ids"]) == 5


def test_import_hf_from_vocab_and_merges(hf_gpt2: Path, tmp_path: Path, tokenizer_dir: Path) -> None:
    src = tmp_path / "two_files"
    shutil.copytree(hf_gpt2, src, ignore=shutil.ignore_patterns("tokenizer.json"))
    for name in ("vocab.json", "merges.txt"):  # GPT-2's own two-file format
        shutil.copy(tokenizer_dir / name, src / name)
    r = gptport("import-hf", str(src), "--out", str(tmp_path / "m"))
    assert r.returncode == 0, r.stderr
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(hf_gpt2))
    for text in TEXTS:
        assert bpe.load(tmp_path / "m").encode(text) == hf(text, add_special_tokens=False)["input_ids"]


def test_import_hf_bad_input(hf_gpt2: Path, tmp_path: Path) -> None:
    other = tmp_path / "llama"
    shutil.copytree(hf_gpt2, other)
    cfg = json.loads((other / "config.json").read_text())
    neox = {**cfg, "model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"]}
    (other / "config.json").write_text(json.dumps(neox))
    assert_one_line_error(gptport("import-hf", str(other), "--out", str(tmp_path / "o1")), 1, "GPTNeoXForCausalLM",
                          "is not one gptport imports")
    nofile = tmp_path / "noweights"
    shutil.copytree(hf_gpt2, nofile, ignore=shutil.ignore_patterns("model.safetensors"))
    (nofile / "pytorch_model.bin").write_bytes(b"pickle")
    assert_one_line_error(gptport("import-hf", str(nofile), "--out", str(tmp_path / "o2")), 1,
                           "no model.safetensors", "pickle")
    small = tmp_path / "small_vocab"
    shutil.copytree(hf_gpt2, small)
    (small / "config.json").write_text(json.dumps({**cfg, "vocab_size": 300}))
    assert_one_line_error(gptport("import-hf", str(small), "--out", str(tmp_path / "o3")), 1, "does not fit")
    for name in ("o1", "o2", "o3"):
        assert not (tmp_path / name).exists() or not any((tmp_path / name).iterdir())
