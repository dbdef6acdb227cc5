"""What the Phi-3 and SmolLM3 tests share: a tiny random transformers model of a config (weights drawn wide, as
tests/export/test_hf_llama.py draws them), imported; transformers' logits through its own cache, step by step, and
its greedy tokens from generate() (both with the cache: LongRoPE's choice of factors is made per call)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from gptport import tokenizer as bpe
from gptport.export.hf import import_hf
from gptport.training.checkpoint import load_model
from gptport.training.model import GPT
from tests.export.test_hf_llama import FLOAT32, _vocab, _widen

RTOL = 1e-4


def make(config_cls: str, model_cls: str, out: Path, tokenizer: Path, **config: Any) -> Path:
    """A tiny random `model_cls` of `config_cls`(**config), saved with the tokenizer's files."""
    import transformers

    vocab = _vocab(tokenizer)
    cfg = getattr(transformers, config_cls)(vocab_size=vocab, bos_token_id=vocab - 2, eos_token_id=vocab - 1,
                                            pad_token_id=None, **config)
    model = getattr(transformers, model_cls)(cfg).eval()
    _widen(model)
    model.save_pretrained(str(out))
    for path in tokenizer.iterdir():
        if path.is_file():
            shutil.copy(path, out / path.name)
    return out


def imported(hf_dir: Path, out: Path) -> GPT:
    import_hf(hf_dir, out)
    return load_model(out, bpe.load(out))[0]


def hf_model(hf_dir: Path) -> Any:
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), **FLOAT32).eval()


def relative_error(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    return float((ours - theirs).abs().max() / theirs.abs().max())


def cached_logits(model: Any, ids: torch.Tensor, prefill: int, hf: bool) -> torch.Tensor:
    """Logits of `ids` (1, T): a prefill of `prefill` tokens, then one token a step through the model's cache."""
    with torch.no_grad():
        if hf:
            out = model(ids[:, :prefill], use_cache=True)
            chunks, past = [out.logits], out.past_key_values
            for t in range(prefill, ids.shape[1]):
                out = model(ids[:, t:t + 1], past_key_values=past, use_cache=True)
                chunks.append(out.logits)
                past = out.past_key_values
            return torch.cat(chunks, dim=1)
        logits, past = model(ids[:, :prefill])
        chunks = [logits]
        for t in range(prefill, ids.shape[1]):
            step, past = model(ids[:, t:t + 1], attention_mask=torch.ones(1, t + 1, dtype=torch.long), past=past)
            chunks.append(step)
        return torch.cat(chunks, dim=1)


def hf_greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    """transformers' generate(), greedy, `n` new tokens, no end token."""
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None,
                              pad_token_id=0)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), generation_config=config)
    return out[0, len(prompt):].tolist()
