"""The peers table: tinyinfer, llama.cpp and vLLM CPU served on one machine,
driven by the same `tinyinfer bench` load (benchmarks/peers.py, `make peers`),
turned into a table and into sentences computed from its numbers.

    from tinyinfer_course.reports import peers
    report = peers.load()          # _build/peers.json if `make peers` ran here, else a stored copy
    print(peers.table(report))     # one row per engine, format and concurrency, with ratios
    print(peers.explain(report))   # which engine wins on this CPU, and why (bytes, BF16 units)
    peers.page(report, users=(1,)) # a page's Markdown: who leads, a compact table, the rest folded

Why the winner changes from one CPU to the next. For one user a decode step
reads every weight once, so the format with the fewest bytes per token can win,
if its kernel streams them near the memory bandwidth. bf16 halves fp32's bytes,
but a CPU without BF16 units (no `avx512_bf16` or `amx_bf16` in /proc/cpuinfo)
converts every bf16 number to fp32 before multiplying: prefill, which is
arithmetic, gets slower, and decode may gain nothing. Under load a step serves
many users with one read of the weights, so arithmetic and batching matter more
than bytes. The sentences below are written from the measurements, not for one CPU.

A saved report is JSON:
    meta     date, cpu, cores, threads, vector_units, emulation (the settings that
             kept torch below the CPU's instructions, if any), bandwidth_gb_s,
             peak_gflops ({format: a square matrix product's GFLOP/s}, runs
             from 2026-12-07 on: the peak MFU is taken against), input_len,
             output_len, concurrency, num_prompts, baseline (a key of engines),
             note, and engine_stamp: the fingerprint of the modules
             `tinyinfer serve` ran (REPORT.stamp()), which the header compares
             with today's code (REPORT.note)
    engines  {key: {engine, label, format, weight_bytes, version, command}}; a
             tinyinfer row also has config, its settings (serve_config)
    runs     {key: {concurrency: summary}}; a summary holds output_throughput,
             median_ttft_ms, median_tpot_ms, completed, failed, and the counted
             tokens per reply (summarize_run makes it from `tinyinfer bench`'s JSON)
"""
from __future__ import annotations

import argparse
from pathlib import Path

from .. import fingerprint, machine
from ..analysis.hardware import mbu, mfu
from .stored import StoredReport, constants_text, fold
from .stored import compact_table as _compact

# The copies stored with the course (one `make peers` run each), beside this file
# rather than in tinyinfer/data, so that storing a new run does not change the
# engine's fingerprint (scripts/make_labs.py): they are measurements, not engine
# code. One per class of CPU, since the winner changes with it: a laptop-class
# CPU (AVX2, no BF16 units) and a server CPU with AVX-512 and BF16 units.
DATA = Path(__file__).resolve().parent / "data"
STORED_COPIES = {
    "avx2": DATA / "peers-2026-12-03-epyc-avx2.json",
    "avx512_bf16": DATA / "peers-2026-12-03-epyc-avx512-bf16.json",
}
STORED = STORED_COPIES["avx2"]  # the one a reader most likely has: a laptop's
ENGINE_NAMES = {"tinyinfer": "tinyinfer", "llama.cpp": "llama.cpp", "vllm": "vLLM CPU"}
# The engine behind the tinyinfer rows: the modules `tinyinfer serve` runs (with
# `tinyinfer bench`, the client), compared with today's by the header's note.
REPORT = StoredReport("a peers report", STORED, fingerprint.serve_modules, saved_name="peers.json",
                      env_var="TINYINFER_PEERS_JSON", program="`tinyinfer serve`", rows="the tinyinfer rows",
                      remeasure="`make peers` measures today's", keys=("meta", "engines", "runs"),
                      made_by="make one with `make peers`", copies=tuple(STORED_COPIES.values()))


# ------------------------------------------------------------------ the machine


def has_bf16_units(meta: dict) -> bool | None:
    """Whether a report's bf16 products ran on BF16 hardware (machine.bf16_units of its
    saved flags and emulation settings). None: unknown."""
    return machine.bf16_units(meta.get("vector_units") or {}, meta.get("emulation") or {})


def units_text(meta: dict) -> str:
    """'AVX2 yes, AVX-512 no, AVX-512 BF16 no, AMX BF16 no' from the saved flags."""
    units = meta.get("vector_units") or {}
    if not units:
        return "vector units unknown"
    names = {"avx2": "AVX2", "avx512f": "AVX-512", "avx512_bf16": "AVX-512 BF16", "amx_bf16": "AMX BF16"}
    text = ", ".join(f"{names[u]} {'yes' if units.get(u) else 'no'}" for u in ("avx2", "avx512f", "avx512_bf16",
                                                                               "amx_bf16") if u in units)
    if meta.get("emulation"):
        text += " (torch limited by " + " ".join(f"{k}={v}" for k, v in meta["emulation"].items()) + ")"
    return text


# ------------------------------------------------------------------ the engine that served it

# The settings of a tinyinfer row that change its numbers (EngineConfig's names).
CONFIG_FIELDS = ("dtype", "quantization", "group_size", "lm_head_quantization", "enforce_eager")


def serve_config(command: str) -> dict:
    """The engine settings a `tinyinfer serve` command line gives ('--dtype bfloat16
    --quantization int4 --group-size 32'), with EngineConfig's defaults for the rest."""
    from tinyinfer.config import EngineConfig

    parser = argparse.ArgumentParser(add_help=False)
    EngineConfig.add_cli_args(parser, CONFIG_FIELDS)
    args, _ = parser.parse_known_args(command.split())
    config = {name: getattr(args, name) for name in CONFIG_FIELDS}
    if not config["quantization"]:
        del config["group_size"]  # unused without quantization
    return config


# ------------------------------------------------------------------ one run


def summarize_run(result: dict, output_len: int, num_prompts: int | None = None) -> dict:
    """The numbers the table needs from one `tinyinfer bench --save-result` JSON, after
    checking that every request finished with exactly `output_len` tokens.

    The tokens are counted, not taken on trust from `ignore_eos`: each reply's count is
    the server's usage report (or, without one, the client's count of streamed chunks),
    and a server that sends more text chunks than it claims tokens is caught too. A
    server that ignores `ignore_eos` stops early at EOS and fails here."""
    n = num_prompts if num_prompts is not None else result["completed"] + result["failed"]
    if result["failed"] or result.get("rejected") or result["completed"] != n:
        errors = [e for e in result.get("errors", []) if e][:3]
        raise ValueError(f"{result['completed']} of {n} requests completed ({result['failed']} failed, "
                         f"{result.get('rejected', 0)} rejected): {errors}")
    ok = [i for i, s in enumerate(result["statuses"]) if s == "ok"]
    tokens = [result["output_lens"][i] for i in ok]
    chunks = [len(result["chunk_times"][i]) for i in ok]
    wrong = sorted({t for t in tokens if t != output_len})
    if wrong:
        raise ValueError(f"{sum(t != output_len for t in tokens)} of {len(tokens)} replies did not have "
                         f"{output_len} output tokens (counts seen: {wrong}): the server stopped early, "
                         "so it did not suppress EOS")
    if any(c > t for c, t in zip(chunks, tokens)):
        raise ValueError(f"a reply streamed more chunks ({max(chunks)}) than its reported tokens "
                         f"({output_len}): the server's token count cannot be trusted")
    keys = ("completed", "failed", "duration", "output_throughput", "total_input_tokens", "median_ttft_ms",
            "median_tpot_ms", "p99_ttft_ms", "p99_tpot_ms", "mean_itl_ms")
    out = {k: result[k] for k in keys if k in result}
    out.update(tokens_per_reply=[min(tokens), max(tokens)], chunks_per_reply=[min(chunks), max(chunks)],
               prompt_tokens_per_reply=[min(result["input_lens"][i] for i in ok),
                                        max(result["input_lens"][i] for i in ok)])
    return out


# ------------------------------------------------------------------ loading


def stored_for(meta: dict | None = None) -> Path:
    """The stored copy from the CPU most like `meta`'s (a report's meta; by default
    this machine's flags and emulation settings): the BF16 server's where bf16
    products run on BF16 units (has_bf16_units), else the laptop's."""
    if meta is None:
        meta = {"vector_units": machine.vector_units(), "emulation": machine.emulated_isa()}
    return STORED_COPIES["avx512_bf16" if has_bf16_units(meta) else "avx2"]


def other_class(report: dict) -> Path:
    """The stored copy from the other class of CPU than `report`'s: a laptop's run
    beside a BF16 server's, and the other way round (which formats win changes)."""
    mine = stored_for(report["meta"])
    return next(path for path in STORED_COPIES.values() if path != mine)


def load(path: str | Path | None = None) -> dict:
    """A saved report: `path`, else this machine's own (REPORT.find_saved), else the stored
    copy from a CPU like this one (stored_for). report['source'] says which file it
    was; report['stored'] whether it is a stored copy."""
    report = REPORT.load(path or REPORT.find_saved() or stored_for())
    report["runs"] = {k: {int(c): s for c, s in v.items()} for k, v in report["runs"].items()}  # JSON's keys
    return report


# ------------------------------------------------------------------ the table


def baseline_key(report: dict) -> str | None:
    """The row the ratios compare with: meta['baseline'] if it ran, else llama.cpp, else vLLM."""
    runs = report["runs"]
    wanted = report["meta"].get("baseline")
    if wanted in runs:
        return wanted
    for engine in ("llama.cpp", "vllm"):
        for key, e in report["engines"].items():
            if e["engine"] == engine and key in runs:
                return key
    return next(iter(runs), None)


def concurrencies(report: dict) -> list[int]:
    return sorted({c for r in report["runs"].values() for c in r})


def short_label(label: str) -> str:
    """An engine's name in tables and sentences: the program, not its command line
    ('tinyinfer serve --no-enforce-eager' is 'tinyinfer compiled'). A flag in a Markdown
    table would also print with an en dash for its two hyphens."""
    return label.replace(" serve --no-enforce-eager", " compiled").replace(" serve", "").replace(" llama-server", "")


def row_name(report: dict, key: str) -> str:
    e = report["engines"][key]
    config = e.get("config") or {}
    head = ", LM head not quantized" if config.get("quantization") and not config.get("lm_head_quantization") else ""
    return f"{short_label(e['label'])}, {e['format']}{head}"


def header(report: dict, today: dict | None = None) -> str:
    m = report["meta"]
    # The stored copy by its name (its folder is wherever the package was installed).
    where = (f"stored copy: tinyinfer_course/reports/data/{Path(report['source']).name}" if report.get("stored")
             else f"this machine's `make peers`: {report.get('source', '?')}")
    lines = [f"{m.get('cpu', 'unknown CPU')}, {m.get('cores', '?')} cores, {m.get('threads', '?')} threads per "
             f"server, {m.get('date', 'no date')} ({where})",
             f"Vector units: {units_text(m)}."]
    if m.get("bandwidth_gb_s"):
        lines[-1] += f" Measured read bandwidth {m['bandwidth_gb_s']:.1f} GB/s."
    versions = [v for v in dict.fromkeys(e.get("version") for e in report["engines"].values()) if v]
    if versions:
        lines.append("Engines: " + "; ".join(versions) + ".")
    lines.append(f"{m.get('input_len', '?')} prompt tokens, {m.get('output_len', '?')} output tokens (EOS "
                 "suppressed, every reply's tokens counted), client `tinyinfer bench`; TTFT and TPOT are medians.")
    if m.get("note"):
        lines.append(f"Note: {m['note']}")
    if any(e["engine"] == "tinyinfer" for k, e in report["engines"].items() if k in report["runs"]):
        lines.append(REPORT.note(report, today))
    return "  \n".join(lines)


def table(report: dict, with_header: bool = True) -> str:
    """Markdown: one row per engine and concurrency, ratios against the baseline row at the
    same concurrency (above 1 is better for tok/s, below 1 for TTFT and TPOT)."""
    base = baseline_key(report)
    bname = row_name(report, base) if base else "-"
    lines = ["| engine, format | c | output tok/s | TTFT p50 | TPOT p50 | tok/s vs base | TTFT vs base "
             "| TPOT vs base | tokens/reply |", "|---|---|---|---|---|---|---|---|---|"]
    for c, key, r, ratios, replies in measured_rows(report):
        name = f"**{row_name(report, key)}**" if key == base else row_name(report, key)
        lines.append(f"| {name} | {c} | {r['output_throughput']:.1f} | {r['median_ttft_ms']:,.0f} ms "
                     f"| {r['median_tpot_ms']:,.1f} ms | {' | '.join(ratios)} | {replies} |")
    text = "\n".join(lines) + f"\n\nBaseline (bold): {bname}."
    return (header(report) + "\n\n" + text) if with_header else text


def _ratio(x, base) -> str:
    return f"{x / base:.2f}x" if base else "-"


def measured_rows(report: dict):
    """(c, engine key, run, its three ratios to the baseline at c, tokens per reply) for
    every run, by concurrency then engine: the rows of table() and compact_table()."""
    base = baseline_key(report)
    for c in concurrencies(report):
        b = report["runs"].get(base, {}).get(c)
        for key, runs in report["runs"].items():
            r = runs.get(c)
            if r is None:
                continue
            ratios = (["1.00x"] * 3 if key == base else
                      [_ratio(r[m], b and b[m]) for m in ("output_throughput", "median_ttft_ms", "median_tpot_ms")])
            lo, hi = r.get("tokens_per_reply", ["?", "?"])
            yield c, key, r, ratios, str(lo if lo == hi else f"{lo}-{hi}")


# ------------------------------------------------------------------ the sentences


def _best(report: dict, c: int, metric: str = "output_throughput", engine: str | None = None):
    """(key, summary) of the row with the most tok/s (or the least TTFT/TPOT) at concurrency c."""
    rows = [(k, r[c]) for k, r in report["runs"].items() if c in r
            and (engine is None or report["engines"][k]["engine"] == engine)]
    if not rows:
        return None, None
    pick = max if metric == "output_throughput" else min
    return pick(rows, key=lambda kr: kr[1][metric])


def _engines(report: dict) -> list[str]:
    return list(dict.fromkeys(e["engine"] for k, e in report["engines"].items() if k in report["runs"]))


def winners(report: dict, c: int) -> str:
    """Who serves the most tok/s at concurrency c, against each other engine's best row."""
    key, r = _best(report, c)
    if key is None:
        return ""
    engine = report["engines"][key]["engine"]
    others = []
    for other in _engines(report):
        if other == engine:
            continue
        k2, r2 = _best(report, c, engine=other)
        others.append(f"{r['output_throughput'] / r2['output_throughput']:.1f} times "
                      f"{ENGINE_NAMES.get(other, other)}'s best ({report['engines'][k2]['format']}, "
                      f"{r2['output_throughput']:.1f} tok/s)")
    who = "one user" if c == 1 else f"{c} users at once"
    text = (f"For {who}, {row_name(report, key)} serves the most: {r['output_throughput']:.1f} output tok/s")
    text += (", " + " and ".join(others) + "." if others else ".")
    tk, t = _best(report, c, "median_ttft_ms")
    pk, p = _best(report, c, "median_tpot_ms")
    text += (f" The first token comes soonest from {row_name(report, tk)} ({t['median_ttft_ms']:,.0f} ms), "
             f"the next ones fastest from {row_name(report, pk)} ({p['median_tpot_ms']:.1f} ms each).")
    return text


def bytes_sentence(report: dict) -> str:
    """For one user: the bytes each format reads per token, the floor that the bandwidth sets,
    and the bandwidth each row actually reached (bytes / TPOT)."""
    m, c = report["meta"], min(concurrencies(report) or [0])
    rows = [(k, e, report["runs"][k][c]) for k, e in report["engines"].items()
            if e.get("weight_bytes") and c in report["runs"].get(k, {})]
    if c != 1 or not rows:
        return ""
    rows.sort(key=lambda x: x[1]["weight_bytes"])
    bw = m.get("bandwidth_gb_s")
    parts = []
    for k, e, r in rows:
        reached = e["weight_bytes"] / r["median_tpot_ms"] / 1e6  # GB/s
        part = f"{row_name(report, k)} reads {e['weight_bytes'] / 1e6:.0f} MB per token and reached {reached:.1f} GB/s"
        if bw:  # MBU: the bytes the step needs per second, over the measured bandwidth (cache left out: ~1%)
            part += f", an MBU of {mbu(e['weight_bytes'], r['median_tpot_ms'] / 1e3, bw * 1e9):.0%}"
        parts.append(part)
    text = ("For one user each decode step reads every weight once, so the bytes per token set a floor"
            + (f" at the measured {bw:.1f} GB/s, and MBU is the share of it a row used: " if bw else ": ")
            + "; ".join(parts) + ".")
    fewest, fastest = rows[0][0], min(rows, key=lambda x: x[2]["median_tpot_ms"])[0]
    if fewest == fastest:
        text += f" The fewest bytes won: {row_name(report, fastest)} has the shortest step."
    else:
        f_rate = report["engines"][fewest]["weight_bytes"] / report["runs"][fewest][c]["median_tpot_ms"]
        w_rate = report["engines"][fastest]["weight_bytes"] / report["runs"][fastest][c]["median_tpot_ms"]
        text += (f" The fewest bytes did not win here: {row_name(report, fewest)} reads the least, but its "
                 f"kernel streamed {f_rate / 1e6:.1f} GB/s against {w_rate / 1e6:.1f} GB/s for "
                 f"{row_name(report, fastest)}, the shortest step. The bytes set what is possible; the "
                 "kernel decides how much of it a format gets.")
    return text


def _parameters(report: dict) -> float | None:
    """The served model's parameter count, from an fp32 or bf16 row's weight bytes."""
    for e in report["engines"].values():
        width = {"fp32": 4, "bf16": 2}.get(e.get("format"))
        if width and e.get("weight_bytes"):
            return e["weight_bytes"] / width
    return None


def mfu_sentence(report: dict) -> str:
    """For one user: MFU of the fp32 and bf16 rows (2 FLOPs per parameter per token over the
    step time, against the run's measured peak in that format), or why it is not computed."""
    params, c = _parameters(report), min(concurrencies(report) or [0])
    rows = [(k, e, report["runs"][k][c]) for k, e in report["engines"].items() if c in report["runs"].get(k, {})]
    if c != 1 or not params or not rows:
        return ""
    flops = 2 * params  # per token: one multiply-add per weight (attention's few left out)
    peaks = report["meta"].get("peak_gflops") or {}
    shares = [(k, mfu(flops, r["median_tpot_ms"] / 1e3, peaks[e["format"]] * 1e9))
              for k, e, r in rows if peaks.get(e.get("format"))]
    head = f"Each token needs about {flops / 1e6:.0f} MFLOP (2 per parameter)"
    if shares:
        text = (f"{head}, so one user's MFU, against the measured peak of a matrix product in the row's format, "
                "is: " + "; ".join(f"{row_name(report, k)} {share:.1%}" for k, share in shares) + ".")
        if max(share for _, share in shares) < 0.1:
            text += " Decode for one user waits for bytes, not arithmetic."
        return text
    k, e, r = min(rows, key=lambda x: x[2]["median_tpot_ms"])
    return (f"{head}: at the shortest step ({row_name(report, k)}) that is "
            f"{flops / r['median_tpot_ms'] / 1e6:.1f} GFLOP/s. This run did not measure the CPU's peak FLOP/s, so "
            "its MFU is not computed here (lab 4 measures your machine's peak).")


def bf16_sentence(report: dict) -> str:
    """bf16 against fp32 on the same engine, with the CPU's BF16 units named."""
    units = has_bf16_units(report["meta"])
    pairs = {}
    for k, e in report["engines"].items():
        if e["format"] in ("bf16", "fp32") and 1 in report["runs"].get(k, {}):
            pairs.setdefault(e["engine"], {})[e["format"]] = report["runs"][k]
    engine = next((en for en, p in pairs.items() if len(p) == 2 and en == "tinyinfer"),
                  next((en for en, p in pairs.items() if len(p) == 2), None))
    if engine is None:
        return ""
    bf, fp = pairs[engine]["bf16"][1], pairs[engine]["fp32"][1]
    name = ENGINE_NAMES.get(engine, engine)
    if units is None:
        cpu = "Whether this CPU has BF16 units was not recorded."
    elif units:
        cpu = "This CPU multiplies bf16 numbers in hardware (`avx512_bf16` or `amx_bf16`)."
    else:
        cpu = ("This CPU has no BF16 units (no `avx512_bf16` or `amx_bf16`, or torch was kept below them), so "
               "every bf16 product is done by converting to fp32 first.")
    ttft = bf["median_ttft_ms"] / fp["median_ttft_ms"]
    tpot = bf["median_tpot_ms"] / fp["median_tpot_ms"]
    text = (f"{cpu} With {name} for one user, bf16's prefill (TTFT {bf['median_ttft_ms']:,.0f} ms) was "
            f"{_compare(ttft)} fp32's ({fp['median_ttft_ms']:,.0f} ms), and its decode step "
            f"({bf['median_tpot_ms']:.1f} ms) {_compare(tpot)} fp32's ({fp['median_tpot_ms']:.1f} ms), "
            "with half the bytes to read.")
    if units is False and ttft > 1.05:
        text += " Prefill is arithmetic, and here bf16 arithmetic is the slow kind."
    elif units and ttft < 0.95:
        text += " Prefill is arithmetic, and here bf16 arithmetic is the fast kind."
    return text


def _compare(time_ratio: float) -> str:
    """'5.2 times slower than' from a ratio of times (bf16 / fp32)."""
    if 0.95 <= time_ratio <= 1.05:
        return "about as fast as"
    if time_ratio > 1:
        return f"{time_ratio:.1f} times slower than"
    return f"{1 / time_ratio:.1f} times faster than"


def load_sentence(report: dict) -> str:
    """Under the heaviest load: which engine's batching wins, against the single-user winner."""
    cs = concurrencies(report)
    if len(cs) < 2:
        return ""
    lo, hi = cs[0], cs[-1]
    k1, r1 = _best(report, lo)
    kn, rn = _best(report, hi)
    same = report["engines"][k1]["engine"] == report["engines"][kn]["engine"]
    text = (f"From {lo} to {hi} users at once, {row_name(report, kn)} grew to {rn['output_throughput']:.1f} tok/s, "
            f"{rn['output_throughput'] / r1['output_throughput']:.1f} times the best single-user rate: with "
            "many users, one read of the weights serves a whole batch, so arithmetic and scheduling matter more "
            "than bytes per token.")
    if not same:
        text += (f" The winner changed with the load: {ENGINE_NAMES.get(report['engines'][k1]['engine'])} "
                 f"for one user, {ENGINE_NAMES.get(report['engines'][kn]['engine'])} for {hi}.")
    return text


def tokens_sentence(report: dict) -> str:
    n = report["meta"].get("output_len")
    seen = sorted({t for runs in report["runs"].values() for r in runs.values()
                   for t in r.get("tokens_per_reply", [])})
    if seen == [n]:
        return (f"Every reply in every row had exactly {n} output tokens, counted from each server's own "
                "usage report, so every row did the same work.")
    return f"Replies did not all have {n} tokens (seen: {seen}): the rows did different work." if seen else ""


def explain(report: dict) -> str:
    """The computed paragraphs: winners per concurrency, then why (bytes, BF16 units, load)."""
    parts = [winners(report, c) for c in concurrencies(report)]
    parts += [bytes_sentence(report), mfu_sentence(report), bf16_sentence(report), load_sentence(report),
              tokens_sentence(report)]
    return "\n\n".join(p for p in parts if p)


def render(report: dict) -> str:
    """The table and the sentences, as one Markdown text."""
    return table(report) + "\n\n" + explain(report)


# ------------------------------------------------------------------ on a page

SENTENCES = {"winners": lambda r: "\n\n".join(winners(r, c) for c in concurrencies(r)), "bytes": bytes_sentence,
             "mfu": mfu_sentence, "bf16": bf16_sentence, "load": load_sentence, "tokens": tokens_sentence}
# A dropped column (the same in every row), said once under the table.
CONSTANT_WORDS = {"users": "{} users at once in every row", "tokens/reply": "every reply: {} output tokens"}


def subset(report: dict, users: tuple[int, ...] | None = None, formats: tuple[str, ...] | None = None) -> dict:
    """The report with only the rows at these concurrencies (`users`) and of these formats
    (a row's format or its short name, format_cell's): a page that teaches formats shows
    the one-user rows, the full table is shown once elsewhere. None keeps every row."""
    runs = {}
    for key, by_c in report["runs"].items():
        fmt = report["engines"][key]["format"]
        if formats is not None and fmt not in formats and short_format(fmt) not in formats:
            continue
        kept = {c: r for c, r in by_c.items() if users is None or c in users}
        if kept:
            runs[key] = kept
    return dict(report, runs=runs)


def short_format(fmt: str) -> str:
    """'INT4 g32 (Q4_1's weights), bf16 activations' is 'INT4 g32' in a table cell; the
    whole name goes in the key under it."""
    return fmt.split(" (")[0].split(", ")[0]


def short_name(report: dict, key: str) -> str:
    """'tinyinfer compiled, INT4 g32': a row by its program and its format's short name."""
    e = report["engines"][key]
    return f"{short_label(e['label'])}, {short_format(e['format'])}"


def _full_format(report: dict, key: str) -> str:
    return row_name(report, key).removeprefix(short_label(report["engines"][key]["label"]) + ", ")


def compact_table(report: dict) -> str:
    """The table for a page: engine and format in columns of their own, the format by its
    short name with a key under the table, and no column that is the same in every row
    (the constant said once under it instead: 'every reply: 64 output tokens')."""
    base = baseline_key(report)
    marks: dict[str, str] = {}  # a format's whole name: its mark in the table
    rows = []
    for c, key, r, ratios, replies in measured_rows(report):
        e = report["engines"][key]
        full = _full_format(report, key)
        fmt = short_format(e["format"])
        if full != fmt:
            fmt += marks.setdefault(full, "¹²³⁴⁵⁶⁷⁸⁹"[len(marks)] if len(marks) < 9 else f" ({len(marks) + 1})")
        # no-break spaces: a table that fits its column gives its room to the names, not the headings
        cells = [short_label(e["label"]).replace(" ", "\u00a0"), fmt.replace(" ", "\u00a0")]
        if key == base:
            cells = [f"**{cell}**" for cell in cells]
        rows.append(cells + [str(c), f"{r['output_throughput']:.1f}", f"{r['median_ttft_ms']:,.0f}",
                             f"{r['median_tpot_ms']:,.1f}", *ratios, replies])
    columns = ["engine", "format", "users", "output tok/s", "TTFT p50, ms", "TPOT p50, ms", "tok/s vs base",
               "TTFT vs base", "TPOT vs base", "tokens/reply"]
    text, dropped = _compact(columns, rows, keep=("engine", "format"))
    notes = [f"Baseline (bold): {row_name(report, base) if base else '-'}; the ratios are against it at the same "
             "number of users (above 1 is better for tok/s, below 1 for TTFT and TPOT)."]
    notes += [f"{mark} {full}" for full, mark in marks.items()]
    words = dict(CONSTANT_WORDS, users="one user at a time in every row") if ("users", "1") in dropped \
        else CONSTANT_WORDS
    if dropped:
        notes.append(constants_text(dropped, words))
    return text + "\n\n" + "  \n".join(notes)


def leaders(report: dict) -> str:
    """The verdict: who serves the most output tok/s at each concurrency (one run of
    concurrencies with the same leader said once), and, for one user alone, the shortest step."""
    groups: list[tuple[str, list[int], list[float]]] = []
    for c in concurrencies(report):
        key, r = _best(report, c)
        if groups and groups[-1][0] == key:
            groups[-1][1].append(c)
            groups[-1][2].append(r["output_throughput"])
        else:
            groups.append((key, [c], [r["output_throughput"]]))
    if not groups:
        return "This report has no rows."

    if concurrencies(report) == [1]:  # one user alone: the most tok/s, and the shortest step
        key, (_, _, (tps,)) = groups[0][0], groups[0]
        pk, p = _best(report, 1, "median_tpot_ms")
        step = f"{p['median_tpot_ms']:.1f} ms"
        return (f"For one user, {short_name(report, key)} serves the most output tokens per second ({tps:.1f})"
                + (f" and has the shortest decode step ({step})." if pk == key else
                   f"; {short_name(report, pk)} has the shortest decode step ({step})."))
    parts = [f"for {'one user' if cs == [1] else _and(cs) + ' users at once'}, {short_name(report, key)} "
             f"({' and '.join(f'{t:.1f}' for t in tps)} tok/s)" for key, cs, tps in groups]
    return "Most output tokens per second: " + "; ".join(parts) + "."


def page(report: dict, users: tuple[int, ...] | None = None, formats: tuple[str, ...] | None = None,
         sentences: tuple[str, ...] | None = None, with_table: bool = True, full: tuple[str, str] | None = None
         ) -> str:
    """The report laid out for a page (stored.fold's comment): the leaders, the compact table,
    the note when the tinyinfer rows are an older engine's, then 'About this run', folded: the
    header and the computed sentences (the SENTENCES named, default all). `users` and `formats`
    choose the rows (subset); `full` is (words, address) of the page with the whole table."""
    shown = subset(report, users, formats)
    today = REPORT.stamp()
    tinyinfer = any(report["engines"][k]["engine"] == "tinyinfer" for k in shown["runs"])
    stale = tinyinfer and not REPORT.current(report, today)
    parts = [leaders(shown)]
    if with_table:
        parts.append(compact_table(shown))
        if full and shown["runs"] != report["runs"]:
            parts.append(f"These are the rows {_which(users, formats)} of this run; [{full[0]}]({full[1]}) shows "
                         f"all of them, at {_and(concurrencies(report))} users at once.")
    if stale:
        parts.append(REPORT.note(report, today))
    head = header(report, today)
    if stale:
        head = head.removesuffix("  \n" + REPORT.note(report, today))
    said = [SENTENCES[name](shown) for name in (sentences or SENTENCES)]
    parts.append(fold("About this run", "\n\n".join([head] + [s for s in said if s])))
    return "\n\n".join(parts)


def _which(users, formats) -> str:
    words = []
    if users:
        words.append("for one user" if list(users) == [1] else f"for {_and(list(users))} users at once")
    if formats:
        words.append(f"in {_and(list(formats))}")
    return " ".join(words)


def _and(items: list) -> str:
    items = [str(i) for i in items]
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)
