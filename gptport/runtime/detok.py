"""Token ids -> text as they are generated: never a broken character, and stop strings honoured.

A multi-byte UTF-8 character can span tokens; decoding a partial one yields U+FFFD, so text is held
back until its last character is whole. Text that could be the start of a stop string is held back
too, so that a stop string never reaches the output. No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence

from gptport.tokenizer import BPETokenizer

MAX_PENDING = 4  # a UTF-8 character is at most 4 bytes: past that many tokens, U+FFFD is real


class TextStream:
    """Feed token ids with `push`; it returns the text that is safe to print now."""

    def __init__(self, tok: BPETokenizer, stops: Sequence[str] = ()) -> None:
        self.tok = tok
        self.stops = [s for s in stops if s]
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.text = ""  # everything decoded so far (cut at a stop string)
        self.emitted = 0  # characters of `text` already returned
        self.pending: list[int] = []
        self.stopped = False

    def push(self, token: int) -> str:
        """Add a token; return newly printable text. After a stop string, `stopped` is True."""
        if self.stopped:
            return ""
        self.pending.append(token)
        piece = self.tok.decode(self.pending)
        if piece.endswith("\ufffd") and len(self.pending) < MAX_PENDING:
            return ""  # the character is not whole yet
        self.pending = []
        start = max(0, len(self.text) - self.hold)
        self.text += piece
        hits = [at for stop in self.stops if (at := self.text.find(stop, start)) >= 0]
        if hits:
            self.text, self.stopped = self.text[:min(hits)], True
        safe = len(self.text) if self.stopped else max(self.emitted, len(self.text) - self.hold)
        out, self.emitted = self.text[self.emitted:safe], safe
        return out

    def finish(self) -> str:
        """The text held back at the end of generation."""
        if self.pending and not self.stopped:
            self.text += self.tok.decode(self.pending)
            self.pending = []
        out, self.emitted = self.text[self.emitted:], len(self.text)
        return out
