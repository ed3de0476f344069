"""Every notebook runs top to bottom, and the solutions reproduce their stored outputs.

nbval executes a notebook in a fresh kernel and compares each cell's new output
with the one stored in the file:

- solutions/*.ipynb: strict (`--nbval`). Solutions are committed executed, so
  every stored output is checked; tests/sanitize.cfg masks timings, speeds,
  progress bars and addresses, and a cell tagged `nbval-ignore-output` is run
  but not compared.
- labs/*.ipynb: a lab must run top to bottom in its unsolved state (stubs raise
  only when called, checks print ✗ instead of raising, and later labs fall back
  to the course's reference for a piece the learner has not kept). Labs store
  no outputs, so they run lax (`--nbval-lax`: only errors fail). The book shows
  the solutions and does not execute them (_config.yml), so each notebook runs
  exactly once per `make test`, here.

Each notebook runs in its own pytest subprocess: `make test` stays a single
pytest run with a single summary line, and nbval's options never reach the
other tests.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SANITIZE = ROOT / "tests" / "sanitize.cfg"
CELL_TIMEOUT_S = 300
NOTEBOOK_TIMEOUT_S = 1200

CASES = [pytest.param(p, "--nbval", id=f"strict:{p.relative_to(ROOT)}")
         for p in sorted((ROOT / "solutions").glob("*.ipynb"))]

CASES += [pytest.param(p, "--nbval-lax", id=f"lax:{p.relative_to(ROOT)}")
          for p in sorted((ROOT / "labs").glob("*.ipynb"))]


@pytest.mark.notebooks
@pytest.mark.parametrize("notebook, mode", CASES)
def test_notebook_runs(notebook: Path, mode: str) -> None:
    cmd = [
        sys.executable, "-m", "pytest", str(notebook.relative_to(ROOT)), mode,
        "--nbval-sanitize-with", str(SANITIZE.relative_to(ROOT)),
        "--nbval-current-env",  # the kernel runs this interpreter, i.e. the venv
        f"--nbval-cell-timeout={CELL_TIMEOUT_S}",
        "-p", "no:cacheprovider", "-q", "--no-header",
    ]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", NO_COLOR="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=NOTEBOOK_TIMEOUT_S)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)}\nexit code {proc.returncode}\n{proc.stdout}\n{proc.stderr}",
                    pytrace=False)
