"""Lab 11 (your engine): the check of the learner's forward pass, the check that
their assembled engine serves a workload with the same greedy tokens as
tinyinfer's, and the helpers the lab uses to compare the two on the real model.

The forward pass, `make_execute_model(model, num_blocks, block_size, rope,
paged_attention, attention) -> execute_model(scheduled, allocator)`, is the
model's arithmetic written out over its weights: embedding, per layer RMSNorm,
the stacked Q/K/V projection, RoPE, paged attention, the output projection and
the MLP with their residuals, then the final norm and the LM head. Its check
drives it with the course's loop, allocator and scheduler on lab 7's
workloads and compares every step's logits with tinyinfer's ModelRunner on the
same steps, handing it the course's RoPE and attention (so a slip in lab 2
cannot fail lab 11). Both checks also run a model with SmolLM2's heads, head
size and RoPE base beside the tiny one, so a constant written as a literal
fails one of them.

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

import torch
import torch.nn.functional as F

from tinyinfer.block_manager import BlockManager
from tinyinfer.kv_cache import KVCache
from tinyinfer.llm import LLM
from tinyinfer.llm_engine import LLMEngine
from tinyinfer.model import Attention, DecoderLayer, LlamaForCausalLM, apply_rope, apply_rope_signed, rope_tables
from tinyinfer.model_runner import ModelRunner
from tinyinfer.paged_kv_cache import PagedKVCache
from tinyinfer.scheduler import Scheduler
from .attention import reference_causal_gqa_attention, reference_rope
from .batching import ReferenceBlockAllocator
from .core import Case, first_difference, first_mismatch, run_check
from .fixtures import SMOL_SHAPED, WIDE_TINY, WORKLOADS, describe_model, engine_outputs, eos_for, tiny_prompt
from .given import greedy
from .given import make_execute_model as engine_execute_model
from .paged_attention import reference_paged_attention
from .records import Request
from .registry import Lab
from .scheduling_answers import reference_run_engine, reference_schedule
from .watch import paused

# What a serve may not call: the engine's forward pass and everything that runs one.
FORBIDDEN = (LlamaForCausalLM.forward, LlamaForCausalLM.rope_at, DecoderLayer, Attention, apply_rope,
             apply_rope_signed, rope_tables,
             PagedKVCache, KVCache, ModelRunner, Scheduler, BlockManager, LLMEngine, LLM,
             F.scaled_dot_product_attention)


# ---------------------------------------------------------------- the forward pass


def reference_make_execute_model(model, num_blocks: int, block_size: int, rope, paged_attention, attention):
    """The course's answer to lab 11's forward-pass exercise."""
    cfg, layers = model.config, model.model.layers
    H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    k_pools = torch.zeros(cfg.num_hidden_layers, num_blocks * block_size, Hkv, D)  # per layer, a pool of slots
    v_pools = torch.zeros_like(k_pools)

    def execute_model(scheduled, allocator) -> dict:
        ids, positions, batch = [], [], []  # batch: (new tokens, context length, block table) per request
        for req, n in scheduled:
            start = req.num_computed
            ids += req.token_ids[start : start + n]
            positions += range(start, start + n)
            batch.append((n, start + n, allocator.block_tables[req.seq_id]))
        positions = torch.tensor(positions)
        with torch.inference_mode():
            x = model.model.embed_tokens(torch.tensor(ids))  # [N, C]
            for i, layer in enumerate(layers):
                qkv = layer.self_attn.qkv_proj(layer.input_layernorm(x)).view(-1, H + 2 * Hkv, D).transpose(0, 1)
                q = rope(qkv[None, :H], positions, cfg.rope_theta)[0]  # [H, N, D]
                k = rope(qkv[None, H : H + Hkv], positions, cfg.rope_theta)[0]  # [Hkv, N, D]
                v = qkv[H + Hkv :]
                o = paged_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), k_pools[i], v_pools[i],
                                    batch, block_size, attention)  # [N, H, D]
                x = x + layer.self_attn.o_proj(o.reshape(len(ids), H * D))
                x = x + layer.mlp(layer.post_attention_layernorm(x))
            x = model.model.norm(x)
            ends = torch.tensor([n for n, _, _ in batch]).cumsum(0) - 1  # each request's last new token
            rows = [(req, int(ends[b])) for b, (req, n) in enumerate(scheduled)
                    if req.num_computed + n == req.num_tokens]  # requests that sample after this step
            logits = model.lm_head(x[[row for _, row in rows]]).float()
        return {req.seq_id: logits[j] for j, (req, _) in enumerate(rows)}

    return execute_model


class _Steps:
    """Every step's logits (seq_id -> [V]) and the greedy tokens that came of them."""

    def __init__(self, steps: list[dict], outputs: dict):
        self.steps, self.outputs = steps, outputs

    def __repr__(self):
        first = next(((k, s, sid) for k, step in enumerate(self.steps) for sid, s in step.items()), None)
        head = "" if first is None else (f"; step {first[0]}'s logits for {first[2]!r} start "
                                         f"{[round(x, 4) for x in first[1][:3].tolist()]}")
        return f"{len(self.steps)} steps, greedy tokens {self.outputs}{head}"


def _same_steps(got, expected, atol: float = 1e-4) -> bool:
    """Same steps, the same requests sampling in each, logits within atol (another
    attention's order of additions moves them in the sixth decimal)."""
    if not isinstance(got, _Steps) or len(got.steps) != len(expected.steps) or got.outputs != expected.outputs:
        return False
    for mine, theirs in zip(got.steps, expected.steps):
        if set(mine) != set(theirs):
            return False
        for sid, row in theirs.items():
            if not (isinstance(mine[sid], torch.Tensor) and mine[sid].shape == row.shape
                    and torch.allclose(mine[sid].float(), row, atol=atol)):
                return False
    return True


def _where_steps(got, expected, atol: float = 1e-4) -> str | None:
    """The first step, and the first request in it, whose logits differ."""
    if not isinstance(got, _Steps):
        return None
    for k, (mine, theirs) in enumerate(zip(got.steps, expected.steps)):
        if set(mine) != set(theirs):
            return f"step {k}: logits for requests {sorted(mine)}, expected {sorted(theirs)}"
        for sid, row in theirs.items():
            diff = first_difference(mine[sid], row, ("logit",), atol=atol, rtol=0)
            if diff:
                return f"step {k}, request {sid!r}: {diff}"
    if len(got.steps) != len(expected.steps):
        return f"{len(got.steps)} steps, expected {len(expected.steps)}"
    return _where_tokens(got.outputs, expected.outputs)


def _where_tokens(got, expected) -> str | None:
    """The first request, and the first token of it, that differ."""
    if not isinstance(got, dict):
        return None
    for sid, tokens in expected.items():
        mine = list(got.get(sid, []))
        at = first_mismatch(mine, tokens)
        if at is not None:
            return (f"request {sid!r} first differs at output token {at}: expected {tokens[at:at + 3]}..., "
                    f"got {mine[at:at + 3]}... ({len(mine)} tokens, expected {len(tokens)})")
    return None


def _forward_steps(build_execute, w, eos) -> _Steps:
    """The workload through the course's loop, allocator and scheduler (greedy),
    with `build_execute(model)`'s forward pass; every step's logits recorded."""
    requests = [Request(s, tiny_prompt(s, p), m) for s, p, m in w.requests]
    with paused():  # building the model runs DecoderLayer's and Attention's constructors
        model = w.model()
    g = torch.Generator().manual_seed(11)
    for name, p in model.named_parameters():  # norms start at all ones: make each layer's norms tell apart
        if name.endswith("norm.weight"):
            p.data = 1 + 0.3 * torch.randn(p.shape, generator=g)
    execute = build_execute(model)
    steps = []

    def recorded(scheduled, allocator):
        logits = execute(scheduled, allocator)
        steps.append({sid: row.detach().float().clone() for sid, row in dict(logits).items()})
        return logits

    reference_run_engine(requests, ReferenceBlockAllocator(w.num_blocks, w.block_size), reference_schedule,
                         recorded, greedy, w.token_budget, w.max_num_seqs, list(eos))
    return _Steps(steps, {r.seq_id: list(r.output_ids) for r in requests})


@functools.lru_cache(maxsize=1)
def _forward_cases() -> tuple[Case, ...]:
    cases = []
    for w in WORKLOADS + [SMOL_SHAPED]:
        eos = tuple(eos_for(w))
        expected = _forward_steps(lambda model: engine_execute_model(model, w.num_blocks, w.block_size), w, eos)
        show = (f"lab 7's workload ({w.why}) on {describe_model(w.model())}, served by the course's loop, "
                f"allocator and scheduler; num_blocks={w.num_blocks}, block_size={w.block_size}, "
                f"token_budget={w.token_budget}; every step's logits compared")
        cases.append(Case((w, eos), expected, show))
    return tuple(cases)


def check_forward_pass(make_execute_model) -> bool:
    """make_execute_model(model, num_blocks, block_size, rope, paged_attention,
    attention) -> execute_model(scheduled, allocator) -> {seq_id: logits [V]}:
    every step's logits against tinyinfer's ModelRunner on the same steps (given
    the course's RoPE, paged attention and attention). Kept as
    "make_execute_model" on a pass."""
    def run(w, eos):
        return _forward_steps(lambda model: make_execute_model(model, w.num_blocks, w.block_size, reference_rope,
                                                               reference_paged_attention,
                                                               reference_causal_gqa_attention), w, eos)

    return run_check("forward_pass", run, lambda: list(_forward_cases()), same=_same_steps,
                     forbidden=FORBIDDEN + (engine_execute_model, reference_make_execute_model),
                     keep=("make_execute_model", make_execute_model), explain=_where_steps)


# ---------------------------------------------------------------- the assembled engine


@functools.lru_cache(maxsize=1)
def _your_engine_cases() -> tuple[Case, ...]:
    cases = []
    for w in WORKLOADS + [SMOL_SHAPED, WIDE_TINY]:
        eos = tuple(eos_for(w))
        outputs, _ = engine_outputs(w, eos)
        reqs = ", ".join(f"{s}: prompt {p}, max_tokens {m}" for s, p, m in w.requests)
        show = (f"{w.why}. On {describe_model(w.model())}; "
                f"num_blocks={w.num_blocks}, block_size={w.block_size}, token_budget={w.token_budget}, "
                f"max_num_seqs={w.max_num_seqs}, eos_token_ids={eos}; requests {reqs}")
        cases.append(Case((w, eos), outputs, show))
    return tuple(cases)


def _play(serve, w, eos) -> dict:
    requests = [Request(s, tiny_prompt(s, p), m) for s, p, m in w.requests]
    with paused():  # building the model runs DecoderLayer's and Attention's constructors
        model = w.model()
    serve(model, requests, w.num_blocks, w.block_size, w.token_budget, w.max_num_seqs, list(eos))
    return {r.seq_id: list(r.output_ids) for r in requests}


def check_your_engine(serve) -> bool:
    """serve(model, requests, num_blocks, block_size, token_budget, max_num_seqs,
    eos_token_ids) -> steps, filling each request's output_ids; greedy tokens
    against tinyinfer's Scheduler + ModelRunner on a tiny random model."""
    return run_check("your_engine", lambda w, eos: _play(serve, w, eos), lambda: list(_your_engine_cases()),
                     forbidden=FORBIDDEN, explain=_where_tokens)


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


LAB = Lab(11, "your engine",
          exports=("check_forward_pass", "reference_make_execute_model", "check_your_engine", "compare_outputs"),
          pieces={"make_execute_model": "reference_make_execute_model"},
          fallbacks={"check_forward_pass": reference_make_execute_model})
