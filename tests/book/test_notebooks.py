"""Every notebook runs top to bottom, and the solutions reproduce their stored outputs.

nbval executes a notebook in a fresh kernel and compares each cell's new output
with the one stored in the file:

- solutions/*.ipynb: strict (`--nbval`). Solutions are committed executed, so
  every stored output is checked; tests/book/sanitize.cfg masks timings, speeds,
  progress bars and addresses, and a cell tagged `nbval-ignore-output` is run
  but not compared.
- labs/*.ipynb: a lab must run top to bottom in its unsolved state (stubs raise
  only when called, checks print ✗ instead of raising, and later labs fall back
  to the course's reference for a piece the learner has not kept). Labs store
  no outputs, so they run lax (`--nbval-lax`: only errors fail). A cell tagged
  `engine-only` in a solution is an experiment on the engine alone; its copy in
  the lab is tagged `nbval-skip` and skipped here, since the solution's run has
  executed the same code on the same inputs (scripts/make_labs.py refuses the
  tag on a cell that reads anything the learner made). The book shows
  the solutions and does not execute them (_config.yml), so each notebook runs
  exactly once per `make test`, here.

Each notebook runs in its own pytest subprocess: `make test` stays a single
pytest run with a single summary line, and nbval's options never reach the
other tests.

The two kinds run side by side, as two streams of one thread each (the course's
machine has two cores): the solutions in order, sharing one engine folder (lab 4
loads what lab 3 kept), and the labs in order, in a folder of their own that
stays empty, as for a learner who has solved nothing. Much of a notebook's time
is not arithmetic (starting a kernel, imports, loading the model, a server's
start-up), and the other stream computes meanwhile. Stored outputs hold on any
CPU and at any thread count, so one thread changes nothing they compare.
The streams start as soon as collection ends (conftest.pytest_collection_finish),
with only the notebooks this pytest run selected, and run beside the engine
tests, which then use one thread too. When the run also builds the book
(tests/book/test_book.py), its build starts then as well, a third stream of one thread.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SANITIZE = ROOT / "tests" / "book" / "sanitize.cfg"
CELL_TIMEOUT_S = 300
NOTEBOOK_TIMEOUT_S = 1200

CASES = [pytest.param(p, "--nbval", id=f"strict:{p.relative_to(ROOT)}")
         for p in sorted((ROOT / "solutions").glob("*.ipynb"))]

CASES += [pytest.param(p, "--nbval-lax", id=f"lax:{p.relative_to(ROOT)}")
          for p in sorted((ROOT / "labs").glob("*.ipynb"))]

_RUNS: dict[tuple[Path, str], Future] = {}  # (notebook, mode) -> the finished subprocess
_LOCK = threading.Lock()


# jsonschema imports rfc3987_syntax when it is installed (Jupyter's extras bring it
# in), and that module builds a parser for IRIs as it is imported: 2 s of every
# process that reads a notebook, since nbformat imports jsonschema. Nothing here
# checks the syntax of an IRI, so each notebook's pytest starts with the module
# marked absent (None in sys.modules: its import fails, as if it were not installed).
PYTEST = [sys.executable, "-c", "import sys; sys.modules['rfc3987_syntax'] = None; "
          "import pytest; raise SystemExit(pytest.main())"]


def run_notebook(notebook: Path, mode: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    cmd = [
        *PYTEST, str(notebook.relative_to(ROOT)), mode,
        "--nbval-sanitize-with", str(SANITIZE.relative_to(ROOT)),
        "--nbval-current-env",  # the kernel runs this interpreter, i.e. the venv
        f"--nbval-cell-timeout={CELL_TIMEOUT_S}",
        "-p", "no:cacheprovider", "-q", "--no-header",
    ]
    try:
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=NOTEBOOK_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(cmd, 124, e.stdout or "", f"timed out after {NOTEBOOK_TIMEOUT_S} s")


FINISHED: dict[str, float] = {}  # stream -> when (time.monotonic()) its last notebook finished
# (OMP_NUM_THREADS, torch threads) to give back once the streams are done (tests/conftest.py)
RESTORE_THREADS: list[tuple[str | None, int]] = []


def _stream(jobs: list[tuple[Path, str]], env: dict[str, str], name: str) -> None:
    """Run one stream's notebooks in order, each result into its future."""
    for key in jobs:
        try:
            _RUNS[key].set_result(run_notebook(*key, env))
        except BaseException as e:  # noqa: BLE001 - the test that waits reports it
            _RUNS[key].set_exception(e)
    FINISHED[name] = time.monotonic()


def start_streams(selected: list[tuple[Path, str]], with_book: bool = False) -> None:
    """Start the selected notebooks' streams once: solutions in one, labs in the
    other, and the book's build beside them if this run builds it."""
    with _LOCK:
        if _RUNS:
            return
        streams = {mode: [key for key in selected if key[1] == mode] for mode in ("--nbval", "--nbval-lax")}
        streams = {mode: jobs for mode, jobs in streams.items() if jobs}
        # no PYTHONDONTWRITEBYTECODE: the venv is installed without .pyc files (Makefile),
        # and the first kernel to import a module keeps its .pyc for every later one
        base = dict(os.environ, NO_COLOR="1")
        if len(streams) > 1:  # side by side: one thread each, so they do not fight over the cores
            base["OMP_NUM_THREADS"] = "1"
        for mode, jobs in streams.items():
            env = dict(base)
            if mode == "--nbval-lax":  # a learner who has kept nothing yet
                env["TINYINFER_MY_ENGINE"] = tempfile.mkdtemp(prefix="tinyinfer-unsolved-")
            for key in jobs:
                _RUNS[key] = Future()
            name = "solutions (strict)" if mode == "--nbval" else "labs (lax)"
            threading.Thread(target=_stream, args=(jobs, env, name), daemon=True, name=f"notebooks {mode}").start()
        if with_book:
            from test_book import start_build  # tests/ is on sys.path, as for test_browser's import

            start_build(threads="1")


def streams_finished() -> bool:
    """Whether every notebook started by start_streams has finished (True if none was)."""
    return all(run.done() for run in _RUNS.values())


def _selected(session) -> list[tuple[Path, str]]:
    return [(item.callspec.params["notebook"], item.callspec.params["mode"])
            for item in session.items if item.originalname == "test_notebook_runs"]


def _builds_book(session) -> bool:
    return any(item.get_closest_marker("book") for item in session.items)


@pytest.mark.notebooks
@pytest.mark.parametrize("notebook, mode", CASES)
def test_notebook_runs(notebook: Path, mode: str) -> None:
    proc = _RUNS[(notebook, mode)].result()  # started with the streams, when collection ended (conftest.py)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, proc.args))}\nexit code {proc.returncode}\n{proc.stdout}\n{proc.stderr}",
                    pytrace=False)
