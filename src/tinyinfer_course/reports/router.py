"""The router report: real replicas behind vllm-router beside the simulator's prediction.

`make fleet` (benchmarks/fleet_router.py) writes it; chapter 8 renders it.

    from tinyinfer_course.reports import router as router_report
    report = router_report.load()       # _build/fleet-router.json if `make fleet` ran here, else the stored copy
    print(router_report.render(report))  # header, table, and sentences computed from the numbers
    router_report.page(report)           # chapter 8's Markdown: a verdict, the table, the rest folded

A report is JSON:
    meta         date, cpu, cores, vector_units, threads_per_replica, replicas,
                 model, dtype, max_num_seqs, max_num_batched_tokens, router
                 (its version), command, and engine_stamp (the fingerprint of
                 the modules the run used: `tinyinfer serve` and the fleet code)
    workload     the session workload's settings, and its prompt tokens: all,
                 the system prompts' whole KV blocks (the simulator's shared
                 prefix) and a session's earlier turns' blocks beyond them
    calibration  the offline StepCostModel and the steps it was fitted to
    runs         {router policy: {real, sim, sim_served, served_cost, step_ratio}}:
                 real is what the client and the replicas' /metrics saw; sim the
                 simulator on the offline calibration (the prediction); sim_served
                 the simulator on a model fitted to the steps the replicas ran;
                 step_ratio those steps' time over what the offline model says
"""
from __future__ import annotations

from pathlib import Path

from .. import fingerprint
from .stored import Age, StoredReport, compact_table, constants_text, fold

DATA = Path(__file__).resolve().parent / "data"  # beside the peers reports: measurements, not code
STORED = DATA / "fleet-router-2026-12-05-xeon.json"
BAR = 0.10  # the bar: shares and hit rates within 10 points of the simulator's
MODULES = ("tinyinfer_course.fleet.live_fleet", "tinyinfer_course.fleet.live_replay",
           "tinyinfer_course.fleet.sessions", "tinyinfer_course.fleet.simulator", "tinyinfer_course.fleet.calibrate",
           "tinyinfer.bench.client")


def router_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm-router")
    except PackageNotFoundError:
        return "unknown"


def stamp_modules() -> list[str]:
    """What the run executed: `tinyinfer serve` and the fleet modules, with their imports."""
    return sorted(set(fingerprint.serve_modules()) | set(fingerprint.closure(MODULES)))


def _note(report: dict, age: Age) -> str:
    """The note in this page's words: the code behind the rows is today's, or an older one (named)."""
    head = f"These rows were measured on {age.when} by {age.named()}"
    if age.same:
        return head + ", the same code that runs today."
    return (head + f". The code has changed since then ({len(age.changed)} of its modules: {age.listed()}; "
            f"today's fingerprint is {age.today}), so they show an older engine: `make fleet` measures today's.")


# reports/data holds measurements, not code: a report being written there is no change to the engine
REPORT = StoredReport("a router report", STORED, stamp_modules, saved_name="fleet-router.json",
                      env_var="TINYINFER_FLEET_JSON", exclude=("tinyinfer_course/reports/data",), words=_note)
load = REPORT.load  # chapter 8 and lab 8 call it


# ------------------------------------------------------------------ the table


def _pct(x: float) -> str:
    return f"{x:.0%}"


def _ms(s: float) -> str:
    return f"{s * 1e3:,.0f}"


def _busier(share: list[float]) -> float:
    return max(share) if share else float("nan")


def header(report: dict) -> str:
    from .peers import units_text

    m, w = report["meta"], report["workload"]
    where = (f"stored copy: tinyinfer_course/reports/data/{Path(report['source']).name}" if report.get("stored")
             else f"this machine's `make fleet`: {report.get('source', '?')}") if "source" in report else "this run"
    return "  \n".join([
        f"{m['cpu']}, {m['cores']} cores; {m['replicas']} replicas of {m['model']} ({m['dtype']}), "
        f"{m['threads_per_replica']} torch thread(s) each, behind {m['router']}; {m['date']} ({where})",
        f"Vector units: {units_text(m)}.{load_text(report)}",
        f"Workload: {w['sessions']} sessions of {w['turns']} turns ({w['requests']} requests), "
        f"{w['system_prompts']} system prompts of {w['system_len']} tokens, {w['user_len']}-token user messages, "
        f"{w['output_len']} output tokens, {w['session_rate']:g} new sessions/s, turns {w['turn_gap_s']:g} s apart. "
        "TTFT is the client's (first streamed token minus send); shares and hits are from each replica's /metrics.",
    ])


def load_text(report: dict) -> str:
    """The machine's load before the benchmark started anything, and whether it was busy."""
    m = report["meta"]
    load = m.get("load_average")
    if load is None:
        return ""
    text = f" Load average (1 minute) before the run: {load:.1f} on {m['cores']} cores"
    if load > m["cores"]:
        return text + (": other work shared the cores, so every real timing is slower than on an idle machine.")
    return text + "."


def table(report: dict) -> str:
    """Markdown: per router policy, the real row and the simulator's two predictions."""
    lines = ["| router policy (simulator's) | busier replica's share: real / sim | prefix-cache hits: real / sim "
             "| TTFT p50 ms: real / sim / sim on the replicas' steps | TTFT p95 ms: real / sim / sim on the "
             "replicas' steps |",
             "|---|---|---|---|---|"]
    for policy, run in report["runs"].items():
        r, s, v = run["real"], run["sim"], run["sim_served"]
        lines.append(f"| {policy} ({s['policy']}) | {_pct(_busier(r['share']))} / {_pct(_busier(s['share']))} "
                     f"| {_pct(r['prefix_hit_rate'])} / {_pct(s['prefix_hit_rate'])} "
                     f"| {_ms(r['ttft_p50_s'])} / {_ms(s['ttft_p50_s'])} / {_ms(v['ttft_p50_s'])} "
                     f"| {_ms(r['ttft_p95_s'])} / {_ms(s['ttft_p95_s'])} / {_ms(v['ttft_p95_s'])} |")
    return "\n".join(lines)


# ------------------------------------------------------------------ the sentences


def _points(a: float, b: float) -> float:
    return abs(a - b) * 100


def share_sentence(report: dict) -> str:
    far = {p: run for p, run in report["runs"].items()
           if _points(_busier(run["real"]["share"]), _busier(run["sim"]["share"])) > BAR * 100}
    close = [p for p in report["runs"] if p not in far]
    out = []
    if close:
        out.append(f"The busier replica's share is within {BAR * 100:.0f} points of the simulator's for "
                   f"{', '.join(close)}.")
    for p, run in far.items():
        real, sim = _busier(run["real"]["share"]), _busier(run["sim"]["share"])
        if p == "cache_aware":
            homes = prefix_homes(report)
            n_homes = len(set(homes.values()))
            where = (f"here all {len(homes)} system prompts' homes are the same replica" if n_homes == 1 else
                     f"here the {len(homes)} system prompts' homes are " +
                     ", ".join(f"prompt {k} on replica {v}" for k, v in homes.items()))
        why = {
            "cache_aware": "the simulator's prefix_affinity sends every request with the same system prompt to "
                           "that prompt's home replica, chosen by a hash, and leaves it only when the home holds "
                           f"too many requests; {where if p == 'cache_aware' else ''}. vllm-router's cache_aware "
                           "matches the prompt's text against what each replica was sent before, and sends to the "
                           "less loaded replica instead when the loads drift apart",
            "power_of_two": "vllm-router compares the loads it last polled from /get_load (every 5 seconds in "
                            "version 0.1.17, so often stale: between two polls both replicas may read 0), "
                            "while the simulator compares the requests outstanding at that instant",
            "round_robin": "round robin counts requests, not work: the replicas' requests differed in length",
        }.get(p, "the two policies differ")
        out.append(f"Under {p} the busier replica took {_pct(real)} of the requests against the simulator's "
                   f"{_pct(sim)} ({_points(real, sim):.0f} points apart): {why}.")
    return " ".join(out)


def prefix_homes(report: dict) -> dict[int, int]:
    """{system prompt: its home replica} under the simulator's prefix_affinity (router.py's hash)."""
    from ..fleet.router import _score

    n = report["meta"]["replicas"]
    return {pid: max(range(n), key=lambda r: _score(pid, r)) for pid in range(report["workload"]["system_prompts"])}


def hit_sentence(report: dict) -> str:
    w = report["workload"]
    hist = w["history_block_tokens"] / max(1, w["prompt_tokens"])
    sysb = w["system_block_tokens"] / max(1, w["prompt_tokens"])
    parts = []
    for p, run in report["runs"].items():
        real, sim = run["real"]["prefix_hit_rate"], run["sim"]["prefix_hit_rate"]
        parts.append(f"{p} {_pct(real)} against {_pct(sim)}")
    above = [p for p, run in report["runs"].items()
             if run["real"]["prefix_hit_rate"] - run["sim"]["prefix_hit_rate"] > BAR]
    text = (f"Prefix-cache hits, real against simulated: {'; '.join(parts)}. The simulator knows one shared "
            f"prefix per request, the system prompt, whose whole blocks are {_pct(sysb)} of the prompt tokens; "
            f"a session's earlier turns are another {_pct(hist)}, which the real cache reuses whenever the next "
            "turn lands on the replica that served the last one, and the simulator never counts.")
    gaps = {p: _points(run["real"]["prefix_hit_rate"], run["sim"]["prefix_hit_rate"])
            for p, run in report["runs"].items()}
    within = [p for p, g in gaps.items() if g <= BAR * 100]
    if len(within) == len(gaps):
        text += f" All are within {BAR * 100:.0f} points (at most {max(gaps.values()):.0f})."
    if above:
        text += f" That is why the real rate is more than {BAR * 100:.0f} points higher under {', '.join(above)}."
    return text


def ttft_sentence(report: dict) -> str:
    parts, served = [], []
    for p, run in report["runs"].items():
        r, s, v = (run[k]["ttft_p95_s"] for k in ("real", "sim", "sim_served"))
        parts.append(f"{p} {r / s:.1f}x")
        served.append(f"{p} {r / v:.1f}x")
    ratios = [run["step_ratio"] for run in report["runs"].values()]
    threads, n, cores = (report["meta"][k] for k in ("threads_per_replica", "replicas", "cores"))
    return (f"The real p95 TTFT over the predicted one: {', '.join(parts)}. The prediction's step costs were "
            f"measured on one engine alone; in the run, {n} replicas of {threads} thread(s) shared {cores} cores "
            "with their HTTP servers, the router and the client, and the steps they ran took "
            f"{_span(ratios)} what the offline model says for the same steps. "
            f"Simulated again on those steps' own costs, the ratio is {', '.join(served)}. What is left comes "
            "from routing differently from the simulator (the shares above) and from what it does not model at "
            "all: HTTP, the router's hop, the client's clock, a request waiting in the server before the engine "
            "sees it.")


def _span(ratios: list[float]) -> str:
    lo, hi = f"{min(ratios):.1f}x", f"{max(ratios):.1f}x"
    return lo if lo == hi else f"{lo} to {hi}"


def rank_sentence(report: dict) -> str:
    runs = report["runs"]
    real = sorted(runs, key=lambda p: runs[p]["real"]["ttft_p95_s"])
    sim = sorted(runs, key=lambda p: runs[p]["sim"]["ttft_p95_s"])
    if real == sim:
        return f"Both rank the policies the same way on p95 TTFT, best first: {', '.join(real)}."
    n = report["workload"]["requests"]
    below = int(0.95 * (n - 1))  # numpy's p95 lies between the sorted values at this index and the next
    return (f"They rank the policies differently on p95 TTFT, best first: the router {', '.join(real)}; the "
            f"simulator {', '.join(sim)}. Of {n} requests, p95 lies between the {_nth(n - below)}- and "
            f"{_nth(n - below - 1)}-slowest TTFT, so a few slow requests decide it: this ranking is one run's.")


def _nth(k: int) -> str:
    return {1: "", 2: "second", 3: "third", 4: "fourth", 5: "fifth", 6: "sixth"}.get(k, f"{k}th")


def explain(report: dict) -> str:
    return "\n\n".join([share_sentence(report), hit_sentence(report), ttft_sentence(report), rank_sentence(report)])


def render(report: dict, with_note: bool = True) -> str:
    head = header(report) + ("  \n" + REPORT.note(report) if with_note else "")
    return "\n\n".join([head, table(report), explain(report)])



# ------------------------------------------------------------------ on a page


def verdict(report: dict) -> str:
    """One or two sentences: where the real replicas came within BAR of the simulator (the
    busier replica's share, the prefix-cache hits) and how far the real p95 TTFT was from
    the prediction."""
    runs, bar = report["runs"], BAR * 100

    def near(metric) -> tuple[list[str], list[str]]:
        close = [p for p, run in runs.items() if _points(metric(run["real"]), metric(run["sim"])) <= bar]
        return close, [p for p in runs if p not in close]

    def said(close: list[str], far: list[str], metric, what: str) -> str:
        if not far:
            return f"{what} within {bar:.0f} points under all {len(close)} policies"
        gaps = _and([f"{p} ({_pct(metric(runs[p]['real']))} against {_pct(metric(runs[p]['sim']))})" for p in far])
        return (f"{what} within {bar:.0f} points under {_and(close)}, but not under {gaps}" if close else
                f"{what} more than {bar:.0f} points away under every policy ({gaps})")

    share, hits = (lambda r: _busier(r["share"])), (lambda r: r["prefix_hit_rate"])
    text = ("The real replicas matched the simulator's " + said(*near(share), share, "busier-replica share")
            + "; and its " + said(*near(hits), hits, "prefix-cache hit rate") + ".")
    ratios = [run["real"]["ttft_p95_s"] / run["sim"]["ttft_p95_s"] for run in runs.values()]
    return text + f" The real p95 TTFT was {_span(ratios)} the predicted one."


def _and(items: list[str]) -> str:
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else "".join(items)


def page(report: dict) -> str:
    """The report laid out for a page (stored.fold's comment): the verdict, the table, the
    note when the code has changed since, then 'About this run', folded: the header (the
    machine, the workload) and the computed sentences."""
    today = REPORT.stamp()
    note = REPORT.note(report, today)
    stale = not REPORT.current(report, today)
    table_text, dropped = compact_table(*_cells(report), keep=("router policy (simulator's)",))
    parts = [verdict(report), table_text + ("\n\n" + constants_text(dropped) if dropped else "")]
    if stale:
        parts.append(note)
    head = header(report) + ("" if stale else "  \n" + note)
    parts.append(fold("About this run", "\n\n".join([head, explain(report)])))
    return "\n\n".join(parts)


def _cells(report: dict) -> tuple[list[str], list[list[str]]]:
    """table()'s columns and cells."""
    lines = table(report).splitlines()
    split = [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]
    return split[0], split[2:]
