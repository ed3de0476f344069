"""The checks that lab notebooks call after each exercise (see core.py).

One module per lab; every public `check_*` and `reference_*` is re-exported here,
so notebooks write `labcheck.check_bpe_encode_piece(fn)` whatever the lab.
"""
from .core import Case, _report, compare_prediction  # noqa: F401
from . import my_engine  # noqa: F401
from .beyond import (  # noqa: F401
    check_parse_tool_call, check_run_agent, check_select_context, check_token_costs, reference_parse_tool_call,
    reference_run_agent, reference_select_context, reference_token_costs,
)
from .batching import ReferenceBlockAllocator, check_block_allocator  # noqa: F401
from .scheduling import Request, Step, check_prefix_hashes, check_run_engine, check_schedule, make_execute_model, reference_prefix_hashes, reference_run_engine, reference_schedule  # noqa: F401,E501
from .capstone import check_your_engine, compare_outputs  # noqa: F401
from .paged_attention import check_paged_attention, reference_paged_attention  # noqa: F401
from .attention import check_causal_gqa_attention, check_rope, reference_causal_gqa_attention, reference_rope  # noqa: F401
from .fleets import check_p95_and_goodput, check_power_of_two, reference_p95_and_goodput, reference_power_of_two  # noqa: F401
from .kv_cache import ReferenceKVCache, check_kv_cache, check_update_kv_cache, reference_update_kv_cache  # noqa: F401
from .prefill_decode import check_time_step, reference_time_step  # noqa: F401
from .generation import check_generate, reference_generate  # noqa: F401
from .quantization import check_pack_int4, check_quantize_int4, check_quantize_int8, reference_pack_int4, reference_quantize_int4, reference_quantize_int8  # noqa: F401,E501
from .speculative import check_accept_draft_tokens, reference_accept_draft_tokens  # noqa: F401
from .sampling import check_repetition_penalty, check_sample, check_temperature, check_top_k, check_top_p, reference_sample  # noqa: F401,E501
from .tokens import (  # noqa: F401
    _cl100k, check_bpe_encode_piece, check_compare_tokenizers, check_count_tokens,
    reference_compare_tokenizers, reference_count_tokens,
)
