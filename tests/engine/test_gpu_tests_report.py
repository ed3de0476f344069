"""tests/engine/test_cuda.py reports cleanly where it runs: the GPU machine's image has
torch, transformers and pytest but no Jupyter package, and may lack the
tokenizer files. Checked on a CPU."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_gpu_tests_run_without_any_jupyter_package(tmp_path):
    """nbformat made unimportable (as on the GPU image, which has no nbval either):
    `pytest tests/engine/test_cuda.py` ends with its own result. Here, without a GPU,
    that is every test skipped and exit status 0; conftest.py's summary hook
    used to import the book's tests, and so nbformat, and end every run in a
    traceback with status 1."""
    hidden = tmp_path / "hidden" / "nbformat"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'nbformat'\")\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "hidden"), str(ROOT / "src")]))
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:nbval", "-p", "no:cacheprovider", "-q", "-rs",
                           "tests/engine/test_cuda.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "Traceback" not in out and "skipped" in out, out[-3000:]


def test_on_a_gpu_missing_tokenizer_files_fail_and_name_tinyinfer_home(tmp_path, monkeypatch):
    """On a GPU, tests/engine/test_cuda.py's model fixture calls this first: without
    the files every test would otherwise skip, and a run of skips looks green."""
    import test_cuda  # tests/ is on sys.path

    monkeypatch.setenv("TINYINFER_HOME", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match="set TINYINFER_HOME"):
        test_cuda.tokenizer_folder()
    folder = tmp_path / "smollm2-135m-instruct"
    folder.mkdir()
    (folder / "tokenizer.json").write_text("{}")
    assert test_cuda.tokenizer_folder() == folder
