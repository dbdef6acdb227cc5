"""Sliding windows of the Llama family, real (a mask on the window layers, n_ctx max_position_embeddings, never
a context cut to the window): a tiny random Mistral (a window of 8 on every layer), Qwen2 (use_sliding_window,
a window of 8 from max_window_layers on, full layers before it), Phi-3 (8 on every layer, rope over half of each
head) and SmolLM3 (use_sliding_window: 8 on its layers without rope) built with transformers, weights drawn wide.
gptport's torch model gives transformers' logits inside and past the window, through its KV cache, and the same
greedy tokens past it; a model without the window, or with one of 7 or 9, fails the comparison; export-hf writes
the class that computes it (transformers' logits past the window, read back to the same model); `gptport export`
of the Qwen2, the Phi-3 and the SmolLM3 passes every gate and `generate` on each cache gives transformers' greedy
tokens past the window; export-gguf refuses the window by name (llama.cpp's llama, qwen2, phi3 and smollm3 attend
to every position)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gptport import tokenizer as bpe
from gptport.arch import family
from gptport.arch.base import Specials
from gptport.export.hf import import_hf
from gptport.runtime.generate import generate
from gptport.runtime.sampling import Sampling
from gptport.training.checkpoint import load_model
from gptport.training.model import GPT
from gptport.training.torch_engine import TorchEngine
from tests.export import test_hf_llama as released
from tests.export.test_hf_llama import _vocab, _widen, hf_tokenizer_dir, relative_error  # noqa: F401
from tests.support.cli import assert_one_line_error, gptport
from tests.support.family_checks import check_logits, hf_model, saved

transformers = pytest.importorskip("transformers", reason="transformers is a dev dependency (pyproject's [dev])")

RTOL = 1e-4
WINDOW = 8
SHAPE = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 64, "tie_word_embeddings": False, "sliding_window": WINDOW}
CASES: dict[str, tuple[str, str, dict[str, Any], tuple[int, ...]]] = {  # config, class, keys, the window layers
    "mistral": ("MistralConfig", "MistralForCausalLM", {"num_hidden_layers": 2}, (0, 1)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"num_hidden_layers": 3, "use_sliding_window": True,
                                                  "max_window_layers": 1, "rope_theta": 1e6}, (1, 2)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"num_hidden_layers": 2, "pad_token_id": None, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}}, (0, 1)),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {"num_hidden_layers": 4, "pad_token_id": None,
                                                        "use_sliding_window": True, "no_rope_layers": [1, 0, 1, 0]},
                (1, 3)),  # SmolLM3Config's layer_types: the layers without rope slide
}
PROMPT = "ka to ri 12 sa ne mo"  # 15 tokens with the begin token: past the window already
NEW = 16


def make_windowed(case: str, out: Path, tokenizer: Path, vocab: int) -> Path:
    """A tiny random transformers model of `case` with a window of 8, saved with the tokenizer's files."""
    config_cls, model_cls, extra, _ = CASES[case]
    config = getattr(transformers, config_cls)(vocab_size=vocab, bos_token_id=vocab - 2, eos_token_id=vocab - 1,
                                               **SHAPE, **extra)
    model = getattr(transformers, model_cls)(config).eval()
    _widen(model)
    return saved(model, out, tokenizer, vocab)


@pytest.fixture(scope="module", params=list(CASES))
def windowed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
             hf_tokenizer_dir: Path) -> tuple[str, Path, Path]:  # noqa: F811
    """(the case, the transformers directory, gptport's import of it)."""
    root = tmp_path_factory.mktemp(f"window_{request.param}")
    hf_dir = make_windowed(request.param, root / "hf", hf_tokenizer_dir, _vocab(hf_tokenizer_dir))
    import_hf(hf_dir, root / "m")
    return request.param, hf_dir, root / "m"


def _ours(model_dir: Path) -> GPT:
    return load_model(model_dir, bpe.load(model_dir))[0]


def _greedy(hf: Any, ids: list[int], n: int) -> list[int]:
    t = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            t = torch.cat([t, hf(t).logits[:, -1:].argmax(-1)], dim=1)
    return t[0, len(ids):].tolist()


def test_the_window_is_a_mask_on_its_layers_not_a_shorter_context(windowed: tuple[str, Path, Path]) -> None:
    case, _, model_dir = windowed
    cfg = _ours(model_dir).cfg
    assert (cfg.n_ctx, cfg.sliding_window, cfg.window_layers) == (64, WINDOW, CASES[case][3])


def test_logits_equal_transformers_inside_and_past_the_window(windowed: tuple[str, Path, Path]) -> None:
    check_logits(*windowed[1:], (1, WINDOW, WINDOW + 1, 33, 64), prefill=5, total=40)  # cached steps past the window


def test_greedy_tokens_past_the_window_equal_transformers(windowed: tuple[str, Path, Path]) -> None:
    _, hf_dir, model_dir = windowed
    model, hf = _ours(model_dir), hf_model(hf_dir)
    prompts = [[5, 17, 200, 3, 9, 11], [9], [44, 45, 46, 47, 48, 49, 50, 51, 52, 53]]  # left-padded batch
    got = generate(TorchEngine(model), prompts, 14, Sampling(), eot_id=-1)
    for prompt, row in zip(prompts, got, strict=True):
        assert row.new_ids == _greedy(hf, prompt, 14)


def test_the_comparison_fails_without_the_window(windowed: tuple[str, Path, Path]) -> None:
    _, hf_dir, model_dir = windowed
    model = _ours(model_dir)
    for window in (0, WINDOW - 1, WINDOW + 1):
        wrong = GPT(replace(model.cfg, sliding_window=window))
        wrong.load_state_dict(model.state_dict())
        ids = torch.randint(0, model.cfg.vocab_size, (1, 40))
        with torch.no_grad():
            assert relative_error(wrong.eval()(ids)[0], hf_model(hf_dir)(ids).logits) > 100 * RTOL


def test_export_hf_writes_the_window_transformers_computes(windowed: tuple[str, Path, Path], tmp_path: Path) -> None:
    case, hf_dir, model_dir = windowed
    r = gptport("export-hf", str(model_dir), "--out", str(tmp_path / "back"))
    assert r.returncode == 0, r.stderr
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    assert written["architectures"] == [CASES[case][1]] and written["sliding_window"] == WINDOW
    back, theirs = hf_model(tmp_path / "back"), hf_model(hf_dir)
    ids = torch.from_numpy(np.random.default_rng(3).integers(0, written["vocab_size"], (2, 40)))
    with torch.no_grad():
        assert relative_error(back(ids).logits, theirs(ids).logits) <= 1e-6
    r = gptport("import-hf", str(tmp_path / "back"), "--out", str(tmp_path / "again"))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "again" / "config.json").read_text())["model"] == json.loads(
        (model_dir / "config.json").read_text())["model"]


def test_export_gguf_refuses_the_window_by_name(windowed: tuple[str, Path, Path], tmp_path: Path) -> None:
    _, _, model_dir = windowed
    out = tmp_path / "m.gguf"
    assert_one_line_error(gptport("export-gguf", str(model_dir), "--out", str(out)), 1,
                          f"a sliding window of {WINDOW}", "to every position")
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("case", ["qwen2", "phi3", "smollm3"])
def test_export_and_generate_past_the_window(case: str, tmp_path: Path, hf_tokenizer_dir: Path) -> None:  # noqa: F811
    """Qwen2's and SmolLM3's mixed layers, Phi-3's partial rotary, through every gate; `generate` on both caches
    gives transformers' greedy tokens."""
    hf_dir = make_windowed(case, tmp_path / "hf", hf_tokenizer_dir, _vocab(hf_tokenizer_dir))
    out = tmp_path / "m"
    for args in (("import-hf", str(hf_dir), "--out", str(out)), ("export", str(out))):
        r = gptport(*args)
        assert r.returncode == 0, r.stderr
    tok = bpe.load(out)
    cfg = load_model(out, tok)[1].model
    prompt = [cfg.bos_id, *tok.encode(PROMPT)]
    assert len(prompt) > WINDOW
    want = _greedy(hf_model(hf_dir), prompt, NEW)
    assert len(set(want)) > NEW // 2  # greedy text that does not repeat one token
    for cache in ("concat", "static"):
        r = gptport("generate", str(out), PROMPT, "--max-new-tokens", str(NEW), "--json", "--kv-cache", cache)
        assert r.returncode == 0, r.stderr
        ids = json.loads(r.stdout)["token_ids"]
        assert ids == want[:len(ids)] and (len(ids) == NEW or want[len(ids)] in cfg.eos_ids), cache


def test_released_configs_keep_their_window() -> None:
    """Mistral 7B v0.1: 4096 on every layer of a 32k context; Qwen2.5 with use_sliding_window (the window from
    max_window_layers on); one that covers the whole context is none."""
    tokens, where = Specials(None, False, (2,), 2), Path("config.json")
    mistral = family("mistral").model_config(released.MISTRAL_V01, 32000, tokens, where)
    assert (mistral.n_ctx, mistral.sliding_window, mistral.window_layers) == (32768, 4096, tuple(range(32)))
    qwen = family("qwen2").model_config({**released.QWEN25, "use_sliding_window": True, "sliding_window": 4096,
                                         "max_window_layers": 21}, 151665, tokens, where)
    assert (qwen.n_ctx, qwen.sliding_window, qwen.window_layers) == (32768, 4096, (21, 22, 23))
    whole = family("qwen2").model_config({**released.QWEN25, "use_sliding_window": True}, 151665, tokens, where)
    assert (whole.sliding_window, whole.window_layers) == (0, ())  # 32768 of 32768: every key seen
    with pytest.raises(Exception, match="max_window_layers must be 0 or more, not -1"):
        family("qwen2").model_config({**released.QWEN25, "use_sliding_window": True, "sliding_window": 64,
                                      "max_window_layers": -1}, 151665, tokens, where)
