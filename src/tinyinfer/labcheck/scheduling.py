"""Lab 7 (batching and scheduling): checks for a scheduler step, chained prefix
hashes and the continuous-batching loop, each against tinyinfer's own engine.

The lab works on a small request record (Request) and a step result (Step),
simpler than the engine's Sequence and SchedulerOutput but with the same
meaning, so every expected value here comes from running tinyinfer's
Scheduler, BlockManager and ModelRunner on the same scenario:
- check_schedule replays scripted arrivals step by step and compares, after
  every step, who ran, with how many tokens, who was preempted, the queues and
  the free blocks;
- check_prefix_hashes compares which full blocks get equal hashes (any hash
  function passes, as long as two blocks hash alike exactly when the prefixes
  that end with them are equal: the engine's rule);
- check_run_engine serves two small workloads on a tiny random model and
  compares every request's greedy tokens and the number of steps.
"""
from __future__ import annotations

import functools
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from .batching import ReferenceBlockAllocator, _keep
from .core import Case, _report

# ---------------------------------------------------------------- the lab's records


@dataclass
class Request:
    """One request as lab 7's scheduler and loop see it."""

    seq_id: str
    prompt_ids: list[int]
    max_tokens: int  # stop after this many output tokens
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose keys and values are in the KV cache
    token_times: list[float] = field(default_factory=list)  # time.perf_counter() of each output token

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)


@dataclass
class Step:
    """What one scheduler step decided."""

    scheduled: list[tuple[Request, int]] = field(default_factory=list)  # (request, new tokens this step)
    preempted: list[Request] = field(default_factory=list)


# ---------------------------------------------------------------- references


def _blocks_to_grow(allocator, seq_id: str, num_tokens: int) -> int:
    """Free blocks the sequence needs so that its table holds num_tokens tokens."""
    return -(-num_tokens // allocator.block_size) - len(allocator.block_tables[seq_id])


def reference_schedule(waiting: deque, running: list, allocator, token_budget: int, max_num_seqs: int) -> Step:
    """The course's answer to lab 7's schedule exercise (tinyinfer.scheduler's
    policy: chunked prefill, recompute preemption, no prefix cache)."""
    step = Step()
    budget = token_budget
    # 1. running requests, oldest first
    i = 0
    while i < len(running) and budget > 0:
        req = running[i]
        n = min(req.num_tokens - req.num_computed, budget)
        if n == 0:
            break
        while _blocks_to_grow(allocator, req.seq_id, req.num_computed + n) > len(allocator.free_blocks):
            victim = running.pop()  # the newest pays
            allocator.free(victim.seq_id)
            victim.num_computed = 0
            waiting.appendleft(victim)
            step.preempted.append(victim)
            if victim is req:
                break
        if step.preempted and step.preempted[-1] is req:
            break
        for _ in range(req.num_computed + n - allocator.num_tokens[req.seq_id]):
            allocator.append(req.seq_id)
        step.scheduled.append((req, n))
        budget -= n
        i += 1
    if step.preempted:  # the pool is full: admit nobody this step
        return step
    # 2. waiting requests, first come first served
    while waiting and budget > 0 and len(running) < max_num_seqs:
        req = waiting[0]
        n = min(req.num_tokens, budget)
        if -(-n // allocator.block_size) > len(allocator.free_blocks):
            break  # nobody overtakes the head of the queue
        waiting.popleft()
        allocator.allocate(req.seq_id, n)
        running.append(req)
        step.scheduled.append((req, n))
        budget -= n
    return step


def reference_prefix_hashes(token_ids: list[int], block_size: int) -> list[int]:
    """The course's answer to lab 7's prefix_hashes exercise: one hash per full
    block, each chained to the one before (tinyinfer.block_manager's rule)."""
    hashes, parent = [], None
    for i in range(len(token_ids) // block_size):
        parent = hash((parent, tuple(token_ids[i * block_size : (i + 1) * block_size])))
        hashes.append(parent)
    return hashes


def reference_run_engine(requests: list[Request], allocator, schedule, execute_model, sample,
                         token_budget: int, max_num_seqs: int, eos_token_ids) -> int:
    """The course's answer to lab 7's run_engine exercise; returns the number of steps."""
    waiting, running = deque(requests), []
    num_steps = 0
    while waiting or running:
        step = schedule(waiting, running, allocator, token_budget, max_num_seqs)
        logits = execute_model(step.scheduled, allocator)
        num_steps += 1
        now = time.perf_counter()
        for req, n in step.scheduled:
            req.num_computed += n
            if req.seq_id not in logits:  # a prompt chunk that is not the last
                continue
            token = sample(logits[req.seq_id], 0.0, None)
            req.output_ids.append(token)
            req.token_times.append(now)
            if token in eos_token_ids or len(req.output_ids) >= req.max_tokens:
                allocator.free(req.seq_id)
                running.remove(req)
    return num_steps


# ---------------------------------------------------------------- the model step (given code)


def make_execute_model(model, num_blocks: int, block_size: int):
    """execute_model(scheduled, allocator) -> {seq_id: logits [V]} for one step:
    the scheduled requests' new tokens packed into one row, run through `model`
    (a tinyinfer LlamaForCausalLM) with a paged KV cache addressed through the
    allocator's block tables. Only requests that reach their last known token
    get logits (a prompt chunk that is not the last has nothing to sample)."""
    from ..paged_kv_cache import PagedAttentionMetadata, PagedKVCache

    dtype = next(model.parameters()).dtype
    device = next(model.parameters()).device
    cache = PagedKVCache(model.config, num_blocks, block_size, dtype, device)

    def execute_model(scheduled, allocator) -> dict:
        with torch.inference_mode():
            return _execute(scheduled, allocator)

    def _execute(scheduled, allocator) -> dict:
        ids, query_lens, context_lens, tables = [], [], [], []
        for req, n in scheduled:
            start = req.num_computed
            ids += req.token_ids[start : start + n]  # only the tokens not yet in the cache
            query_lens.append(n)
            context_lens.append(start + n)
            tables.append(allocator.block_tables[req.seq_id])
        if not ids:
            return {}
        meta = PagedAttentionMetadata.build(query_lens, context_lens, tables, block_size, device)
        hidden = model(torch.tensor([ids], device=device), meta.positions, cache, meta)[0]  # [N, C]
        ends = torch.tensor(query_lens).cumsum(0) - 1  # each request's last new token
        rows = [b for b, (req, n) in enumerate(scheduled) if req.num_computed + n == req.num_tokens]
        logits = model.compute_logits(hidden[ends[rows].to(device)]) if rows else []
        return {scheduled[b][0].seq_id: logits[i] for i, b in enumerate(rows)}

    return execute_model


def greedy(logits: torch.Tensor, temperature: float = 0.0, generator=None) -> int:
    """The sampler the check hands run_engine: the highest score."""
    return int(logits.argmax())


# ---------------------------------------------------------------- check: schedule


@dataclass
class _Scenario:
    num_blocks: int
    block_size: int
    token_budget: int
    max_num_seqs: int
    requests: list[tuple[str, int, int, int]]  # (seq_id, prompt length, max_tokens, arrives before step)
    num_steps: int
    why: str


_SCENARIOS = [
    _Scenario(64, 4, 8, 4, [("a", 5, 3, 0), ("b", 12, 2, 0), ("c", 3, 2, 1)], 4,
              "a token budget of 8: b's prompt is cut into chunks"),
    _Scenario(4, 4, 64, 8, [("a", 10, 4, 0), ("b", 6, 2, 0), ("c", 2, 2, 1)], 6,
              "4 blocks of 4: b waits for free blocks, and c may not overtake it"),
    _Scenario(64, 4, 64, 2, [("a", 3, 3, 0), ("b", 4, 2, 0), ("c", 2, 2, 0)], 4,
              "max_num_seqs=2: c waits for a place"),
    _Scenario(6, 2, 32, 4, [("a", 3, 6, 0), ("b", 3, 6, 0), ("c", 3, 6, 0)], 12,
              "6 blocks of 2: growing requests run out of blocks and the newest is preempted"),
    _Scenario(5, 4, 6, 4, [("a", 9, 4, 0), ("b", 7, 3, 0), ("c", 4, 2, 2)], 9,
              "budget 6 and 5 blocks of 4: chunks, preemption and recompute together"),
]


def _prompt(seq_id: str, length: int) -> list[int]:
    return [100 * (ord(seq_id[0]) - 96) + i for i in range(length)]


def _record(scheduled, preempted, running, waiting, free_blocks) -> dict:
    return {"scheduled": [(r.seq_id, n) for r, n in scheduled], "preempted": [r.seq_id for r in preempted],
            "running": [r.seq_id for r in running], "waiting": [r.seq_id for r in waiting],
            "free_blocks": free_blocks}


def _play_schedule(schedule, sc: _Scenario, num_steps: int) -> dict:
    """Run the learner's schedule for num_steps steps (each followed by the
    loop's bookkeeping: count the computed tokens, sample token 1 where a
    request reached its end, finish at max_tokens); the record of the last step."""
    allocator = ReferenceBlockAllocator(sc.num_blocks, sc.block_size)
    waiting, running = deque(), []
    record = None
    for k in range(num_steps):
        waiting.extend(Request(s, _prompt(s, p), m) for s, p, m, at in sc.requests if at == k)
        try:
            step = schedule(waiting, running, allocator, sc.token_budget, sc.max_num_seqs)
        except RuntimeError as e:
            if isinstance(e, NotImplementedError):
                raise
            return {"step": k, "raised": f"RuntimeError: {e}"}
        record = {"step": k, **_record(step.scheduled, step.preempted, running, waiting,
                                        len(allocator.free_blocks))}
        for req, n in step.scheduled:
            req.num_computed += n
            if req.num_computed == req.num_tokens:
                req.output_ids.append(1)
                if len(req.output_ids) >= req.max_tokens:
                    allocator.free(req.seq_id)
                    running.remove(req)
    return record


def _engine_schedule_trace(sc: _Scenario) -> list[dict]:
    """The same scenario through tinyinfer's Scheduler and BlockManager."""
    from ..block_manager import BlockManager
    from ..request import Request
    from ..sampling import SamplerOutput, SamplingParams
    from ..scheduler import Scheduler, SchedulerConfig

    bm = BlockManager(sc.num_blocks, sc.block_size, enable_prefix_caching=False)
    sched = Scheduler(SchedulerConfig(sc.max_num_seqs, sc.token_budget, True, "recompute"), bm)
    trace = []
    for k in range(sc.num_steps):
        for s, p, m, at in sc.requests:
            if at == k:
                sched.add(Request(s, None, _prompt(s, p), SamplingParams(max_tokens=m, temperature=0.0,
                                                                          ignore_eos=True)))
        out = sched.schedule()
        scheduled = [(e.seq, e.num_new_tokens) for e in out.scheduled]
        trace.append({"step": k, **_record(scheduled, out.preempted, sched.running, sched.waiting,
                                            bm.num_free_blocks)})
        sched.update_from_output(out, SamplerOutput([1] * len(out.sampling), [None] * len(out.sampling)))
    return trace


def _describe_scenario(sc: _Scenario) -> str:
    reqs = ", ".join(f"{s}: prompt {p}, max_tokens {m}" + (f", arrives before step {at}" if at else "")
                     for s, p, m, at in sc.requests)
    return (f"{sc.why}. BlockAllocator({sc.num_blocks}, block_size={sc.block_size}), token_budget="
            f"{sc.token_budget}, max_num_seqs={sc.max_num_seqs}; requests {reqs}")


def _schedule_cases() -> list[Case]:
    cases = []
    for sc in _SCENARIOS:
        for k, expected in enumerate(_engine_schedule_trace(sc)):
            cases.append(Case((sc, k + 1), expected, f"{_describe_scenario(sc)}\n    -> step {k}"))
    return cases


def check_schedule(schedule) -> bool:
    """schedule(waiting, running, allocator, token_budget, max_num_seqs) -> Step,
    step by step against tinyinfer's Scheduler on the same scripted arrivals."""
    from ..block_manager import BlockManager
    from ..scheduler import Scheduler

    ok = _report("schedule", lambda sc, k: _play_schedule(schedule, sc, k), _schedule_cases,
                 forbidden=(reference_schedule, Scheduler, BlockManager))
    return _keep(ok, "schedule", schedule)


# ---------------------------------------------------------------- check: prefix hashes


def _rename(hash_lists: list[list]) -> list[list[int]]:
    """Hashes renamed 0, 1, 2... in order of first appearance: only which blocks
    hash alike is compared, not the hash function."""
    names: dict = {}
    return [[names.setdefault(h, len(names)) for h in hashes] for hashes in hash_lists]


def _engine_hashes(token_ids: list[int], block_size: int) -> list[int]:
    from ..block_manager import BlockManager

    hashes, parent = [], None
    for i in range(len(token_ids) // block_size):
        parent = BlockManager.hash_block(parent, token_ids[i * block_size : (i + 1) * block_size])
        hashes.append(parent)
    return hashes


_SYSTEM = [7, 7, 3, 9, 1, 4, 4, 8]  # a shared "system prompt" of 8 tokens
_PREFIX_CASES = [  # (token lists, block_size, what the case is for)
    ([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]], 4, "10 tokens in blocks of 4: two full blocks, the partial third has no hash"),
    ([[5, 6, 7, 8, 9, 10, 11, 12]], 4, "8 tokens: exactly two full blocks"),
    ([[1, 2, 3]], 4, "fewer tokens than one block: no hashes"),
    ([_SYSTEM + [20, 21, 22, 23], _SYSTEM + [30, 31, 32, 33, 34]], 4,
     "two prompts with the same 8-token start: their first two blocks hash alike, the third differs"),
    ([[1, 2, 3, 4, 1, 2, 3, 4]], 4, "the same four tokens twice: different prefixes, so different hashes"),
    ([[1, 2, 3, 4, 9, 9, 9, 9], [5, 6, 7, 8, 9, 9, 9, 9]], 4,
     "equal second blocks after different first blocks: the second hashes must differ too"),
    ([[3, 1, 4, 1, 5], [3, 1, 4, 1, 6], [3, 1, 4, 2]], 1, "block_size 1: one hash per token"),
    ([[1, 2, 3, 4, 5, 6], [1, 2, 4, 3, 5, 6]], 2, "the same tokens in another order are another prefix"),
]


def _prefix_cases() -> list[Case]:
    cases = []
    for lists, bs, why in _PREFIX_CASES:
        shown = ", ".join(str(t) for t in lists)
        cases.append(Case((lists, bs), _rename([_engine_hashes(t, bs) for t in lists]),
                          f"token lists {shown}, block_size={bs}  ({why}); hashes renamed 0, 1, 2... "
                          "in order of first appearance"))
    return cases


def check_prefix_hashes(prefix_hashes) -> bool:
    """prefix_hashes(token_ids, block_size) -> one hash per full block, chained:
    equal exactly when the whole prefix up to that block's end is equal (the
    structure of tinyinfer.block_manager's hashes; the hash function is yours)."""
    from ..block_manager import BlockManager

    ok = _report("prefix_hashes", lambda lists, bs: _rename([prefix_hashes(list(t), bs) for t in lists]),
                 _prefix_cases, forbidden=(reference_prefix_hashes, BlockManager))
    return _keep(ok, "prefix_hashes", prefix_hashes)


# ---------------------------------------------------------------- check: run_engine

MAX_STEPS = 400  # a loop that runs longer than this never ends


class _Stopped(Exception):
    """The learner's loop went wrong in a way that the check reports as its result."""


_TINY_MODEL = None


def tiny_model():
    """A 2-layer Llama with random weights (seeded): small enough for a check."""
    global _TINY_MODEL
    if _TINY_MODEL is None:
        from ..config import ModelConfig
        from ..model import LlamaForCausalLM

        config = ModelConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                             max_position_embeddings=256)
        with torch.random.fork_rng():
            torch.manual_seed(0)
            _TINY_MODEL = LlamaForCausalLM(config).eval()
    return _TINY_MODEL


@dataclass
class _Workload:
    num_blocks: int
    block_size: int
    token_budget: int
    max_num_seqs: int
    requests: list[tuple[str, int, int]]  # (seq_id, prompt length, max_tokens)
    eos: bool  # pick an end-of-sequence id that some request produces
    why: str


_WORKLOADS = [
    _Workload(64, 4, 16, 3, [("a", 5, 6), ("b", 19, 4), ("c", 3, 8), ("d", 11, 1), ("e", 7, 5)], True,
              "token budget 16, at most 3 running: chunked prompts, a one-token reply, an end-of-sequence id"),
    _Workload(9, 4, 32, 4, [("a", 6, 10), ("b", 6, 10), ("c", 5, 9), ("d", 3, 6)], False,
              "9 blocks of 4: requests are preempted and recomputed"),
]


def _tiny_prompt(seq_id: str, length: int) -> list[int]:
    g = torch.Generator().manual_seed(ord(seq_id[0]) * 31 + length)
    return torch.randint(0, 97, (length,), generator=g).tolist()


def _engine_outputs(w: _Workload, eos_token_ids) -> tuple[dict, int]:
    """Greedy outputs and step count of tinyinfer's own Scheduler, BlockManager
    and ModelRunner on the workload (LLMEngine.step without the tokenizer)."""
    from ..block_manager import BlockManager
    from ..model_runner import ModelRunner
    from ..request import Request
    from ..sampling import SamplerOutput, SamplingParams
    from ..scheduler import Scheduler, SchedulerConfig

    model = tiny_model()
    bm = BlockManager(w.num_blocks, w.block_size, enable_prefix_caching=False)
    sched = Scheduler(SchedulerConfig(w.max_num_seqs, w.token_budget, True, "recompute"), bm)
    runner = ModelRunner(model, torch.device("cpu"), torch.float32, w.num_blocks, w.block_size)
    requests = [Request(s, None, _tiny_prompt(s, p), SamplingParams(max_tokens=m, temperature=0.0), eos_token_ids)
                for s, p, m in w.requests]
    for request in requests:
        sched.add(request)
    steps = 0
    while sched.waiting or sched.running:
        out = sched.schedule()
        logits = runner.execute_model(out).logits
        tokens = [int(row.argmax()) for row in logits]
        sched.update_from_output(out, SamplerOutput(tokens, [None] * len(tokens)))
        steps += 1
    return {r.request_id: r.samples[0].output_token_ids for r in requests}, steps


def _eos_for(w: _Workload) -> list[int]:
    """An id that request a produces as its third token (so it stops early), or none."""
    if not w.eos:
        return []
    outputs, _ = _engine_outputs(w, [])
    return [outputs["a"][2]]


def _play_engine(run_engine, w: _Workload, eos_token_ids: list[int]) -> dict:
    allocator = ReferenceBlockAllocator(w.num_blocks, w.block_size)
    requests = [Request(s, _tiny_prompt(s, p), m) for s, p, m in w.requests]
    calls = [0]

    def counted_schedule(*args):  # the course's schedule: only the loop is checked here
        calls[0] += 1
        if calls[0] > MAX_STEPS:
            raise _Stopped(f"still running after {MAX_STEPS} steps (does every finished request leave `running`?)")
        try:
            return reference_schedule(*args)
        except Exception as e:  # the loop handed the scheduler a state it cannot be in
            raise _Stopped(f"the scheduler failed at step {calls[0]} ({type(e).__name__}: {e}): is a finished "
                           "request still in `running`, or a freed one still scheduled?") from e

    execute_model = make_execute_model(tiny_model(), w.num_blocks, w.block_size)
    try:
        steps = run_engine(requests, allocator, counted_schedule, execute_model, greedy,
                           w.token_budget, w.max_num_seqs, eos_token_ids)
    except _Stopped as e:
        steps = str(e)
    return _engine_result({r.seq_id: r.output_ids for r in requests}, steps, len(allocator.free_blocks),
                          {r.seq_id: len(r.token_times) for r in requests})


def _engine_result(outputs, steps, free_blocks, times) -> dict:
    return {"outputs": outputs, "steps": steps, "free blocks at the end": free_blocks,
            "token_times per request": times}


@functools.lru_cache(maxsize=1)
def _run_engine_cases_cached() -> tuple[Case, ...]:
    return tuple(_run_engine_cases())


def _run_engine_cases() -> list[Case]:
    cases = []
    for w in _WORKLOADS:
        eos = tuple(_eos_for(w))
        outputs, steps = _engine_outputs(w, eos)
        expected = _engine_result(outputs, steps, w.num_blocks, {s: len(o) for s, o in outputs.items()})
        reqs = ", ".join(f"{s}: prompt {p}, max_tokens {m}" for s, p, m in w.requests)
        show = (f"{w.why}. A tiny random 2-layer model; BlockAllocator({w.num_blocks}, block_size="
                f"{w.block_size}), token_budget={w.token_budget}, max_num_seqs={w.max_num_seqs}, "
                f"eos_token_ids={eos}; requests {reqs}")
        cases.append(Case((w, eos), expected, show))
    return cases


def check_run_engine(run_engine) -> bool:
    """run_engine(requests, allocator, schedule, execute_model, sample, token_budget,
    max_num_seqs, eos_token_ids) -> number of steps; every request's greedy
    tokens and the step count against tinyinfer's Scheduler + ModelRunner."""
    from ..block_manager import BlockManager
    from ..llm import LLM
    from ..llm_engine import LLMEngine
    from ..model_runner import ModelRunner
    from ..scheduler import Scheduler

    ok = _report("run_engine", lambda w, eos: _play_engine(run_engine, w, eos),
                 lambda: list(_run_engine_cases_cached()),
                 forbidden=(reference_run_engine, LLMEngine, LLM, Scheduler, ModelRunner, BlockManager))
    return _keep(ok, "run_engine", run_engine)
