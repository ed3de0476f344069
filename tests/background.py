"""Engine tests that run in a pytest process of their own, beside the rest of a
full run (one that also runs the notebooks).

A full run is several parts side by side on two cores: the two notebook streams,
the book's build and this process's engine tests (tests/test_notebooks.py). The
engine tests are the most work of the four, so they ended last, alone on one
core for minutes. The files in BACKGROUND move to a fifth part that starts with
the others: torch.compile's cold build of the tiny model (test_compiled_decode,
minutes of C++ compiling on a shared core), the decode benchmark's run, and the
parity checks against transformers. None of them needs anything of this process.

Each moved test keeps its place in this run's report: when its turn comes, it
waits for the background run and passes, fails or skips as the test did there
(conftest.pytest_pyfunc_call). Its reported duration is then that wait. Run a
file by itself (`pytest tests/test_compiled_decode.py`) and it runs here as usual.
"""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What moves: files of long tests that share nothing with this process, about a
# third of its work (the engine tests ended over 2 minutes after the streams before
# the last two moved: 795 against 667 s under AVX2 emulation).
BACKGROUND = ("tests/test_compiled_decode.py", "tests/test_decode_benchmark.py", "tests/test_engine_parity.py")
OUTCOMES = "TINYINFER_TEST_OUTCOMES"  # set in the background run: where it writes each test's outcome
TIMEOUT_S = 1200

_RUN: list[Future] = []  # the one background run of this pytest run, once started
_MOVED: set[str] = set()  # the node ids it runs
FINISHED: dict[str, float] = {}  # "engine tests (background)" -> when (time.monotonic()) it ended


def moves(nodeid: str) -> bool:
    """Whether a full run gives this test to the background run."""
    return nodeid.startswith(BACKGROUND)


def start(items: list, env: dict[str, str]) -> None:
    """Run these tests in a pytest subprocess, in a thread of this one (once).
    Here they set up nothing: their fixtures are made where they run."""
    if _RUN or not items:
        return
    from test_notebooks import PYTEST  # tests/ is on sys.path; the same quick-start pytest

    nodeids = [item.nodeid for item in items]
    for item in items:
        item.setup = lambda: None  # pytest calls item.setup() to fill the test's fixtures
    _MOVED.update(nodeids)
    outcomes = tempfile.mkstemp(prefix="tinyinfer-outcomes-", suffix=".jsonl")[1]
    cmd = [*PYTEST, *nodeids, "-p", "no:cacheprovider", "-q", "--no-header"]
    future: Future = Future()
    _RUN.append(future)

    def run():
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=dict(env, **{OUTCOMES: outcomes}),
                                  capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            proc = subprocess.CompletedProcess(cmd, 124, e.stdout or "", f"timed out after {TIMEOUT_S} s")
        lines = Path(outcomes).read_text().splitlines()
        future.set_result((proc, [json.loads(line) for line in lines]))
        FINISHED["engine tests (background)"] = time.monotonic()

    threading.Thread(target=run, daemon=True, name="engine tests (background)").start()


def finished() -> bool:
    """Whether the background run has ended (True if none was started)."""
    return all(run.done() for run in _RUN)


def runs_elsewhere(nodeid: str) -> bool:
    return nodeid in _MOVED


def record(report) -> None:
    """In the background run: append a test's outcome, and any phase (setup,
    teardown) that did not pass, to the file the full run reads."""
    path = os.environ.get(OUTCOMES)
    if not path or (report.passed and report.when != "call"):
        return
    text = report.longrepr[2] if report.skipped and isinstance(report.longrepr, tuple) else str(report.longrepr or "")
    with open(path, "a") as f:
        f.write(json.dumps({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                            "text": text}) + "\n")


def replay(nodeid: str) -> None:
    """Wait for the background run, then end as this test ended there."""
    proc, outcomes = _RUN[0].result()
    phases = [o for o in outcomes if o["nodeid"] == nodeid]
    for o in phases:
        if o["outcome"] == "failed":
            pytest.fail(f"failed in the background run ({o['when']}):\n{o['text']}", pytrace=False)
    for o in phases:
        if o["outcome"] == "skipped":
            pytest.skip(o["text"].removeprefix("Skipped: "))
    if not any(o["when"] == "call" and o["outcome"] == "passed" for o in phases):
        pytest.fail(f"the background run did not report this test (exit code {proc.returncode}):\n"
                    f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}", pytrace=False)
