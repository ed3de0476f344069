"""Lab 7 (batching and scheduling): checks for a scheduler step, chained prefix
hashes and the continuous-batching loop, each against tinyinfer's own engine.

The lab works on a small request record (Request) and a step result (Step),
simpler than the engine's Sequence and SchedulerOutput but with the same
meaning (records.py), so every expected value here comes from running
tinyinfer's Scheduler, BlockManager and ModelRunner on the same scenario
(fixtures.py):
- check_schedule replays scripted arrivals step by step and compares, after
  every step, who ran, with how many tokens, who was preempted, the queues and
  the free blocks;
- check_prefix_hashes compares which full blocks get equal hashes (any hash
  function passes, as long as two blocks hash alike exactly when the prefixes
  that end with them are equal: the engine's rule);
- check_run_engine serves two small workloads on a tiny random model and
  compares every request's greedy tokens and the number of steps.

The course's answers are in scheduling_answers.py, the model step and sampler
the loop is handed in given.py.
"""
from __future__ import annotations

import functools
from collections import deque

from tinyinfer.block_manager import BlockManager
from tinyinfer.llm import LLM
from tinyinfer.llm_engine import LLMEngine
from tinyinfer.model_runner import ModelRunner
from tinyinfer.scheduler import Scheduler
from .batching import ReferenceBlockAllocator
from .core import Case, run_check
from .fixtures import (WORKLOADS, Scenario, Workload, engine_outputs, engine_schedule_trace, eos_for, scenario_prompt,
                       step_record, tiny_model, tiny_prompt)
from .given import greedy, make_execute_model
from .records import Request, Step  # noqa: F401  (Step: exported, see LAB)
from .registry import Lab
from .scheduling_answers import reference_prefix_hashes, reference_run_engine, reference_schedule
from .watch import paused, pausing


# ---------------------------------------------------------------- check: schedule

_SCENARIOS = [
    Scenario(64, 4, 8, 4, [("a", 5, 3, 0), ("b", 12, 2, 0), ("c", 3, 2, 1)], 4,
             "a token budget of 8: b's prompt is cut into chunks"),
    Scenario(4, 4, 64, 8, [("a", 10, 4, 0), ("b", 6, 2, 0), ("c", 2, 2, 1)], 6,
             "4 blocks of 4: b waits for free blocks, and c may not overtake it"),
    Scenario(64, 4, 64, 2, [("a", 3, 3, 0), ("b", 4, 2, 0), ("c", 2, 2, 0)], 4,
             "max_num_seqs=2: c waits for a place"),
    Scenario(6, 2, 32, 4, [("a", 3, 6, 0), ("b", 3, 6, 0), ("c", 3, 6, 0)], 12,
             "6 blocks of 2: growing requests run out of blocks and the newest is preempted"),
    Scenario(5, 4, 6, 4, [("a", 9, 4, 0), ("b", 7, 3, 0), ("c", 4, 2, 2)], 9,
             "budget 6 and 5 blocks of 4: chunks, preemption and recompute together"),
]


def _play_schedule(schedule, sc: Scenario, num_steps: int) -> dict:
    """Run the learner's schedule for num_steps steps (each followed by the
    loop's bookkeeping: count the computed tokens, sample token 1 where a
    request reached its end, finish at max_tokens); the record of the last step."""
    allocator = ReferenceBlockAllocator(sc.num_blocks, sc.block_size)
    waiting, running = deque(), []
    record = None
    for k in range(num_steps):
        waiting.extend(Request(s, scenario_prompt(s, p), m) for s, p, m, at in sc.requests if at == k)
        try:
            step = schedule(waiting, running, allocator, sc.token_budget, sc.max_num_seqs)
        except RuntimeError as e:
            if isinstance(e, NotImplementedError):
                raise
            return {"step": k, "raised": f"RuntimeError: {e}"}
        record = {"step": k, **step_record(step.scheduled, step.preempted, running, waiting,
                                           len(allocator.free_blocks))}
        for req, n in step.scheduled:
            req.num_computed += n
            if req.num_computed == req.num_tokens:
                req.output_ids.append(1)
                if len(req.output_ids) >= req.max_tokens:
                    allocator.free(req.seq_id)
                    running.remove(req)
    return record


def _describe_scenario(sc: Scenario) -> str:
    reqs = ", ".join(f"{s}: prompt {p}, max_tokens {m}" + (f", arrives before step {at}" if at else "")
                     for s, p, m, at in sc.requests)
    return (f"{sc.why}. BlockAllocator({sc.num_blocks}, block_size={sc.block_size}), token_budget="
            f"{sc.token_budget}, max_num_seqs={sc.max_num_seqs}; requests {reqs}")


def _schedule_cases() -> list[Case]:
    cases = []
    for sc in _SCENARIOS:
        for k, expected in enumerate(engine_schedule_trace(sc)):
            cases.append(Case((sc, k + 1), expected, f"{_describe_scenario(sc)}\n    -> step {k}"))
    return cases


def check_schedule(schedule) -> bool:
    """schedule(waiting, running, allocator, token_budget, max_num_seqs) -> Step,
    step by step against tinyinfer's Scheduler on the same scripted arrivals."""
    return run_check("schedule", lambda sc, k: _play_schedule(schedule, sc, k), _schedule_cases,
                     forbidden=(reference_schedule, Scheduler, BlockManager), keep=("schedule", schedule))


# ---------------------------------------------------------------- check: prefix hashes


def _rename(hash_lists: list[list]) -> list[list[int]]:
    """Hashes renamed 0, 1, 2... in order of first appearance: only which blocks
    hash alike is compared, not the hash function."""
    names: dict = {}
    return [[names.setdefault(h, len(names)) for h in hashes] for hashes in hash_lists]


def _engine_hashes(token_ids: list[int], block_size: int) -> list[int]:
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
    return run_check("prefix_hashes", lambda lists, bs: _rename([prefix_hashes(list(t), bs) for t in lists]),
                     _prefix_cases, forbidden=(reference_prefix_hashes, BlockManager),
                     keep=("prefix_hashes", prefix_hashes))


# ---------------------------------------------------------------- check: run_engine

MAX_STEPS = 400  # a loop that runs longer than this never ends


class _Stopped(Exception):
    """The learner's loop went wrong in a way that the check reports as its result."""


def _play_engine(run_engine, w: Workload, eos_token_ids: list[int]) -> dict:
    allocator = ReferenceBlockAllocator(w.num_blocks, w.block_size)
    # Each request has its own temperature and seed; the check's sampler stays
    # greedy (so the tokens are the engine's) and notes what it was handed.
    requests = [Request(s, tiny_prompt(s, p), m, temperature=0.5 + k / 8, seed=100 + k)
                for k, (s, p, m) in enumerate(w.requests)]
    settings = {r.temperature: r.generator for r in requests}
    handed = []

    def recording_sample(logits, temperature, generator):
        handed.append(settings.get(temperature, "none") is generator)
        return greedy(logits)

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

    with paused():  # the check's own model step: the engine's ModelRunner, which the loop may not call itself
        execute_model = pausing(make_execute_model(tiny_model(), w.num_blocks, w.block_size))
    try:
        steps = run_engine(requests, allocator, counted_schedule, execute_model, recording_sample,
                           w.token_budget, w.max_num_seqs, eos_token_ids)
    except _Stopped as e:
        steps = str(e)
    return _engine_result({r.seq_id: r.output_ids for r in requests}, steps, len(allocator.free_blocks),
                          {r.seq_id: len(r.token_times) for r in requests}, all(handed))


def _engine_result(outputs, steps, free_blocks, times, own_settings=True) -> dict:
    return {"outputs": outputs, "steps": steps, "free blocks at the end": free_blocks,
            "token_times per request": times, "each token sampled with its request's temperature and generator":
            own_settings}


@functools.lru_cache(maxsize=1)
def _run_engine_cases() -> tuple[Case, ...]:
    """The cases, with the engine's outputs: computed once per process."""
    cases = []
    for w in WORKLOADS:
        eos = tuple(eos_for(w))
        outputs, steps = engine_outputs(w, eos)
        expected = _engine_result(outputs, steps, w.num_blocks, {s: len(o) for s, o in outputs.items()})
        reqs = ", ".join(f"{s}: prompt {p}, max_tokens {m}" for s, p, m in w.requests)
        show = (f"{w.why}. A tiny random 2-layer model; BlockAllocator({w.num_blocks}, block_size="
                f"{w.block_size}), token_budget={w.token_budget}, max_num_seqs={w.max_num_seqs}, "
                f"eos_token_ids={eos}; requests {reqs}, request k with temperature 0.5 + k/8 and seed 100 + k "
                f"(the check's sampler is greedy, so the tokens stay the engine's)")
        cases.append(Case((w, eos), expected, show))
    return tuple(cases)


def check_run_engine(run_engine) -> bool:
    """run_engine(requests, allocator, schedule, execute_model, sample, token_budget,
    max_num_seqs, eos_token_ids) -> number of steps; every request's greedy
    tokens and the step count against tinyinfer's Scheduler + ModelRunner, and
    every token sampled with its request's own temperature and generator."""
    return run_check("run_engine", lambda w, eos: _play_engine(run_engine, w, eos), lambda: list(_run_engine_cases()),
                     forbidden=(reference_run_engine, LLMEngine, LLM, Scheduler, ModelRunner, BlockManager),
                     keep=("run_engine", run_engine))


LAB = Lab(7, "batching and scheduling",
          exports=("check_schedule", "check_prefix_hashes", "check_run_engine", "reference_schedule",
                   "reference_prefix_hashes", "reference_run_engine", "Request", "Step", "make_execute_model"),
          pieces={"schedule": "reference_schedule", "prefix_hashes": "reference_prefix_hashes",
                  "run_engine": "reference_run_engine"},
          fallbacks={"check_schedule": reference_schedule, "check_prefix_hashes": reference_prefix_hashes,
                     "check_run_engine": reference_run_engine})
