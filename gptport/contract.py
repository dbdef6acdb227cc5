"""The ONNX I/O contract as code: names, dynamic dimensions, dtypes, metadata keys. No torch."""

from __future__ import annotations

INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
LOGITS = "logits"
HEAD = "head_logits"  # the head MatMul's output in a graph that finishes the logits after it (Granite, Gemma 2)
HEADS = (LOGITS, HEAD)  # what the head MatMul writes: a node with either output is the head

BATCH, SEQUENCE, PAST, TOTAL = "batch", "sequence", "past_sequence", "total_sequence"

META_CONFIG = "gptport.config"  # the model's config.json "model" object, as JSON
META_TOKENIZER = "gptport.tokenizer_sha256"
META_WEIGHTS = "gptport.weights_sha256"  # of the model.safetensors it was exported from (provenance.py)
META_CONFIG_SHA = "gptport.config_sha256"  # of the config.json it was exported from
META_PRECISION = "gptport.precision"
META_VERSION = "gptport.version"
META_CONTRACT = "gptport.contract"
CONTRACT_VERSION = "1"
META_CACHE = "gptport.cache"  # absent or "concat": this contract; "static": gqa_graph.py's I/O
CACHE_CONCAT, CACHE_STATIC = "concat", "static"
# the static-cache graph with an int8 cache (export --kv-dtype int8): its file's cache part; at run time it is
# a static-cache graph whose cache inputs are int8 (OnnxModel.kv_dtype), scales calibrated and stored in it
CACHE_STATIC_KV8 = "static.kv8"
# the multi-row append graph (export/scatter_graph.py): the static-cache graph's twin that appends several tokens
# to several rows of the same cache buffers in one run (fp32, float32 cache); runtime/slots.py steps both
CACHE_APPEND = "append"
# the one-token decode graph (export/cuda_graphs.py): the static-cache graph's inputs and buffers, one new token per
# row (S = 1), written with TensorScatter and attended with Attention-24 over the whole buffer: fp32 on the CUDA
# provider, where GroupQueryAttention takes float16 only; fixed shapes, so CUDA graphs can replay it
CACHE_DECODE = "decode"
KV_DTYPES = ("float32", "int8")
META_KV_SCALES = "gptport.kv_scales"  # an int8-cache graph's scale kind (per-tensor, per-channel) and its gate
META_GATED = "gptport.gated"  # "true": the graph passed export's accuracy check for its precision (fp32: parity
# and greedy decoding against torch; a variant: the gate); "false": a variant written with --no-gate
META_GATE_TEXT = "gptport.gate_text"  # a gated variant's held-out text: data/val.bin, the --heldout file, or
# "the model's own samples" (--gate-on-sampled-text)

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


SEQLENS_K = "seqlens_k"  # static-cache graphs: (batch,) int32, each row's cached tokens after the call - 1
TOTAL_SEQUENCE_LENGTH = "total_sequence_length"  # static-cache graphs: () int32, the longest row's tokens
LOGITS_INDEX = "logits_index"  # static-cache graphs: (batch, L) int64, the new positions that get logits
WRITE_INDEX = "write_index"  # the multi-row append graph: (batch,) int64, each row's first new position
PACK_INDEX = "pack_index"  # the multi-row append graph: (batch, K) int64, each row's tokens in the packed sequence
UNPACK_INDEX = "unpack_index"  # the multi-row append graph: (T,) int64, each packed token's place r * K + j


def static_input_names(n_layer: int) -> list[str]:
    """The static-cache graphs' inputs (gqa_graph.py); their outputs are output_names()."""
    return [INPUT_IDS, POSITION_IDS, SEQLENS_K, TOTAL_SEQUENCE_LENGTH, LOGITS_INDEX, *past_names(n_layer)]


def append_input_names(n_layer: int) -> list[str]:
    """The multi-row append graph's inputs (scatter_graph.py); its outputs are output_names()."""
    return [INPUT_IDS, POSITION_IDS, WRITE_INDEX, PACK_INDEX, UNPACK_INDEX, LOGITS_INDEX, *past_names(n_layer)]


def decode_input_names(n_layer: int) -> list[str]:
    """The one-token decode graph's inputs (export/cuda_graphs.py): the static-cache graph's but
    total_sequence_length; its outputs are output_names()."""
    return [INPUT_IDS, POSITION_IDS, SEQLENS_K, LOGITS_INDEX, *past_names(n_layer)]


def onnx_file(precision: str, cache: str = CACHE_CONCAT) -> str:
    """model.onnx for fp32, model.{precision}.onnx for the variants; model.static.onnx and
    model.{precision}.static.onnx for the static-cache graphs, model[.{precision}].static.kv8.onnx for
    their int8-cache twins, model.append.onnx for the multi-row append graph, model.decode.onnx for the
    one-token decode graph."""
    stem = "model" if precision == "fp32" else f"model.{precision}"
    return f"{stem}.onnx" if cache == CACHE_CONCAT else f"{stem}.{cache}.onnx"


def ort_file(precision: str) -> str:
    """model.ort, model.{precision}.ort: a contract graph in ONNX Runtime's format (export --ort-format)."""
    return onnx_file(precision)[: -len(".onnx")] + ".ort"


def graph_files() -> list[str]:
    """Every graph file name export may write: each precision, every cache kind, and the .ort files."""
    onnx = [onnx_file(p, c) for p in PRECISIONS for c in (CACHE_CONCAT, CACHE_STATIC, CACHE_STATIC_KV8)]
    return onnx + [onnx_file("fp32", CACHE_APPEND), onnx_file("fp32", CACHE_DECODE)] + [ort_file(p) for p in PRECISIONS]
