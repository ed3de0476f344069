"""The GPU report: one run of the engine on a CUDA GPU (parity with transformers,
decode step times against the memory-bandwidth bound, kernel launches, every lab
notebook's time), stored with the course and rendered by chapter 4.

    from tinyinfer_course.reports import gpu as gpu_report
    report = gpu_report.load()        # $TINYINFER_GPU_REPORT, else the stored copy
    print(gpu_report.render(report))  # header, tables, and the sentences computed from them
    gpu_report.page(report)           # chapter 4's Markdown: a verdict, compact tables, the rest folded

CI has no GPU, so the stored report is not remeasured at every build: like the
peers reports (peers.py) it carries the fingerprint of the engine code it
measured, and the header says whether today's code is the same (engine_note).
A stale report is not an error; a page that hides its age would be.

A report is JSON:
    meta       date, device, torch, transformers, cuda, bandwidth_gbs (measured read
               bandwidth, GB/s), launch_us (one kernel launch's cost, or null),
               weights (what they were: random in the real shapes), command,
               engine_stamp (REPORT.stamp() when it ran), and optionally note
    parity     [{shape, dtype, mode, identical, of, max_logprob_diff}]: greedy
               continuations equal to transformers', and the largest difference
               of a prompt's log-probabilities
    decode     [{shape, weight_bytes, dtype, batch, mode, step_ms,
               step_ms_includes_prefill, bound_ms, fraction_of_bound,
               launches_per_step}]; MBU and MFU are computed against the datasheet
               of the GPU named (hardware.CHIPS), not stored; mode is eager, graphs, compiled or
               transformers; bound_ms is weight_bytes / bandwidth. A row may add
               tok_s and step_ms_derived (how step_ms was worked out from tok/s)
    notebooks  [{name, seconds, ok, error}]: each solution notebook run on the GPU
A missing value (null, or no such row) is reported as missing: the sentences
never fill it in.
"""
from __future__ import annotations

from pathlib import Path

from .. import fingerprint
from ..analysis.hardware import CHIPS, Chip, mbu, mfu
from .stored import StoredReport, compact_table, constants_text, fold

DATA = Path(__file__).resolve().parent / "data"  # beside peers' copies: measurements, not engine code
STORED = DATA / "gpu-2026-12-04-h200.json"
MODES = ("eager", "compiled", "graphs", "transformers")  # the table's order
MODE_NAMES = {"eager": "tinyinfer eager", "compiled": "tinyinfer compiled (torch.compile, no graphs)",
              "graphs": "tinyinfer with CUDA graphs", "transformers": "transformers eager",
              "eager_cudnn": "tinyinfer eager, cuDNN attention allowed",
              "compiled_graphs": "tinyinfer compiled, recorded as CUDA graphs"}
SHAPE_NAMES = {"135m": "135M", "1.7b": "1.7B"}
# Decoder layers of each shape, as benchmarks/gpu_check.py's SHAPES builds them from the
# models' config.json (num_hidden_layers); a decode row that records its own "layers" wins.
SHAPE_LAYERS = {"135m": 30, "1.7b": 24}
# Two shapes' step times "follow" their kernel counts when their ratio is within this
# share of the ratio of their layers.
LAYERS_MATCH = 0.25
# A step whose launching alone would take at least this share of its time is
# called launch-bound: the GPU then waits on the CPU more than it works.
LAUNCH_BOUND_SHARE = 0.5


# ------------------------------------------------------------------ the engine that ran it


def engine_modules(root: Path = fingerprint.ROOT) -> list[str]:
    """The modules an `LLM` runs (the engine the GPU check measures), not the server."""
    return fingerprint.closure(["tinyinfer.llm"], root)


TODAY_COMMAND = "python benchmarks/gpu_check.py engine"  # docs/benchmarks.md, "On a GPU"
TODAY_SCRIPT = TODAY_COMMAND.split()[1]
# Today's engine is measured by today's GPU check, whatever script made a report.
REPORT = StoredReport("a GPU report", STORED, engine_modules, env_var="TINYINFER_GPU_REPORT", program="`LLM`",
                      remeasure=f"`{TODAY_COMMAND}` on a CUDA GPU measures today's", keys=("meta",),
                      made_by="the GPU check writes one")


def engine_note(report: dict, today: dict | None = None) -> str:
    """REPORT.note (the same wording as the peers reports'), and for a report without a
    fingerprint but with a commit, what git says changed since (changed_since)."""
    note = REPORT.note(report, today)
    stamp = report["meta"].get("engine_stamp") or {}
    if stamp.get("engine_fingerprint", "unknown") == "unknown":
        moved = changed_since(stamp.get("engine_commit", "unknown"))
        if moved:
            listed = ", ".join(moved[:4]) + (f" and {len(moved) - 4} more" if len(moved) > 4 else "")
            note += (f" Git can tell from the commit: since then, {len(moved)} of the modules `LLM` runs have changed "
                     f"({listed}), so these rows show an engine older than today's.")
        elif moved == []:
            note += " Git finds none of the modules `LLM` runs changed since that commit."
    return note


def changed_since(commit: str, root: Path = fingerprint.ROOT) -> list[str] | None:
    """The modules of engine_modules() whose files differ from `commit`'s ('model_runner',
    ...), or None when git cannot tell (no checkout, a shallow clone without that commit)."""
    if not commit or commit == "unknown":
        return None
    files = fingerprint.package_modules(root)
    names = {files[name].relative_to(root).as_posix(): name for name in engine_modules(root)}
    out = fingerprint._git(root, "diff", "--name-only", "--relative", commit.split("+")[0], "--", *names)
    if out is None:
        return None
    return sorted(names[path].removeprefix("tinyinfer.")
                  for path in out.splitlines() if path in names)


def load(path: str | Path | None = None) -> dict:
    """REPORT.load, with an empty list for each section a run skipped."""
    report = REPORT.load(path)
    for key in ("parity", "decode", "notebooks"):
        report.setdefault(key, [])
    return report


# ------------------------------------------------------------------ formatting


def _num(value, fmt: str, missing: str = "not measured") -> str:
    return missing if value is None else format(value, fmt)


def _shape(row: dict) -> str:
    return SHAPE_NAMES.get(row.get("shape"), str(row.get("shape")))


def _ms(value: float) -> str:
    return f"{value:.3f} ms" if value < 1 else f"{value:.1f} ms"


def _step(ms: float) -> str:
    return f"{ms:.2f} ms" if ms < 1 else f"{ms:.1f} ms"


def _pct(fraction: float) -> str:
    return f"{fraction:.1%}" if fraction < 0.095 else f"{fraction:.0%}"


def _share(fraction: float | None) -> str:
    """A utilisation: as _pct, with two significant digits below 0.1% (an MFU of 0.0037%)."""
    if fraction is None:
        return "not known"
    return _pct(fraction) if fraction >= 0.001 else f"{100 * fraction:.2g}%"


def header(report: dict, today: dict | None = None) -> str:
    m = report["meta"]
    where = (f"stored copy: tinyinfer_course/reports/data/{Path(report['source']).name}" if report.get("stored")
             else f"a saved run: {report.get('source', '?')}")
    versions = ", ".join(f"{name} {m[key]}" for name, key in (("torch", "torch"), ("CUDA", "cuda"),
                                                              ("transformers", "transformers")) if m.get(key))
    lines = [f"{m.get('device', 'unknown GPU')}, {versions or 'versions unknown'}, {m.get('date', 'no date')} "
             f"({where})",
             f"Measured read bandwidth: {_num(m.get('bandwidth_gbs'), ',.0f')} GB/s; one kernel launch: "
             + (f"{m['launch_us']:.1f} µs." if m.get("launch_us") is not None else "not measured."),
             f"Weights: {m.get('weights', 'not stated')}. {command_note(m.get('command'))}"]
    if m.get("note"):
        lines.append(f"Note: {m['note']}")
    lines.append(engine_note(report, today))
    return "  \n".join(lines)


def command_note(command: str | None) -> str:
    """The command that made the report, and today's when that one ran another script
    (the stored H200 run was made by benchmarks/cuda_check.py, which gpu_check.py replaced)."""
    if not command:
        return "Command: not stated."
    words = command.split()
    script = next((w for w in words if w.endswith(".py")), None)
    if script is None or script == TODAY_SCRIPT:
        return f"Command: `{command}`."
    return f"Command: `{command}`, an earlier script than today's GPU check, `{TODAY_COMMAND}`."


PARITY_COLUMNS = ["shape", "dtype, mode", "continuations identical to transformers'",
                  "prompt log-probs, max difference"]


def parity_rows(report: dict) -> list[list[str]]:
    return [[_shape(r), f"{r.get('dtype')}, {r.get('mode')}", f"{r.get('identical')} of {r.get('of')}",
             _num(r.get("max_logprob_diff"), ".2g")] for r in report["parity"]]


def parity_table(report: dict) -> str:
    if not report["parity"]:
        return "No parity rows in this report."
    return "\n".join(["| " + " | ".join(PARITY_COLUMNS) + " |", "|---|---|---|---|"]
                     + ["| " + " | ".join(row) + " |" for row in parity_rows(report)])


def _sorted(rows: list[dict]) -> list[dict]:
    order = {m: i for i, m in enumerate(MODES)}
    return sorted(rows, key=lambda r: (r.get("weight_bytes") or 0, r.get("batch", 0), order.get(r.get("mode"), 9)))


def datasheet_chip(device: str | None) -> Chip | None:
    """The datasheet (hardware.CHIPS) of the GPU a report names, or None for one the
    course has no figures for. A PCIe board has lower peaks than the SXM one listed."""
    if not device or "PCIe" in device:
        return None
    return next((chip for name, chip in CHIPS.items() if name.split()[0] in device), None)


DTYPE_BYTES = {"bfloat16": 2, "float16": 2}  # the formats the datasheet's tensor-core peak (CHIPS) is for


def utilisation(row: dict, chip: Chip | None) -> tuple[float | None, float | None]:
    """(MBU, MFU) of a decode row against the chip's datasheet peaks: the weights' bytes
    per second of the step, and 2 FLOPs per parameter per sequence (attention's few left
    out). None where the step time, the chip, or (for MFU) a 16-bit format is missing."""
    if chip is None or not row.get("step_ms") or not row.get("weight_bytes"):
        return None, None
    seconds, width = row["step_ms"] / 1e3, DTYPE_BYTES.get(row.get("dtype"))
    flops = 2 * row["weight_bytes"] / width * row.get("batch", 1) if width else None
    return (mbu(row["weight_bytes"], seconds, chip.roofline.bandwidth),
            mfu(flops, seconds, chip.roofline.peak_flops) if flops else None)


DECODE_COLUMNS = ["shape, weights", "batch", "engine", "ms per step", "bound", "% of bound",
                  "kernel launches per step", "MBU, datasheet", "MFU, datasheet"]


# The page's decode table (page()): the shape, the weights' size and their dtype in columns of
# their own, and the bound's unit in its heading, so that a column the same in every row can go.
PAGE_DECODE_COLUMNS = ["shape", "weights", "dtype", "batch", "engine", "ms per step", "bound, ms", "% of bound",
                       "kernel launches per step", "MBU, datasheet", "MFU, datasheet"]


def decode_rows(report: dict, split: bool = False) -> list[list[str]]:
    """The decode table's cells, row by row: DECODE_COLUMNS, or with split PAGE_DECODE_COLUMNS."""
    chip = datasheet_chip(report["meta"].get("device"))
    out = []
    for r in _sorted(report["decode"]):
        marks = ("¹" if r.get("step_ms_includes_prefill") else "") + ("²" if r.get("step_ms_derived") else "")
        step = f"{_step(r['step_ms'])[:-3]}{marks}" if r.get("step_ms") is not None else "not measured"
        bound = _ms(r["bound_ms"]) if r.get("bound_ms") is not None else "not known"
        frac = _pct(r["fraction_of_bound"]) if r.get("fraction_of_bound") is not None else "not known"
        size = f"{r['weight_bytes'] / 1e9:.2f} GB" if r.get("weight_bytes") else "?"
        weights = f"{size} {r.get('dtype', '')}" if r.get("weight_bytes") else "?"
        head = ([_shape(r), size, str(r.get("dtype", "?")), str(r.get("batch"))] if split else
                [f"{_shape(r)}, {weights}", str(r.get("batch"))])
        out.append(head + [MODE_NAMES.get(r.get("mode"), r.get("mode")), step,
                           bound.removesuffix(" ms") if split else bound, frac,
                           _num(r.get("launches_per_step"), ",d"), *(_share(x) for x in utilisation(r, chip))])
    return out


def decode_notes(report: dict) -> str:
    """What the decode table's columns and marks mean, for under it."""
    rows, chip = report["decode"], datasheet_chip(report["meta"].get("device"))
    notes = [f"% of bound: against the bandwidth measured on the run. MBU and MFU: against the {chip.name} "
             f"datasheet ({chip.roofline.bandwidth / 1e12:.2f} TB/s, {chip.roofline.peak_flops / 1e12:,.0f} TFLOP/s "
             "dense in 16 bits); the bytes are the weights, the FLOPs 2 per parameter and sequence."
             if chip else "% of bound: against the bandwidth measured on the run. MBU and MFU: not known, as the "
             "course has no datasheet for this GPU."]
    if any(r.get("step_ms_includes_prefill") for r in rows):
        notes.append("¹ includes the prompt's prefill, spread over the new tokens (a user's ms per token), so a "
                     "decode step alone is shorter and its share of the bound higher.")
    if any(r.get("step_ms_derived") for r in rows):
        derived = next(r["step_ms_derived"] for r in rows if r.get("step_ms_derived"))
        notes.append(f"² worked out from tokens per second: {derived}.")
    return "  \n".join(notes)


def decode_table(report: dict) -> str:
    if not report["decode"]:
        return "No decode rows in this report."
    lines = ["| " + " | ".join(DECODE_COLUMNS) + " |", "|" + "---|" * len(DECODE_COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in decode_rows(report)]
    return "\n".join(lines) + "\n\n" + decode_notes(report)


# ------------------------------------------------------------------ the sentences


def _rows(report: dict, **match) -> list[dict]:
    return [r for r in report["decode"] if all(r.get(k) == v for k, v in match.items())]


def _best(rows: list[dict]) -> dict | None:
    timed = [r for r in rows if r.get("step_ms") is not None]
    return min(timed, key=lambda r: r["step_ms"]) if timed else None


def _shapes(report: dict) -> list[str]:
    """The shapes of the decode rows, smallest first."""
    return list(dict.fromkeys(r["shape"] for r in _sorted(report["decode"])))


def bound_sentence(report: dict) -> str:
    """Each shape's best batch-1 step without graphs, and with them, against its bound."""
    parts = []
    for shape in _shapes(report):
        without = _best([r for r in _rows(report, shape=shape, batch=1) if r.get("mode") in ("eager", "compiled")])
        graphs = _best(_rows(report, shape=shape, batch=1, mode="graphs"))
        name = SHAPE_NAMES.get(shape, shape)
        if without and without.get("bound_ms") is not None:
            text = (f"Without CUDA graphs, the best batch-1 step of the {name} shape ({without['mode']}) took "
                    f"{_step(without['step_ms'])}, {_pct(without['fraction_of_bound'])} of the bound: reading its "
                    f"{without['weight_bytes'] / 1e9:.2f} GB of weights at the measured bandwidth takes "
                    f"{_ms(without['bound_ms'])}.")
        elif without:
            text = f"Without CUDA graphs, the best batch-1 step of the {name} shape took {_step(without['step_ms'])}."
        else:
            text = f"The {name} shape has no batch-1 row without CUDA graphs."
        if graphs:
            text += (f" With graphs it took {_step(graphs['step_ms'])}, "
                     f"{_pct(graphs['fraction_of_bound'])} of the bound" if graphs.get("fraction_of_bound") is not None
                     else f" With graphs it took {_step(graphs['step_ms'])}")
            text += (f", {without['step_ms'] / graphs['step_ms']:.1f} times as fast." if without else ".")
        else:
            text += (" This report has no row with CUDA graphs for it, so how close graphs bring it is not "
                     "measured here.")
        parts.append(text)
    if any(r.get("step_ms_includes_prefill") for r in report["decode"]):
        parts.append("These step times include the prefill, so they overstate a decode step somewhat.")
    return " ".join(parts)


def utilisation_sentence(report: dict) -> str:
    """Each shape's fastest batch-1 step as MBU and MFU against the datasheet of the GPU the
    report names, and the MFU that a batch-1 step could reach at most (1 FLOP per byte of
    16-bit weights, over the ridge point)."""
    chip = datasheet_chip(report["meta"].get("device"))
    if chip is None:
        return ""
    parts = []
    for shape in _shapes(report):
        row = _best(_rows(report, shape=shape, batch=1))
        used_bytes, used_flops = utilisation(row, chip) if row else (None, None)
        if used_bytes is not None and used_flops is not None:
            parts.append(f"the {_shape(row)} shape ({row['mode']}) had an MBU of {_share(used_bytes)} and an MFU of "
                         f"{_share(used_flops)}")
    if not parts:
        return ""
    ridge = chip.roofline.ridge_point
    return (f"Against the {chip.name} datasheet, the fastest batch-1 step of " + ", and that of ".join(parts) + ". "
            f"A batch-1 step in 16 bits does 1 FLOP per byte of weights, so even at an MBU of 100% its MFU could "
            f"not pass {_share(1 / ridge)} (1 over the ridge point, {ridge:.0f} FLOP per byte): for decode, MBU "
            "is the figure to watch.")


def _layers(row: dict) -> int | None:
    return row.get("layers") or SHAPE_LAYERS.get(row.get("shape"))


def size_sentence(report: dict) -> str:
    """Whether the step grows with the bytes read: two shapes' best batch-1 steps without
    graphs. Where it does not, the two shapes' layer counts (hence kernels per step)
    are set beside the step times: a step that follows its kernels, not its bytes,
    is launch-bound."""
    best = {}
    for shape in _shapes(report):
        row = _best([r for r in _rows(report, shape=shape, batch=1) if r.get("mode") in ("eager", "compiled")])
        if row and row.get("weight_bytes"):
            best[shape] = row
    if len(best) < 2:
        return ""
    small = min(best.values(), key=lambda r: r["weight_bytes"])
    large = max(best.values(), key=lambda r: r["weight_bytes"])
    bytes_ratio, time_ratio = large["weight_bytes"] / small["weight_bytes"], large["step_ms"] / small["step_ms"]
    head = f"The {_shape(large)} shape reads {bytes_ratio:.1f} times the bytes of the {_shape(small)} shape"
    if time_ratio < 1:
        text = f"{head}, yet its step was shorter: {time_ratio:.2f} times as long."
    elif time_ratio < bytes_ratio ** 0.5:
        text = f"{head}, and its step took only {time_ratio:.2f} times as long: it barely grew with its bytes."
    else:
        return f"{head}, and its step took {time_ratio:.2f} times as long: the bytes set much of its pace."
    text += " So the step was not waiting on memory."
    layers_small, layers_large = _layers(small), _layers(large)
    if layers_small and layers_large:
        layers_ratio = layers_large / layers_small
        if abs(time_ratio / layers_ratio - 1) <= LAYERS_MATCH:
            text += (f" It follows the number of kernels instead: the {_shape(large)} shape has {layers_large} "
                     f"layers against {layers_small}, and nearly all of a step's kernels are launched layer by "
                     f"layer, the same ones in every layer, so its step launches about {layers_ratio:.2f} times as "
                     f"many, against {time_ratio:.2f} for the step times.")
        else:
            text += (f" (It has {layers_large} layers against {layers_small}, so {layers_ratio:.2f} times as many "
                     "kernels per step; the step times do not follow that ratio.)")
    return text + (" That is the mark of a launch-bound step: the GPU spends most of it idle, waiting for the CPU "
                   "to launch the next kernel.")


def graphs_sentence(report: dict) -> str:
    """Whether this report measured what CUDA graphs do: its rows with graphs, against the
    same shape's best batch-1 step without them, and its counted launches; or that it has neither."""
    graphs = [r for r in report["decode"] if r.get("mode") in ("graphs", "compiled_graphs") and r.get("step_ms")]
    counted = [r for r in report["decode"] if r.get("launches_per_step") is not None]
    if not graphs and not counted:
        return ("This run has no row with CUDA graphs and counted no kernel launches, so what graphs do for "
                "these steps is explained on this page, not measured by it.")
    parts = []
    for g in _sorted([r for r in graphs if r.get("batch") == 1]):
        without = _best([r for r in _rows(report, shape=g["shape"], batch=1) if r.get("mode") in ("eager", "compiled")])
        if without:
            parts.append(f"with {MODE_NAMES.get(g['mode'], g['mode'])} the {_shape(g)} batch-1 step took "
                         f"{_step(g['step_ms'])} against {_step(without['step_ms'])} {without['mode']}, "
                         f"{without['step_ms'] / g['step_ms']:.1f} times as fast")
    text = ("This run measured CUDA graphs: " + "; ".join(parts) + "." if parts else
            "This run has no batch-1 row with CUDA graphs to set beside one without them." if not graphs else
            "This run has rows with CUDA graphs but none at batch 1 beside a step without them.")
    if counted:
        text += f" It counted the kernel launches of {len(counted)} of its {len(report['decode'])} steps."
    else:
        text += " It counted no kernel launches."
    return text


def launch_sentence(report: dict) -> str:
    """Launches per step, times one launch's cost, against the step: launch-bound or not."""
    launch_us = report["meta"].get("launch_us")
    counted = [r for r in report["decode"] if r.get("launches_per_step") is not None and r.get("step_ms")]
    if not counted:
        text = "This report counted no kernel launches per step"
        return text + (", so whether its steps are launch-bound is inferred from their times, not counted."
                       if launch_us is None else f" (one launch cost {launch_us:.1f} µs).")
    parts = []
    for r in _sorted(counted):
        head = f"A {_shape(r)} batch-{r['batch']} step, {r['mode']}, launched {r['launches_per_step']:,} kernels"
        if launch_us is None:
            parts.append(head + "; the cost of one launch was not measured.")
            continue
        share = r["launches_per_step"] * launch_us / 1e3 / r["step_ms"]
        verdict = "launch-bound" if share >= LAUNCH_BOUND_SHARE else "not launch-bound"
        parts.append(f"{head}: at {launch_us:.1f} µs each that is {r['launches_per_step'] * launch_us / 1e3:.2f} ms "
                     f"of launching in a {r['step_ms']:.2f} ms step ({share:.0%}), {verdict}.")
    return " ".join(parts)


def batch_sentence(report: dict) -> str:
    """Batch 8 against batch 1, for each shape and mode that has both."""
    parts = []
    for r8 in _sorted(_rows(report, batch=8)):
        r1 = next(iter(_rows(report, shape=r8["shape"], batch=1, mode=r8["mode"])), None)
        if not r1 or r1.get("step_ms") is None or r8.get("step_ms") is None:
            continue
        parts.append(f"{_shape(r8)} {MODE_NAMES.get(r8['mode'], r8['mode'])}: {_step(r8['step_ms'])} at batch 8 "
                     f"against {_step(r1['step_ms'])} at batch 1 ({r8['step_ms'] / r1['step_ms']:.2f} times, "
                     "for 8 times the tokens)")
    if not parts:
        return ""
    return "A batch of 8 shares each read of the weights: " + "; ".join(parts) + "."


def notebook_sentence(report: dict) -> str:
    books = report["notebooks"]
    if not books:
        return "This report holds no notebook runs on the GPU."
    failed = [b["name"] for b in books if not b.get("ok")]
    timed = [b for b in books if b.get("seconds") is not None]
    text = f"{len(books) - len(failed)} of {len(books)} solution notebooks ran on the GPU without an error"
    if timed:
        slowest = max(timed, key=lambda b: b["seconds"])
        text += (f", in {sum(b['seconds'] for b in timed) / 60:.1f} minutes in all (the longest, "
                 f"{slowest['name']}, {slowest['seconds']:.0f} s)")
    return text + (f"; failed: {', '.join(failed)}." if failed else ".")


SENTENCES = {"bound": bound_sentence, "utilisation": utilisation_sentence, "size": size_sentence,
             "launch": launch_sentence, "batch": batch_sentence, "notebooks": notebook_sentence}


def explain(report: dict, skip: tuple[str, ...] = ()) -> str:
    """The sentences computed from the report, less those named in skip (keys of
    SENTENCES: a page that words one of them in its own prose skips it here)."""
    parts = [fn(report) for name, fn in SENTENCES.items() if name not in skip]
    return "\n\n".join(p for p in parts if p)


def render(report: dict, skip: tuple[str, ...] = ()) -> str:
    """The header, both tables and the sentences, as one Markdown text."""
    return "\n\n".join([header(report), parity_table(report), decode_table(report), explain(report, skip)])


# ------------------------------------------------------------------ on a page


def verdict(report: dict) -> str:
    """One sentence: each shape's fastest batch-1 decode step against its bandwidth bound."""
    parts = []
    for shape in _shapes(report):
        row = _best([r for r in _rows(report, shape=shape, batch=1) if r.get("fraction_of_bound") is not None])
        if row:
            parts.append(f"{'that' if parts else 'the fastest batch-1 decode step'} of the {_shape(row)} shape "
                         f"({row['mode']}) took {_step(row['step_ms'])}, {_pct(row['fraction_of_bound'])} of its "
                         f"bound of {_ms(row['bound_ms'])}")
    device = f"the {report['meta']['device']}" if report["meta"].get("device") else "an unnamed GPU"
    if not parts:
        return f"This report has no batch-1 decode step to set against the bandwidth bound on {device}."
    far = max(r["fraction_of_bound"] for r in report["decode"] if r.get("fraction_of_bound") is not None) < 0.5
    return (f"On {device}, " + ", and ".join(parts)
            + (": every step here is far from what the memory allows." if far else "."))


# A parity column that is the same in every row, said once under the table.
PARITY_WORDS = {"shape": "every row is the {} shape",
                "continuations identical to transformers'": "{} continuations identical to transformers' in each",
                "dtype": "the weights are {} in every row"}


def page(report: dict, skip: tuple[str, ...] = ()) -> str:
    """The report laid out for a page (stored.fold's comment): the verdict, both tables with
    no column that is the same in every row, the note when the engine has changed since (or
    its age is not known), then 'About this run', folded: the header and the sentences
    (explain's, less those in skip)."""
    today = REPORT.stamp()
    stale = not REPORT.current(report, today)
    parts = [verdict(report)]
    for rows, columns, notes, empty in ((parity_rows(report), PARITY_COLUMNS, "", "No parity rows in this report."),
                                        (decode_rows(report, split=True), PAGE_DECODE_COLUMNS, decode_notes(report),
                                         "No decode rows in this report.")):
        if not rows:
            parts.append(empty)
            continue
        table, dropped = compact_table(columns, rows, keep=("engine",))
        below = [text for text in (constants_text(dropped, PARITY_WORDS), notes) if text]
        parts.append(table + ("\n\n" + "  \n".join(below) if below else ""))
    note = engine_note(report, today)
    if stale:
        parts.append(note)
    head = header(report, today)
    if stale:
        head = head.removesuffix("  \n" + note)
    parts.append(fold("About this run", "\n\n".join([head, explain(report, skip)])))
    return "\n\n".join(parts)
