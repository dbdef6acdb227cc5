"""POST /tokenize and /detokenize, in vLLM's shapes and llama-server's: text (or chat messages, as the
chat route renders them) to token ids, and back. No torch here.
"""

from __future__ import annotations

from typing import Any

from gptport.serve.api_error import ApiError, bad
from gptport.serve.protocol import message_dict
from gptport.serve.tools import parse_tools
from gptport.tokenizer import BPETokenizer

TOKENIZE = {"model", "prompt", "content", "messages", "tools", "tool_choice", "add_special_tokens", "add_special",
            "add_generation_prompt", "return_token_strs", "with_pieces"}
DETOKENIZE = {"model", "tokens"}


def _known(body: Any, fields: set[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", None, "invalid_json")
    for name, value in body.items():
        if value is not None and name not in fields:
            raise ApiError(400, f"Unrecognized request argument supplied: {name}", name, "unrecognized_argument")
    return body


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(name, "expected true or false", "invalid_type")
    return value


def tokenize(body: Any, tok: BPETokenizer, n_ctx: int, render: Any) -> dict[str, Any]:
    """{prompt | content | messages} -> {tokens, count, max_model_len} (token_strs with
    return_token_strs, llama-server's [{id, piece}] with with_pieces)."""
    body = _known(body, TOKENIZE)
    given = [name for name in ("prompt", "content", "messages") if body.get(name) is not None]
    if len(given) != 1:
        raise bad("prompt", "give exactly one of prompt, content (text) or messages (a chat)", "invalid_value")
    # the tokenizer adds no special tokens to text, so add_special_tokens true and false tokenize alike
    _flag(body, "add_special_tokens", True)
    _flag(body, "add_special", True)
    if given[0] == "messages":
        messages = body["messages"]
        if not isinstance(messages, list) or not messages:
            raise bad("messages", "expected a non-empty list of {role, content} objects", "invalid_type")
        if not _flag(body, "add_generation_prompt", True):
            raise bad("add_generation_prompt", "false is not supported: the chat template always ends with the "
                      "assistant's turn", "unsupported")
        tools = parse_tools(body)
        text, _ = render([message_dict(i, m) for i, m in enumerate(messages)],
                         tools if tools is not None and tools.active else None)
    else:
        text = body[given[0]]
        if not isinstance(text, str):
            raise bad(given[0], "expected a string", "invalid_type")
        for name in ("tools", "tool_choice", "add_generation_prompt"):
            if body.get(name) is not None:
                raise bad(name, "applies to messages only", "invalid_value")
    ids = tok.encode(text)
    out: dict[str, Any] = {"tokens": ids, "count": len(ids), "max_model_len": n_ctx}
    if _flag(body, "return_token_strs", False):
        out["token_strs"] = [tok.decode([t]) for t in ids]
    if _flag(body, "with_pieces", False):
        out["tokens"] = [{"id": t, "piece": tok.decode([t])} for t in ids]
    return out


def detokenize(body: Any, tok: BPETokenizer) -> dict[str, Any]:
    """{tokens} -> the text, as vLLM names it (prompt) and as llama-server does (content)."""
    body = _known(body, DETOKENIZE)
    ids = body.get("tokens")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise bad("tokens", "expected a list of token ids", "invalid_type")
    outside = [t for t in ids if not 0 <= t < tok.vocab_size]
    if outside:
        raise bad("tokens", f"token id {outside[0]} is outside the vocabulary (0..{tok.vocab_size - 1})",
                  "invalid_token")
    text = tok.decode(ids)
    return {"prompt": text, "content": text}
