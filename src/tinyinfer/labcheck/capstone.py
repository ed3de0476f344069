"""Lab 11 (your engine): the check that the learner's assembled engine serves a
workload with the same greedy tokens as tinyinfer's, and the helpers the lab
uses to compare the two on the real model.

The learner's `serve(model, requests, num_blocks, block_size, token_budget,
max_num_seqs, eos_token_ids) -> steps` runs their own forward pass (their RoPE
and attention over their paged cache, with the model's weights and its
RMSNorm/MLP submodules), their allocator, scheduler, loop and sampler. The
check serves lab 7's two workloads on a tiny random model and compares every
request's tokens with tinyinfer's Scheduler + ModelRunner, and refuses a serve
that runs tinyinfer's own attention, RoPE, cache, model forward or engine.
The model's helpers stay allowed: model.compute_logits, its embedding, norms
and MLPs are weights the learner's forward pass uses, not the answer.
"""
from __future__ import annotations

import functools

import torch.nn.functional as F

from ..block_manager import BlockManager
from ..kv_cache import KVCache
from ..llm import LLM
from ..llm_engine import LLMEngine
from ..model import Attention, DecoderLayer, LlamaForCausalLM, apply_rope, rope_tables
from ..model_runner import ModelRunner
from ..paged_kv_cache import PagedKVCache
from ..scheduler import Scheduler
from .core import Case, run_check
from .fixtures import WORKLOADS, engine_outputs, eos_for, tiny_model, tiny_prompt
from .records import Request
from .registry import Lab
from .watch import paused

# What a serve may not call: the engine's forward pass and everything that runs one.
FORBIDDEN = (LlamaForCausalLM.forward, LlamaForCausalLM.rope_at, DecoderLayer, Attention, apply_rope, rope_tables,
             PagedKVCache, KVCache, ModelRunner, Scheduler, BlockManager, LLMEngine, LLM,
             F.scaled_dot_product_attention)


@functools.lru_cache(maxsize=1)
def _your_engine_cases() -> tuple[Case, ...]:
    cases = []
    for w in WORKLOADS:
        eos = tuple(eos_for(w))
        outputs, _ = engine_outputs(w, eos)
        reqs = ", ".join(f"{s}: prompt {p}, max_tokens {m}" for s, p, m in w.requests)
        show = (f"{w.why}. A tiny random 2-layer model (4 query heads, 2 K/V heads, head_dim 16); "
                f"num_blocks={w.num_blocks}, block_size={w.block_size}, token_budget={w.token_budget}, "
                f"max_num_seqs={w.max_num_seqs}, eos_token_ids={eos}; requests {reqs}")
        cases.append(Case((w, eos), outputs, show))
    return tuple(cases)


def _play(serve, w, eos) -> dict:
    requests = [Request(s, tiny_prompt(s, p), m) for s, p, m in w.requests]
    with paused():  # building the model runs DecoderLayer's and Attention's constructors
        model = tiny_model()
    serve(model, requests, w.num_blocks, w.block_size, w.token_budget, w.max_num_seqs, list(eos))
    return {r.seq_id: list(r.output_ids) for r in requests}


def check_your_engine(serve) -> bool:
    """serve(model, requests, num_blocks, block_size, token_budget, max_num_seqs,
    eos_token_ids) -> steps, filling each request's output_ids; greedy tokens
    against tinyinfer's Scheduler + ModelRunner on a tiny random model."""
    return run_check("your_engine", lambda w, eos: _play(serve, w, eos), lambda: list(_your_engine_cases()),
                     forbidden=FORBIDDEN)


def compare_outputs(mine: dict, engine: dict, decode=None) -> bool:
    """Print ✓ or ✗ for every request: are your greedy tokens the engine's? Returns
    True when all are. decode (the tokenizer's) shows the text too."""
    same = 0
    for seq_id, expected in engine.items():
        got = list(mine.get(seq_id, []))
        text = f"  {decode(got)!r}" if decode else ""
        if got == list(expected):
            same += 1
            print(f"✓ request {seq_id}: {len(got)} tokens, equal to tinyinfer's{text}")
        else:
            at = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
            print(f"✗ request {seq_id}: differs from token {at} on\n    expected {list(expected)}\n    got      {got}")
    print(f"{same} of {len(engine)} requests equal token for token")
    return same == len(engine)


LAB = Lab(11, "your engine", exports=("check_your_engine", "compare_outputs"))
