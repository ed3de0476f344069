"""The stored reports as the chapters lay them out (page(): issue 57, "reports a reader can
take in"): a verdict first, the table with no column that is the same in every row, the
note that the engine has changed since kept in view, and the provenance with the computed
sentences folded under "About this run". Chapter 6 shows the one-user rows of the peers
table, chapter 8 the whole of it. render() stays the whole text (terminals, lab 8).
"""
from __future__ import annotations

import copy
import functools
import re
from pathlib import Path

import pytest

from tinyinfer_course.reports import gpu as gpu_report
from tinyinfer_course.reports import peers
from tinyinfer_course.reports import router as router_report
from tinyinfer_course.reports.stored import StoredReport, compact_table, constants_text, fold

ROOT = Path(__file__).resolve().parents[2]
FOLD_OPEN = "<details>\n<summary>About this run</summary>\n\n"
CH6_USERS = (1,)


def split(text: str) -> tuple[str, str]:
    """(what a reader sees with the fold closed, what the fold holds)."""
    assert text.count("<details>") == 1 and text.rstrip().endswith("\n\n</details>"), text[-200:]
    assert FOLD_OPEN in text  # GFM: a blank line after <summary>, so the Markdown inside renders
    shown, folded = text.split(FOLD_OPEN)
    return shown, folded


def table_rows(text: str) -> list[list[str]]:
    """The cells of every Markdown table row in `text`, header rows included, rules left out."""
    return [[c.strip().replace("\u00a0", " ") for c in line.strip().strip("|").split(" | ")]
            for line in text.splitlines() if line.startswith("| ")]


def headers(text: str) -> list[list[str]]:
    lines = text.splitlines()
    return [table_rows(lines[i])[0] for i in range(len(lines) - 1) if lines[i + 1].startswith("|---")]


def flags_outside_code(text: str) -> list[str]:
    """`--flag`s printed outside backticks: Sphinx's smart quotes turn their '--' into an en dash."""
    plain = re.sub(r"`[^`]*`", "", text)
    return re.findall(r"(?<![-|])--[A-Za-z][\w-]*", plain)


_TODAY: dict[int, dict] = {}
_REAL_STAMP = StoredReport.stamp


@pytest.fixture(autouse=True)
def one_stamp_per_report(monkeypatch):
    """Today's code does not change during these tests, so each report hashes it once
    (a stamp takes ~1 s; every page() asks for one, 40 times in this file)."""
    def stamp(self):
        if id(self) not in _TODAY:
            _TODAY[id(self)] = _REAL_STAMP(self)
        return _TODAY[id(self)]

    monkeypatch.setattr(StoredReport, "stamp", stamp)


@functools.cache
def peers_copies():
    return tuple(peers.load(path) for path in peers.STORED_COPIES.values())


@functools.cache
def pages():
    """Every report as the chapters show it (the same calls as chapters 4, 6 and 8)."""
    out = []
    for report in peers_copies():
        out += [peers.page(report), peers.page(report, users=CH6_USERS, full=("chapter 8", "08-fleets.html#x")),
                peers.page(report, with_table=False, sentences=("winners", "load"))]
    out.append(gpu_report.page(gpu_report.load(), skip=("size",)))
    out.append(router_report.page(router_report.load()))
    return tuple(out)


# --- the shared pieces ------------------------------------------------------------------

def test_compact_table_drops_constant_and_unmeasured_columns():
    rows = [["a", "64", "not measured", "1"], ["b", "64", "not measured", "2"]]
    text, dropped = compact_table(["engine", "tokens", "launches", "c"], rows)
    assert table_rows(text) == [["engine", "c"], ["a", "1"], ["b", "2"]]
    assert dropped == [("tokens", "64"), ("launches", "not measured")]
    assert constants_text(dropped, {"tokens": "every reply: {} tokens"}) == (
        "Every reply: 64 tokens; launches: not measured in any row.")
    # a column named in keep stays, and one row alone is not "the same in every row"
    assert table_rows(compact_table(["engine", "tokens"], rows[:1], keep=())[0])[0] == ["engine", "tokens"]
    assert table_rows(compact_table(["engine", "tokens"], [r[:2] for r in rows], keep=("tokens",))[0])[1] == [
        "a", "64"]


def test_fold_is_closed_gfm_with_markdown_inside():
    text = fold("About this run", "| a |\n|---|\n| 1 |\n\nA paragraph.")
    assert text.startswith(FOLD_OPEN) and text.endswith("A paragraph.\n\n</details>")
    assert " open" not in text.split("\n")[0]


# --- every page -------------------------------------------------------------------------

@pytest.mark.parametrize("index", range(len(pages())))
def test_every_page_opens_on_a_verdict_and_folds_its_provenance(index):
    shown, folded = split(pages()[index])
    first = shown.split("\n\n")[0]
    assert not first.startswith("|") and first.endswith(".") and len(first) < 420, first
    assert "stored copy: tinyinfer_course/reports/data/" in folded
    assert "stored copy" not in shown and "Vector units" not in shown and "Command:" not in shown
    for header in headers(shown):  # no column says the same thing in every row
        assert "tokens/reply" not in header and "kernel launches per step" not in header, header


@pytest.mark.parametrize("index", range(len(pages())))
def test_no_flag_is_printed_outside_code(index):
    assert flags_outside_code(pages()[index]) == []


def test_flags_outside_code_are_caught():
    assert flags_outside_code("tinyinfer serve --no-enforce-eager") == ["--no-enforce-eager"]
    assert flags_outside_code("run `tinyinfer serve --no-enforce-eager`\n|---|---|") == []


# --- peers ------------------------------------------------------------------------------

@pytest.mark.parametrize("report", peers_copies(), ids=list(peers.STORED_COPIES))
def test_peers_table_drops_the_constant_column_and_says_it_once(report):
    shown, folded = split(peers.page(report))
    header = headers(shown)[0]
    assert header[:3] == ["engine", "format", "users"] and "tokens/reply" not in header
    assert "Every reply: 64 output tokens." in shown or "every reply: 64 output tokens." in shown
    # every row of the full table, with the same numbers as peers.table's
    rows = table_rows(shown)[1:]
    assert len(rows) == sum(len(by_c) for by_c in report["runs"].values())
    for c in peers.concurrencies(report):
        for key, by_c in report["runs"].items():
            if c in by_c:
                assert f"| {by_c[c]['output_throughput']:.1f} | {by_c[c]['median_ttft_ms']:,.0f} |" in shown
    # the computed sentences live in the fold
    assert "serves the most:" in folded and "serves the most:" not in shown


def test_peers_keeps_a_column_that_differs():
    report = peers_copies()[0]
    key = next(iter(report["runs"]))
    changed = copy.deepcopy(report)
    first = next(iter(changed["runs"][key].values()))
    first["tokens_per_reply"] = [12, 64]
    assert "tokens/reply" in headers(peers.page(changed))[0]


@pytest.mark.parametrize("report", peers_copies(), ids=list(peers.STORED_COPIES))
def test_chapter_6_shows_only_the_one_user_rows_and_links_the_full_table(report):
    text = peers.page(report, users=CH6_USERS, full=("chapter 8", "08-fleets.html#side-by-side-on-one-cpu"))
    shown, folded = split(text)
    rows = table_rows(shown)[1:]
    one_user = [k for k, by_c in report["runs"].items() if 1 in by_c]
    assert len(rows) == len(one_user) and "users" not in headers(shown)[0]
    assert "One user at a time in every row" in shown
    for by_c in report["runs"].values():
        for c, r in by_c.items():
            assert (f"| {r['output_throughput']:.1f} | {r['median_ttft_ms']:,.0f} |" in shown) == (c == 1)
    assert "[chapter 8](08-fleets.html#side-by-side-on-one-cpu)" in shown
    assert "users at once" not in folded  # the sentences are the one-user rows' too
    # by format
    only = peers.page(report, formats=("Q4_1 GGUF",))
    assert {row[1] for row in table_rows(split(only)[0])[1:]} == {"**Q4_1 GGUF**"}


def test_chapter_6_links_an_anchor_that_chapter_8_has():
    """The link sits in a Markdown output, where {doc} does not work: a relative HTML link
    to the section of chapter 8 that shows the full table (its heading's anchor)."""
    source = (ROOT / "chapters" / "06-quantization.md").read_text()
    anchors = re.findall(r"08-fleets\.html#([\w-]+)", source)
    assert anchors, "chapter 6 links chapter 8's full peers table"
    headings = re.findall(r"^#+ (.+)$", (ROOT / "chapters" / "08-fleets.md").read_text(), re.M)
    slugs = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}
    assert set(anchors) <= slugs, set(anchors) - slugs


@pytest.mark.parametrize("report", peers_copies(), ids=list(peers.STORED_COPIES))
def test_the_stamp_note_stays_in_view_when_the_engine_is_older(report):
    today = peers.REPORT.stamp()
    note = peers.REPORT.note(report, today)
    assert not peers.REPORT.current(report, today) and "older engine" in note
    shown, folded = split(peers.page(report))
    assert note in shown and note not in folded
    current = copy.deepcopy(report)
    current["meta"]["engine_stamp"] = today
    shown, folded = split(peers.page(current))
    assert "the same code" in folded and "the same code" not in shown


def test_the_verdict_names_who_leads_at_each_concurrency():
    report = peers.load(peers.STORED_COPIES["avx512_bf16"])
    assert peers.leaders(report) == ("Most output tokens per second: for one user, llama.cpp 0c1e570, Q4_1 GGUF "
                                     "(56.1 tok/s); for 8 and 32 users at once, vLLM CPU 0.32, bf16 "
                                     "(148.9 and 267.3 tok/s).")
    assert peers.leaders(peers.subset(report, users=(1,))) == (
        "For one user, llama.cpp 0c1e570, Q4_1 GGUF serves the most output tokens per second (56.1) and has "
        "the shortest decode step (10.8 ms).")


# --- GPU and router -----------------------------------------------------------------------

def test_gpu_page_drops_the_unmeasured_launches_and_keeps_the_old_engine_in_view():
    report = gpu_report.load()
    text = gpu_report.page(report, skip=("size",))
    shown, folded = split(text)
    assert shown.startswith("On the NVIDIA H200, the fastest batch-1 decode step of the 135M shape (compiled) "
                            "took 7.3 ms, 0.9% of its bound of 0.066 ms")
    assert "kernel launches per step: not measured in any row." in shown
    assert "Every row is the 135M shape; 4 of 4 continuations identical to transformers' in each." in shown
    assert "¹ includes the prompt's prefill" in shown  # the table's key stays under it
    assert "engine older than today's" in shown and "engine older than today's" not in folded
    assert "Command: `python benchmarks/cuda_check.py" in folded and "batch of 8 shares" in folded
    assert "12.7 times the bytes" not in text  # skip=("size",): chapter 4 words it in its prose
    assert "The weights are bfloat16 in every row;" in shown  # a dtype column said once
    # the decode rows are all there, with render's numbers
    whole = gpu_report.render(report)
    decode = [row for row in table_rows(shown) if row[0] in ("135M", "1.7B") and len(row) > 4]
    assert len(decode) == len(report["decode"])
    for shape, size, batch, engine, step, bound, *rest in decode:
        assert f"| {shape}, {size} bfloat16 | {batch} | {engine} | {step} | {bound} ms | {rest[0]} |" in whole


def test_router_page_opens_on_the_comparison_with_the_simulator():
    report = router_report.load()
    shown, folded = split(router_report.page(report))
    assert shown.startswith("The real replicas matched the simulator's busier-replica share within 10 points "
                            "under round_robin and power_of_two, but not under cache_aware (61% against 100%)")
    assert "| cache_aware (prefix_affinity) | 61% / 100% |" in shown
    assert "Workload:" in folded and "Under cache_aware the busier replica took 61%" in folded
    note = router_report.REPORT.note(report)
    assert "older engine" in note and note in shown


def test_gpu_page_of_a_bare_report_says_what_is_missing(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text('{"meta": {}}')
    shown, folded = split(gpu_report.page(gpu_report.load(path)))
    assert shown.startswith("This report has no batch-1 decode step to set against the bandwidth bound on an "
                            "unnamed GPU.")
    assert "No parity rows in this report." in shown and "No decode rows in this report." in shown
    assert "not known" in shown and "unknown GPU" in folded
