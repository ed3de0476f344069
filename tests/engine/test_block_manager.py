"""BlockManager bookkeeping: reference counts, the free list, prefix hashes.

The property test drives random sequences of allocate / append / fork /
mark_computed / free and checks after every operation that the counts agree
with the block tables, which the sequences carry. The other tests pin down specific behaviours."""
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dataclasses import dataclass, field

from tinyinfer.block_manager import BlockManager, NoFreeBlocksError
from tinyinfer.request import Request
from tinyinfer.sampling import SamplingParams


@dataclass
class Seq:
    """What the block manager reads and writes on a sequence (tinyinfer's
    Sequence has these, and more): its tokens, how many are computed, and its
    block table with the count of its blocks filed in the prefix cache."""

    seq_id: str
    token_ids: list[int]
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    num_hashed_blocks: int = 0


def scheduled(bm: BlockManager, seq: Seq, num_tokens: int) -> list:
    """A step's share: grow the table to num_tokens, which the step then computes
    (the scheduler counts them computed once scheduled)."""
    copies = bm.append_slots(seq, num_tokens)
    seq.num_computed_tokens = num_tokens
    return copies


def check_invariants(bm: BlockManager, seqs: dict[str, Seq]) -> None:
    refs = [0] * bm.num_blocks
    for seq in seqs.values():
        table = seq.block_table
        assert len(set(table)) == len(table), "a table lists a block twice"
        for b in table:
            refs[b] += 1
        assert len(table) == bm.blocks_for(seq.num_computed_tokens)
        assert all(bm.blocks[b].hash is not None for b in table[: seq.num_hashed_blocks])
    assert [blk.ref_count for blk in bm.blocks] == refs
    assert set(bm.free_block_ids) == {i for i, r in enumerate(refs) if r == 0}
    assert bm.num_free_blocks + bm.num_used_blocks == bm.num_blocks
    for h, b in bm.cached_blocks.items():
        assert bm.blocks[b].hash == h


ops = st.lists(st.tuples(st.sampled_from(["alloc", "append", "fork", "computed", "free"]),
                         st.integers(0, 5), st.integers(1, 40), st.integers(0, 2)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(ops)
@example([("alloc", 0, 3, 0), ("fork", 0, 5, 0), ("append", 0, 3, 0)])  # a write into the shared partial block
def test_random_operations_keep_counts_consistent(operations):
    bm = BlockManager(num_blocks=12, block_size=4)
    seqs: dict[str, Seq] = {}
    for op, sid_n, n, variant in operations:
        sid = f"s{sid_n}"
        seq = seqs.get(sid)
        if op == "alloc" and seq is None:
            # Few distinct prompts, so prefixes repeat and the cache gets hits.
            seq = Seq(sid, [variant] * 6 + list(range(n)))
            hits = bm.match_prefix(seq)
            if bm.can_allocate(seq, len(seq.token_ids), hits):
                cached = bm.allocate(seq, len(seq.token_ids), hits)
                assert cached == len(hits) * bm.block_size and cached < len(seq.token_ids)
                seq.num_computed_tokens = len(seq.token_ids)
                seqs[sid] = seq
            else:
                with pytest.raises(NoFreeBlocksError):
                    bm.allocate(seq, len(seq.token_ids), hits)
                assert not seq.block_table
        elif op == "append" and seq is not None:
            grow = len(seq.token_ids) + n % 9
            before = (bm.num_free_blocks, list(seq.block_table))
            start = seq.num_computed_tokens
            try:
                copies = scheduled(bm, seq, grow)
                seq.token_ids += [7] * (grow - len(seq.token_ids))
                for _, dst in copies:  # the copy is this sequence's own
                    assert dst in seq.block_table and bm.blocks[dst].ref_count == 1
                if grow > start:  # every block the step writes into is this sequence's alone
                    written = seq.block_table[start // bm.block_size : bm.blocks_for(grow)]
                    assert all(bm.blocks[b].ref_count == 1 for b in written)
            except NoFreeBlocksError:
                assert (bm.num_free_blocks, seq.block_table) == before  # a failed append changes nothing
        elif op == "fork" and seq is not None:
            child_id = f"c{sid_n}{n}"
            if child_id not in seqs:
                child = Seq(child_id, list(seq.token_ids), seq.num_computed_tokens)
                bm.fork(seq, child)
                assert child.block_table == seq.block_table
                seqs[child_id] = child
        elif op == "computed" and seq is not None:
            bm.mark_computed(seq)
        elif op == "free" and seq is not None:
            bm.free(seq)
            assert not seq.block_table
            del seqs[sid]
        check_invariants(bm, seqs)
    for seq in seqs.values():
        bm.free(seq)
    check_invariants(bm, {})
    assert bm.num_free_blocks == bm.num_blocks


def allocated(bm: BlockManager, sid: str, token_ids: list[int]) -> tuple[Seq, int]:
    """A prompt admitted whole: its blocks, with its cached prefix; (seq, cached tokens)."""
    seq = Seq(sid, list(token_ids))
    cached = bm.allocate(seq, len(token_ids))
    seq.num_computed_tokens = len(token_ids)
    return seq, cached


def test_prefix_hit_reuses_computed_blocks_and_verifies_tokens():
    bm = BlockManager(num_blocks=8, block_size=4)
    prompt = list(range(10))  # blocks [0..3] [4..7] and a partial [8, 9]
    a, cached = allocated(bm, "a", prompt)
    assert cached == 0
    assert bm.match_prefix(Seq("x", prompt)) == []  # nothing is filed before it is computed
    bm.mark_computed(a)
    assert a.num_hashed_blocks == 2  # the partial block is not filed
    assert bm.match_prefix(Seq("x", prompt)) == a.block_table[:2]
    b, cached = allocated(bm, "b", prompt)
    assert cached == 8 and b.num_hashed_blocks == 2
    assert b.block_table[:2] == a.block_table[:2]
    assert bm.blocks[a.block_table[0]].ref_count == 2
    # a different second block: only the first block matches
    assert len(bm.match_prefix(Seq("x", prompt[:4] + [99] * 6))) == 1
    # a prompt that is exactly the cached blocks still computes its last token
    assert len(bm.match_prefix(Seq("x", prompt[:8]))) == 1


def test_freed_cached_blocks_are_revived_or_evicted_lru():
    bm = BlockManager(num_blocks=4, block_size=2)
    a = [1, 2, 3, 4, 5]
    first, _ = allocated(bm, "a", a)
    bm.mark_computed(first)
    bm.free(first)
    assert bm.num_free_blocks == 4 and first.block_table == [] and first.num_hashed_blocks == 0
    assert len(bm.match_prefix(Seq("x", a))) == 2  # still cached after the free
    second, cached = allocated(bm, "b", a)
    assert cached == 4  # revived, not recomputed
    bm.free(second)
    # fill the pool with other tokens: the cached blocks are evicted
    allocated(bm, "c", [9] * 8)
    assert bm.match_prefix(Seq("x", a)) == []
    assert bm.prefix_cache_hit_tokens == 4


def test_fork_shares_blocks_and_copies_on_write():
    bm = BlockManager(num_blocks=6, block_size=4)
    parent, _ = allocated(bm, "p", [1] * 6)  # one full block + a partial one
    child = Seq("c", [1] * 6, parent.num_computed_tokens)
    bm.fork(parent, child)
    assert child.block_table == parent.block_table
    copies = scheduled(bm, child, 7)  # the child writes into the shared partial block
    assert len(copies) == 1 and copies[0][0] == parent.block_table[1]
    assert child.block_table[1] == copies[0][1] != parent.block_table[1]
    assert child.block_table[0] == parent.block_table[0]  # the full block stays shared
    assert scheduled(bm, parent, 7) == []  # the parent is now the block's only user: no copy
    check_invariants(bm, {"p": parent, "c": child})


def test_the_engine_sequence_carries_its_blocks():
    """The real Sequence is what the scheduler hands the block manager."""
    bm = BlockManager(num_blocks=4, block_size=4)
    seq = Request("r", None, list(range(6)), SamplingParams()).samples[0]
    assert bm.allocate(seq, 6) == 0 and len(seq.block_table) == 2
    seq.num_computed_tokens = 6
    bm.mark_computed(seq)
    assert seq.num_hashed_blocks == 1
    bm.free(seq)
    assert seq.block_table == [] and bm.num_free_blocks == 4
    with pytest.raises(RuntimeError, match="freed twice"):
        bm._release(0)


def test_bad_sizes_are_rejected_with_the_field_name():
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(0, 16)
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(4, 0)


def test_a_block_is_found_only_after_the_same_prefix():
    """A block's keys and values depend on every token before it, so a cached block
    is reused only behind the same parents. Here the block [5, 6, 7, 8] was computed
    after [1, 2, 3, 4]; a prompt that starts with [5, 6, 7, 8] must not get it (its
    tokens match, its past does not). A hash that ignored the parent would hand it
    over, and that prompt would continue from another prompt's keys."""
    bm = BlockManager(num_blocks=8, block_size=4)
    first = Seq("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    bm.allocate(first, 9)
    first.num_computed_tokens = 9
    bm.mark_computed(first)
    bm.free(first)
    assert len(bm.match_prefix(Seq("same", [1, 2, 3, 4, 5, 6, 7, 8, 10]))) == 2  # both blocks, behind the same past
    assert bm.match_prefix(Seq("shifted", [5, 6, 7, 8, 9])) == []  # block 2's tokens, but at the start
    assert bm.match_prefix(Seq("other-past", [0, 2, 3, 4, 5, 6, 7, 8, 9])) == []  # the first block differs
