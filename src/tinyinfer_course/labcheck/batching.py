"""Lab 7 (batching and scheduling): the check for a paged KV block allocator.

The learner writes a class with the shape of ReferenceBlockAllocator below
(allocate, append, fork and free over a pool of blocks with reference counts).
The check plays scripts of operations against it and, after each operation,
compares the allocator's state with tinyinfer's BlockManager's (prefix cache
off; fixtures.EngineAllocator). Block ids are free to differ: tables are
compared after renaming blocks in order of first use, so any allocator that
shares, counts and frees the same way passes.
"""
from __future__ import annotations

from collections import deque

from tinyinfer.block_manager import BlockManager
from .core import Case, run_check
from .fixtures import EngineAllocator
from .registry import Lab

# ---------------------------------------------------------------- lab 7: batching


class ReferenceBlockAllocator:
    """The course's answer to lab 7's BlockAllocator exercise (a small
    tinyinfer.block_manager.BlockManager, without the prefix cache)."""

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.ref_count = [0] * num_blocks  # how many sequences use each block
        self.free_blocks = deque(range(num_blocks))  # ids with ref_count 0; hand out from the left
        self.block_tables: dict[str, list[int]] = {}  # seq_id -> its block ids, in order
        self.num_tokens: dict[str, int] = {}  # seq_id -> tokens its blocks hold

    def _take_free_block(self) -> int:
        block = self.free_blocks.popleft()
        self.ref_count[block] = 1
        return block

    def allocate(self, seq_id: str, num_tokens: int) -> None:
        need = -(-num_tokens // self.block_size)  # ceil: a partly filled last block still counts
        if need > len(self.free_blocks):
            raise RuntimeError(f"out of KV blocks: {seq_id!r} needs {need}, {len(self.free_blocks)} are free")
        self.block_tables[seq_id] = [self._take_free_block() for _ in range(need)]
        self.num_tokens[seq_id] = num_tokens

    def append(self, seq_id: str):
        table, n = self.block_tables[seq_id], self.num_tokens[seq_id]
        copy = None
        if n % self.block_size == 0:  # the last block is full (or there is none): a new one
            if not self.free_blocks:
                raise RuntimeError(f"out of KV blocks: {seq_id!r} needs 1, 0 are free")
            table.append(self._take_free_block())
        elif self.ref_count[table[-1]] > 1:  # shared and partly full: copy before writing
            if not self.free_blocks:
                raise RuntimeError(f"out of KV blocks: {seq_id!r} needs 1, 0 are free")
            new = self._take_free_block()
            self.ref_count[table[-1]] -= 1
            copy = (table[-1], new)
            table[-1] = new
        self.num_tokens[seq_id] = n + 1
        return copy

    def fork(self, parent_id: str, child_id: str) -> None:
        for block in self.block_tables[parent_id]:
            self.ref_count[block] += 1
        self.block_tables[child_id] = list(self.block_tables[parent_id])
        self.num_tokens[child_id] = self.num_tokens[parent_id]

    def free(self, seq_id: str) -> None:
        for block in self.block_tables.pop(seq_id):
            self.ref_count[block] -= 1
            if self.ref_count[block] == 0:
                self.free_blocks.append(block)
        del self.num_tokens[seq_id]


def _snapshot(alloc, returned) -> dict:
    """The allocator's state with block ids renamed 0, 1, 2... in order of first
    use (sequences sorted by id), so two allocators that picked different ids
    for the same structure look the same."""
    tables = {s: list(t) for s, t in sorted(alloc.block_tables.items())}
    name: dict[int, int] = {}
    for table in tables.values():
        for block in table:
            name.setdefault(block, len(name))
    if isinstance(returned, tuple):  # a copy-on-write (src, dst)
        returned = tuple(name.get(b, f"unused block {b}") for b in returned)
    free = list(alloc.free_blocks)
    return {
        "returned": returned,
        "block_tables": {s: [name[b] for b in t] for s, t in tables.items()},
        "ref_counts": [alloc.ref_count[b] for b in name],
        "num_tokens": dict(sorted(alloc.num_tokens.items())),
        "num_free_blocks": len(free),
        "in_use_yet_free": sorted(name[b] for b in free if b in name),
    }


def _play(cls, num_blocks: int, block_size: int, ops: list[tuple]) -> dict:
    """Run ops on a fresh allocator; the state after the last one. Running out of
    blocks (RuntimeError) is an outcome to compare; any other error propagates."""
    alloc = cls(num_blocks, block_size)
    returned = None
    for op, *args in ops:
        try:
            returned = getattr(alloc, op)(*args)
        except RuntimeError as e:
            if isinstance(e, NotImplementedError):
                raise
            returned = "RuntimeError (out of blocks)"
    return _snapshot(alloc, returned)


# Each script: (num_blocks, block_size, ops). Every prefix of a script is a case,
# so a failure names the first operation that went wrong.
_SCRIPTS = [
    (8, 4, [("allocate", "a", 10), ("append", "a"), ("append", "a"), ("append", "a"), ("allocate", "b", 4),
            ("append", "b"), ("free", "a"), ("allocate", "c", 17)]),
    (6, 4, [("allocate", "p", 6), ("fork", "p", "q"), ("append", "q"), ("append", "q"), ("append", "p"),
            ("free", "p"), ("append", "q"), ("free", "q")]),
    (5, 4, [("allocate", "a", 8), ("fork", "a", "b"), ("append", "a"), ("free", "a"), ("allocate", "c", 13),
            ("free", "b"), ("allocate", "c", 13)]),
    (4, 2, [("allocate", "x", 5), ("allocate", "y", 3), ("free", "x"), ("allocate", "y", 3), ("append", "y"),
            ("append", "y"), ("allocate", "z", 4), ("free", "y"), ("allocate", "z", 4)]),
]


def _describe(num_blocks: int, block_size: int, ops: list[tuple]) -> str:
    calls = "; ".join(f"{op}({', '.join(map(repr, args))})" for op, *args in ops)
    return f"BlockAllocator(num_blocks={num_blocks}, block_size={block_size}); {calls}  -> state after the last call"


def _allocator_cases() -> list[Case]:
    cases = []
    for num_blocks, block_size, ops in _SCRIPTS:
        for k in range(1, len(ops) + 1):
            script = ops[:k]
            cases.append(Case((num_blocks, block_size, script),
                              _play(EngineAllocator, num_blocks, block_size, script),
                              _describe(num_blocks, block_size, script)))
    return cases


def check_block_allocator(cls) -> bool:
    """cls(num_blocks, block_size) -> an allocator with allocate, append, fork and
    free; its state after every call against tinyinfer's BlockManager's."""
    return run_check("block_allocator", lambda n, bs, ops: _play(cls, n, bs, ops), _allocator_cases,
                     forbidden=(ReferenceBlockAllocator, BlockManager), keep=("BlockAllocator", cls))


LAB = Lab(7, "batching and scheduling", exports=("check_block_allocator", "ReferenceBlockAllocator"),
          pieces={"BlockAllocator": "ReferenceBlockAllocator"},
          fallbacks={"check_block_allocator": ReferenceBlockAllocator})
