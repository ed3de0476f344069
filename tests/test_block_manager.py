"""BlockManager bookkeeping: reference counts, the free list, prefix hashes.

The property test drives random sequences of allocate / append / fork /
mark_computed / free and checks after every operation that the counts agree
with the block tables. The other tests pin down specific behaviours."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyinfer.block_manager import BlockManager, NoFreeBlocksError


def check_invariants(bm: BlockManager) -> None:
    refs = [0] * bm.num_blocks
    for table in bm.block_tables.values():
        assert len(set(table)) == len(table), "a table lists a block twice"
        for b in table:
            refs[b] += 1
    assert [blk.ref_count for blk in bm.blocks] == refs
    assert set(bm.free_block_ids) == {i for i, r in enumerate(refs) if r == 0}
    assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks
    for h, b in bm.cached_blocks.items():
        assert bm.blocks[b].hash == h
    for sid, table in bm.block_tables.items():
        assert len(table) == bm.blocks_for(bm.num_slots[sid]) or bm.num_slots[sid] == 0


ops = st.lists(st.tuples(st.sampled_from(["alloc", "append", "fork", "computed", "free"]),
                         st.integers(0, 5), st.integers(1, 40), st.integers(0, 2)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_random_operations_keep_counts_consistent(operations):
    bm = BlockManager(num_blocks=12, block_size=4)
    tokens: dict[str, list[int]] = {}
    for op, sid_n, n, variant in operations:
        sid = f"s{sid_n}"
        if op == "alloc" and sid not in bm.block_tables:
            # Few distinct prompts, so prefixes repeat and the cache gets hits.
            ids = [variant] * 6 + list(range(n))
            if bm.can_allocate(sid, ids, len(ids)):
                cached = bm.allocate(sid, ids, len(ids))
                assert cached % bm.block_size == 0 and cached < len(ids)
                tokens[sid] = ids
            else:
                with pytest.raises(NoFreeBlocksError):
                    bm.allocate(sid, ids, len(ids))
        elif op == "append" and sid in bm.block_tables:
            grow = bm.num_slots[sid] + n % 9
            before = bm.num_free_blocks
            try:
                bm.append_slots(sid, grow)
                tokens[sid] = tokens[sid] + [7] * (grow - len(tokens[sid]))
            except NoFreeBlocksError:
                assert bm.num_free_blocks == before  # a failed append changes nothing
        elif op == "fork" and sid in bm.block_tables:
            child = f"c{sid_n}{n}"
            if child not in bm.block_tables:
                bm.fork(sid, child)
                tokens[child] = list(tokens[sid])
        elif op == "computed" and sid in bm.block_tables:
            bm.mark_computed(sid, tokens[sid], min(len(tokens[sid]), bm.num_slots[sid]))
        elif op == "free":
            bm.free(sid)
            tokens.pop(sid, None)
        check_invariants(bm)
    for sid in list(bm.block_tables):
        bm.free(sid)
    check_invariants(bm)
    assert bm.num_free_blocks == bm.num_blocks


def test_prefix_hit_reuses_computed_blocks_and_verifies_tokens():
    bm = BlockManager(num_blocks=8, block_size=4)
    prompt = list(range(10))  # blocks [0..3] [4..7] and a partial [8, 9]
    assert bm.allocate("a", prompt, len(prompt)) == 0
    assert bm.match_prefix(prompt) == []  # nothing is filed before it is computed
    bm.mark_computed("a", prompt, len(prompt))
    assert bm.match_prefix(prompt) == bm.block_table("a")[:2]
    assert bm.allocate("b", prompt, len(prompt)) == 8
    assert bm.block_table("b")[:2] == bm.block_table("a")[:2]
    assert bm.blocks[bm.block_table("a")[0]].ref_count == 2
    # a different second block: only the first block matches
    other = prompt[:4] + [99] * 6
    assert len(bm.match_prefix(other)) == 1
    # a prompt that is exactly the cached blocks still computes its last token
    assert len(bm.match_prefix(prompt[:8])) == 1


def test_freed_cached_blocks_are_revived_or_evicted_lru():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = [1, 2, 3, 4, 5]
    bm.allocate("a", a, 5)
    bm.mark_computed("a", a, 5)
    bm.free("a")
    assert bm.num_free_blocks == 4
    assert len(bm.match_prefix(a)) == 2  # still cached after the free
    assert bm.allocate("b", a, 5) == 4  # revived, not recomputed
    bm.free("b")
    # fill the pool with other tokens: the cached blocks are evicted
    bm.allocate("c", [9] * 8, 8)
    assert bm.match_prefix(a) == []
    assert bm.prefix_cache_hit_tokens == 4


def test_fork_shares_blocks_and_copies_on_write():
    bm = BlockManager(num_blocks=6, block_size=4)
    bm.allocate("p", [1] * 6, 6)  # one full block + a partial one
    bm.fork("p", "c")
    assert bm.block_table("c") == bm.block_table("p")
    copies = bm.append_slots("c", 7)  # the child writes into the shared partial block
    assert len(copies) == 1 and copies[0][0] == bm.block_table("p")[1]
    assert bm.block_table("c")[1] == copies[0][1] != bm.block_table("p")[1]
    assert bm.block_table("c")[0] == bm.block_table("p")[0]  # the full block stays shared
    check_invariants(bm)


def test_bad_sizes_are_rejected_with_the_field_name():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(0, 16)
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(4, 0)
