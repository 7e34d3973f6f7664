"""Incremental detokenization of one request's generated tokens, with stop strings.

Text is emitted the way vLLM does it: decode a short window of recent tokens twice, with and
without the newest ones, and emit the difference once it no longer ends in an incomplete UTF-8
sequence (U+FFFD). Decoding a window rather than single tokens keeps sentencepiece's word-initial
spaces and byte-level BPE's multi-token characters right.

Stop strings follow the OpenAI / vLLM rule: the text ends just before the first stop string, which
is not included. While stop strings are set, the last `max(len(stop)) - 1` characters are held
back (they might be the start of a stop string); `flush()` releases them when generation ends for
another reason (EOS, max_tokens). Stop token ids are the engine's business, not this module's.
"""

from __future__ import annotations

from ninfer.tokenizer import Tokenizer

_PROMPT_CONTEXT = 6  # prompt tokens that seed the window (leading-space context)
_INCOMPLETE = "\ufffd"


class Detokenizer:
    """Turns a growing list of token ids into text deltas. Not thread-safe; one per request.

    Invariants: `prefix_offset <= read_offset <= len(ids)`; `text` is everything emitted so far
    plus what is held back, cut at the first stop string once one is hit.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: list[int] | None = None,
        stop: list[str] | None = None,
        skip_special_tokens: bool = True,
    ) -> None:
        self._tok = tokenizer
        self._skip = skip_special_tokens
        context = list(prompt_token_ids or [])[-_PROMPT_CONTEXT:]
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._stop = [s for s in (stop or []) if s]
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self.text = ""  # the output text so far (held-back characters included)
        self._emitted = 0  # characters of `text` already returned
        self.stopped = False
        self.stop_string: str | None = None  # the stop string that ended the text

    def feed(self, token_ids: list[int]) -> tuple[str, bool]:
        """Add generated tokens; return (new text to show, stop string hit).

        After a stop string is hit, further calls return ("", True).
        """
        if self.stopped:
            return "", True
        for t in token_ids:
            self._ids.append(t)
            self.text += self._next_piece()
        if self._stop:
            cut = self._find_stop()
            if cut is not None:
                self.text = self.text[:cut]
                self.stopped = True
                return self._take(len(self.text)), True
        return self._take(max(self._emitted, len(self.text) - self._hold)), False

    def flush(self) -> str:
        """The held-back text, at the end of generation (after a stop string: nothing new)."""
        return self._take(len(self.text))

    # ---- internals ----------------------------------------------------------------------------
    def _take(self, end: int) -> str:
        out = self.text[self._emitted : end]
        self._emitted = max(self._emitted, end)
        return out

    def _next_piece(self) -> str:
        """Text added by the newest token, or "" while it ends in an incomplete character.

        ids:  ... | prefix_offset ... read_offset ... | newest
                    `-- prefix_text --'
                    `----------- new_text ------------'
        """
        prefix_text = self._tok.decode(
            self._ids[self._prefix_offset : self._read_offset], skip_special_tokens=self._skip
        )
        new_text = self._tok.decode(
            self._ids[self._prefix_offset :], skip_special_tokens=self._skip
        )
        if len(new_text) <= len(prefix_text) or new_text.endswith(_INCOMPLETE):
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]

    def _find_stop(self) -> int | None:
        """Index in `text` of the earliest stop string that a new character completed; the
        string is kept in `stop_string` (the shortest of those starting there, which
        completed first)."""
        longest = max(len(s) for s in self._stop)
        start = max(0, self._emitted - longest + 1)
        hits = [(i, len(s), s) for s in self._stop if (i := self.text.find(s, start)) != -1]
        if not hits:
            return None
        i, _, self.stop_string = min(hits)
        return i
