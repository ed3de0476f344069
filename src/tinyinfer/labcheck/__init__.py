"""The checks that lab notebooks call after each exercise (see core.py).

One module per lab; every public `check_*` and `reference_*` is re-exported here,
so notebooks write `labcheck.check_bpe_encode_piece(fn)` whatever the lab.
"""
from .core import Case, _report  # noqa: F401
from .tokens import (  # noqa: F401
    _cl100k, check_bpe_encode_piece, check_compare_tokenizers, check_count_tokens,
    reference_compare_tokenizers, reference_count_tokens,
)
