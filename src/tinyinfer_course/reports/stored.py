"""What every stored measurement that a page renders has in common: the copy
stored with the course, this machine's own run of it, the stamp of the code
that made it, and the sentence saying whether that code is today's.

    REPORT = StoredReport("a peers report", STORED, fingerprint.serve_modules, saved_name="peers.json",
                          env_var="TINYINFER_PEERS_JSON", program="`tinyinfer serve`",
                          rows="the tinyinfer rows", remeasure="`make peers` measures today's")
    report = REPORT.load()   # $TINYINFER_PEERS_JSON, else _build/peers.json, else the stored copy
    REPORT.note(report)      # measured by today's code, or by an older one (naming what changed)
    REPORT.stamp()           # what a new run stores as meta["engine_stamp"]

A stale report is not an error (CI cannot remeasure most of them); a page that
hides its age would be. So a new run stores stamp(), and the page prints note().
A report module keeps only its tables and sentences, and one StoredReport.

The note's words are fingerprint.stamp_note's (peers, gpu). The router, tp_gloo,
kv_int8 and tool_calls pages print older wordings of their own, which their
chapters, labs and tests quote; they pass `words=`, a function of the report and
an Age (the comparison already made), so only the sentence is theirs.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import fingerprint


def closure_of(*roots: str) -> Callable[[], list[str]]:
    """The modules a run of `roots` executes today: they and all they import."""
    return lambda: fingerprint.closure(list(roots))


@dataclass(frozen=True)
class Age:
    """A stored stamp against today's, for a report whose note has words of its own.
    `changed` names the modules that differ ('tinyinfer.model', ...)."""

    when: str
    commit: str
    fingerprint: str
    today: str
    changed: list[str]

    @property
    def same(self) -> bool:
        return self.fingerprint == self.today

    def named(self, word: str = "engine fingerprint") -> str:
        """'tinyinfer at commit abc (engine fingerprint 0123...)'."""
        return f"tinyinfer at commit {self.commit} ({word} {self.fingerprint})"

    def listed(self, first: int = 4) -> str:
        """'model, cli, config, quant and 3 more': the changed modules by their short names."""
        short = [fingerprint.short_name(name) for name in self.changed]
        more = len(short) - first
        return ", ".join(short[:first]) + (f" and {more} more" if more > 0 else "")


@dataclass(frozen=True)
class StoredReport:
    """One kind of stored report.

    name        what it is, for an error: 'a peers report'
    stored      the copy stored with the course (reports/data/)
    saved_name  _build/<saved_name>: this machine's own run, shown instead of the stored copy
    env_var     names another file to render instead
    modules     today's modules of what the measurement runs (closure_of(...)); their
                fingerprint is the stamp
    program     what runs that code, for the note: '`tinyinfer serve`'
    rows        the measurements the note concerns: 'the tinyinfer rows'
    remeasure   how to measure today's: '`make peers` measures today's'
    keys        what a file must hold to be this report
    made_by     how to make one, for the error: 'make one with `make peers`'
    copies      every stored copy, where there are several (peers: one per class of CPU)
    exclude     folders whose uncommitted changes do not mark the commit '+uncommitted'
    words       a note in the report's own words, from (report, Age); None: fingerprint.stamp_note's
    """

    name: str
    stored: Path
    modules: Callable[[], list[str]]
    saved_name: str | None = None
    env_var: str | None = None
    program: str = "tinyinfer"
    rows: str = "these rows"
    remeasure: str = ""
    keys: tuple[str, ...] = ()
    made_by: str = ""
    copies: tuple[Path, ...] = ()
    exclude: tuple[str, ...] = ()
    words: Callable[[dict, Age], str] | None = None

    def stamp(self) -> dict:
        """What a new run stores about the code it ran (fingerprint.stamp of today's modules)."""
        return fingerprint.stamp(fingerprint.module_hashes(self.modules()), exclude=self.exclude)

    def find_saved(self, start: Path | None = None) -> Path | None:
        """$env_var, else _build/<saved_name> in the current folder (or `start`) or one of
        its three parents: a run on this machine (`make peers`, `make fleet`) is shown
        instead of the stored copy. None when there is neither."""
        if self.env_var and os.environ.get(self.env_var):
            return Path(os.environ[self.env_var])
        if not self.saved_name:
            return None
        here = (start or Path.cwd()).resolve()
        for folder in (here, *here.parents[:3]):
            if (folder / "_build" / self.saved_name).exists():
                return folder / "_build" / self.saved_name
        return None

    def load(self, path: str | Path | None = None) -> dict:
        """A report: `path`, else this machine's own (find_saved), else the stored copy.
        report['source'] names the file; report['stored'] says whether it is a stored copy."""
        chosen = Path(path) if path else (self.find_saved() or self.stored)
        report = json.loads(chosen.read_text())
        for key in self.keys:
            if not isinstance(report.get(key), (dict, list)):
                raise ValueError(f"{chosen}: not {self.name} (no {key!r}); {self.made_by}")
        report["source"] = str(chosen)
        report["stored"] = chosen.resolve() in {p.resolve() for p in (self.stored, *self.copies)}
        return report

    def note(self, report: dict, today: dict | None = None) -> str:
        """One sentence on the code behind the report: today's, or an older one (naming
        what changed), or unknown. `today` is stamp()'s result, computed here when needed."""
        meta = report["meta"]
        stamp = meta.get("engine_stamp") or {}
        when = meta.get("date", "an unknown date")
        if self.words is None:
            if stamp.get("engine_fingerprint", "unknown") != "unknown":  # else there is nothing to compare
                today = today or self.stamp()
            return fingerprint.stamp_note(stamp, when, today or {}, self.program, self.rows, self.remeasure)
        today = today or self.stamp()
        changed = [line.split(" (")[0] for line in fingerprint.changed(stamp.get("engine_modules") or {},
                                                                         today["engine_modules"])]
        age = Age(when, stamp.get("engine_commit", "unknown"), stamp.get("engine_fingerprint", "unknown"),
                  today["engine_fingerprint"], changed)
        return self.words(report, age)

    def current(self, report: dict, today: dict | None = None) -> bool:
        """Whether the report was measured by today's code (its fingerprint is today's). False
        for an older engine, and for a report with no fingerprint (its age is not known): a
        page keeps note() in view unless this is True."""
        theirs = (report["meta"].get("engine_stamp") or {}).get("engine_fingerprint", "unknown")
        return theirs != "unknown" and theirs == (today or self.stamp())["engine_fingerprint"]


# ------------------------------------------------------------------ a report on a page
# The chapters show a report's Markdown through IPython.display.Markdown, read as GitHub's
# Markdown (_config.yml's nb_render_markdown_format: gfm): MyST directives do not work there,
# raw HTML does. page() functions (peers, gpu, router) lay a report out for a page: a verdict
# of a sentence or two, the table with no column that says the same thing in every row, the
# stamp note when the code has changed since (never folded), then "About this run", folded:
# the provenance and the sentences computed from the numbers. render() stays the whole text,
# for a terminal and for the labs whose stored outputs show it.

MISSING = ("not measured", "not known", "-", "?", "")  # a cell that holds no measurement


def fold(summary: str, body: str) -> str:
    """`body` (Markdown) in a closed <details> block headed `summary`. The blank lines matter:
    GitHub's Markdown ends an HTML block at a blank line, so the Markdown inside renders
    (tables and paragraphs), and </details> is an HTML block of its own."""
    return f"<details>\n<summary>{summary}</summary>\n\n{body.strip()}\n\n</details>"


def compact_table(columns: list[str], rows: list[list[str]], keep: tuple[str, ...] = ()
                  ) -> tuple[str, list[tuple[str, str]]]:
    """A Markdown table of `rows` under `columns`, less every column whose cells are all
    the same (in more than one row) or all empty of a measurement (MISSING), unless named
    in `keep`. Returns the table and the (column, value) of each column dropped, for the
    page to say once under the table ('every reply: 64 tokens')."""
    dropped, shown = [], []
    for i, name in enumerate(columns):
        cells = {row[i] for row in rows}
        if name not in keep and rows and (len(cells) == 1 and len(rows) > 1 or cells <= set(MISSING)):
            dropped.append((name, rows[0][i]))
        else:
            shown.append(i)
    lines = ["| " + " | ".join(columns[i] for i in shown) + " |", "|" + "---|" * len(shown)]
    lines += ["| " + " | ".join(row[i] for i in shown) + " |" for row in rows]
    return "\n".join(lines), dropped


def constants_text(dropped: list[tuple[str, str]], words: dict[str, str] | None = None) -> str:
    """compact_table's dropped columns as one sentence for under the table: 'every reply: 64
    output tokens' (words[column], with {} for the value), else 'column: value in every row',
    or 'column: not measured in any row'."""
    def said(name: str, value: str) -> str:
        if name in (words or {}):
            return words[name].format(value)
        if value in MISSING:
            return f"{name}: {value if value.startswith('not ') else 'none'} in any row"
        return f"{name}: {value} in every row"

    text = "; ".join(said(name, value) for name, value in dropped)
    return text[:1].upper() + text[1:] + "." if text else ""
