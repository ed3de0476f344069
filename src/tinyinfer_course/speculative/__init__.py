"""Speculative decoding: a cheap draft guesses k tokens, the target checks them
all in one forward pass, and a rejection rule keeps the output distribution
exactly the target's.

  verify.py   accept_draft_tokens: the accept/reject rule, a pure function
  drafts.py   NgramDraft (prompt lookup) and LayerDraft (the target's first layers)
  decoder.py  SpeculativeDecoder: the draft / verify / accept loop, with stats
"""
from .decoder import SpecDecodeStats, SpeculativeDecoder
from .drafts import LayerDraft, NgramDraft
from .verify import accept_draft_tokens

__all__ = ["SpeculativeDecoder", "SpecDecodeStats", "accept_draft_tokens", "NgramDraft", "LayerDraft"]
