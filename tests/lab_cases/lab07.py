"""Lab 7 (batching and scheduling): wrong block allocators the check must reject,
and the reference it must accept. Collected by tests/test_labs.py.

Each wrong allocator is the reference with one plausible mistake."""
from tinyinfer import labcheck

Ref = labcheck.ReferenceBlockAllocator


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
    "check_block_allocator": lambda: labcheck.ReferenceBlockAllocator,
}
