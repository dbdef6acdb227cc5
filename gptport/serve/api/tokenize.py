"""POST /tokenize and /detokenize, in vLLM's shapes and llama-server's: text (or chat messages, as the
chat route renders them) to token ids, and back. No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gptport.serve.api.api_error import bad
from gptport.serve.api.fields import ROUTE_FIELDS, check_names, reader
from gptport.serve.api.protocol import message_dict
from gptport.serve.api.tools import parse_tools
from gptport.tokenizer import BPETokenizer

TOKENIZE, DETOKENIZE = set(ROUTE_FIELDS["tokenize"]), set(ROUTE_FIELDS["detokenize"])  # each field: fields.py


def tokenize(body: Any, tok: BPETokenizer, n_ctx: int, render: Any, start: Sequence[int] = ()) -> dict[str, Any]:
    """{prompt | content | messages} -> {tokens, count, max_model_len} (token_strs with
    return_token_strs, llama-server's [{id, piece}] with with_pieces). A text's ids follow `start` (the
    model's begin token where its tokenizer adds one, as a completion's prompt) unless add_special_tokens
    or add_special is false; a chat's template writes its own."""
    f = reader(body, "tokenize")
    body = f.body
    check_names(body, "tokenize")
    given = [name for name in ("prompt", "content", "messages") if body.get(name) is not None]
    if len(given) != 1:
        raise bad("prompt", "give exactly one of prompt, content (text) or messages (a chat)", "invalid_value")
    special = [f.read("add_special_tokens"), f.read("add_special")] == [True, True]
    if given[0] == "messages":
        messages = body["messages"]
        if not isinstance(messages, list) or not messages:
            raise bad("messages", "expected a non-empty list of {role, content} objects", "invalid_type")
        f.read("add_generation_prompt")
        tools = parse_tools(body)
        text, _ = render([message_dict(i, m) for i, m in enumerate(messages)],
                         tools if tools is not None and tools.active else None)
    else:
        text = f.read(given[0])
        for name in ("tools", "tool_choice", "add_generation_prompt"):
            if body.get(name) is not None:
                raise bad(name, "applies to messages only", "invalid_value")
    ids = [*start, *tok.encode(text)] if special and given[0] != "messages" else tok.encode(text)
    out: dict[str, Any] = {"tokens": ids, "count": len(ids), "max_model_len": n_ctx}
    if f.read("return_token_strs"):
        out["token_strs"] = [tok.decode([t]) for t in ids]
    if f.read("with_pieces"):
        out["tokens"] = [{"id": t, "piece": tok.decode([t])} for t in ids]
    return out


def detokenize(body: Any, tok: BPETokenizer) -> dict[str, Any]:
    """{tokens} -> the text, as vLLM names it (prompt) and as llama-server does (content)."""
    body = reader(body, "detokenize").body
    check_names(body, "detokenize")
    ids = body.get("tokens")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise bad("tokens", "expected a list of token ids", "invalid_type")
    outside = [t for t in ids if not 0 <= t < tok.vocab_size]
    if outside:
        raise bad("tokens", f"token id {outside[0]} is outside the vocabulary (0..{tok.vocab_size - 1})",
                  "invalid_token")
    text = tok.decode(ids)
    return {"prompt": text, "content": text}
