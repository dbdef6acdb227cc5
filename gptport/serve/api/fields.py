"""Every request field of the HTTP API, defined once (`Field`, field_spec.py): its routes, type, bounds,
default, description, examples, and whether OpenAI's API has it. The parser reads each field by its
definition and GET /openapi.json describes each from it. Nothing a client sends is silently ignored: a
field of OpenAI's API that gptport does not implement is a 400 `unsupported` naming it; a field OpenAI's
API does not have is refused as OpenAI refuses it ("Unrecognized request argument supplied"), unless it
is one of gptport's documented extras. A null value is an absent field, as in OpenAI's API. No torch here.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gptport.serve.api import responses_fields, shapes
from gptport.serve.api.api_error import ApiError, bad
from gptport.serve.api.field_spec import ROUTES, Field, Limits, Reader

BOTH = ("completions", "chat")
COMPLETIONS, CHAT_ONLY, TOKENIZE_ONLY = ("completions",), ("chat",), ("tokenize",)
MAX_LOGPROBS = 20  # OpenAI's bound of top_logprobs
MIN_PENALTY = 0.01
MIN_TEMPERATURE = 1e-5  # below it, sampling is greedy (as vLLM): 1/temperature would overflow the logits
CONSTRAINT = "an output constraint: at most one per request, and not beside ignore_eos"


def _slots(limits: Limits) -> dict[str, Any]:
    return {"maximum": limits.slots}


def _model(limits: Limits) -> dict[str, Any]:
    return {"examples": [limits.model]}


MESSAGES = Field("messages", "any", ("chat",), shape=shapes.MESSAGES, required=("chat",),
                 examples=([{"role": "user", "content": "Hello"}],))
TOOLS = Field("tools", "any", ("chat",), shape=shapes.TOOLS,
              examples=([{"type": "function", "function": {"name": "now"}}],))
TOOL_CHOICE = Field("tool_choice", "any", ("chat",), shape=shapes.TOOL_CHOICE, examples=("none",))
TEXT = Field("prompt", "string", TOKENIZE_ONLY, "one of prompt, content, messages", ("Hello",), brief=True)
PENALTY = Field("frequency_penalty", "number", BOTH, "subtracted from a token's logit once per time it was generated "
                "(the prompt does not count); 0 is off", (0.5,), 0, lo=-2, hi=2)
FLAG = Field("with_pieces", "boolean", TOKENIZE_ONLY, examples=(True,), default=False, brief=True)

FIELDS: tuple[Field, ...] = (
    Field("model", "string", ("completions", "chat", "tokenize", "detokenize"),
          "one of this server's names for its model (another name is a 404); responses echo it", limit=_model),
    # ---- completions and chat: OpenAI's
    Field("max_tokens", "integer", BOTH, "generation also stops at the model's context", (8,), 16, lo=1),
    Field("temperature", "number", BOTH, f"0 (or below {MIN_TEMPERATURE:g}) is greedy", (0.7,), 1, lo=0,
          bounds=">= 0 (0 is greedy)"),
    Field("top_p", "number", BOTH, "", (0.9,), 1, lo=0, hi=1, above=True, bounds="in (0, 1]"),
    Field("n", "integer", BOTH, "choices per prompt; prompts x n is at most the server's slots", (1,), 1, lo=1,
          limit=_slots),
    Field("stream", "boolean", BOTH, examples=(True,), default=False),
    Field("stream_options", "object", BOTH, examples=({"include_usage": True},), shape=shapes.STREAM_OPTIONS),
    Field("stop", "any", BOTH, f"a string or a list: at most {shapes.MAX_STOPS} stop sequences, of at most "
          f"{shapes.MAX_STOP_BYTES} UTF-8 bytes together; the text ends before the first one generated",
          (["\n"],), shape=shapes.STOP),
    Field("seed", "integer", BOTH, "taken modulo 2**63; choice j of a prompt samples with seed + j", (42,),
          lo=-(2**63)),
    Field("user", "string", BOTH, examples=("u-1",), brief=True),
    Field("logit_bias", "any", BOTH, "token id (below the vocabulary's size) -> bias", ({"11": -5},),
          shape=shapes.LOGIT_BIAS),
    PENALTY, replace(PENALTY, name="presence_penalty", about="subtracted once from the logit of each token generated "
                     "so far (the prompt does not count); 0 is off"),
    Field("response_format", "any", BOTH, f"text (no constraint), or {CONSTRAINT}", ({"type": "json_object"},),
          shape=shapes.RESPONSE_FORMAT, openai=("chat",)),
    # ---- completions and chat: gptport's extras (vLLM's sampling extras, output constraints)
    Field("top_k", "integer", BOTH, "0 is off", (40,), 0, lo=0, openai=()),
    Field("min_p", "number", BOTH, "after temperature, tokens less likely than min_p times the likeliest are dropped; "
          "0 is off", (0.05,), 0, lo=0, hi=1, openai=()),
    Field("repetition_penalty", "number", BOTH, "1 is off", (1.1,), 1, lo=MIN_PENALTY, hi=1 / MIN_PENALTY,
          bounds=f"between {MIN_PENALTY} and {1 / MIN_PENALTY:g} (1 is off)", openai=()),  # beyond: float32 overflows
    Field("ignore_eos", "boolean", BOTH, examples=(True,), default=False, openai=()),
    Field("json_schema", "any", BOTH, CONSTRAINT, ({"type": "object"},), shape=shapes.JSON_SCHEMA, openai=()),
    Field("regex", "any", BOTH, CONSTRAINT, ("[a-z]+",), shape=shapes.NON_EMPTY, openai=()),
    Field("grammar", "any", BOTH, f"Lark or GBNF; {CONSTRAINT}", ('start: "yes" | "no"',), shape=shapes.NON_EMPTY,
          openai=()),
    Field("choice", "any", BOTH, CONSTRAINT, (["yes", "no"],), shape=shapes.CHOICE, openai=()),
    Field("structured_outputs", "any", BOTH, f"vLLM's form, one key set; {CONSTRAINT}", ({"regex": "[a-z]+"},),
          shape=shapes.STRUCTURED_OUTPUTS, openai=()),
    # ---- completions
    Field("prompt", "any", COMPLETIONS, "a string, token ids, or a list of either (one choice set per prompt); "
          "each at most the model's context", ("Once upon a time",), shape=shapes.prompt, required=COMPLETIONS),
    Field("logprobs", "integer", COMPLETIONS, "log-probabilities of each token and this many alternatives", (2,),
          lo=0, hi=MAX_LOGPROBS),
    Field("echo", "boolean", COMPLETIONS, "the prompt comes first in the text (not beside response_format)", (True,),
          False),
    Field("best_of", "integer", COMPLETIONS, "only equal to n", (1,), lo=1),
    Field("suffix", "string", COMPLETIONS, "not supported: only empty", ("",), only=("",), refusal="is not supported"),
    # ---- chat
    MESSAGES,
    Field("max_completion_tokens", "integer", CHAT_ONLY, "wins over max_tokens when both are given", (8,), lo=1),
    Field("logprobs", "boolean", CHAT_ONLY, examples=(True,), default=False),
    Field("top_logprobs", "integer", CHAT_ONLY, "alternatives per token, with logprobs true", (2,), 0, lo=0,
          hi=MAX_LOGPROBS),
    Field("safety_identifier", "string", CHAT_ONLY, examples=("u-1",), brief=True),
    TOOLS, TOOL_CHOICE,
    Field("parallel_tool_calls", "boolean", CHAT_ONLY, "one call per reply either way", (True,), brief=True),
    Field("store", "any", CHAT_ONLY, "gptport stores nothing: only false", (False,), only=(False,),
          refusal="true is not supported: gptport keeps no completions (false is)"),
    Field("service_tier", "any", CHAT_ONLY, examples=("auto",), only=("auto", "default"),
          refusal="{value!r} is not supported; gptport has one tier (auto or default)"),
    Field("modalities", "any", CHAT_ONLY, examples=(["text"],), only=(["text"],), refusal='only ["text"] is supported'),
    # ---- chat: OpenAI's fields gptport refuses whenever they are set, and why
    *(Field(name, "any", CHAT_ONLY, refused=why) for name, why in {
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
    }.items()),
    # ---- /tokenize (vLLM's and llama-server's fields)
    TEXT,
    replace(TEXT, name="content", about="llama-server's name for prompt"),
    replace(MESSAGES, routes=TOKENIZE_ONLY, required=(), about="a chat, rendered as /v1/chat/completions renders it"),
    replace(TOOLS, routes=TOKENIZE_ONLY, about="with messages"),
    replace(TOOL_CHOICE, routes=TOKENIZE_ONLY, about="with messages"),
    replace(FLAG, name="add_special_tokens", about="text: the begin token first where the model's tokenizer adds "
            "one", default=True),
    replace(FLAG, name="add_special", about="text: the begin token first where the model's tokenizer adds one",
            default=True),
    replace(FLAG, name="add_generation_prompt", about="with messages; only true", default=True, only=(True,),
            refusal="false is not supported: the chat template always ends with the assistant's turn"),
    replace(FLAG, name="return_token_strs"),
    replace(FLAG, about="tokens as [{id, piece}]"),
    # ---- /detokenize
    Field("tokens", "any", ("detokenize",), examples=([11, 12],), shape=shapes.token_ids, required=("detokenize",)),
    # ---- /v1/responses: its table is responses_fields.py
    *responses_fields.FIELDS,
)


def honoured(route: str) -> dict[str, Field]:
    """The fields a route takes, by name."""
    return {f.name: f for f in FIELDS if route in f.routes and not f.refused}


ROUTE_FIELDS = {route: honoured(route) for route in ROUTES}
REFUSED = {f.name: f.refused for f in FIELDS if f.refused and "chat" in f.routes}  # /v1/responses: its own
# by origin (the site's HTTP reference is made from this table): OpenAI's fields gptport implements, and its extras
COMPLETION = {name for name, f in ROUTE_FIELDS["completions"].items() if not f.extra("completions")}
CHAT = {name for name, f in ROUTE_FIELDS["chat"].items() if not f.extra("chat")}
EXTRAS_COMPLETION = set(ROUTE_FIELDS["completions"]) - COMPLETION
EXTRAS_CHAT = set(ROUTE_FIELDS["chat"]) - CHAT
EXTRAS_BOTH = EXTRAS_COMPLETION & EXTRAS_CHAT
STREAM_OPTIONS = set(shapes.keys(shapes.STREAM_OPTIONS))


def reader(body: Any, route: str) -> Reader:
    """The body's fields by their definitions; 400 for a body that is not an object."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", None, "invalid_json")
    return Reader(body, ROUTE_FIELDS[route])


def check_fields(body: dict[str, Any], chat: bool) -> None:
    """Refuse what gptport does not do: unknown fields, refused fields, and refused values of
    fields it reads only in part."""
    route = "chat" if chat else "completions"
    check_names(body, route)
    _values(Reader(body, ROUTE_FIELDS[route]), chat)


def check_names(body: dict[str, Any], route: str) -> None:
    """Each non-null field is one the route takes (or 400, unsupported for an OpenAI field gptport refuses)."""
    known = ROUTE_FIELDS[route]
    for name, value in body.items():
        if value is None or name in known:
            continue
        if route == "chat" and name in REFUSED:
            raise bad(name, REFUSED[name], "unsupported")
        raise ApiError(400, f"Unrecognized request argument supplied: {name}", name, "unrecognized_argument")


def _values(f: Reader, chat: bool) -> None:
    get = f.body.get
    for name in ("store", "service_tier", "modalities"):
        if get(name) is not None and name in f.fields:
            f.bounded(name, get(name))
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
    for name in ("user", "safety_identifier", "parallel_tool_calls"):
        if get(name) is not None and name in f.fields:
            f.typed(name)
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
    top = shapes.MAX_BIAS
    for key, bias in value.items():
        if not (key.isascii() and key.isdigit()):  # int() would take " 1", "+1", "1_0" and other scripts' digits
            raise bad("logit_bias", f"key {key!r:.40} is not a token id", "invalid_value")
        token = int(key)
        if not 0 <= token < vocab:
            raise bad("logit_bias", f"token id {token} is outside the vocabulary (0..{vocab - 1})", "invalid_token")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -top <= bias <= top:
            raise bad("logit_bias", f"the bias of token {token} must be a number in [-{top}, {top}], not {bias!r}",
                      "invalid_value")
        out[token] = float(bias)
    return out
