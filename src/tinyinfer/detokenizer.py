"""Incremental detokenization: the reply's text, grown by a few tokens' worth
at a time (vLLM's detokenize_incrementally).

Decoding the whole reply after every token would cost O(reply) per token, so
O(reply²) over a reply. Instead we decode a short window: the tokens from
`prefix_offset` on. The text of the window up to `read_offset` was already
emitted; whatever the full window adds beyond it is new. Why a window and not
just the newest token:
- A token is not a character. An emoji can be split over several byte-level
  tokens; until its last byte arrives, the window decodes to U+FFFD ("�"), so
  we wait and emit nothing.
- Some tokenizers change a token's text by its neighbour (SentencePiece drops a
  leading space at the start of a decode), so we decode it in context, with the
  previous token(s) in the window, and subtract the context's own text.
Once a window decodes cleanly, both offsets move forward; the window stays a
handful of tokens long however long the reply grows.
"""
from __future__ import annotations


class IncrementalDetokenizer:
    def __init__(self, decode, token_ids: list[int], start: int):
        self.decode = decode  # ids -> text (special tokens such as EOS decode to "")
        self.token_ids = token_ids  # the sequence's own list (read, never copied whole)
        self.prefix_offset = self.read_offset = start  # the reply starts here
        self.text = ""  # the reply's text so far: what add() and flush() returned (the sequence may cut it)
        self.num_decoded_tokens = 0  # work done: tokens passed to decode (tests count it)

    def _text(self, stop: int) -> str:
        self.num_decoded_tokens += stop - self.prefix_offset
        return self.decode(self.token_ids[self.prefix_offset : stop])

    def add(self) -> str:
        """The sequence got a token: return the text it completes ("" while a
        character is still incomplete)."""
        end = len(self.token_ids)
        prefix, text = self._text(self.read_offset), self._text(end)
        if text.endswith("\ufffd"):
            return ""  # an incomplete character: wait for its next bytes
        self.prefix_offset, self.read_offset = self.read_offset, end
        return text[len(prefix):]

    def flush(self) -> str:
        """The reply ended: whatever is still held back (an incomplete character
        decodes to U+FFFD, as a full decode would show it)."""
        end = len(self.token_ids)
        prefix, text = self._text(self.read_offset), self._text(end)
        self.prefix_offset = self.read_offset = end
        return text[len(prefix):]
