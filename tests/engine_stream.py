"""A few engine test files run in a pytest process of their own, beside this one.

On the course's two-core machine, a whole `make test` runs this process's engine
tests beside the notebooks' two streams and the book's build
(tests/test_notebooks.py). Those parts end minutes before this process's tests
do, and the run then ends on one busy core beside an idle one. So the run moves
FILES, whole files of self-contained tests, into a second pytest process,
started with the streams (conftest.pytest_collection_finish); this process
keeps their items, ordered after its own, and reports for each one what the
other process reported: the same pass, fail or skip, its output and duration,
in the one summary of the run.

The other process writes each report as a line of JSON through pytest's own
serialisation hooks (pytest_report_to_serializable, as pytest-xdist does), into
the file named by REPORTS_ENV. An item it did not see to its end (a crash, a
timeout) fails here with that process's output. Run alone (`pytest tests/test_scheduler.py`),
or in a run that selects no notebook, nothing is moved: the tests run here.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path

from _pytest.reports import TestReport

ROOT = Path(__file__).resolve().parents[1]
# ~200 s of one core on the course's machine, alone: enough to even out the run's
# parts there. Each loads its own models (the `llm` fixture too), nothing from here.
FILES = ("tests/test_quant.py", "tests/test_scheduler.py", "tests/test_speculative.py")
REPORTS_ENV = "TINYINFER_TEST_REPORTS"  # set in the other process: where it writes its reports
TIMEOUT_S = 1200

_MOVED: set[str] = set()  # node ids of the items the other process runs
_RUN: Future = Future()  # its CompletedProcess, and the reports it wrote
FINISHED: dict[str, float] = {}  # "engine tests (own process)" -> when (time.monotonic()) it ended


def moves(nodeid: str) -> bool:
    """Whether an item with this node id belongs to FILES (and so may be moved)."""
    return nodeid.split("::", 1)[0] in FILES


def start(items, config) -> None:
    """Start the other process on those of `items` that FILES names."""
    ids = [item.nodeid for item in items if moves(item.nodeid)]
    if not ids or _MOVED:
        return
    _MOVED.update(ids)
    fd, reports = tempfile.mkstemp(prefix="tinyinfer-test-reports-", suffix=".jsonl")
    os.close(fd)
    cmd = [sys.executable, "-m", "pytest", *ids, "-p", "no:cacheprovider", "-p", "no:nbval", "-q", "--no-header"]
    env = dict(os.environ, **{REPORTS_ENV: reports})

    def run():
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            proc = subprocess.CompletedProcess(cmd, 124, e.stdout or "", f"timed out after {TIMEOUT_S} s")
        by_id: dict[str, list[TestReport]] = {}
        for line in Path(reports).read_text().splitlines():
            report = config.hook.pytest_report_from_serializable(config=config, data=json.loads(line))
            if isinstance(report.longrepr, list):  # a skip's (path, line, reason): JSON made the tuple a list
                report.longrepr = tuple(report.longrepr)
            by_id.setdefault(report.nodeid, []).append(report)
        Path(reports).unlink()
        FINISHED["engine tests (own process)"] = time.monotonic()
        _RUN.set_result((proc, by_id))

    threading.Thread(target=run, daemon=True, name="engine tests").start()


def finished() -> bool:
    """Whether the other process has ended (True if none was started)."""
    return not _MOVED or _RUN.done()


def replay(item) -> bool:
    """Report `item` as the other process did; False if it is not one it ran."""
    if item.nodeid not in _MOVED:
        return False
    proc, by_id = _RUN.result()
    reports = by_id.get(item.nodeid, [])
    if not any(report.when == "teardown" for report in reports):  # it never ended there: crashed, timed out
        reports.append(TestReport(item.nodeid, item.location, {}, "failed", when="call", longrepr=(
            f"{item.nodeid} did not finish in {' '.join(proc.args[:3])} ... (exit code {proc.returncode})\n"
            f"{proc.stdout[-5000:]}\n{proc.stderr[-5000:]}")))
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for report in reports:
        item.ihook.pytest_runtest_logreport(report=report)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def write_report(config, report) -> None:
    """In the other process: append one report to the file the run reads back."""
    path = os.environ.get(REPORTS_ENV)
    if path:
        data = config.hook.pytest_report_to_serializable(config=config, report=report)
        with open(path, "a") as f:
            f.write(json.dumps(data) + "\n")
