"""Lab 7 (batching and scheduling): wrong block allocators the check must reject,
and the reference it must accept. Collected by tests/course/test_labs.py.

Each wrong allocator is the reference with one plausible mistake."""
import time
from collections import deque

from tinyinfer_course import labcheck


class _Allocator:
    """A correct allocator written for these tests (the check refuses labcheck's
    ReferenceBlockAllocator); the wrong ones below each change one method."""

    def __init__(self, num_blocks, block_size):
        self.block_size = block_size
        self.ref_count = [0] * num_blocks
        self.free_blocks = deque(range(num_blocks))
        self.block_tables, self.num_tokens = {}, {}

    def _take_free_block(self):
        if not self.free_blocks:
            raise RuntimeError("no free block")
        block = self.free_blocks.popleft()
        self.ref_count[block] = 1
        return block

    def allocate(self, seq_id, num_tokens):
        if (num_tokens + self.block_size - 1) // self.block_size > len(self.free_blocks):
            raise RuntimeError("out of KV blocks")
        self.block_tables[seq_id] = []
        self.num_tokens[seq_id] = 0
        while len(self.block_tables[seq_id]) * self.block_size < num_tokens:
            self.block_tables[seq_id].append(self._take_free_block())
        self.num_tokens[seq_id] = num_tokens

    def append(self, seq_id):
        table, used = self.block_tables[seq_id], self.num_tokens[seq_id]
        if used == len(table) * self.block_size:  # no room left in the last block
            table.append(self._take_free_block())
            self.num_tokens[seq_id] += 1
            return None
        last = table[-1]
        copied = None
        if self.ref_count[last] > 1:
            table[-1] = self._take_free_block()
            self.ref_count[last] -= 1
            copied = (last, table[-1])
        self.num_tokens[seq_id] += 1
        return copied

    def fork(self, parent_id, child_id):
        self.block_tables[child_id] = self.block_tables[parent_id][:]
        self.num_tokens[child_id] = self.num_tokens[parent_id]
        for block in self.block_tables[child_id]:
            self.ref_count[block] += 1

    def free(self, seq_id):
        for block in self.block_tables.pop(seq_id):
            self.ref_count[block] -= 1
            if not self.ref_count[block]:
                self.free_blocks.append(block)
        del self.num_tokens[seq_id]


Ref = _Allocator


class _NoRefDecrement(Ref):
    # frees a block only if this sequence was its sole user, but forgets to
    # decrement the count when others still share it: shared blocks leak
    def free(self, seq_id):
        for block in self.block_tables.pop(seq_id):
            if self.ref_count[block] == 1:
                self.ref_count[block] = 0
                self.free_blocks.append(block)
        del self.num_tokens[seq_id]


class _FreeIgnoresSharing(Ref):
    # returns every block to the free list, even those another sequence still uses
    def free(self, seq_id):
        for block in self.block_tables.pop(seq_id):
            self.ref_count[block] = 0
            self.free_blocks.append(block)
        del self.num_tokens[seq_id]


class _NeverReusesFreedBlocks(Ref):
    # counts down, but a freed block never goes back to the free list
    def free(self, seq_id):
        for block in self.block_tables.pop(seq_id):
            self.ref_count[block] -= 1
        del self.num_tokens[seq_id]


class _BlockPerToken(Ref):
    # one block per token, as if block_size were 1
    def allocate(self, seq_id, num_tokens):
        if num_tokens > len(self.free_blocks):
            raise RuntimeError("out of KV blocks")
        self.block_tables[seq_id] = [self._take_free_block() for _ in range(num_tokens)]
        self.num_tokens[seq_id] = num_tokens


class _FloorDivision(Ref):
    # num_tokens // block_size: a partly filled last block gets no room
    def allocate(self, seq_id, num_tokens):
        need = num_tokens // self.block_size
        if need > len(self.free_blocks):
            raise RuntimeError("out of KV blocks")
        self.block_tables[seq_id] = [self._take_free_block() for _ in range(need)]
        self.num_tokens[seq_id] = num_tokens


class _NewBlockEveryAppend(Ref):
    # a new block for every decoded token, even when the last block has room
    def append(self, seq_id):
        if not self.free_blocks:
            raise RuntimeError("out of KV blocks")
        self.block_tables[seq_id].append(self._take_free_block())
        self.num_tokens[seq_id] += 1


class _NoCopyOnWrite(Ref):
    # writes into a shared, partly filled block: the other sequence's past changes
    def append(self, seq_id):
        if self.num_tokens[seq_id] % self.block_size == 0:
            if not self.free_blocks:
                raise RuntimeError("out of KV blocks")
            self.block_tables[seq_id].append(self._take_free_block())
        self.num_tokens[seq_id] += 1


class _ForkCopies(Ref):
    # fork duplicates the parent's blocks instead of sharing them
    def fork(self, parent_id, child_id):
        n = len(self.block_tables[parent_id])
        if n > len(self.free_blocks):
            raise RuntimeError("out of KV blocks")
        self.block_tables[child_id] = [self._take_free_block() for _ in range(n)]
        self.num_tokens[child_id] = self.num_tokens[parent_id]


class _PartialAllocationOnFailure(Ref):
    # takes blocks one by one and only notices the pool is empty halfway
    def allocate(self, seq_id, num_tokens):
        table = self.block_tables.setdefault(seq_id, [])
        self.num_tokens[seq_id] = num_tokens
        for _ in range(-(-num_tokens // self.block_size)):
            if not self.free_blocks:
                raise RuntimeError("out of KV blocks")
            table.append(self._take_free_block())


WRONG = {
    "check_block_allocator": [_NoRefDecrement, _FreeIgnoresSharing, _NeverReusesFreedBlocks, _BlockPerToken,
                              _FloorDivision, _NewBlockEveryAppend, _NoCopyOnWrite, _ForkCopies,
                              _PartialAllocationOnFailure],
}
REFERENCE = {
    "check_block_allocator": lambda: _Allocator,
}


# ------------------------------------------------ schedule, prefix_hashes, run_engine
#
# REFERENCE: correct implementations written here, in another shape than
# labcheck's references (the checks compare them with tinyinfer's engine).
# WRONG: each one plausible mistake. ANSWERS: the course's own, refused.
import hashlib  # noqa: E402

from tinyinfer.block_manager import BlockManager  # noqa: E402
from tinyinfer_course.labcheck import Step  # noqa: E402
from tinyinfer_course.labcheck.fixtures import EngineAllocator as _EngineAllocator  # noqa: E402  (BlockManager behind the lab's interface)
from tinyinfer.sampling import SamplingParams  # noqa: E402
from tinyinfer.request import Request  # noqa: E402
from tinyinfer.scheduler import Scheduler, SchedulerConfig  # noqa: E402


def _room(alloc, seq_id, total):
    """Can seq_id's table grow to hold `total` tokens?"""
    have = len(alloc.block_tables[seq_id]) * alloc.block_size
    return total <= have or (total - have + alloc.block_size - 1) // alloc.block_size <= len(alloc.free_blocks)


def _grow(alloc, seq_id, total):
    while alloc.num_tokens[seq_id] < total:
        alloc.append(seq_id)


def make_schedule(preempt_newest=True, reset_on_preempt=True, requeue_front=True, admit_after_preempt=False,
                  budget_for_decode=True, chunk=True, check_blocks=True, fcfs=True, cap=True):
    """A scheduler step; every flag True but admit_after_preempt is the right policy."""

    def schedule(waiting, running, alloc, token_budget, max_num_seqs):
        scheduled, preempted = [], []
        left = token_budget
        for req in list(running):
            if left <= 0 or req not in running:
                break
            want = req.num_tokens - req.num_computed
            n = min(want, left) if budget_for_decode else want
            while not _room(alloc, req.seq_id, req.num_computed + n):
                victim = running[-1] if preempt_newest else running[0]
                running.remove(victim)
                alloc.free(victim.seq_id)
                if reset_on_preempt:
                    victim.num_computed = 0
                (waiting.appendleft if requeue_front else waiting.append)(victim)
                preempted.append(victim)
                if victim is req:
                    break
            if req not in running:
                if preempt_newest:
                    break
                continue
            _grow(alloc, req.seq_id, req.num_computed + n)
            scheduled.append((req, n))
            left -= n
        if preempted and not admit_after_preempt:
            return Step(scheduled, preempted)
        skipped = []
        while waiting and left > 0 and (len(running) < max_num_seqs or not cap):
            req = waiting.popleft()
            n = req.num_tokens - req.num_computed
            if n > left and not chunk:
                skipped.append(req)
                break
            n = min(n, left)
            if check_blocks and (n + alloc.block_size - 1) // alloc.block_size > len(alloc.free_blocks):
                skipped.append(req)
                if fcfs:
                    break
                continue
            alloc.allocate(req.seq_id, n)
            running.append(req)
            scheduled.append((req, n))
            left -= n
        waiting.extendleft(reversed(skipped))
        return Step(scheduled, preempted)

    return schedule


def _hash_only_own_block(token_ids, block_size):  # forgets the chain: equal blocks anywhere hash alike
    return [hash(tuple(token_ids[i:i + block_size])) for i in range(0, len(token_ids) - block_size + 1, block_size)]


def _hash_partial_block_too(token_ids, block_size):  # also hashes the unfinished last block
    out, parent = [], None
    for i in range(0, len(token_ids), block_size):
        parent = hash((parent, tuple(token_ids[i:i + block_size])))
        out.append(parent)
    return out


def _hash_sum_of_tokens(token_ids, block_size):  # chained, but a block is keyed by its sum: order is lost
    out, parent = [], 0
    for i in range(len(token_ids) // block_size):
        parent = hash((parent, sum(token_ids[i * block_size:(i + 1) * block_size])))
        out.append(parent)
    return out


def _hash_parent_only(token_ids, block_size):  # chains the parent, but forgets this block's own tokens
    out, parent = [], hash(tuple(token_ids[:block_size]))
    for i in range(len(token_ids) // block_size):
        out.append(parent)
        parent = hash((parent, i))
    return out


def _sha256_prefix_hashes(token_ids, block_size):
    """Correct, with another hash function (vLLM uses sha256 too)."""
    digest, out = b"", []
    for end in range(block_size, len(token_ids) + 1, block_size):
        digest = hashlib.sha256(digest + repr(token_ids[end - block_size:end]).encode()).digest()
        out.append(digest.hex())
    return out


def make_run_engine(free_finished=True, stop_on_eos=True, max_inclusive=True, skip_chunks=True,
                    record_times=True, remove_finished=True, own_settings=True):
    """The continuous-batching loop; every flag True is right."""

    def run_engine(requests, allocator, schedule, execute_model, sample, token_budget, max_num_seqs,
                   eos_token_ids):
        waiting, running, steps = deque(requests), [], 0
        while running or waiting:
            step = schedule(waiting, running, allocator, token_budget, max_num_seqs)
            logits = execute_model(step.scheduled, allocator)
            steps += 1
            for req, n in step.scheduled:
                req.num_computed += n
                if skip_chunks and req.seq_id not in logits:
                    continue
                if req.seq_id not in logits:  # samples from the previous row it saw: a chunk's garbage
                    req.output_ids.append(0)
                    continue
                settings = (req.temperature, req.generator) if own_settings else (0.0, None)
                req.output_ids.append(sample(logits[req.seq_id], *settings))
                if record_times:
                    req.token_times.append(time.perf_counter())
                done = len(req.output_ids) >= req.max_tokens if max_inclusive else len(req.output_ids) > req.max_tokens
                if (stop_on_eos and req.output_ids[-1] in eos_token_ids) or done:
                    if free_finished:
                        allocator.free(req.seq_id)
                    if remove_finished:
                        running.remove(req)
        return steps

    return run_engine


def _engine_schedule(waiting, running, allocator, token_budget, max_num_seqs):
    """The engine's Scheduler behind the lab's interface: the course's answer."""
    sched = Scheduler(SchedulerConfig(max_num_seqs, token_budget), BlockManager(1, allocator.block_size))
    for req in waiting:
        sched.add(Request(req.seq_id, None, req.token_ids, SamplingParams(max_tokens=req.max_tokens)))
    out = sched.schedule()
    return Step([(next(r for r in waiting if r.seq_id == e.seq.seq_id), e.num_new_tokens) for e in out.scheduled],
                [])


def _engine_prefix_hashes(token_ids, block_size):
    out, parent = [], None
    for i in range(len(token_ids) // block_size):
        parent = BlockManager.hash_block(parent, token_ids[i * block_size:(i + 1) * block_size])
        out.append(parent)
    return out


def _engine_run_engine(requests, allocator, schedule, execute_model, sample, token_budget, max_num_seqs,
                       eos_token_ids):
    """tinyinfer's Scheduler drives the lab's model step: the course's answer."""
    bm = BlockManager(len(allocator.free_blocks), allocator.block_size, enable_prefix_caching=False)
    sched = Scheduler(SchedulerConfig(max_num_seqs, token_budget), bm)
    for r in requests:
        sched.add(Request(r.seq_id, None, r.prompt_ids, SamplingParams(max_tokens=r.max_tokens), eos_token_ids))
    sched.schedule()  # ... and so on, as LLMEngine.step does: enough for the check to see it
    return 0


WRONG.update({
    "check_schedule": [
        make_schedule(preempt_newest=False),  # preempts the oldest request, which waited longest
        make_schedule(reset_on_preempt=False),  # a preempted request keeps num_computed: its cache is gone
        make_schedule(requeue_front=False),  # a preempted request goes to the back of the queue
        make_schedule(admit_after_preempt=True),  # admits newcomers into a pool it just had to free
        make_schedule(budget_for_decode=False),  # running requests take all their tokens, budget or not
        make_schedule(chunk=False),  # a prompt longer than what is left of the budget waits
        make_schedule(check_blocks=False),  # admits without counting free blocks
        make_schedule(fcfs=False),  # lets a later request overtake a blocked head of the queue
        make_schedule(cap=False),  # ignores max_num_seqs
    ],
    "check_prefix_hashes": [_hash_only_own_block, _hash_partial_block_too, _hash_sum_of_tokens, _hash_parent_only],
    "check_run_engine": [
        make_run_engine(free_finished=False),  # finished requests keep their blocks: the pool runs dry
        make_run_engine(stop_on_eos=False),  # only max_tokens ends a request
        make_run_engine(max_inclusive=False),  # one token too many
        make_run_engine(skip_chunks=False),  # "samples" after a prompt chunk that is not the last
        make_run_engine(record_times=False),  # no token times: no TTFT or TPOT later
        make_run_engine(remove_finished=False),  # a finished request stays in `running` (the check stops the loop)
        make_run_engine(own_settings=False),  # samples greedily whatever the request's temperature and seed
    ],
})
REFERENCE.update({
    "check_schedule": lambda: make_schedule(),
    "check_prefix_hashes": lambda: _sha256_prefix_hashes,
    "check_run_engine": lambda: make_run_engine(),
})
ANSWERS = {
    "check_block_allocator": [labcheck.ReferenceBlockAllocator, _EngineAllocator],
    "check_schedule": [labcheck.reference_schedule, _engine_schedule],
    "check_prefix_hashes": [labcheck.reference_prefix_hashes, _engine_prefix_hashes],
    "check_run_engine": [labcheck.reference_run_engine, _engine_run_engine],
}
