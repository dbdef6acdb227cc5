"""The names a server answers to (`--served-model-name`, vLLM's option; `--model-name` is the same):
repeated or comma-separated, the first being the primary name, `/v1/models` listing each. No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence

from gptport.errors import UsageError


def served_names(values: Sequence[str] | None, default: str) -> tuple[str, ...]:
    """The names given (each value may hold several, comma-separated), in order; `default` alone when none
    is given. An empty or repeated name is a usage error."""
    names = [name.strip() for value in values or () for name in value.split(",")]
    if not names:
        return (default,)
    for i, name in enumerate(names):
        if not name:
            raise UsageError(f"--served-model-name {','.join(names)!r}: name {i + 1} is empty")
        if name in names[:i]:
            raise UsageError(f"--served-model-name: {name!r} is given twice")
    return tuple(names)
