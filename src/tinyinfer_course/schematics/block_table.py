"""Chapter 7's pictures of paged KV memory: block tables pointing into one
pool, a block shared by reference count, and copy-on-write. The block ids and
reference counts are not drawn by hand: the engine's own BlockManager is run
on the scenario, and the picture shows what it decided."""
from __future__ import annotations

from tinyinfer.block_manager import BlockManager
from tinyinfer.config import EngineConfig
from tinyinfer.request import Request
from tinyinfer.sampling import SamplingParams
from .draw import arrow, blocks, box, canvas, label


def _ref_color(ref_count: int) -> str:
    return "grey" if ref_count == 0 else ("blue" if ref_count == 1 else "orange")


def block_table_scenario(block_size: int | None = None, num_blocks: int = 8):
    """Run the scenario on a real BlockManager; returns (block_size, before, after, copies),
    each snapshot a dict with the block tables and every block's reference count.

    Request A's prompt fills two blocks and half a third; it asks for two samples
    (n=2), so after its prefill the engine forks a second sequence that shares all
    three blocks. Request B starts with the same two blocks of tokens (a shared
    system prompt) and finds them in the prefix cache. Then A's second sample
    writes its first token into the shared, half-full last block: copy-on-write."""
    bs = block_size or EngineConfig().block_size
    bm = BlockManager(num_blocks=num_blocks, block_size=bs)
    system = list(range(1000, 1000 + 2 * bs))  # two full blocks of shared tokens
    a = system + list(range(bs // 2))  # A: the system prompt and half a block of its own
    b = system + list(range(500, 500 + bs // 2 + 2))
    request_a = Request("A", None, a, SamplingParams(n=2))
    seq_a = request_a.samples[0]
    bm.allocate(seq_a, len(a))
    seq_a.num_computed_tokens = len(a)
    bm.mark_computed(seq_a)  # A's prefill ran: its full blocks are filed under their hashes
    (seq_a1,) = request_a.fork()  # n=2: the second sample (A#1) shares every block
    bm.fork(seq_a, seq_a1)
    seq_b = Request("B", None, b, SamplingParams()).samples[0]
    bm.allocate(seq_b, len(b))  # finds the system prompt's two blocks in the prefix cache
    seqs = (seq_a, seq_a1, seq_b)
    snap = lambda: dict(tables={s.seq_id: list(s.block_table) for s in seqs},  # noqa: E731
                        refs=[blk.ref_count for blk in bm.blocks], tokens={"A": len(a), "A#1": len(a), "B": len(b)})
    before = snap()
    copies = bm.append_slots(seq_a1, len(a) + 1)  # A#1 writes one token into the shared last block
    after = snap()
    after["tokens"]["A#1"] += 1
    return bs, before, after, copies


def _panel(ax, x0, title, snap, bs, copies=()):
    label(ax, x0 + 3.6, 8.6, title, fontsize=9)
    names = {"A": "A, sample 0", "A#1": "A, sample 1", "B": "B"}
    label(ax, x0 + 3.6, 8.05, "block tables: the pool block behind each run of positions", fontsize=9, italic=True)
    for row, (seq, table) in enumerate(snap["tables"].items()):
        y = 6.9 - row * 1.2
        label(ax, x0 + 1.7, y + 0.4, names[seq], ha="right", fontsize=9)
        blocks(ax, x0 + 1.9, y, [str(b) for b in table], [_ref_color(snap["refs"][b]) for b in table], size=0.8)
        label(ax, x0 + 2.0 + 0.9 * len(table), y + 0.4, f"{snap['tokens'][seq]} tokens", ha="left", fontsize=9,
              italic=True)
    y_pool = 2.4
    label(ax, x0 + 3.6, y_pool + 1.3, "the KV pool: block id (top), reference count (below)", fontsize=9)
    centres = blocks(ax, x0 + 0.2, y_pool, [str(i) for i in range(len(snap["refs"]))],
                     [_ref_color(r) for r in snap["refs"]], size=0.8)
    for c, r in zip(centres, snap["refs"]):
        label(ax, c, y_pool - 0.35, f"x{r}", fontsize=9)
    for src, dst in copies:
        arrow(ax, (centres[src], y_pool - 0.7), (centres[dst], y_pool - 0.7), color="vermillion", curve=0.4)
        label(ax, (centres[src] + centres[dst]) / 2, y_pool - 1.45, f"copy block {src} into {dst}", fontsize=9,
              color="vermillion")
    return centres


def draw_block_table(block_size: int | None = None):
    """Two snapshots of the engine's block manager, side by side. Each shows the
    block table of three sequences (the two samples of request A and request B)
    above the pool of KV blocks with their reference counts. Left: after the
    prefill, A's two samples share all three of A's blocks and B shares the two
    full blocks of the common system prompt (orange: shared, blue: one owner,
    grey: free). Right: A's second sample writes its next token into the shared,
    half-full last block, so the engine first copies that block to a free one
    (copy-on-write) and points the sample's table at the copy."""
    bs, before, after, copies = block_table_scenario(block_size)
    fig, ax = canvas(16.9, 9.4)
    _panel(ax, 0.2, "after A's prefill (n=2) and B's prefix-cache hit", before, bs)
    _panel(ax, 9.0, "A's sample 1 writes one token: copy-on-write", after, bs, copies)
    ax.plot([8.6, 8.6], [0.6, 8.9], color="#cccccc", linewidth=0.8)
    for x, color, text in ((0.6, "orange", "shared (count > 1)"), (4.0, "blue", "one owner"),
                           (6.6, "grey", "free")):
        box(ax, x, 0.25, 0.45, 0.45, "", color)
        label(ax, x + 0.6, 0.47, text, ha="left", fontsize=9)
    label(ax, 16.6, 0.47, f"{bs} token positions per block", ha="right", fontsize=9, italic=True)
    return fig
