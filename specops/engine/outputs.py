"""Per-request output handling when a step emits several tokens: detokenizing, EOS, stop
strings and the token limit.

A speculative step hands each request 1..k+1 tokens at once. Three things can end a
request inside that run, and the tokens after the end must be dropped:

- the EOS token (kept in ``token_ids``, never in ``text``);
- a stop string, which may span tokens and steps (``text`` is cut before it; the token
  that completed it is the last one kept);
- ``max_tokens`` (the run is cut at the limit).

Text is streamed only when final: the detokenizer holds back an incomplete UTF-8 character
(a multi-byte character split across byte tokens), and the stop check holds back the
longest tail of the text that is the beginning of some stop string (it may yet complete).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

# U+FFFD: what a decoder returns for bytes that do not (yet) form a character.
REPLACEMENT_CHAR = "\ufffd"
# Prompt tokens the detokenizer reads as context: tokenizers such as SentencePiece drop or
# add a leading space depending on the token before.
PROMPT_CONTEXT_TOKENS = 5


class FinishReason(enum.Enum):
    """Why a request ended."""

    STOP = "stop"  # EOS token or stop string
    LENGTH = "length"  # max_tokens reached


@dataclass(frozen=True)
class StopParams:
    """When a request ends.

    Parameters
    ----------
    max_tokens : int
        Generated tokens at most (>= 1); EOS counts as a token.
    eos_token_id : int or None
        The end-of-sequence id; None never stops at EOS (a tokenizer without one, or
        "ignore EOS").
    stop : tuple of str
        Stop strings (non-empty); the output text ends before the first one that appears.
    """

    max_tokens: int
    eos_token_id: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self):
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if self.eos_token_id is not None and (not isinstance(self.eos_token_id, int) or self.eos_token_id < 0):
            raise ValueError(f"eos_token_id must be None or an int >= 0, got {self.eos_token_id!r}")
        if isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop must be a tuple of non-empty strings, got {self.stop!r}")


class IncrementalDetokenizer:
    """Turns token ids into text as they arrive, emitting complete characters only.

    Works with any tokenizer through its ``decode`` (e.g. ``tokenizers.Tokenizer.decode``):
    the text of the tokens since the last emission is decoded with a few tokens of context
    before it, and emitted when it no longer ends in U+FFFD (an unfinished character).

    Parameters
    ----------
    decode : callable
        ``decode(ids: list[int]) -> str``; undecodable bytes must come out as U+FFFD.
    prompt_token_ids : sequence of int
        The prompt; its last tokens are context only, never emitted.
    """

    def __init__(self, decode: Callable[[list[int]], str], prompt_token_ids: Sequence[int] = ()):
        if not callable(decode):
            raise TypeError(f"decode must be callable, got {type(decode).__name__}")
        self._decode = decode
        self._ids = [int(t) for t in prompt_token_ids[-PROMPT_CONTEXT_TOKENS:]]
        # ids[prefix:read] decode to text already emitted (context); ids[read:] are pending.
        self._prefix = 0
        self._read = len(self._ids)

    def push(self, token_id: int) -> str:
        """Add one token; return the text that became complete (possibly empty)."""
        self._ids.append(int(token_id))
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        new_text = self._decode(self._ids[self._prefix:])
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return new_text[len(prefix_text):]

    def flush(self) -> str:
        """Text still held back (an unfinished character comes out as U+FFFD); call at the end."""
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        new_text = self._decode(self._ids[self._prefix:])
        self._prefix = self._read = len(self._ids)
        return new_text[len(prefix_text):]


@dataclass
class RequestOutput:
    """What a request has produced so far.

    ``text`` is final text only: it never contains a stop string and grows by the deltas
    ``OutputProcessor.append`` returns. ``stop_reason`` is the EOS id or the stop string
    that ended the request (None for LENGTH or while running).
    """

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class OutputProcessor:
    """One request's output: feed it each step's emitted tokens with ``append``.

    Parameters
    ----------
    params : StopParams
        When to stop.
    decode : callable
        ``decode(ids: list[int]) -> str`` of the request's tokenizer (special tokens skipped).
    prompt_token_ids : sequence of int
        The prompt, as detokenizer context.

    Examples
    --------
    >>> proc = OutputProcessor(StopParams(max_tokens=8, stop=("\\n",)), lambda ids: bytes(ids).decode(errors="replace"))
    >>> proc.append([104, 105]), proc.append([10, 33]), proc.output.finish_reason
    ('hi', '', <FinishReason.STOP: 'stop'>)
    """

    def __init__(self, params: StopParams, decode: Callable[[list[int]], str], prompt_token_ids: Sequence[int] = ()):
        if not isinstance(params, StopParams):
            raise TypeError(f"params must be a StopParams, got {type(params).__name__}")
        self.params = params
        self.output = RequestOutput()
        self._detokenizer = IncrementalDetokenizer(decode, prompt_token_ids)
        self._pending = ""  # decoded text not yet final: it may start a stop string

    def append(self, token_ids: Sequence[int]) -> str:
        """Take one step's emitted tokens (in order); return the newly final text.

        Tokens after the one that ends the request are dropped. Raises RuntimeError if the
        request has already finished.
        """
        if self.output.finished:
            raise RuntimeError("append on a finished request (finish_reason is already set)")
        start = len(self.output.text)
        params = self.params
        for token_id in token_ids:
            token_id = int(token_id)
            self.output.token_ids.append(token_id)
            if params.eos_token_id is not None and token_id == params.eos_token_id:
                self._finish(FinishReason.STOP, token_id)
                break
            self._pending += self._detokenizer.push(token_id)
            if self._cut_at_stop_string():
                break
            if len(self.output.token_ids) >= params.max_tokens:
                self._finish(FinishReason.LENGTH, None)
                break
        if not self.output.finished:
            self._release(len(self._pending) - self._stop_prefix_len())
        return self.output.text[start:]

    def _cut_at_stop_string(self) -> bool:
        """End the request if a stop string appears in the pending text.

        A stop string cannot start in text already released: from its start to the end of
        the text then decoded, it would have been a tail that begins a stop string, which
        is held back; or the whole stop string, which was searched for then.
        """
        found = [(index, stop) for stop in self.params.stop if (index := self._pending.find(stop)) >= 0]
        if not found:
            return False
        index, stop = min(found, key=lambda item: item[0])
        self._release(index)
        self._pending = ""
        self.output.finish_reason = FinishReason.STOP
        self.output.stop_reason = stop
        return True

    def _stop_prefix_len(self) -> int:
        """Length of the longest tail of the pending text that begins some stop string."""
        longest = 0
        for stop in self.params.stop:
            for length in range(min(len(stop) - 1, len(self._pending)), longest, -1):
                if self._pending.endswith(stop[:length]):
                    longest = length
                    break
        return longest

    def _finish(self, reason: FinishReason, stop_reason: int | None) -> None:
        self._pending += self._detokenizer.flush()
        # Flushed text may complete a stop string; the text must still end before it.
        if self._cut_at_stop_string():
            return
        self._release(len(self._pending))
        self.output.finish_reason = reason
        self.output.stop_reason = stop_reason

    def _release(self, num_chars: int) -> None:
        if num_chars > 0:
            self.output.text += self._pending[:num_chars]
            self._pending = self._pending[num_chars:]


__all__ = [
    "FinishReason",
    "IncrementalDetokenizer",
    "OutputProcessor",
    "RequestOutput",
    "StopParams",
]
