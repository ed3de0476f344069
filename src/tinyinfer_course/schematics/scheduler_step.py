"""Chapter 7's picture of continuous batching at work: consecutive steps of
the engine's own Scheduler, each a bar as long as the token budget, split
among the requests that run in it (decode tokens, prompt chunks), with the
queue beside it and a preemption when the KV pool runs dry.

Nothing here is drawn by hand: a small scripted workload runs through the real
Scheduler and BlockManager, with a stand-in for the model (every sampled token
is 0), and the picture shows the steps it scheduled."""
from __future__ import annotations

from dataclasses import dataclass, field

from matplotlib.patches import Rectangle

from tinyinfer.block_manager import BlockManager
from tinyinfer.config import EngineConfig
from tinyinfer.request import Request
from tinyinfer.sampling import SamplerOutput, SamplingParams
from tinyinfer.scheduler import Scheduler, SchedulerConfig
from .draw import COLORS, FILLS, canvas, label

# (request, arrives before step, prompt tokens, tokens it will write): a short
# picture, so the budget and the pool are small; block_size is the engine's.
SCRIPT = (("A", 0, 14, 30), ("B", 0, 17, 30), ("C", 1, 40, 30), ("D", 2, 20, 30))
BUDGET, NUM_BLOCKS, MAX_NUM_SEQS = 32, 6, 4
COLOR_OF = {"A": "blue", "B": "green", "C": "orange", "D": "purple"}


@dataclass
class StepRecord:
    """What one call to Scheduler.schedule() decided."""

    index: int
    # (request, tokens, "decode" | "prefill" | "chunk" | "rest", prompt tokens done after the step, prompt length)
    work: list[tuple[str, int, str, int, int]] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)  # after the step was decided
    blocks: dict[str, int] = field(default_factory=dict)  # KV blocks each request holds during the step
    free_blocks: int = 0
    grew: list[str] = field(default_factory=list)  # requests that took a new block in this step


def run_script(script=SCRIPT, budget: int = BUDGET, num_blocks: int = NUM_BLOCKS, block_size: int | None = None,
               max_num_seqs: int = MAX_NUM_SEQS, steps: int = 12) -> list[StepRecord]:
    """Run the script through the engine's Scheduler and record every step."""
    bs = block_size or EngineConfig().block_size
    sched = Scheduler(SchedulerConfig(max_num_seqs, budget), BlockManager(num_blocks, bs, enable_prefix_caching=False))
    records = []
    for index in range(steps):
        for name, arrives, prompt, output in script:
            if arrives == index:
                params = SamplingParams(max_tokens=output, temperature=0, ignore_eos=True)
                sched.add(Request(name, None, [1] * prompt, params))
        out = sched.schedule()
        rec = StepRecord(index, preempted=[s.seq_id for s in out.preempted],
                         waiting=[s.seq_id for s in sched.waiting], free_blocks=sched.block_manager.num_free_blocks)
        for entry in out.scheduled:
            seq, n = entry.seq, entry.num_new_tokens
            done = entry.start + n
            kind = ("decode" if n == 1 and seq.num_output_tokens else "chunk" if done < seq.num_tokens
                    else "rest" if entry.start else "prefill")
            rec.work.append((seq.seq_id, n, kind, done, seq.num_tokens))
            rec.blocks[seq.seq_id] = len(entry.block_table)
            if records and 0 < records[-1].blocks.get(seq.seq_id, 0) < rec.blocks[seq.seq_id]:
                rec.grew.append(seq.seq_id)
        records.append(rec)
        if out.is_empty:
            break
        sampled = SamplerOutput(token_ids=[0] * len(out.sampling), logprobs=[None] * len(out.sampling))
        sched.update_from_output(out, sampled)
    return records


def pick_steps(records: list[StepRecord]) -> list[StepRecord]:
    """The steps worth drawing: from the first one with a prompt chunk through
    the first preemption (or the first three steps if the script shows neither)."""
    first = next((r.index for r in records if any(w[2] == "chunk" for w in r.work)), 0)
    last = next((r.index for r in records if r.preempted and r.index >= first), first + 2)
    return records[first : last + 1]


def _step_row(ax, y, rec: StepRecord, budget: int, num_blocks: int, x0: float = 2.2, width: float = 9.0):
    unit = width / budget
    label(ax, x0 - 0.15, y + 0.35, f"step {rec.index}", ha="right", fontsize=9)
    x = x0
    for name, n, kind, done, total in rec.work:
        text = {"decode": "", "prefill": f"{name}: prompt, {n}", "chunk": f"{name}: chunk, {done} of {total}",
                "rest": f"{name}: rest, {n}"}[kind]
        color = COLOR_OF.get(name, "grey")
        ax.add_patch(Rectangle((x, y), n * unit, 0.7, facecolor=FILLS[color], edgecolor=COLORS[color], linewidth=1.0,
                               linestyle="--" if kind == "chunk" else "-"))
        if text and n * unit > 1.2:
            label(ax, x + n * unit / 2, y + 0.35, text, fontsize=9)
        else:  # a decode token is a sliver: name it above
            label(ax, x + n * unit / 2, y + 0.92, name, fontsize=9)
        x += n * unit
    if x < x0 + width:  # what the step left unused
        ax.add_patch(Rectangle((x, y), x0 + width - x, 0.7, facecolor="white", edgecolor=COLORS["grey"],
                               hatch="///", linewidth=0.6))
    used = sum(w[1] for w in rec.work)
    label(ax, x0 + width + 0.15, y + 0.35, f"{used}/{budget}", ha="left", fontsize=9)
    notes = []
    if rec.preempted:
        who = f"{', '.join(rec.grew)} needs a new block, none is free: " if rec.grew else "pool full: "
        notes.append(f"{who}{', '.join(rec.preempted)} (the newest) is preempted, back to the queue's front")
    why = ""
    if rec.waiting and not rec.preempted:  # why the head of the queue was not admitted
        why = " (budget spent)" if used >= budget else " (no free block)" if rec.free_blocks == 0 else ""
    elif rec.waiting:
        why = " (no admissions after a preemption)"
    notes.append("queue: " + (", ".join(rec.waiting) + why if rec.waiting else "empty"))
    for j, note in enumerate(notes):
        label(ax, x0, y - 0.3 - 0.4 * j, note, ha="left", fontsize=9,
              color="vermillion" if rec.preempted and j == 0 else None, italic=True)
    # The KV pool during the step: one square per block, coloured by its owner.
    px = 13.0
    owned = [name for name, count in rec.blocks.items() for _ in range(count)]
    for i in range(num_blocks):
        name = owned[i] if i < len(owned) else None
        color = COLOR_OF.get(name, "grey") if name else "grey"
        ax.add_patch(Rectangle((px + i * 0.42, y + 0.1), 0.36, 0.5, facecolor=FILLS[color] if name else "white",
                               edgecolor=COLORS[color], linewidth=0.8))
        if name:
            label(ax, px + i * 0.42 + 0.18, y + 0.35, name, fontsize=9)


def draw_scheduler_step(script=SCRIPT, budget: int = BUDGET, num_blocks: int = NUM_BLOCKS,
                        block_size: int | None = None):
    """Consecutive steps of the engine's scheduler, one row each. A row's bar is
    the step's token budget: one token for each decoding request, a prompt (or a
    dashed chunk of one, when it does not fit the budget) for each prefilling
    one, hatched where the budget went unused. Under the bar, the queue; on the
    right, the KV pool's blocks coloured by the request holding them. In the last
    row a decoding request needs a new block, the pool has none, and the newest
    request is preempted: its blocks are freed and it returns to the front of the
    queue, and nobody new is admitted in that step."""
    bs = block_size or EngineConfig().block_size
    rows = pick_steps(run_script(script, budget, num_blocks, bs))
    pitch = 2.0  # a row: the bar, the names of decode slivers above it, two lines of notes below
    fig, ax = canvas(16, pitch * len(rows) + 1.9)
    top = pitch * len(rows) + 0.6
    label(ax, 6.7, top + 0.9, f"token budget per step: {budget} (max_num_batched_tokens)", fontsize=9)
    label(ax, 13.0 + num_blocks * 0.21, top + 0.9, f"KV pool: {num_blocks} blocks of {bs}", fontsize=9)
    for i, rec in enumerate(rows):
        _step_row(ax, top - 0.4 - i * pitch, rec, budget, num_blocks)
    label(ax, 0.3, 0.4, "Running requests go first, oldest first; then the queue, while budget, seats and blocks "
          "last.\nHatched: budget left unused.", ha="left", fontsize=9, italic=True)
    return fig
