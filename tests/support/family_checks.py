"""What every family's tests check against transformers (tests/export/test_gemma2.py, test_granite.py,
test_olmo2.py): a tiny random model of the family's class saved with a tokenizer, gptport's import of it
giving transformers' logits at several lengths, through its KV cache and layer by layer, the same greedy
tokens, `gptport generate` on each exported cache giving them too, and export-hf writing the family's class
back to the same logits. Imports torch and transformers: only tests that need them call these."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gptport import tokenizer as bpe
from gptport.export.layer_reference import LayerOut, run_layers
from gptport.runtime.generate import generate
from gptport.runtime.sampling import Sampling
from gptport.training.checkpoint import load_model
from gptport.training.model import GPT  # noqa: F401 (the tests build one)
from gptport.training.torch_engine import TorchEngine
from gptport.weights import open_weights
from tests.support.cli import gptport

RTOL = 1e-4  # design record 0031's relative bound: max |ours - theirs| / max |theirs|
SHAPE = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "max_position_embeddings": 64}


def make(config_cls: str, model_cls: str, out: Path, tokenizer: Path, vocab: int, norm_mean: float,
         **config: Any) -> Path:
    """A tiny random transformers model, every weight N(0, 0.3), norms N(norm_mean, 0.3) (0 for Gemma's 1 + w),
    saved with the tokenizer's files; its end token the vocabulary's last."""
    import transformers

    settings = {**SHAPE, **config}
    made = getattr(transformers, config_cls)(vocab_size=vocab, bos_token_id=vocab - 2, eos_token_id=vocab - 1,
                                             pad_token_id=0, **settings)
    model = getattr(transformers, model_cls)(made).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (norm_mean if name.endswith("norm.weight") else 0.0))
    return saved(model, out, tokenizer, vocab)


def saved(model: Any, out: Path, tokenizer: Path, vocab: int) -> Path:
    """A transformers model saved to `out` with the tokenizer's files and a generation config whose end token is
    the vocabulary's last."""
    from transformers import GenerationConfig

    model.save_pretrained(str(out))
    for path in tokenizer.iterdir():
        if path.is_file():
            shutil.copy(path, out / path.name)
    GenerationConfig(eos_token_id=[vocab - 1]).save_pretrained(str(out))
    return out


def hf_model(hf_dir: Path) -> Any:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()


def ours(model_dir: Path) -> GPT:
    return load_model(model_dir, bpe.load(model_dir))[0]


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def check_logits(hf_dir: Path, model_dir: Path, lengths: tuple[int, ...] = (1, 7, 9, 33, 64), prefill: int = 12,
                 total: int = 30) -> None:
    """Logits within RTOL of transformers' at each length (two rows), and through the KV cache: a prefill of
    `prefill`, then one step at a time up to `total` tokens (past a window, where the model has one)."""
    model, hf = ours(model_dir), hf_model(hf_dir)
    torch.manual_seed(1)
    for length in lengths:
        ids = torch.randint(0, model.cfg.vocab_size, (2, length))
        with torch.no_grad():
            theirs, mine = hf(ids).logits, model(ids)[0]
        assert theirs.abs().max() > 1.0
        assert relative_error(mine, theirs) <= RTOL, length
    ids = torch.randint(0, model.cfg.vocab_size, (1, total))
    with torch.no_grad():
        theirs = hf(ids).logits
        steps, past = model(ids[:, :prefill])
        chunks = [steps]
        for t in range(prefill, total):
            step, past = model(ids[:, t:t + 1], attention_mask=torch.ones(1, t + 1, dtype=torch.long), past=past)
            chunks.append(step)
    assert relative_error(torch.cat(chunks, dim=1), theirs) <= RTOL


def check_layers(hf_dir: Path, model_dir: Path, length: int = 20) -> None:
    """layer_reference.run_layers (export's layer-by-layer reference) against transformers' hidden states, on two
    rows of `length` tokens."""
    weights = open_weights(model_dir)
    cfg = ours(model_dir).cfg
    ids = np.random.default_rng(2).integers(0, cfg.vocab_size, (2, length))
    with torch.no_grad():
        out = hf_model(hf_dir)(torch.from_numpy(ids), output_hidden_states=True)
    got = list(run_layers(cfg, lambda n: np.asarray(weights[n], np.float32), ids))
    layers = [o for o in got if isinstance(o, LayerOut)]
    assert len(layers) == cfg.n_layer
    for o in layers[:-1]:  # transformers' last hidden state is after the final norm
        theirs = out.hidden_states[o.index + 1].numpy()
        assert np.abs(o.hidden - theirs).max() <= RTOL * np.abs(theirs).max(), o.index
    assert relative_error(torch.from_numpy(got[-1]), out.logits) <= RTOL


def hf_greedy(hf: Any, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(n):
            ids = torch.cat([ids, hf(ids).logits[:, -1:].argmax(-1)], dim=1)
    return ids[0, len(prompt):].tolist()


def check_greedy(hf_dir: Path, model_dir: Path) -> None:
    """gptport's torch engine on a left-padded batch gives transformers' greedy tokens."""
    model, hf = ours(model_dir), hf_model(hf_dir)
    prompts = [[5, 17, 200, 3, 9, 11], [9], [44, 45, 46, 47, 48, 49, 50, 51, 52, 53]]
    got = generate(TorchEngine(model), prompts, 14, Sampling(), eot_id=-1)
    for prompt, row in zip(prompts, got, strict=True):
        assert row.new_ids == hf_greedy(hf, prompt, 14)


def check_generate(hf_dir: Path, model_dir: Path, prompt: str, cache: str, new: int = 16) -> None:
    """`gptport generate` on the exported `cache` graph gives transformers' greedy tokens (until an end id)."""
    tok = bpe.load(model_dir)
    cfg = load_model(model_dir, tok)[1].model
    ids = ([cfg.bos_id] if cfg.add_bos and cfg.bos_id is not None else []) + tok.encode(prompt)
    want = hf_greedy(hf_model(hf_dir), ids, new)
    assert len(set(want)) > new // 2  # greedy text that does not repeat one token
    r = gptport("generate", str(model_dir), prompt, "--max-new-tokens", str(new), "--json", "--kv-cache", cache)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["kv_cache"] == cache and got["prompt_tokens"] == len(ids)
    out = got["token_ids"]
    assert out == want[:len(out)] and (len(out) == new or want[len(out)] in cfg.eos_ids)


def check_export_hf(hf_dir: Path, model_dir: Path, out: Path, architecture: str) -> dict[str, Any]:
    """export-hf writes `architecture`, which transformers loads to the source's logits; its config.json."""
    r = gptport("export-hf", str(model_dir), "--out", str(out))
    assert r.returncode == 0, r.stderr
    written = json.loads((out / "config.json").read_text())
    assert written["architectures"] == [architecture]
    back, theirs = hf_model(out), hf_model(hf_dir)
    ids = torch.from_numpy(np.random.default_rng(3).integers(0, written["vocab_size"], (2, 40)))
    with torch.no_grad():
        assert relative_error(back(ids).logits, theirs(ids).logits) <= 1e-6
    return written
