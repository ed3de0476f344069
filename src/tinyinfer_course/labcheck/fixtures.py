"""What several labs' checks share: the tiny random model, lab 7's workloads,
and the adapters that run tinyinfer's own engine parts behind the labs'
interfaces, which is where those checks' expected values come from.

The adapters (EngineAllocator, engine_schedule_trace, engine_outputs) are the
only labcheck code that knows the engine's BlockManager, Scheduler and
SchedulerOutput; when those change, these change with them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from tinyinfer.block_manager import BlockManager
from tinyinfer.config import ModelConfig
from tinyinfer.model import LlamaForCausalLM
from tinyinfer.model_runner import ModelRunner
from tinyinfer.request import Request
from tinyinfer.sampling import SamplerOutput, SamplingParams
from tinyinfer.scheduler import Scheduler, SchedulerConfig
from tinyinfer.sequence import Sequence

# ---------------------------------------------------------------- the tiny model


def tiny_model(seed: int = 0, init_std: float | None = None, max_position_embeddings: int = 256):
    """A 2-layer Llama with random weights (seeded), grouped-query (4 query
    heads, 2 KV heads of 16): small enough for a check. init_std spreads the
    weights wider than the default init, so every number matters."""
    config = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=max_position_embeddings)
    with torch.random.fork_rng(devices=[]):  # the notebook's own random state is left alone
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
        if init_std is not None:
            for p in model.parameters():
                torch.nn.init.normal_(p, std=init_std)
    return model


def smol_shaped_model(seed: int = 0, init_std: float = 0.3):
    """A 2-layer Llama with random weights and SmolLM2-135M's attention: 9 query
    heads, 3 KV heads of 64, RoPE base 1e5 (tiny_model has 4, 2, 16 and 1e4),
    but a narrow residual stream and vocabulary, so a check on it stays fast.
    A forward pass that writes one of these constants as a literal fails on
    one of the two models."""
    config = ModelConfig(vocab_size=97, hidden_size=96, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=256,
                         rope_theta=100000.0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
        for p in model.parameters():  # wide enough that a wrong RoPE base or scale moves the greedy tokens
            torch.nn.init.normal_(p, std=init_std)
    return model


def describe_model(model) -> str:
    c = model.config
    return (f"a random {c.num_hidden_layers}-layer model ({c.num_attention_heads} query heads, "
            f"{c.num_key_value_heads} K/V heads, head_dim {c.head_dim}, rope_theta {c.rope_theta:g})")


# ---------------------------------------------------------------- lab 7: the block allocator


class EngineAllocator:
    """tinyinfer's BlockManager (prefix cache off) behind lab 7's allocator
    interface: where check_block_allocator's expected states come from. The
    engine's sequences carry their own block tables; this keeps one Sequence
    per lab seq_id, whose num_computed_tokens is the lab's num_tokens."""

    def __init__(self, num_blocks: int, block_size: int):
        self.bm = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
        self.block_size = block_size
        self.seqs: dict[str, Sequence] = {}  # the lab's seq_id -> the engine's sequence

    ref_count = property(lambda self: [b.ref_count for b in self.bm.blocks])
    free_blocks = property(lambda self: list(self.bm.free_block_ids))
    block_tables = property(lambda self: {sid: s.block_table for sid, s in self.seqs.items()})
    num_tokens = property(lambda self: {sid: s.num_computed_tokens for sid, s in self.seqs.items()})

    def allocate(self, seq_id, num_tokens):
        seq = Request(seq_id, None, [0] * num_tokens, SamplingParams()).samples[0]
        self.bm.allocate(seq, num_tokens)
        seq.num_computed_tokens = num_tokens  # what its blocks hold
        self.seqs[seq_id] = seq

    def append(self, seq_id):
        seq = self.seqs[seq_id]
        copies = self.bm.append_slots(seq, seq.num_computed_tokens + 1)
        seq.num_computed_tokens += 1
        return copies[0] if copies else None

    def fork(self, parent_id, child_id):
        parent = self.seqs[parent_id]
        child = parent.fork(1)
        self.bm.fork(parent, child)
        self.seqs[child_id] = child

    def free(self, seq_id):
        self.bm.free(self.seqs.pop(seq_id))


# ---------------------------------------------------------------- lab 7: a scheduler step


@dataclass
class Scenario:
    """Scripted arrivals for check_schedule."""

    num_blocks: int
    block_size: int
    token_budget: int
    max_num_seqs: int
    requests: list[tuple[str, int, int, int]]  # (seq_id, prompt length, max_tokens, arrives before step)
    num_steps: int
    why: str


def scenario_prompt(seq_id: str, length: int) -> list[int]:
    return [100 * (ord(seq_id[0]) - 96) + i for i in range(length)]


def step_record(scheduled, preempted, running, waiting, free_blocks) -> dict:
    """One step as check_schedule compares it: who ran with how many tokens, who
    was preempted, the queues and the free blocks (requests by seq_id)."""
    return {"scheduled": [(r.seq_id, n) for r, n in scheduled], "preempted": [r.seq_id for r in preempted],
            "running": [r.seq_id for r in running], "waiting": [r.seq_id for r in waiting],
            "free_blocks": free_blocks}


def engine_schedule_trace(sc: Scenario) -> list[dict]:
    """The scenario through tinyinfer's Scheduler and BlockManager: every step's
    record, each step followed by sampling token 1 for whoever reached its end."""
    bm = BlockManager(sc.num_blocks, sc.block_size, enable_prefix_caching=False)
    sched = Scheduler(SchedulerConfig(sc.max_num_seqs, sc.token_budget, True, "recompute"), bm)
    trace = []
    for k in range(sc.num_steps):
        for s, p, m, at in sc.requests:
            if at == k:
                sched.add(Request(s, None, scenario_prompt(s, p), SamplingParams(max_tokens=m, temperature=0.0,
                                                                                 ignore_eos=True)))
        out = sched.schedule()
        scheduled = [(entry.seq, entry.num_new_tokens) for entry in out.scheduled]
        trace.append({"step": k, **step_record(scheduled, out.preempted, sched.running, sched.waiting,
                                               bm.num_free_blocks)})
        n = len(out.sampling)
        sched.update_from_output(out, SamplerOutput(token_ids=[1] * n, logprobs=[None] * n))
    return trace


# ---------------------------------------------------------------- labs 7 and 11: serving a workload


@dataclass
class Workload:
    num_blocks: int
    block_size: int
    token_budget: int
    max_num_seqs: int
    requests: list[tuple[str, int, int]]  # (seq_id, prompt length, max_tokens)
    eos: bool  # pick an end-of-sequence id that some request produces
    why: str
    model: Callable = tiny_model  # the random model it runs on


WORKLOADS = [
    Workload(64, 4, 16, 3, [("a", 5, 6), ("b", 19, 4), ("c", 3, 8), ("d", 11, 1), ("e", 7, 5)], True,
             "token budget 16, at most 3 running: chunked prompts, a one-token reply, an end-of-sequence id"),
    Workload(9, 4, 32, 4, [("a", 6, 10), ("b", 6, 10), ("c", 5, 9), ("d", 3, 6)], False,
             "9 blocks of 4: requests are preempted and recomputed"),
]


def wide_tiny_model(seed: int = 0):
    """tiny_model with weights spread wide (std 0.5): attention, and so RoPE's
    base and the score scale, then decide greedy tokens, not just logits."""
    return tiny_model(seed, init_std=0.5)


# Lab 11's checks also serve a workload on a model with SmolLM2's heads, head
# size and RoPE base, and (for the engine, whose check sees greedy tokens only)
# on the tiny model with wide weights: a constant written as a literal changes
# the tokens on one of them.
_SHORT = [("a", 9, 5), ("b", 14, 4), ("c", 5, 6)]
SMOL_SHAPED = Workload(32, 4, 16, 3, _SHORT, False, "SmolLM2's attention shape (9 query heads, 3 K/V heads of 64, "
                       "RoPE base 1e5): a chunked prompt and decodes", smol_shaped_model)
WIDE_TINY = Workload(32, 4, 16, 3, _SHORT, False, "the tiny model with wide weights, where attention decides the "
                     "greedy tokens: a chunked prompt and decodes", wide_tiny_model)


def tiny_prompt(seq_id: str, length: int) -> list[int]:
    g = torch.Generator().manual_seed(ord(seq_id[0]) * 31 + length)
    return torch.randint(0, 97, (length,), generator=g).tolist()


def engine_outputs(w: Workload, eos_token_ids) -> tuple[dict, int]:
    """Greedy outputs and step count of tinyinfer's own Scheduler, BlockManager
    and ModelRunner on the workload (LLMEngine.step without the tokenizer)."""
    bm = BlockManager(w.num_blocks, w.block_size, enable_prefix_caching=False)
    sched = Scheduler(SchedulerConfig(w.max_num_seqs, w.token_budget, True, "recompute"), bm)
    runner = ModelRunner(w.model(), torch.device("cpu"), torch.float32, w.num_blocks, w.block_size)
    requests = [Request(s, None, tiny_prompt(s, p), SamplingParams(max_tokens=m, temperature=0.0), eos_token_ids)
                for s, p, m in w.requests]
    for request in requests:
        sched.add(request)
    steps = 0
    while sched.waiting or sched.running:
        out = sched.schedule()
        logits = runner.execute_model(out).logits
        tokens = [int(row.argmax()) for row in logits]
        sched.update_from_output(out, SamplerOutput(token_ids=tokens, logprobs=[None] * len(tokens)))
        steps += 1
    return {r.request_id: r.samples[0].output_token_ids for r in requests}, steps


def eos_for(w: Workload) -> list[int]:
    """An id that request a produces as its third token (so it stops early), or none."""
    if not w.eos:
        return []
    outputs, _ = engine_outputs(w, [])
    return [outputs["a"][2]]

