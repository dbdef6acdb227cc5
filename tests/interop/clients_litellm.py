"""LiteLLM against `gptport serve`: completion() through its OpenAI-compatible provider
(model="openai/<served name>", api_base, api_key), whole and streamed. Runs in the clients' virtual
environment (see clients_common), with LITELLM_LOCAL_MODEL_COST_MAP=True so that it fetches no price list."""

from __future__ import annotations

from typing import Any

import litellm

from tests.interop.clients_common import MESSAGES, Scenario, Target, check, main


def completion(t: Target) -> dict[str, Any]:
    """A whole completion, then the same request streamed: the streamed text is the whole one."""
    kw: dict[str, Any] = {"model": f"openai/{t.model}", "api_base": t.v1, "api_key": t.api_key,
                          "messages": MESSAGES, "max_tokens": 12, "temperature": 0, "num_retries": 0, "timeout": 120}
    whole = litellm.completion(**kw)
    choice = whole.choices[0]
    check(isinstance(choice.message.content, str) and choice.finish_reason in ("stop", "length"), f"{whole}")
    check(whole.usage.completion_tokens > 0, f"usage: {whole.usage}")
    chunks = list(litellm.completion(**kw, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    check(text == choice.message.content and reasons == [choice.finish_reason],
          f"streamed {text!r} {reasons} != {choice.message.content!r} {choice.finish_reason}")
    return {"text": choice.message.content, "finish_reason": choice.finish_reason, "chunks": len(chunks)}


SCENARIOS: dict[str, Scenario] = {"litellm": completion}

if __name__ == "__main__":
    raise SystemExit(main(SCENARIOS))
