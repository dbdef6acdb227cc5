"""genai_config.json: lets onnxruntime-genai run a gptport model directory as it is. No torch here.

onnxruntime-genai's "gpt2" type expects the old combined past_%d cache; gptport's graphs have Optimum's
separate past_key_values.{i}.key/.value, which genai's generic decoder-only pipeline reads (type "phi",
a GPT-style decoder: the type picks genai's runtime pipeline, not the network's math). The config
names model.onnx; the 8-bit graph runs with the overlay {"model": {"decoder": {"filename":
"model.int8.onnx"}}} (onnxruntime_genai.Config.overlay).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gptport import atomic, contract, paths
from gptport.config import ModelConfig

GENAI_FILE = paths.GENAI
GENAI_TYPE = "phi"


def genai_config(config: ModelConfig, eot_id: int, filename: str = "model.onnx") -> dict[str, Any]:
    """The config of a model whose end-of-text is `eot_id`: its cache has n_kv_head heads; it ends on its
    eos_ids (a list) where it has them, begins with its bos_id where it has one."""
    ends: int | list[int] = list(config.eos_ids) or eot_id
    return {
        "model": {
            "type": GENAI_TYPE,
            "vocab_size": config.vocab_size,
            "context_length": config.n_ctx,
            "bos_token_id": eot_id if config.bos_id is None else config.bos_id, "eos_token_id": ends,
            "pad_token_id": eot_id,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": filename,
                "head_size": config.head_dim,
                "hidden_size": config.d_model,
                "num_attention_heads": config.n_head,
                "num_key_value_heads": config.n_kv_head,
                "num_hidden_layers": config.n_layer,
                "inputs": {"input_ids": contract.INPUT_IDS, "attention_mask": contract.ATTENTION_MASK,
                           "position_ids": contract.POSITION_IDS,
                           "past_key_names": "past_key_values.%d.key", "past_value_names": "past_key_values.%d.value"},
                "outputs": {"logits": contract.LOGITS, "present_key_names": "present.%d.key",
                            "present_value_names": "present.%d.value"},
            },
        },
        "search": {"do_sample": False, "max_length": config.n_ctx, "min_length": 0, "num_beams": 1,
                   "num_return_sequences": 1, "past_present_share_buffer": False, "repetition_penalty": 1.0,
                   "temperature": 1.0, "top_k": 1, "top_p": 1.0, "early_stopping": True, "length_penalty": 1.0,
                   "diversity_penalty": 0.0, "no_repeat_ngram_size": 0},
    }


def write(model_dir: Path, config: ModelConfig, eot_id: int) -> Path:
    path = model_dir / GENAI_FILE
    atomic.write_text(path, json.dumps(genai_config(config, eot_id), indent=2) + "\n")
    return path
