"""Tiny random transformers models of the Llama family (Llama, Qwen2, Qwen3) saved as the Hub ships them, with a
tokenizer built locally (tests/support/hf_tokenizers.py) and a generation_config.json whose end tokens include
one the model reaches by itself under greedy decoding, so that stopping on any end token is seen at work. The
weights are drawn wide (std 0.3) so that the logits are far from uniform. Imports transformers and torch: only
tests that need them call these."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

SHAPE = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
         "max_position_embeddings": 64}
ARCHS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"num_key_value_heads": 2, "rope_theta": 500000.0,
                                                  "tie_word_embeddings": False}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"num_key_value_heads": 1, "rope_theta": 1e6,
                                                  "tie_word_embeddings": True}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"num_key_value_heads": 2, "head_dim": 32,
                                                  "tie_word_embeddings": False}),
}
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' + '\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA2 = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}"
          "{{ '[INST] ' + m['content'] + ' [/INST]' }}{% else %}{{ ' ' + m['content'] + eos_token }}{% endif %}"
          "{% endfor %}")


@dataclass
class HfModel:
    """A saved transformers directory and what the tests compare against."""

    path: Path
    model: Any  # the transformers model, float32, eval mode
    tokenizer: Any  # its PreTrainedTokenizerFast
    stop_id: int  # the end token of generation_config.json that greedy decoding of `prompt` reaches
    prompt: str


def tokenizer(kind: str, tokenizer_dir: Path, corpus: Path) -> Any:
    """A PreTrainedTokenizerFast: "byte-level" (Llama 3's kind: begin token added by its post-processor),
    "chatml" (Qwen's: no begin token, <|im_end|> ends a turn) or "metaspace" (Llama 2's: byte fallback, <s>)."""
    from transformers import PreTrainedTokenizerFast

    from tests.support import hf_tokenizers

    if kind == "metaspace":
        backend = hf_tokenizers.metaspace(corpus)
        fast = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
        fast.chat_template = LLAMA2
    elif kind == "chatml":
        backend = hf_tokenizers.byte_level(tokenizer_dir / "tokenizer.json", ["<|im_start|>", "<|im_end|>"], None)
        fast = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
        fast.chat_template = CHATML
    else:
        backend = hf_tokenizers.byte_level(tokenizer_dir / "tokenizer.json", ["<|begin_of_text|>", "<|eot_id|>"],
                                           "<|begin_of_text|>")
        fast = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
        fast.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}<|eot_id|>{% endfor %}"
    return fast


def widen(model: Any, std: float = 0.3, seed: int = 0) -> None:
    """Every weight drawn N(0, std), norms N(1, std), biases N(0, std)."""
    import torch

    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * std + (1.0 if name.endswith("norm.weight") else 0.0))


def greedy(model: Any, ids: list[int], new_tokens: int) -> list[int]:
    """transformers' generate, greedy, from `ids`: the new tokens (an end token included, as it gives them)."""
    import torch

    prompt = torch.tensor([ids])
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=model.generation_config.pad_token_id or 0)
    return [int(t) for t in out[0, len(ids):]]


def build(arch: str, kind: str, out: Path, tokenizer_dir: Path, corpus: Path, prompt_ids: Any = None,
          prompt: str = "ka to ri men", stop_at: int = 6, config: dict[str, Any] | None = None) -> HfModel:
    """A random `arch` model with a `kind` tokenizer saved to `out` (`config`: keys of its config beside or
    instead of ARCHS'). Greedy decoding of `prompt` (its ids: `prompt_ids(tokenizer)`, else the tokenizer's
    encoding with its special tokens) is run with no end token first; the first new token not seen before
    position `stop_at` becomes an end token of generation_config.json, beside the tokenizer's eos (and
    config.json's)."""
    import torch
    import transformers
    from transformers import GenerationConfig

    from tests.support import hf_tokenizers

    fast = tokenizer(kind, tokenizer_dir, corpus)
    vocab = len(fast)
    config_cls, model_cls, extra = ARCHS[arch]
    config = getattr(transformers, config_cls)(vocab_size=vocab, bos_token_id=fast.bos_token_id,
                                               eos_token_id=fast.eos_token_id, **{**SHAPE, **extra, **(config or {})})
    model = getattr(transformers, model_cls)(config).eval()
    widen(model)
    if kind == "metaspace" and not config.tie_word_embeddings:  # random byte-fallback runs: invalid UTF-8
        with torch.no_grad():
            model.lm_head.weight[len(hf_tokenizers.SP_SPECIALS):len(hf_tokenizers.SP_SPECIALS) + 256] = 0.0
    ids = prompt_ids(fast) if prompt_ids is not None else fast(prompt)["input_ids"]
    model.generation_config.eos_token_id = None
    free = greedy(model, ids, stop_at + 10)
    stop_id = next(t for j, t in enumerate(free) if j >= stop_at and t not in free[:j] and t != fast.eos_token_id)
    model.save_pretrained(str(out))
    fast.save_pretrained(str(out))
    GenerationConfig(bos_token_id=fast.bos_token_id, eos_token_id=[fast.eos_token_id, stop_id],
                     pad_token_id=fast.pad_token_id).save_pretrained(str(out))
    dtype = "dtype" if int(transformers.__version__.split(".")[0]) >= 5 else "torch_dtype"
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(out), **{dtype: torch.float32}).eval()
    return HfModel(out, reloaded, transformers.AutoTokenizer.from_pretrained(str(out)), stop_id, prompt)


def to_tokenizer_config(path: Path) -> None:
    """Move chat_template.jinja into tokenizer_config.json's chat_template, as transformers < 4.43 saved it."""
    import json

    config_path = path / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["chat_template"] = (path / "chat_template.jinja").read_text(encoding="utf-8")
    config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    (path / "chat_template.jinja").unlink()
