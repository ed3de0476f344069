"""The book builds, with warnings as errors, and shows executed output.

This is the slowest test: the build executes every notebook and every chapter
with {code-cell}s (`execute_notebooks: force` in _config.yml): about 30 s with
chapter 1 on two cores, more as chapters are added. Skip it with
`pytest -m "not book"`.

It builds into a temporary folder, so it neither needs nor touches _build/.
Without -W a failing cell still gives exit code 0; with it, any warning (a
missing page, a broken reference, a cell that raises) fails the build.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 1500


def toc_files() -> list[str]:
    """Every page named in _toc.yml (root first), without its suffix."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]

    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk({k: v for k, v in toc.items() if k != "root"})
    return [str(Path(f).with_suffix("")) if Path(f).suffix in {".md", ".ipynb"} else f for f in files]


def source_of(page: str) -> Path:
    for suffix in (".md", ".ipynb"):
        if (ROOT / (page + suffix)).exists():
            return ROOT / (page + suffix)
    raise FileNotFoundError(f"_toc.yml lists {page!r}, but neither {page}.md nor {page}.ipynb exists")


def jupyter_book() -> str:
    here = Path(sys.executable).parent / "jupyter-book"
    return str(here) if here.exists() else shutil.which("jupyter-book") or "jupyter-book"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("book")
    cmd = [jupyter_book(), "build", str(ROOT), "--path-output", str(out), "-W", "-n", "--keep-going"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)}\nexit code {proc.returncode}\n{proc.stdout[-20000:]}\n{proc.stderr[-20000:]}",
                    pytrace=False)
    return out / "_build" / "html"


@pytest.mark.book
def test_every_page_is_built(built: Path) -> None:
    pages = toc_files()
    assert "intro" in pages
    assert any(p.startswith("chapters/") for p in pages)
    assert any(p.startswith("labs/") for p in pages)
    missing = [p for p in pages if not (built / f"{p}.html").is_file()]
    assert not missing, f"no HTML for {missing} in {built}"


@pytest.mark.book
def test_notebooks_were_executed(built: Path) -> None:
    """Labs, and chapters with code cells, show cell output in the site: the
    build really ran them."""
    executable = [p for p in toc_files()
                  if source_of(p).suffix == ".ipynb" or "{code-cell}" in source_of(p).read_text()]
    assert any(p.startswith("labs/") for p in executable)
    for page in executable:
        html = (built / f"{page}.html").read_text()
        assert "cell_output" in html, f"{page}.html shows no executed output"
