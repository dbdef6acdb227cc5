"""The ONNX I/O contract as code: names, dynamic dimensions, dtypes, metadata keys. No torch."""

from __future__ import annotations

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
LOGITS = "logits"

BATCH, SEQUENCE, PAST, TOTAL = "batch", "sequence", "past_sequence", "total_sequence"

META_CONFIG = "gptport.config"  # the model's config.json "model" object, as JSON
META_TOKENIZER = "gptport.tokenizer_sha256"
META_PRECISION = "gptport.precision"
META_VERSION = "gptport.version"
META_CONTRACT = "gptport.contract"
CONTRACT_VERSION = "1"

PRECISIONS = ("fp32", "int8", "int4", "fp16")


def past_names(n_layer: int) -> list[str]:
    """past_key_values.{i}.key / .value, layer by layer: (batch, heads, past_sequence, head_dim)."""
    return [f"past_key_values.{i}.{kv}" for i in range(n_layer) for kv in ("key", "value")]


def present_names(n_layer: int) -> list[str]:
    """present.{i}.key / .value: (batch, heads, total_sequence, head_dim)."""
    return [f"present.{i}.{kv}" for i in range(n_layer) for kv in ("key", "value")]


def input_names(n_layer: int) -> list[str]:
    return [INPUT_IDS, ATTENTION_MASK, POSITION_IDS, *past_names(n_layer)]


def output_names(n_layer: int) -> list[str]:
    return [LOGITS, *present_names(n_layer)]


def onnx_file(precision: str) -> str:
    """model.onnx for fp32, model.{precision}.onnx for the variants."""
    return "model.onnx" if precision == "fp32" else f"model.{precision}.onnx"
