"""Lab 11 (your engine): prefix caches the check must reject, one written here
(independently of labcheck and the engine) that it must accept, and the
course's own it must refuse. Collected by tests/course/test_labs.py."""
from tinyinfer_course import labcheck
from tinyinfer.block_manager import BlockManager


class _Cache:
    """A prefix cache with one plausible mistake switched on at a time (none: correct)."""

    cap, pin, share_refs, set_tokens, hit = True, True, True, True, True
    refs_before_cap, pin_every_call, refile = False, False, False  # reference leaks
    table_first, count_first = False, False  # issue 56: the allocator written before knowing there is a hit
    early = None  # issue 56: files blocks whose tokens are not all computed yet ("table", "ceil")

    def __init__(self, block_size, prefix_hashes):
        self.block_size, self.prefix_hashes, self.filed = block_size, prefix_hashes, {}

    def lookup(self, req, allocator):
        if self.table_first:  # starts the table, then fills it: a miss leaves an empty one behind
            allocator.block_tables.setdefault(req.seq_id, [])
        if self.count_first:  # the tokens the table holds, set before the hashes are looked up
            allocator.num_tokens[req.seq_id] = 0
        blocks = []
        for h in self.prefix_hashes(req.prompt_ids, self.block_size):
            if h not in self.filed:
                break
            blocks.append(self.filed[h])
        if self.refs_before_cap:  # counted before the cap below: the dropped blocks keep a user forever
            for b in blocks:
                allocator.ref_count[b] += 1
        if self.cap:
            while blocks and len(blocks) * self.block_size > len(req.prompt_ids) - 1:
                blocks.pop()
        if not blocks or not self.hit:
            return 0
        if self.share_refs and not self.refs_before_cap:
            for b in blocks:
                allocator.ref_count[b] += 1
        allocator.block_tables[req.seq_id] = list(blocks)
        if self.set_tokens:
            allocator.num_tokens[req.seq_id] = len(blocks) * self.block_size
        else:
            allocator.num_tokens[req.seq_id] = 0
        return len(blocks) * self.block_size

    def insert(self, req, allocator, num_computed):
        hashes = self.prefix_hashes(req.prompt_ids, self.block_size)
        table = allocator.block_tables[req.seq_id]
        full = min(num_computed, len(req.prompt_ids)) // self.block_size
        if self.early == "table":  # every block of the table that has a prompt hash, computed or not
            full = min(len(hashes), len(table))
        elif self.early == "ceil":  # a partly computed block counted as full
            full = min(len(hashes), -(-min(num_computed, len(req.prompt_ids)) // self.block_size))
        for i in range(full):
            if self.pin_every_call and self.filed.get(hashes[i]) == table[i]:
                allocator.ref_count[table[i]] += 1  # pinned again at every step that computes more of the prompt
            if self.refile and self.filed.get(hashes[i]) == table[i] and (req.seq_id, i) not in self.filed:
                self.filed[req.seq_id, i] = table[i]  # files (and pins) a block it was handed by lookup, once more
                allocator.ref_count[table[i]] += 1
            elif hashes[i] not in self.filed:
                self.filed[hashes[i]] = table[i]
                if self.pin:
                    allocator.ref_count[table[i]] += 1


def _with(**mistake):
    return type("Wrong", (_Cache,), mistake)


class _EngineCache:
    """tinyinfer's BlockManager filing the blocks: the course's answer."""

    def __init__(self, block_size, prefix_hashes):
        self.bm = BlockManager(64, block_size)

    def lookup(self, req, allocator):
        self.bm.hash_block(None, req.prompt_ids[: self.bm.block_size])
        return 0

    def insert(self, req, allocator, num_computed):
        pass


WRONG = {
    "check_prefix_cache": [
        _with(cap=False),  # caches a whole prompt: its last token is never computed, nothing to sample from
        _with(pin=False),  # files blocks without a reference: freed, reused and overwritten while still filed
        _with(share_refs=False),  # shares blocks without counting the new user: its free releases them
        _with(set_tokens=False),  # the allocator thinks the shared blocks are empty: the scheduler grows them wrong
        _with(hit=False),  # never finds anything: correct tokens, but no prefill saved
        # Reference leaks: the tokens and the free blocks at the end come out right (the cache never evicts).
        _with(refs_before_cap=True),  # counts a user on the blocks the cap then drops
        _with(pin_every_call=True),  # pins a filed block again at every step of its request
        _with(refile=True),  # files again, and pins, each shared block a request was handed: a pin per reuse
        # Issue 56: a miss must change nothing; these write to the allocator before they know there is a hit.
        _with(table_first=True),  # an empty block table on a miss
        _with(count_first=True),  # num_tokens = 0 on a miss
        _with(early="table"),  # files every block of the table, the last one half computed
        _with(early="ceil"),  # counts a partly computed block as full
    ],
}
REFERENCE = {"check_prefix_cache": lambda: _Cache}
ANSWERS = {"check_prefix_cache": [labcheck.ReferencePrefixCache, _EngineCache]}
