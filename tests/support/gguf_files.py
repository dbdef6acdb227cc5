"""GGUF files written as llama.cpp's converter writes them, for import-gguf's tests: a transformers Llama's weights
under the converter's names (gguf's own TensorNameMap), q and k rows permuted as LlamaModel.permute does, Llama 3's
rope_freqs.weight, matrices quantized with gguf.quants, and a tokenizer's vocabulary, merges, token types and
special ids under tokenizer.ggml.*."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType
NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's LlamaModel.permute: each head's rows from halves order to interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def roundtrip(w: np.ndarray, qtype: Q) -> np.ndarray:
    """What `qtype` stores of `w`: gguf.quants' quantization, dequantized by gguf.quants (the reference values)."""
    return gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype).reshape(w.shape)


def matrix_type(name: str, w: np.ndarray, qtype: Q) -> Q:
    """The converter's choice: 1-D tensors (norms, biases) stay F32, matrices take the file's type."""
    return Q.F32 if w.ndim == 1 else qtype


def llama3_freqs(cfg: Any) -> np.ndarray:
    """rope_freqs.weight as llama.cpp's LlamaModel.generate_extra_tensors computes it."""
    rope = getattr(cfg, "rope_parameters", None) or {"rope_theta": cfg.rope_theta, **(cfg.rope_scaling or {})}
    dim = cfg.head_dim
    freqs = 1.0 / (rope["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        smooth = (old / wavelen - low) / (high - low)
        out.append(1.0 if wavelen < old / high else factor if wavelen > old / low
                   else 1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def tokenizer_fields(tok: Any) -> dict[str, Any]:
    """A `tokenizers` BPE's vocabulary (by id), token types (added special tokens CONTROL) and merges."""
    spec = json.loads(tok.to_str())
    by_id = {i: t for t, i in tok.get_vocab(with_added_tokens=True).items()}
    special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    types = [CONTROL if i in special else BYTE if by_id[i].startswith("<0x") and len(by_id[i]) == 6 else NORMAL
             for i in range(len(by_id))]
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    return {"tokens": [by_id[i] for i in range(len(by_id))], "types": types, "merges": merges}


def write(path: Path, arch: str, meta: Callable[[gguf.GGUFWriter], None],
          tensors: list[tuple[str, np.ndarray, Q]]) -> Path:
    """A GGUF file of `arch`: `meta` adds its keys, each tensor is stored quantized as its type says (a uint8
    array: already the type's bytes)."""
    writer = gguf.GGUFWriter(path, arch=arch)
    meta(writer)
    for name, w, qtype in tensors:
        data = w if w.dtype == np.uint8 else gguf.quants.quantize(np.ascontiguousarray(w, dtype=np.float32), qtype)
        writer.add_tensor(name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def add_tokenizer(writer: gguf.GGUFWriter, fields: dict[str, Any], model: str = "gpt2", pre: str | None = "gpt-2",
                  bos: int | None = None, eos: int | None = None, add_bos: bool | None = None,
                  template: str | None = None, scores: list[float] | None = None, eot: int | None = None,
                  unk: int | None = None) -> None:
    writer.add_tokenizer_model(model)
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(fields["tokens"])
    writer.add_token_types(fields["types"])
    if fields.get("merges"):
        writer.add_token_merges(fields["merges"])
    if scores is not None:
        writer.add_token_scores(scores)
    for value, add in ((bos, writer.add_bos_token_id), (eos, writer.add_eos_token_id), (eot, writer.add_eot_token_id),
                       (unk, writer.add_unk_token_id)):
        if value is not None:
            add(value)
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    if template is not None:
        writer.add_chat_template(template)


def llama_tensors(model: Any, qtype: Q, permuted: bool = True) -> list[tuple[str, np.ndarray, Q]]:
    """A transformers Llama's tensors as the converter writes them (rope_freqs.weight for llama3 scaling);
    `permuted` False: q and k rows left in transformers' order, which no converter writes."""
    cfg = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, cfg.num_hidden_layers)
    out = []
    for name, tensor in model.state_dict().items():
        if name.endswith("rotary_emb.inv_freq") or name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue  # a buffer; a tied head, which save_pretrained does not write
        w = tensor.detach().float().numpy()
        if permuted and name.endswith(("q_proj.weight", "q_proj.bias")):
            w = permute(w, cfg.num_attention_heads)
        if permuted and name.endswith(("k_proj.weight", "k_proj.bias")):
            w = permute(w, cfg.num_key_value_heads)
        gguf_name = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gguf_name is not None, name
        out.append((gguf_name, w, matrix_type(gguf_name, w, qtype)))
    rope = getattr(cfg, "rope_parameters", None) or cfg.rope_scaling or {}
    if rope.get("rope_type") == "llama3":
        out.append(("rope_freqs.weight", llama3_freqs(cfg), Q.F32))
    return out


def llama_meta(cfg: Any, fields: dict[str, Any], **tokenizer: Any) -> Callable[[gguf.GGUFWriter], None]:
    """The llama.* keys of a transformers LlamaConfig, as the converter writes them, and the tokenizer's."""
    def add(w: gguf.GGUFWriter) -> None:
        rope = getattr(cfg, "rope_parameters", None) or {"rope_theta": cfg.rope_theta, **(cfg.rope_scaling or {})}
        w.add_block_count(cfg.num_hidden_layers)
        w.add_context_length(cfg.max_position_embeddings)
        w.add_embedding_length(cfg.hidden_size)
        w.add_feed_forward_length(cfg.intermediate_size)
        w.add_head_count(cfg.num_attention_heads)
        w.add_head_count_kv(cfg.num_key_value_heads)
        w.add_rope_freq_base(rope["rope_theta"])
        w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
        w.add_rope_dimension_count(cfg.head_dim)
        w.add_vocab_size(cfg.vocab_size)
        if rope.get("rope_type") == "llama3":
            w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        add_tokenizer(w, fields, **tokenizer)
    return add
