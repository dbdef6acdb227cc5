"""The OpenAI Agents SDK against `gptport serve`: an agent with a function tool, in the SDK's default
Responses mode (the server's POST /v1/responses) and in its chat-completions mode
(OpenAIChatCompletionsModel): the model calls the tool, the tool runs, the run finishes. Runs in the
clients' virtual environment (see clients_common)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_default_openai_api,
    set_default_openai_client,
    set_tracing_disabled,
)
from openai import AsyncOpenAI
from pydantic import BaseModel, ConfigDict, Field

from tests.interop.clients_common import Scenario, Target, check, main

CALLS: list[tuple[int, int]] = []  # what the tool was called with, in order


@function_tool
def add(a: Annotated[int, Field(ge=-99, le=99)], b: Annotated[int, Field(ge=-99, le=99)]) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    CALLS.append((a, b))
    return a + b


class Answer(BaseModel):
    """The agent's final output: a structured reply, so that a tiny model's last turn finishes."""

    model_config = ConfigDict(extra="forbid")
    total: int = Field(ge=-999, le=999)


def make_agent(model: str | OpenAIChatCompletionsModel) -> Agent[Any]:
    """The first turn must call a tool; after it the SDK resets tool_choice, so the model may answer."""
    settings = ModelSettings(tool_choice="required", max_tokens=120, temperature=0)
    return Agent(name="adder", instructions="You add numbers with the add tool.", tools=[add], model=model,
                 model_settings=settings, output_type=Answer)


def run(agent: Agent[Any]) -> Any:
    """Run the agent on one request, with the tool's record of calls emptied first."""
    CALLS.clear()
    return asyncio.run(Runner.run(agent, "Add 2 and 3.", max_turns=4))


def finished(result: Any) -> dict[str, Any]:
    """The checks both modes share: the tool ran with valid arguments and the run came to a final output."""
    outputs = [item for item in result.new_items if item.type == "tool_call_output_item"]
    check(bool(CALLS) and len(outputs) == len(CALLS), f"tool calls {CALLS}, outputs {outputs}")
    check(outputs[0].output == sum(CALLS[0]), f"the tool's output {outputs[0].output} != {sum(CALLS[0])}")
    check(isinstance(result.final_output, Answer), f"final output {result.final_output!r}: {result.new_items}")
    return {"calls": CALLS, "final_output": result.final_output.model_dump(),
            "items": [i.type for i in result.new_items]}


def responses_mode(t: Target) -> dict[str, Any]:
    """The SDK's default: the Responses API, through the client set as the default."""
    set_tracing_disabled(True)
    set_default_openai_client(AsyncOpenAI(base_url=t.v1, api_key=t.api_key, max_retries=0), use_for_tracing=False)
    set_default_openai_api("responses")
    result = run(make_agent(t.model))
    check(result.raw_responses and all(r.response_id for r in result.raw_responses), "responses carry ids")
    return finished(result)


def chat_mode(t: Target) -> dict[str, Any]:
    """OpenAIChatCompletionsModel: the same agent over POST /v1/chat/completions."""
    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(model=t.model, openai_client=AsyncOpenAI(base_url=t.v1, api_key=t.api_key,
                                                                                max_retries=0))
    return finished(run(make_agent(model)))


SCENARIOS: dict[str, Scenario] = {"agents_responses": responses_mode, "agents_chat": chat_mode}

if __name__ == "__main__":
    raise SystemExit(main(SCENARIOS))
