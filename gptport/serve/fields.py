"""Which request fields gptport honours, which it refuses, and gptport's own extras: nothing a client
sends is silently ignored. A field of OpenAI's API that gptport does not implement is a 400 `unsupported`
naming it; a field OpenAI's API does not have is refused as OpenAI refuses it ("Unrecognized request
argument supplied"), unless it is one of gptport's documented extras. A null value is an absent field,
as in OpenAI's API. No torch here.
"""

from __future__ import annotations

from typing import Any

from gptport.serve.api_error import ApiError, bad

# OpenAI's fields that gptport implements (README "Fields"); a field refused for some values only (a
# penalty other than 0, store true, ...) is listed here and checked where it is read.
COMPLETION = {"model", "prompt", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "logprobs",
              "echo", "stop", "seed", "user", "logit_bias", "frequency_penalty", "presence_penalty", "best_of",
              "suffix"}
CHAT = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stream",
        "stream_options", "stop", "seed", "logprobs", "top_logprobs", "user", "safety_identifier", "logit_bias",
        "frequency_penalty", "presence_penalty", "response_format", "tools", "tool_choice", "parallel_tool_calls",
        "store", "service_tier", "modalities"}
# OpenAI's fields gptport refuses whenever they are set, and why
REFUSED = {
    "audio": "audio output is not supported: gptport generates text",
    "function_call": "is deprecated by OpenAI; use tools and tool_choice",
    "functions": "is deprecated by OpenAI; use tools",
    "metadata": "is for stored completions, which gptport does not keep",
    "moderation": "is not supported: gptport runs no moderation model",
    "prediction": "(predicted outputs) is not supported",
    "prompt_cache_key": "is not supported: gptport keeps no prompt cache",
    "prompt_cache_options": "is not supported: gptport keeps no prompt cache",
    "prompt_cache_retention": "is not supported: gptport keeps no prompt cache",
    "reasoning_effort": "is not supported: gptport's models do not reason before answering",
    "verbosity": "is not supported",
    "web_search_options": "is not supported: gptport searches nothing",
}
# gptport's own request fields (README "Fields"): sampling extras, as vLLM takes them, and output constraints
EXTRAS_BOTH = {"top_k", "repetition_penalty", "ignore_eos", "json_schema", "regex", "grammar", "choice",
               "structured_outputs"}
EXTRAS_COMPLETION = EXTRAS_BOTH | {"response_format"}
EXTRAS_CHAT = EXTRAS_BOTH
STREAM_OPTIONS = {"include_usage", "include_obfuscation"}


def check_fields(body: dict[str, Any], chat: bool) -> None:
    """Refuse what gptport does not do: unknown fields, refused fields, and refused values of
    fields it reads only in part."""
    known = (CHAT | EXTRAS_CHAT) if chat else (COMPLETION | EXTRAS_COMPLETION)
    for name, value in body.items():
        if value is None:
            continue
        if name in known:
            continue
        if chat and name in REFUSED:
            raise bad(name, REFUSED[name], "unsupported")
        raise ApiError(400, f"Unrecognized request argument supplied: {name}", name, "unrecognized_argument")
    _values(body, chat)


def _values(body: dict[str, Any], chat: bool) -> None:
    get = body.get
    if get("store") is not None and get("store") is not False:  # not `in (None, False)`: 0 == False
        raise bad("store", "true is not supported: gptport keeps no completions (false is)", "unsupported")
    tier = get("service_tier")
    if tier is not None and tier not in ("auto", "default"):
        raise bad("service_tier", f"{tier!r} is not supported; gptport has one tier (auto or default)",
                  "unsupported")
    modalities = get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise bad("modalities", "only [\"text\"] is supported", "unsupported")
    best_of, n = get("best_of"), get("n") or 1
    if best_of is not None and (type(best_of) is not int or best_of != n):  # true == 1, 1.0 == 1: not integers
        raise bad("best_of", f"is supported only equal to n ({n}), not {best_of!r}: gptport returns every "
                  "choice it generates", "unsupported")
    options = get("stream_options")
    if isinstance(options, dict):
        unknown = sorted(set(options) - STREAM_OPTIONS)
        if unknown:
            raise bad("stream_options", f"unknown option {unknown[0]!r}", "invalid_value")
        for key in STREAM_OPTIONS:
            if options.get(key) is not None and not isinstance(options[key], bool):
                raise bad(f"stream_options.{key}", "expected true or false", "invalid_type")
        if options.get("include_obfuscation"):
            raise bad("stream_options.include_obfuscation", "true is not supported: gptport pads no chunks",
                      "unsupported")
    for name in ("user", "safety_identifier"):
        value = get(name)
        if value is not None and not isinstance(value, str):
            raise bad(name, "expected a string", "invalid_type")
    ptc = get("parallel_tool_calls")
    if ptc is not None and not isinstance(ptc, bool):
        raise bad("parallel_tool_calls", "expected true or false", "invalid_type")
    if not chat and get("response_format") is not None and get("echo"):
        raise bad("echo", "cannot be combined with response_format", "invalid_value")


def logit_bias(value: Any, vocab: int) -> dict[int, float] | None:
    """OpenAI's logit_bias: token ids (as strings) to a bias in [-100, 100], added to the logits."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad("logit_bias", "expected an object of token id -> bias", "invalid_type")
    if not value:
        return None
    out: dict[int, float] = {}
    for key, bias in value.items():
        if not (key.isascii() and key.isdigit()):  # int() would take " 1", "+1", "1_0" and other scripts' digits
            raise bad("logit_bias", f"key {key!r:.40} is not a token id", "invalid_value")
        token = int(key)
        if not 0 <= token < vocab:
            raise bad("logit_bias", f"token id {token} is outside the vocabulary (0..{vocab - 1})", "invalid_token")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise bad("logit_bias", f"the bias of token {token} must be a number in [-100, 100], not {bias!r}",
                      "invalid_value")
        out[token] = float(bias)
    return out
