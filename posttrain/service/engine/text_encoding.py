"""Tokenising a client's text at a bounded cost: length checked first, long unbroken runs cut.

A byte-level BPE tokenizer merges within one pre-tokenised word at a cost that grows with
the square of the word's length: a 1 MB chat message without a space held a core for hours
(the third hostile probe: 20,000 characters 8 s, 40,000 characters 28 s), and it ran before
any length check. Two rules bound every text a request brings:

- **length first**: a text longer than ``max_chars`` is refused (413) before the tokenizer
  sees it. ``max_chars`` is the token budget times the most characters one token of this
  vocabulary spells (``longest_token_chars``), so no text that could fit the budget is
  refused for its length alone;
- **linear on unbroken text**: a run of more than ``UNBROKEN_PIECE`` characters without
  whitespace is tokenised in pieces of that many characters and the ids put together.
  Text made of ordinary words is tokenised exactly as the tokenizer would; in a run that
  long the merges across a cut may differ, still a valid encoding of the same text (it
  decodes to it). Tokenizers that add something at the start of every call (a
  sentencepiece prefix space) cannot be cut so; for them a run that long is refused
  instead (``Encoder.cuts_safely``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from posttrain.service.engine.errors import BadRequest, TooLarge

UNBROKEN_PIECE = 256
_LONG_RUN = re.compile(rf"\S{{{UNBROKEN_PIECE + 1},}}")
_PROBE = ("abcdefghij" * 3, "klmnopqrst" * 3)


def longest_token_chars(tokenizer: Any) -> int:
    """The most characters one token of ``tokenizer``'s vocabulary decodes to (at least 1)."""
    texts = tokenizer.batch_decode([[token_id] for token_id in range(len(tokenizer))])
    return max([1, *(len(text) for text in texts)])


def _cuts_safely(tokenizer: Any) -> bool:
    """Do two encodings put together decode to the two texts put together?"""
    first, second = _PROBE
    ids = (tokenizer.encode(first, add_special_tokens=False)
           + tokenizer.encode(second, add_special_tokens=False))
    return tokenizer.decode(ids) == first + second


@dataclass(frozen=True)
class Encoder:
    """``tokenizer``'s encoding of client text within a character budget (module docstring)."""

    tokenizer: Any
    max_chars: int
    cuts_safely: bool

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, max_tokens: int) -> Encoder:
        return cls(tokenizer, max_tokens * longest_token_chars(tokenizer),
                   _cuts_safely(tokenizer))

    def check(self, text: str, where: str) -> None:
        """``TooLarge`` when ``text`` cannot fit the token budget whatever it says;
        ``BadRequest`` for an unbroken run this tokenizer cannot take in pieces."""
        if len(text) > self.max_chars:
            raise TooLarge(f"{where}: {len(text):,} characters; at most {self.max_chars:,} "
                           "can fit this server's max_sequence_tokens (refused before "
                           "tokenising)")
        if not self.cuts_safely and _LONG_RUN.search(text):
            raise BadRequest(f"{where}: a run of more than {UNBROKEN_PIECE} characters "
                             "without whitespace, which this model's tokenizer cannot take "
                             "at a bounded cost")

    def encode(self, text: str, where: str = "text") -> list[int]:
        """Token ids of ``text`` (no special tokens added), checked first."""
        self.check(text, where)
        ids: list[int] = []
        for piece in pieces(text):
            ids.extend(self.tokenizer.encode(piece, add_special_tokens=False))
        return ids

    def encode_chat(self, messages: Sequence[dict[str, Any]], where: str = "messages",
                    **template: Any) -> list[int]:
        """Token ids of ``messages`` through the chat template, ready for the reply: the
        template's text, then ``encode`` (what ``apply_chat_template(tokenize=True)`` does,
        with the checks). ``template``: the template's own keyword arguments."""
        for index, message in enumerate(messages):
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):  # before the template copies it around
                self.check(content, f"{where}[{index}].content")
        text = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True,
                                                  tokenize=False, **template)
        return self.encode(text, where)


def pieces(text: str) -> list[str]:
    """``text`` cut inside every run of more than ``UNBROKEN_PIECE`` non-space characters,
    every ``UNBROKEN_PIECE`` characters; ordinary text comes back whole."""
    cut_at = [cut for run in _LONG_RUN.finditer(text)
              for cut in range(run.start() + UNBROKEN_PIECE, run.end(), UNBROKEN_PIECE)]
    if not cut_at:
        return [text]
    bounds = [0, *cut_at, len(text)]
    return [text[start:end] for start, end in pairwise(bounds)]
