"""The `openai` package against `gptport serve`: chat and text completions (whole and streamed), parsed
structured output, a required tool call, and the Responses API (whole, streamed, parsed). Runs in the
clients' virtual environment (see clients_common)."""

from __future__ import annotations

from typing import Any

import openai

from tests.interop.clients_common import ADD_TOOL, MESSAGES, TOOL_MESSAGES, Add, Person, Scenario, Target, check, main

PROMPT = "ka to ri"


def client(t: Target) -> openai.OpenAI:
    return openai.OpenAI(base_url=t.v1, api_key=t.api_key, max_retries=0, timeout=120)


def chat(t: Target) -> dict[str, Any]:
    """A whole chat completion, then the same request streamed: the streamed text is the whole one."""
    c = client(t)
    out = c.chat.completions.create(model=t.model, messages=MESSAGES, max_tokens=12, temperature=0)
    choice = out.choices[0]
    check(out.model == t.model and choice.message.role == "assistant", f"model/role: {out}")
    check(isinstance(choice.message.content, str) and choice.finish_reason in ("stop", "length"), f"{choice}")
    check(out.usage is not None and 0 < out.usage.completion_tokens <= 12, f"usage: {out.usage}")
    parts, reasons, usage = [], [], None
    for chunk in c.chat.completions.create(model=t.model, messages=MESSAGES, max_tokens=12, temperature=0,
                                           stream=True, stream_options={"include_usage": True}):
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            reasons += [chunk.choices[0].finish_reason] if chunk.choices[0].finish_reason else []
        usage = chunk.usage or usage
    check("".join(parts) == choice.message.content, f"streamed {''.join(parts)!r} != {choice.message.content!r}")
    check(reasons == [choice.finish_reason] and usage is not None, f"stream end: {reasons} {usage}")
    counts = (usage.prompt_tokens, usage.completion_tokens)
    check(counts == (out.usage.prompt_tokens, out.usage.completion_tokens), f"usage: {usage} vs {out.usage}")
    return {"text": choice.message.content, "finish_reason": choice.finish_reason}


def completions(t: Target) -> dict[str, Any]:
    """A whole text completion, then the same request streamed: the streamed text is the whole one."""
    c = client(t)
    out = c.completions.create(model=t.model, prompt=PROMPT, max_tokens=12, temperature=0)
    choice = out.choices[0]
    check(out.model == t.model and isinstance(choice.text, str) and choice.finish_reason in ("stop", "length"),
          f"{out}")
    streamed = list(c.completions.create(model=t.model, prompt=PROMPT, max_tokens=12, temperature=0, stream=True))
    text = "".join(s.choices[0].text for s in streamed if s.choices)
    check(text == choice.text, f"streamed {text!r} != {choice.text!r}")
    return {"text": choice.text, "finish_reason": choice.finish_reason}


def parse(t: Target) -> dict[str, Any]:
    """chat.completions.parse with a pydantic model as response_format: a valid Person comes back."""
    out = client(t).chat.completions.parse(model=t.model, messages=MESSAGES, response_format=Person,
                                           max_tokens=200, temperature=0.7, seed=1)
    message = out.choices[0].message
    check(out.choices[0].finish_reason == "stop" and isinstance(message.parsed, Person), f"{out}")
    return {"parsed": message.parsed.model_dump() if message.parsed else None}


def tools(t: Target) -> dict[str, Any]:
    """tool_choice required, with a plain (non-strict) tool and with openai's strict pydantic tool (parsed)."""
    c = client(t)
    out = c.chat.completions.create(model=t.model, messages=TOOL_MESSAGES, tools=[ADD_TOOL],
                                    tool_choice="required", max_tokens=120, temperature=0.7, seed=2)
    choice = out.choices[0]
    check(choice.finish_reason == "tool_calls" and choice.message.tool_calls is not None, f"{choice}")
    call = choice.message.tool_calls[0]
    check(call.type == "function" and call.function.name == "add" and call.id, f"{call}")
    plain = Add.model_validate_json(call.function.arguments)
    parsed = c.chat.completions.parse(model=t.model, messages=TOOL_MESSAGES, tools=[openai.pydantic_function_tool(Add)],
                                      tool_choice="required", max_tokens=120, temperature=0.7, seed=3)
    strict = parsed.choices[0].message.tool_calls[0].function.parsed_arguments
    check(isinstance(strict, Add), f"parsed arguments: {parsed}")
    return {"plain": plain.model_dump(), "strict": strict.model_dump()}


def responses(t: Target) -> dict[str, Any]:
    """POST /v1/responses whole, then streamed: the streamed deltas are the whole reply's text."""
    c = client(t)
    out = c.responses.create(model=t.model, input="ka to ri so ne", max_output_tokens=16, temperature=0)
    check(out.status in ("completed", "incomplete") and out.model == t.model, f"{out}")
    check(isinstance(out.output_text, str) and out.usage is not None, f"{out}")
    deltas, final = [], None
    for event in c.responses.create(model=t.model, input="ka to ri so ne", max_output_tokens=16, temperature=0,
                                    stream=True):
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        elif event.type in ("response.completed", "response.incomplete"):
            final = event.response
    check(final is not None and "".join(deltas) == final.output_text == out.output_text,
          f"streamed {''.join(deltas)!r}, final {final}, whole {out.output_text!r}")
    return {"text": out.output_text, "status": out.status}


def responses_parse(t: Target) -> dict[str, Any]:
    """responses.parse with a pydantic model as text_format: a valid Person comes back."""
    out = client(t).responses.parse(model=t.model, input="Describe a person.", text_format=Person,
                                    max_output_tokens=200, temperature=0.7)
    check(out.status == "completed" and isinstance(out.output_parsed, Person), f"{out}")
    return {"parsed": out.output_parsed.model_dump()}


SCENARIOS: dict[str, Scenario] = {"chat": chat, "completions": completions, "parse": parse, "tools": tools,
                                  "responses": responses, "responses_parse": responses_parse}

if __name__ == "__main__":
    raise SystemExit(main(SCENARIOS))
