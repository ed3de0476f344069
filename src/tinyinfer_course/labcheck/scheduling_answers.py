"""The course's answers to lab 7's scheduler exercises: a scheduler step,
chained prefix hashes and the continuous-batching loop. A lab falls back to
them where the learner's own has not passed; the checks (scheduling.py) refuse
them, and compare with tinyinfer's engine instead."""
from __future__ import annotations

import time
from collections import deque

from .records import Request, Step


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
            token = sample(logits[req.seq_id], req.temperature, req.generator)
            req.output_ids.append(token)
            req.token_times.append(now)
            if token in eos_token_ids or len(req.output_ids) >= req.max_tokens:
                allocator.free(req.seq_id)
                running.remove(req)
    return num_steps
