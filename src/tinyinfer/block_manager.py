"""BlockManager: the KV cache cut into fixed-size blocks, handed out on demand.

A contiguous cache reserves max_len slots for every sequence up front; most of
that space never holds a token. Paging (vLLM's PagedAttention) reserves memory
one block of `block_size` tokens at a time instead, so a sequence wastes at most
one partly filled block. Each sequence has a *block table*: the list of block ids
that hold its positions 0..bs-1, bs..2bs-1, and so on. Blocks need not be
adjacent; attention looks positions up through the table.

Blocks are shared, with reference counts:
- **Prefix caching.** Once a block is full and its keys/values are computed, we
  file it under a hash of its tokens chained with its parent block's hash (so
  the hash stands for the whole prefix, not just these 16 tokens). A new prompt
  that starts with the same tokens finds those blocks and skips their prefill.
  A hash can collide, so a hit is confirmed by comparing the token ids.
- **Freed blocks stay cached.** A block whose last user leaves goes to the end of
  the free list with its hash kept; if the same prefix comes back before the
  block is reused, it is revived for free. New allocations take the block at
  the front, the least recently freed: LRU eviction.
- **fork** lets two sequences share every block (parallel sampling, beam
  search); the first write into a shared, partly filled block copies it
  (copy-on-write).

The manager only does bookkeeping on ids; the tensors live in PagedKVCache.
Each sequence carries its own block table, so the manager keeps nothing per
sequence: it only knows which blocks are free, shared or cached.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .checks import check_int

if TYPE_CHECKING:
    from .sequence import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None  # set once the block is full and computed
    token_ids: tuple[int, ...] = ()  # the tokens it holds, to confirm a hash hit


class NoFreeBlocksError(RuntimeError):
    """Raised when an allocation is attempted without checking can_allocate first."""


class BlockManager:
    """Owns the blocks; each sequence owns its block table (seq.block_table, the
    ids of the blocks that hold its positions, in order) and the count of its
    blocks filed in the prefix cache (seq.num_hashed_blocks). Every call takes
    the sequence, as in nano-vllm. A sequence's next write lands at position
    seq.num_computed_tokens: the block manager reads it to know whether the
    write falls into a shared block that must be copied first."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        check_int("num_blocks", num_blocks, 1)
        check_int("block_size", block_size, 1)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # ref_count == 0 blocks, oldest-freed first (an OrderedDict used as an LRU list).
        self.free_block_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached_blocks: dict[int, int] = {}  # prefix hash -> block id
        self.prefix_cache_hit_tokens = 0  # cumulative, for stats

    # --- queries ------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_block_ids)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_block_ids)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)  # ceil division

    # --- prefix caching -------------------------------------------------------

    @staticmethod
    def hash_block(parent_hash: int | None, token_ids) -> int:
        """A block's key: its tokens *and* everything before them (via the parent's hash)."""
        return hash((parent_hash, tuple(token_ids)))

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Ids of cached blocks holding a prefix of seq's tokens, in order.

        Only blocks inside token_ids[:-1] count: the last token must be computed
        anyway, because its output is the next token's distribution."""
        if not self.enable_prefix_caching:
            return []
        hits, parent = [], None
        bs, token_ids = self.block_size, seq.token_ids
        for i in range((len(token_ids) - 1) // bs):
            chunk = tuple(token_ids[i * bs : (i + 1) * bs])
            h = self.hash_block(parent, chunk)
            block_id = self.cached_blocks.get(h)
            if block_id is None or self.blocks[block_id].token_ids != chunk:  # a miss, or a collision
                break
            hits.append(block_id)
            parent = h
        return hits

    # --- allocation -------------------------------------------------------------

    def can_allocate(self, seq: Sequence, num_tokens: int, hits: list[int] | None = None) -> bool:
        """Could a sequence without blocks get them for its first num_tokens tokens
        now? `hits`: match_prefix(seq), if the caller has it already (the
        scheduler matches once per admission; [] to use no cached block)."""
        hits = self.match_prefix(seq) if hits is None else hits
        # A hit block nobody uses sits in the free list; reviving it uses up one free block.
        revived = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        return self.blocks_for(num_tokens) - len(hits) + revived <= self.num_free_blocks

    def allocate(self, seq: Sequence, num_tokens: int, hits: list[int] | None = None) -> int:
        """Give a sequence without blocks a table for its first num_tokens tokens,
        starting with the cached blocks `hits` (default: match_prefix(seq)).
        Returns how many leading tokens those hold (already computed)."""
        if seq.block_table:
            raise ValueError(f"sequence {seq.seq_id!r} already has blocks")
        hits = self.match_prefix(seq) if hits is None else hits
        if not self.can_allocate(seq, num_tokens, hits):
            raise NoFreeBlocksError(f"not enough free KV blocks for {num_tokens} tokens")
        for block_id in hits:
            self._take(block_id)
        seq.block_table = list(hits)
        seq.num_hashed_blocks = len(hits)
        while len(seq.block_table) < self.blocks_for(num_tokens):
            seq.block_table.append(self._pop_free())
        cached = len(hits) * self.block_size
        self.prefix_cache_hit_tokens += cached
        return cached

    def _blocks_needed(self, seq: Sequence, num_tokens: int) -> tuple[int, bool]:
        """(free blocks needed to hold num_tokens, whether the block the next write
        lands in must be copied first)."""
        table, start = seq.block_table, seq.num_computed_tokens
        # The next write (position `start`) lands in a block already in the table
        # when that block is partly filled. If another sequence shares it (fork),
        # writing would change that sequence's past: copy it first.
        cow = num_tokens > start and start % self.block_size != 0 and start // self.block_size < len(table) \
            and self.blocks[table[start // self.block_size]].ref_count > 1
        return max(0, self.blocks_for(num_tokens) - len(table)) + cow, cow

    def can_append(self, seq: Sequence, num_tokens: int) -> bool:
        """Could seq's table grow to hold num_tokens tokens now (counting the copy
        a shared, partly filled block needs)?"""
        return self._blocks_needed(seq, num_tokens)[0] <= self.num_free_blocks

    def append_slots(self, seq: Sequence, num_tokens: int) -> list[tuple[int, int]]:
        """Grow seq's table to hold num_tokens tokens. Returns (src, dst) block
        copies the cache must make: copy-on-write for a shared block it writes."""
        need, cow = self._blocks_needed(seq, num_tokens)
        if need > self.num_free_blocks:
            raise NoFreeBlocksError(f"sequence {seq.seq_id!r} needs {need} more KV blocks; "
                                    f"{self.num_free_blocks} are free")
        table, copies = seq.block_table, []
        if cow:
            i = seq.num_computed_tokens // self.block_size
            new = self._pop_free()
            self._release(table[i])
            copies.append((table[i], new))
            table[i] = new
        while len(table) < self.blocks_for(num_tokens):
            table.append(self._pop_free())
        return copies

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """The child shares every block of the parent (no copy until one writes)."""
        if child.block_table:
            raise ValueError(f"sequence {child.seq_id!r} already has blocks")
        for block_id in parent.block_table:
            self.blocks[block_id].ref_count += 1
        child.block_table = list(parent.block_table)
        child.num_hashed_blocks = parent.num_hashed_blocks

    def free(self, seq: Sequence) -> None:
        """Release a finished, aborted or preempted sequence's blocks. Tail blocks
        are freed first, so a prefix's head stays cached longest."""
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table, seq.num_hashed_blocks = [], 0

    def mark_computed(self, seq: Sequence) -> None:
        """File every block of seq that is now full and computed (up to
        seq.num_computed_tokens) under its prefix hash, so later prompts can reuse it."""
        if not self.enable_prefix_caching:
            return
        table, done, bs = seq.block_table, seq.num_hashed_blocks, self.block_size
        parent = self.blocks[table[done - 1]].hash if done else None
        for i in range(done, min(seq.num_computed_tokens // bs, len(table))):
            block = self.blocks[table[i]]
            chunk = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            h = self.hash_block(parent, chunk)
            if block.hash is None:
                block.hash, block.token_ids = h, chunk
                self.cached_blocks.setdefault(h, block.block_id)
            parent = block.hash
            seq.num_hashed_blocks = i + 1

    def reset_prefix_cache(self) -> int:
        """Forget the prefixes cached in free blocks (vLLM's reset_prefix_cache),
        e.g. so that a benchmark's second run must compute what its first did.
        Blocks in use keep theirs. Returns how many blocks were forgotten."""
        forgotten = 0
        for block_id in self.free_block_ids:
            if self.blocks[block_id].hash is not None:
                self._forget(block_id)
                forgotten += 1
        return forgotten

    # --- internals --------------------------------------------------------------

    def _pop_free(self) -> int:
        block_id, _ = self.free_block_ids.popitem(last=False)  # least recently freed
        if self.blocks[block_id].hash is not None:  # evict it from the prefix cache
            self._forget(block_id)
        self.blocks[block_id].ref_count = 1
        return block_id

    def _forget(self, block_id: int) -> None:
        """Drop a block's prefix hash and its entry in the prefix cache."""
        block = self.blocks[block_id]
        if self.cached_blocks.get(block.hash) == block_id:
            del self.cached_blocks[block.hash]
        block.hash, block.token_ids = None, ()

    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_block_ids[block_id]
        block.ref_count += 1

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count <= 0:  # a bookkeeping bug: raise even under python -O, where an assert vanishes
            raise RuntimeError(f"block {block_id} freed twice (its reference count is already 0)")
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free_block_ids[block_id] = None  # to the back: freed most recently
