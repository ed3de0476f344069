"""Lab 11 (your engine): the check of a prefix cache over lab 7's allocator, and
the given code that plugs one into lab 7's scheduler and loop.

The learner writes a class with the shape of ReferencePrefixCache below:
`lookup(req, allocator)` starts a new request's block table with the cached
blocks of the longest run of its prompt's full blocks (found by lab 7's chained
`prefix_hashes`) and returns how many tokens they hold; `insert(req, allocator,
num_computed)` files a request's full prompt blocks once their keys and values
are computed. The cache holds a reference to every block it files, so a
finished request's `free` leaves them cached (tinyinfer's BlockManager keeps
freed blocks cached until they are reused; this one never evicts, enough for a
lab).

`with_prefix_cache(schedule, execute_model, cache)` is the given code: the
scheduler admits a waiting request whose prompt starts with cached blocks as a
running request with those tokens already computed, so lab 7's scheduler, which
continues partly computed prompts, needs no change.

The check serves scripted requests one after another on the tiny model with
the course's loop, scheduler and allocator and tinyinfer's model runner, and
compares the greedy tokens (a cache hit must not change a token), the cached
tokens of every request and the free blocks at the end with what a correct
cache gives.
"""
from __future__ import annotations

from dataclasses import dataclass

from tinyinfer.block_manager import BlockManager
from .batching import ReferenceBlockAllocator
from .core import Case, run_check
from .fixtures import tiny_model, tiny_prompt
from .given import greedy, make_execute_model
from .records import Request
from .registry import Lab
from .scheduling_answers import reference_prefix_hashes, reference_run_engine, reference_schedule
from .watch import paused, pausing


class ReferencePrefixCache:
    """The course's answer to lab 11's prefix cache exercise."""

    def __init__(self, block_size: int, prefix_hashes):
        self.block_size, self.prefix_hashes = block_size, prefix_hashes
        self.blocks: dict = {}  # chained hash of a full prompt block -> the block holding its keys and values

    def lookup(self, req, allocator) -> int:
        """Share the cached blocks that start req's prompt; the tokens they hold (0: nothing changes)."""
        table = []
        for h in self.prefix_hashes(req.prompt_ids, self.block_size):
            if h not in self.blocks:
                break
            table.append(self.blocks[h])
        table = table[: (len(req.prompt_ids) - 1) // self.block_size]  # the last prompt token is always computed
        if not table:
            return 0
        for block in table:
            allocator.ref_count[block] += 1
        allocator.block_tables[req.seq_id] = table
        allocator.num_tokens[req.seq_id] = len(table) * self.block_size
        return len(table) * self.block_size

    def insert(self, req, allocator, num_computed: int) -> None:
        """File req's full prompt blocks among its first num_computed tokens; the cache keeps a reference."""
        full = min(num_computed, len(req.prompt_ids)) // self.block_size
        table = allocator.block_tables[req.seq_id]
        for i, h in enumerate(self.prefix_hashes(req.prompt_ids, self.block_size)[:full]):
            if h not in self.blocks:
                self.blocks[h] = table[i]
                allocator.ref_count[table[i]] += 1  # pinned: a finished request's free leaves it cached


def with_prefix_cache(schedule, execute_model, cache):
    """(schedule, execute_model) for lab 7's loop, with `cache` in between: a
    waiting request whose prompt starts with cached blocks is admitted with them
    already computed, and every step files the prompt blocks it completed."""

    def cached_schedule(waiting, running, allocator, token_budget: int, max_num_seqs: int):
        # First come, first served: only the head of the queue, and only while it hits.
        while waiting and len(running) < max_num_seqs and waiting[0].num_computed == 0:
            hit = cache.lookup(waiting[0], allocator)
            if not hit:
                break
            req = waiting.popleft()
            req.num_computed = hit  # its first `hit` tokens' keys and values are in the shared blocks
            running.append(req)  # the scheduler continues it as a partly computed prompt
        return schedule(waiting, running, allocator, token_budget, max_num_seqs)

    def cached_execute(scheduled, allocator) -> dict:
        logits = execute_model(scheduled, allocator)
        for req, n in scheduled:
            cache.insert(req, allocator, req.num_computed + n)
        return logits

    return cached_schedule, cached_execute


# ---------------------------------------------------------------- the check


@dataclass
class _Scenario:
    num_blocks: int
    block_size: int
    token_budget: int
    requests: list[tuple[str, list[tuple[str, int]], int]]  # (seq_id, prompt as (source, length) pieces, max_tokens)
    why: str
    together: bool = False  # all requests arrive at once (one run of the loop), not one after another
    max_num_seqs: int = 4
    admissions: dict | None = None  # together: the tokens cached at each admission, worked out by hand


def _prompt(pieces) -> list[int]:
    """A prompt glued from seeded token runs, so prompts can share exact prefixes."""
    return [t for source, length in pieces for t in tiny_prompt(source, length)]


# Requests are served one after another: each sees every earlier prompt's blocks cached.
_SCENARIOS = [
    _Scenario(32, 4, 16, [("a", [("s", 12), ("x", 5)], 3), ("b", [("s", 12), ("y", 3)], 3),
                          ("c", [("t", 9)], 2)],
              "a shared 12-token system prompt (3 blocks of 4): b reuses a's 3 blocks, c shares nothing"),
    _Scenario(32, 4, 16, [("a", [("s", 8)], 2), ("b", [("s", 8)], 2), ("c", [("s", 8), ("z", 1)], 2)],
              "b's prompt is exactly a's 2 full blocks: only the first is reused (its last token must be computed "
              "to sample from); c extends it and reuses both"),
    _Scenario(32, 4, 16, [("a", [("s", 6), ("x", 6)], 2), ("b", [("s", 6), ("y", 6)], 2)],
              "b shares a's first 6 tokens: one full block of 4, not the partly shared second"),
    _Scenario(11, 4, 16, [("a", [("s", 8), ("x", 4)], 4), ("b", [("q", 8)], 24), ("c", [("s", 8), ("y", 4)], 2)],
              "a pool of 11 blocks of 4: b needs 8 of them, every block a left free, so a's cached blocks must stay "
              "out of the free list for c to reuse them intact"),
    # Issue 56: requests that arrive together. With a token budget of 5, a prompt's chunks end inside
    # blocks, and o's growth preempts b half-way through its prompt; b then comes back and hits the
    # blocks a and it filed. A cache that files a block before all its tokens are computed hands out
    # keys and values nobody wrote. (The hits are what a correct cache gives: the course's and the
    # tests' own agree.)
    _Scenario(8, 4, 5, [("o", [("s", 4)], 14), ("a", [("s", 4), ("p", 10)], 3),
                        ("b", [("s", 4), ("p", 10), ("q", 2)], 2)],
              "o, a and b arrive together; the budget of 5 ends chunks inside blocks, and o's growth preempts b "
              "half-way through its prompt", together=True, admissions={"o": [0], "a": [0], "b": [4, 12]}),
]
MAX_STEPS = 200
MISSES = "allocator changed by a lookup that found nothing"


class _MissWatch:
    """The learner's cache, as with_prefix_cache sees it: a lookup that returns 0 must
    leave the allocator as it was (no empty table, no count, no reference)."""

    def __init__(self, cache, missed: list):
        self.cache, self.missed = cache, missed

    def lookup(self, req, allocator) -> int:
        before = _state(allocator)
        hit = self.cache.lookup(req, allocator)
        if not hit and not self.missed:
            after = _state(allocator)
            changed = [name for name in before if before[name] != after[name]]
            if changed:
                self.missed.append(f"lookup({req.seq_id!r}) returned {hit!r} and changed the allocator's "
                                   + " and ".join(changed) + f" (for {req.seq_id!r}: table "
                                   f"{after['block_tables'].get(req.seq_id, 'none')!r}, num_tokens "
                                   f"{after['num_tokens'].get(req.seq_id, 'none')!r})")
        return hit

    def insert(self, req, allocator, num_computed: int) -> None:
        return self.cache.insert(req, allocator, num_computed)


def _state(allocator) -> dict:
    return {"block_tables": {s: list(t) for s, t in allocator.block_tables.items()},
            "num_tokens": dict(allocator.num_tokens), "ref_count": list(allocator.ref_count)}


class _Stopped(Exception):
    pass


def _serve(cache_cls, sc: _Scenario, cached: bool) -> dict:
    """The scenario's requests one after another; what a correct cache is judged by."""
    if sc.together:
        return _serve_together(cache_cls, sc, cached)
    allocator = ReferenceBlockAllocator(sc.num_blocks, sc.block_size)
    with paused():  # the check's own model step: tinyinfer's ModelRunner
        execute = pausing(make_execute_model(tiny_model(), sc.num_blocks, sc.block_size))
    schedule = reference_schedule
    cache = cache_cls(sc.block_size, reference_prefix_hashes) if cached else None
    missed = []  # what a lookup that found nothing changed in the allocator
    if cache is not None:
        schedule, execute = with_prefix_cache(schedule, execute, _MissWatch(cache, missed))
    steps = [0]

    def counted(*args):
        steps[0] += 1
        if steps[0] > MAX_STEPS:
            raise _Stopped(f"still running after {MAX_STEPS} steps: a request whose whole prompt is cached has "
                           "no token left to compute, so it never gets logits to sample from")
        return schedule(*args)

    outputs, hits, tables, admitted, finished = {}, {}, {}, {}, {}
    try:
        for seq_id, pieces, max_tokens in sc.requests:
            req = Request(seq_id, _prompt(pieces), max_tokens)
            first = []

            def first_admission(waiting, running, allocator_, budget, max_seqs, req=req, first=first):
                out = counted(waiting, running, allocator_, budget, max_seqs)
                if not first and req in running:  # where its computing starts (the cached tokens), its table, refs
                    first.append((req.num_computed, len(allocator_.block_tables[req.seq_id]),
                                  _users(allocator_)))
                return out

            reference_run_engine([req], allocator, first_admission, execute, greedy, sc.token_budget, 4, [])
            outputs[seq_id] = list(req.output_ids)
            hits[seq_id], tables[seq_id], admitted[seq_id] = first[0] if first else (None, None, None)
            finished[seq_id] = f"{_users(allocator)}, {len(allocator.free_blocks)} free"
    except _Stopped as e:
        return {"stopped": str(e)}
    return {"outputs": outputs, "cached tokens per request": hits, "blocks in its table after its first step": tables,
            "blocks by users, once admitted": admitted, "blocks by users, once finished": finished,
            "free blocks at the end": len(allocator.free_blocks), MISSES: missed}


def _serve_together(cache_cls, sc: _Scenario, cached: bool) -> dict:
    """The scenario's requests arriving together (issue 56): a request's prompt blocks may be
    filed, looked up and shared while another is still computing its own, and a request
    preempted half-way through its prompt is admitted again later. Judged by the greedy
    tokens, the tokens cached at each admission, and the blocks once all have finished."""
    allocator = ReferenceBlockAllocator(sc.num_blocks, sc.block_size)
    with paused():
        execute = pausing(make_execute_model(tiny_model(), sc.num_blocks, sc.block_size))
    schedule, missed = reference_schedule, []
    if cached:
        schedule, execute = with_prefix_cache(schedule, execute, _MissWatch(cache_cls(sc.block_size,
                                                                                      reference_prefix_hashes), missed))
    requests = [Request(seq_id, _prompt(pieces), max_tokens) for seq_id, pieces, max_tokens in sc.requests]
    admissions = {req.seq_id: [] for req in requests}
    steps = [0]

    def noted(waiting, running, allocator_, budget, max_seqs):
        steps[0] += 1
        if steps[0] > MAX_STEPS:
            raise _Stopped(f"still running after {MAX_STEPS} steps")
        before = {id(req) for req in running}
        out = schedule(waiting, running, allocator_, budget, max_seqs)
        for req in running:  # admitted this step, with its cached tokens already counted as computed
            if id(req) not in before:
                admissions[req.seq_id].append(req.num_computed)
        return out

    try:
        reference_run_engine(requests, allocator, noted, execute, greedy, sc.token_budget, sc.max_num_seqs, [])
    except _Stopped as e:
        return {"stopped": str(e)}
    return {"outputs": {req.seq_id: list(req.output_ids) for req in requests},
            "tokens cached at each admission": admissions,
            "blocks by users, once all have finished": _users(allocator),
            "free blocks at the end": len(allocator.free_blocks), MISSES: missed}


def _expected_together(sc: _Scenario) -> dict:
    """Greedy tokens without a cache, the hits worked out by hand for the scenario
    (sc.admissions), and every distinct full prompt block filed once all have finished."""
    result = _serve_together(None, sc, cached=False)
    distinct = {h for _, pieces, _ in sc.requests for h in reference_prefix_hashes(_prompt(pieces), sc.block_size)}
    result["tokens cached at each admission"] = dict(sc.admissions)
    result["blocks by users, once all have finished"] = _users(_Counts([1] * len(distinct)))
    result["free blocks at the end"] = sc.num_blocks - len(distinct)
    return result


def _users(allocator) -> str:
    """How many blocks have 1 user, 2 users, ...: reference counts without the
    block ids (another allocator may pick other ids). A leaked reference shows
    as a block with a user too many."""
    counts = {}
    for n in allocator.ref_count:
        if n:
            counts[n] = counts.get(n, 0) + 1
    return ", ".join(f"{blocks} block{'s' if blocks > 1 else ''} x {n} user{'s' if n > 1 else ''}"
                     for n, blocks in sorted(counts.items())) or "no block in use"


def _where(got, expected) -> str | None:
    """The first request, and the first thing about it, that differs."""
    if not isinstance(got, dict) or "stopped" in got or "stopped" in expected:
        return None
    if "tokens cached at each admission" in expected:  # requests that arrived together
        for key, theirs in expected.items():
            mine = got.get(key)
            if key == MISSES or mine == theirs:
                continue
            if isinstance(theirs, dict):
                differs = [s for s in theirs if not isinstance(mine, dict) or mine.get(s) != theirs[s]]
                seq_id = (differs or list(theirs))[0]
                mine = mine.get(seq_id) if isinstance(mine, dict) else mine
                return f"first difference: request {seq_id!r}, {key}: expected {theirs[seq_id]!r}, got {mine!r}"
            return f"first difference: {key}: expected {theirs!r}, got {mine!r}"
    for seq_id in expected["outputs"]:
        for key in ("outputs", "cached tokens per request", "blocks in its table after its first step",
                    "blocks by users, once admitted", "blocks by users, once finished"):
            mine, theirs = got.get(key, {}).get(seq_id), expected[key][seq_id]
            if mine != theirs:
                return f"request {seq_id!r}, {key}: expected {theirs!r}, got {mine!r}"
    if got.get(MISSES):
        return f"first difference: {got[MISSES][0]}; with no hit, lookup must change nothing and return 0"
    return None


def _expected(sc: _Scenario) -> dict:
    """Greedy tokens without a cache (a hit must not change one), and the cached
    tokens and pinned blocks a correct cache gives, worked out from the prompts."""
    result = _serve(None, sc, cached=False)
    seen, hits, tables, admitted, finished = set(), {}, {}, {}, {}
    for seq_id, pieces, _ in sc.requests:
        prompt = _prompt(pieces)
        hashes = reference_prefix_hashes(prompt, sc.block_size)
        run = 0
        while run < len(hashes) and hashes[run] in seen:
            run += 1
        hits[seq_id] = hit = min(run, (len(prompt) - 1) // sc.block_size) * sc.block_size
        # the shared blocks, then blocks for the first chunk the budget allows, no more
        tables[seq_id] = -(-(hit + min(len(prompt) - hit, sc.token_budget)) // sc.block_size)
        # Once admitted: its shared blocks have 2 users (the cache and it); every other filed block 1 (the
        # cache), and so has each new block of its table. Once finished: only the cache's references remain.
        shared = hit // sc.block_size
        admitted[seq_id] = _users(_Counts([2] * shared + [1] * (len(seen) - shared + tables[seq_id] - shared)))
        seen.update(hashes)
        finished[seq_id] = f"{_users(_Counts([1] * len(seen)))}, {sc.num_blocks - len(seen)} free"
    result["cached tokens per request"] = hits
    result["blocks in its table after its first step"] = tables
    result["blocks by users, once admitted"] = admitted
    result["blocks by users, once finished"] = finished
    result["free blocks at the end"] = sc.num_blocks - len(seen)  # the cache keeps every distinct full block
    result[MISSES] = []
    return result


@dataclass
class _Counts:
    ref_count: list[int]  # stands for an allocator in _users


def _cases() -> list[Case]:
    cases = []
    for sc in _SCENARIOS:
        reqs = ", ".join(f"{s}: prompt {'+'.join(f'{src}[{n}]' for src, n in p)}, max_tokens {m}"
                         for s, p, m in sc.requests)
        order = f"arriving together (at most {sc.max_num_seqs} running)" if sc.together else "one after another"
        show = (f"{sc.why}. Requests {order} on the tiny model, BlockAllocator({sc.num_blocks}, "
                f"block_size={sc.block_size}), token_budget={sc.token_budget}; {reqs} (x[n]: n seeded tokens "
                "from source x, so equal sources make equal prefixes)")
        cases.append(Case((sc,), _expected_together(sc) if sc.together else _expected(sc), show))
    return cases


def check_prefix_cache(cls) -> bool:
    """cls(block_size, prefix_hashes) with lookup(req, allocator) -> cached tokens
    and insert(req, allocator, num_computed), plugged in by with_prefix_cache:
    greedy tokens unchanged by the cache, every request's cached tokens, the
    blocks' reference counts once it is admitted and once it has finished, and
    the free blocks (the cache pins what it files, and nothing more)."""
    return run_check("prefix_cache", lambda sc: _serve(cls, sc, cached=True), _cases,
                     forbidden=(ReferencePrefixCache, BlockManager), keep=("PrefixCache", cls), explain=_where)


LAB = Lab(11, "your engine", exports=("check_prefix_cache", "ReferencePrefixCache", "with_prefix_cache"),
          pieces={"PrefixCache": "ReferencePrefixCache"}, fallbacks={"check_prefix_cache": ReferencePrefixCache})
