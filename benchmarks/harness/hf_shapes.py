"""Random-weight Hugging Face directories of real models' shapes, made locally (no hub): config.json written by
hand as transformers writes it, bf16 safetensors shards written tensor by tensor with numpy (each tensor drawn
and converted in chunks, so making an 8B shape holds a few hundred MB, never the model), the index
model.safetensors.index.json, and a byte-level BPE tokenizer of the shape's vocabulary with its special tokens
and chat template (tokenizer.json, tokenizer_config.json, generation_config.json).

Weights: N(0, 0.02) (norm weights 1), drawn from numpy's PCG64 seeded by the tensor's index, so a directory is
the same every time it is made. Each shard holds at most SHARD_BYTES."""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

SHARD_BYTES = 2 * 10**9
CHUNK = 1 << 24  # elements drawn and converted at once: 64 MB of float32
STD = 0.02
INDEX = "model.safetensors.index.json"
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>' + '\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
LLAMA3_CHAT = ("{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n'"
               " + m['content'] + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
               "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}")
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA3_NAMED = ["<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>"]


def llama3_specials(n: int) -> list[str]:
    """Llama 3's special tokens, the named ones then reserved ones up to `n` in all (256 in Llama 3)."""
    return [*LLAMA3_NAMED, *(f"<|reserved_special_token_{i}|>" for i in range(3, 3 + n - len(LLAMA3_NAMED)))]


def _llama(layers: int, d: int, heads: int, kv: int, ff: int, vocab: int, ordinary: int, tied: bool,
           factor: float, original: int, max_pos: int) -> dict[str, Any]:
    """A Llama 3 config.json; its special tokens (llama3_specials) follow `ordinary` ones: begin-of-text first,
    then end-of-text, end-of-message and end-of-turn end a sequence."""
    eos = [ordinary + LLAMA3_NAMED.index(t) for t in ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")]
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": False,
            "attention_dropout": 0.0, "bos_token_id": ordinary, "eos_token_id": eos, "head_dim": d // heads,
            "hidden_act": "silu", "hidden_size": d, "initializer_range": 0.02, "intermediate_size": ff,
            "max_position_embeddings": max_pos, "mlp_bias": False, "num_attention_heads": heads,
            "num_hidden_layers": layers, "num_key_value_heads": kv, "pretraining_tp": 1, "rms_norm_eps": 1e-5,
            "rope_scaling": {"factor": factor, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                             "original_max_position_embeddings": original, "rope_type": "llama3"},
            "rope_theta": 500000.0, "tie_word_embeddings": tied, "torch_dtype": "bfloat16", "use_cache": True,
            "vocab_size": vocab}


QWEN25_05B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "attention_dropout": 0.0,
              "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896,
              "initializer_range": 0.02, "intermediate_size": 4864, "max_position_embeddings": 32768,
              "max_window_layers": 21, "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
              "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
              "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936}

# name -> (config.json, the tokenizer's ordinary tokens, its special tokens (ids follow), its chat template)
SHAPES: dict[str, tuple[dict[str, Any], int, list[str], str]] = {
    "tiny": (_llama(2, 64, 4, 2, 128, 512, 496, True, 8.0, 256, 2048), 496, llama3_specials(16), LLAMA3_CHAT),
    "qwen2.5-0.5b": (QWEN25_05B, 151643, QWEN_SPECIALS, CHATML),
    "llama-3.2-1b": (_llama(16, 2048, 32, 8, 8192, 128256, 128000, True, 32.0, 8192, 131072), 128000,
                     llama3_specials(256), LLAMA3_CHAT),
    "llama-3.1-8b": (_llama(32, 4096, 32, 8, 14336, 128256, 128000, False, 8.0, 8192, 131072), 128000,
                     llama3_specials(256), LLAMA3_CHAT),
}
Spec = tuple[str, tuple[int, ...]]  # a tensor's name and shape


def tensors(config: dict[str, Any]) -> list[Spec]:
    """Every weight's name and shape, in transformers' order, for a Llama or Qwen2 config."""
    d, layers, vocab = config["hidden_size"], config["num_hidden_layers"], config["vocab_size"]
    hd = config.get("head_dim") or d // config["num_attention_heads"]
    q, kv, ff = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd, config["intermediate_size"]
    bias = config["model_type"] == "qwen2" or config.get("attention_bias", False)
    out: list[Spec] = [("model.embed_tokens.weight", (vocab, d))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out.append((p + "input_layernorm.weight", (d,)))
        for proj, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            out.append((p + f"self_attn.{proj}.weight", (rows, d)))
            if bias:
                out.append((p + f"self_attn.{proj}.bias", (rows,)))
        out += [(p + "self_attn.o_proj.weight", (d, q)), (p + "post_attention_layernorm.weight", (d,)),
                (p + "mlp.gate_proj.weight", (ff, d)), (p + "mlp.up_proj.weight", (ff, d)),
                (p + "mlp.down_proj.weight", (d, ff))]
    out.append(("model.norm.weight", (d,)))
    if not config.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (vocab, d)))
    return out


def nbytes(shape: tuple[int, ...]) -> int:
    return 2 * int(np.prod(shape))  # bf16


def parameters(name: str) -> int:
    """The shape's weight count (tied embeddings once)."""
    return sum(nbytes(s) for _, s in tensors(SHAPES[name][0])) // 2


def shards(specs: list[Spec], limit: int | None = None) -> list[list[Spec]]:
    """The tensors in order, cut into shards of at most `limit` bytes (default SHARD_BYTES; a tensor larger than
    `limit` alone)."""
    limit = SHARD_BYTES if limit is None else limit
    out: list[list[Spec]] = [[]]
    size = 0
    for name, shape in specs:
        if out[-1] and size + nbytes(shape) > limit:
            out.append([])
            size = 0
        out[-1].append((name, shape))
        size += nbytes(shape)
    return out


def draws(seed: int, count: int, norm: bool) -> Iterator[np.ndarray]:
    """A tensor's `count` values as bf16 chunks: N(0, STD), or ones for a norm's weight."""
    rng = np.random.default_rng(seed)
    for start in range(0, count, CHUNK):
        n = min(CHUNK, count - start)
        if norm:
            yield np.ones(n, dtype=ml_dtypes.bfloat16)
        else:
            x = rng.standard_normal(n, dtype=np.float32)  # (n,)
            x *= STD
            yield x.astype(ml_dtypes.bfloat16)


def write_shard(path: Path, specs: list[Spec], first: int) -> None:
    """One safetensors file of `specs` (bf16), its header written first, then each tensor chunk by chunk; the
    tensor of index `first + k` seeded with that index."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in specs:
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes(shape)]}
        offset += nbytes(shape)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for k, (name, shape) in enumerate(specs):
            for chunk in draws(first + k, int(np.prod(shape)), name.endswith("norm.weight")):
                f.write(chunk.tobytes())


def byte_level_bpe(ordinary: int, specials: list[str], template: str, bos: str | None, eos: str, out: Path) -> None:
    """A byte-level BPE of `ordinary` tokens (every byte, every pair of bytes, then byte triples) and the
    `specials` after them, saved by transformers (tokenizer.json, tokenizer_config.json) with `template`; `bos`,
    where given, put first by the post-processor as Llama 3's does."""
    import transformers
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {c: i for i, c in enumerate(alphabet[:ordinary])}
    merges = []
    for a in alphabet:
        for b in alphabet:
            if len(vocab) >= ordinary:
                break
            vocab[a + b] = len(vocab)
            merges.append((a, b))
    for a in alphabet:
        for b in alphabet:
            for c in alphabet:
                if len(vocab) >= ordinary:
                    break
                vocab[a + b + c] = len(vocab)
                merges.append((a + b, c))
    backend = Tokenizer(models.BPE(vocab, merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    if bos is not None:
        backend.post_processor = processors.TemplateProcessing(single=f"{bos} $A",
                                                               special_tokens=[(bos, backend.token_to_id(bos))])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token=eos,
                                                pad_token=specials[0] if bos is None else None)
    fast.chat_template = template
    fast.save_pretrained(str(out))


def size_of(name: str) -> int:
    """Bytes the shape's directory takes (its weights; the tokenizer adds some MB)."""
    return sum(nbytes(s) for _, s in tensors(SHAPES[name][0]))


def make(name: str, out: Path) -> Path:
    """The directory of shape `name` at `out`, made in a temporary sibling and renamed into place; kept when
    already there. Refused in one line (SystemExit) when the disk has not room for it."""
    if (out / INDEX).is_file():
        return out
    config, ordinary, specials, template = SHAPES[name]
    out.parent.mkdir(parents=True, exist_ok=True)
    need = size_of(name) + 100 * 2**20
    free = shutil.disk_usage(out.parent).free
    if free < need:
        raise SystemExit(f"{out.parent}: {free / 1e9:.1f} GB free, the {name} directory needs {need / 1e9:.1f} GB")
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    llama = config["model_type"] == "llama"
    eos = "<|eot_id|>" if llama else "<|im_end|>"
    byte_level_bpe(ordinary, specials, template, "<|begin_of_text|>" if llama else None, eos, tmp)
    (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    ids = config["eos_token_id"] if isinstance(config["eos_token_id"], list) else [config["eos_token_id"]]
    gen = {"bos_token_id": config["bos_token_id"], "eos_token_id": ids, "do_sample": False}
    (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n", encoding="utf-8")
    parts = shards(tensors(config))
    weight_map, first = {}, 0
    for i, part in enumerate(parts):
        file = f"model-{i + 1:05d}-of-{len(parts):05d}.safetensors"
        write_shard(tmp / file, part, first)
        weight_map |= {n: file for n, _ in part}
        first += len(part)
    index = {"metadata": {"total_size": size_of(name)}, "weight_map": weight_map}
    (tmp / INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out
