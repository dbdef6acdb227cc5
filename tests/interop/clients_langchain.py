"""LangChain's ChatOpenAI against `gptport serve`: invoke, stream, bind_tools (a non-strict tool, as
LangChain sends it by default) giving tool_calls, and with_structured_output of a pydantic model. Runs in the
clients' virtual environment (see clients_common)."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage
from langchain_openai import ChatOpenAI

from tests.interop.clients_common import MESSAGES, TOOL_MESSAGES, Add, Person, Scenario, Target, check, main


def chat_model(t: Target, **kw: Any) -> ChatOpenAI:
    return ChatOpenAI(model=t.model, base_url=t.v1, api_key=t.api_key, max_retries=0, timeout=120,
                      **kw)


def messages() -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in MESSAGES]


def invoke_and_stream(t: Target) -> dict[str, Any]:
    """invoke, then stream the same request: the chunks add up to the invoked message."""
    llm = chat_model(t, temperature=0, max_tokens=12)
    whole = llm.invoke(messages())
    check(isinstance(whole, AIMessage) and isinstance(whole.content, str), f"{whole!r}")
    check(whole.response_metadata.get("finish_reason") in ("stop", "length"), f"{whole.response_metadata}")
    chunks = list(llm.stream(messages()))
    text = "".join(str(c.content) for c in chunks)
    check(len(chunks) > 1 and text == whole.content, f"streamed {text!r} != {whole.content!r}")
    return {"text": whole.content, "chunks": len(chunks)}


def bind_tools(t: Target) -> dict[str, Any]:
    """bind_tools with LangChain's defaults (no strict), the call required: tool_calls with valid args, no text."""
    llm = chat_model(t, temperature=0.7, max_tokens=120, seed=4).bind_tools([Add], tool_choice="required")
    reply = llm.invoke([(m["role"], m["content"]) for m in TOOL_MESSAGES])
    check(isinstance(reply, AIMessage) and len(reply.tool_calls) == 1, f"{reply!r}")
    call = reply.tool_calls[0]
    check(call["name"] == "Add" and bool(call["id"]) and not reply.invalid_tool_calls, f"{reply!r}")
    check(not reply.content, f"the call leaked as text: {reply.content!r}")
    return {"args": Add.model_validate(call["args"]).model_dump()}


def structured_output(t: Target) -> dict[str, Any]:
    """with_structured_output(Person): LangChain's default method (a json_schema response_format)."""
    person = chat_model(t, temperature=0.7, max_tokens=200, seed=5).with_structured_output(Person).invoke(messages())
    check(isinstance(person, Person), f"{person!r}")
    return {"parsed": person.model_dump()}


SCENARIOS: dict[str, Scenario] = {"langchain_chat": invoke_and_stream, "langchain_tools": bind_tools,
                                  "langchain_structured": structured_output}

if __name__ == "__main__":
    raise SystemExit(main(SCENARIOS))
