"""The graphs `gptport serve` opens beside its model: the multi-row append graph of the fp32 static cache,
and a draft model (or prompt lookup) for speculative decoding. No torch here.
"""

from __future__ import annotations

from typing import Any

from gptport.serve.engine.drafting import Drafting
from gptport.serve.settings import Settings


def appender(s: Settings, engine: Any) -> Any:
    """The multi-row append graph's model beside the static-cache engine, or None (turned off, or no twin:
    another precision, cache or provider, or an export from before the graph was written)."""
    if not s.multi_row_append:
        return None
    from gptport.runtime.engine import Capability
    from gptport.runtime.loader import open_appender

    if Capability.APPEND_ROWS not in engine.capabilities:
        return None
    return open_appender(s.model_dir, engine, s.run)


def drafting(s: Settings, opened: Any) -> tuple[Drafting | None, str]:
    """The scheduler's drafting (--draft or --prompt-lookup; server.check refused bad values), and the
    startup line's words for it."""
    from gptport.runtime import speculative

    if s.draft is None and s.prompt_lookup is None:
        return None, ""
    speculative.static_model(opened.engine, "--draft" if s.draft is not None else "--prompt-lookup")
    k = "adaptive" if s.draft_tokens is None else str(s.draft_tokens)
    if s.prompt_lookup is not None:
        return (Drafting(speculative.LookupDrafter(s.prompt_lookup), s.draft_tokens),
                f" · drafts by prompt lookup ({s.prompt_lookup}-grams, k {k})")
    from gptport.runtime.choice import GraphChoice, RunOptions
    from gptport.runtime.loader import open_model

    assert s.draft is not None
    small = open_model(s.draft, GraphChoice.parse(s.draft_precision or opened.precision),
                       RunOptions.parse(opened.provider, speculative.draft_threads(s.draft_threads), s.spin))
    speculative.check_tokenizers(s.model_dir, opened.tok.sha256, s.draft, small.tok.sha256)
    n = speculative.draft_threads(s.draft_threads)
    threads = "default threads" if n == 0 else f"{n} thread" + ("s" if n > 1 else "")
    return (Drafting(speculative.ModelDrafter(small.engine), s.draft_tokens),
            f" · drafts from {s.draft} ({small.precision}, k {k}, {threads})")
