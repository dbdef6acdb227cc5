"""The errors gptport raises on purpose. Their message is what the user reads: one line,
naming the file, value or option at fault."""

from __future__ import annotations


class GptportError(Exception):
    """Base of every error meant for the user. The CLI prints it as one line and exits with `exit_code`."""

    exit_code = 1


class InputError(GptportError):
    """A corpus, prompt or other input that cannot be used as given."""


class UsageError(GptportError):
    """An option value out of range or options that contradict each other."""

    exit_code = 2


class ArtifactError(GptportError):
    """A model directory that is missing files, is stale, or disagrees with itself."""


class ProviderError(GptportError):
    """An onnxruntime execution provider that was asked for but does not run here."""


class ValidationError(GptportError):
    """An exported model that fails its checks against the torch model."""


def first_line(e: BaseException) -> str:
    """The first line of a library's exception message (its class name when empty), to quote in ours."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def escaped(text: str) -> str:
    """`text` on one line: its control characters (a name from a stranger's file may hold a newline) as escapes."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
