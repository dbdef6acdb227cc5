"""Token ids -> text as they are generated: never a broken character, and stop strings honoured.

A multi-byte UTF-8 character can span tokens; decoding a partial one yields U+FFFD, so text is held
back until its last character is whole. Text that could be the start of a stop string is held back
too, so that a stop string never reaches the output. A stop string can only be completed by the
characters a token adds, so each push checks, for each added character, only the stops that end with
it: many stops cost little more per token than one. A SentencePiece-style tokenizer's decoder drops the
space ("▁") that starts what it decodes, so there a token is decoded after the tokens printed just before
it and the text they decode to is taken off: the text streamed is the whole decode's. No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence

from gptport.tokenizer import BPETokenizer

MAX_PENDING = 4  # a UTF-8 character is at most 4 bytes: past that many tokens, U+FFFD is real
CONTEXT = 4  # tokens already printed that a token is decoded after (a tokenizer that does not join: tok.joins)


class TextStream:
    """Feed token ids with `push`; it returns the text that is safe to print now."""

    def __init__(self, tok: BPETokenizer, stops: Sequence[str] = ()) -> None:
        self.tok = tok
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.ending: dict[str, list[str]] = {}  # a stop's last character -> the stops that end with it
        for stop in self.stops:
            self.ending.setdefault(stop[-1], []).append(stop)
        self.text = ""  # everything decoded so far (cut at a stop string)
        self.emitted = 0  # characters of `text` already returned
        self.pending: list[int] = []
        self.context: list[int] | None = None if tok.joins else []  # the last tokens printed, where they matter
        self.stopped = False

    def push(self, token: int) -> str:
        """Add a token; return newly printable text. After a stop string, `stopped` is True."""
        if self.stopped:
            return ""
        self.pending.append(token)
        piece = self._decode()
        if piece.endswith("\ufffd") and len(self.pending) < MAX_PENDING:
            return ""  # the character is not whole yet
        if self.context is not None:
            self.context = [*self.context, *self.pending][-CONTEXT:]
        self.pending = []
        old = len(self.text)
        self.text += piece
        at = self._first_stop(old) if self.ending else None
        if at is not None:
            self.text, self.stopped = self.text[:at], True
        safe = len(self.text) if self.stopped else max(self.emitted, len(self.text) - self.hold)
        out, self.emitted = self.text[self.emitted:safe], safe
        return out

    def _decode(self) -> str:
        """The text the pending tokens add: decoded alone, or after the context where the tokenizer does not
        join (the text the context decodes to taken off the front)."""
        if not self.context:
            return self.tok.decode(self.pending)
        before = self.tok.decode(self.context)
        whole = self.tok.decode([*self.context, *self.pending])
        return whole[len(before):] if whole.startswith(before) else self.tok.decode(self.pending)

    def _first_stop(self, old: int) -> int | None:
        """Where the earliest stop string that ends past `old` (in the text just added) starts, if any."""
        text, best = self.text, None
        for end in range(old, len(text)):
            for stop in self.ending.get(text[end], ()):
                at = end + 1 - len(stop)
                if at >= 0 and (best is None or at < best) and text.startswith(stop, at):
                    best = at
        return best

    def finish(self) -> str:
        """The text held back at the end of generation."""
        if self.pending and not self.stopped:
            self.text += self._decode()
            self.pending = []
        out, self.emitted = self.text[self.emitted:], len(self.text)
        return out
