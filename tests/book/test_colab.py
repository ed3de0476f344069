"""Every lab opens in Colab: a badge that links to it on GitHub, then a cell
that installs the course there, both naming the repository in _config.yml.

The install cell is only checked, never run here: it must do nothing (and print
nothing) outside Colab, which is verified by running it with and without a fake
`google.colab` module, with subprocess.run replaced by a recorder.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import re
import subprocess
import sys
import types
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
LABS = sorted((ROOT / "labs").glob("[0-9][0-9]-*.ipynb"))
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
REPO_URL = CONFIG["repository"]["url"].rstrip("/")
BRANCH = CONFIG["repository"].get("branch") or "main"
BADGE_LINK = re.compile(r"\]\((https://colab\.research\.google\.com/github/[^)\s]+)\)")


def make_labs_module():
    spec = importlib.util.spec_from_file_location("make_labs", ROOT / "scripts" / "make_labs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def install_cell(nb):
    cells = [c for c in nb.cells if c.cell_type == "code" and '"google.colab" in sys.modules' in c.source]
    assert len(cells) == 1, f"expected one Colab install cell, found {len(cells)}"
    return cells[0]


def run_install_cell(source: str, in_colab: bool) -> tuple[list[list[str]], str]:
    """Execute the cell with subprocess.run recorded, not run; returns (commands, stdout)."""
    commands: list[list[str]] = []
    real_run, colab = subprocess.run, sys.modules.pop("google.colab", None)
    subprocess.run = lambda cmd, *a, **k: commands.append(list(cmd))
    if in_colab:
        sys.modules["google.colab"] = types.ModuleType("google.colab")
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(source, "<colab-install>", "exec"), {})
    finally:
        subprocess.run = real_run
        sys.modules.pop("google.colab", None)
        if colab is not None:
            sys.modules["google.colab"] = colab
    return commands, out.getvalue()


def test_there_are_labs() -> None:
    assert LABS, "no labs/NN-*.ipynb"
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", REPO_URL), REPO_URL


@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.stem)
def test_lab_has_a_colab_badge_for_itself(lab: Path) -> None:
    nb = nbformat.read(lab, as_version=4)
    badges = [c for c in nb.cells if c.cell_type == "markdown" and "colab.research.google.com" in c.source]
    assert len(badges) == 1, f"{lab.name}: expected one 'Open in Colab' badge cell, found {len(badges)}"
    assert nb.cells.index(badges[0]) <= 1, f"{lab.name}: the badge should come right after the title"
    assert "colab-badge.svg" in badges[0].source
    link = BADGE_LINK.search(badges[0].source)
    assert link, f"{lab.name}: the badge links nowhere"
    owner_repo = REPO_URL.removeprefix("https://github.com/")
    assert link.group(1) == f"https://colab.research.google.com/github/{owner_repo}/blob/{BRANCH}/labs/{lab.name}"


@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.stem)
def test_lab_installs_the_course_in_colab_only(lab: Path) -> None:
    nb = nbformat.read(lab, as_version=4)
    cell = install_cell(nb)
    assert nb.cells.index(cell) <= 2, f"{lab.name}: the install cell must run before anything imports tinyinfer"
    first_import = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "tinyinfer" in c.source
                        and c is not cell)
    assert nb.cells.index(cell) < first_import

    commands, printed = run_install_cell(cell.source, in_colab=False)
    assert commands == [] and printed == "", f"{lab.name}: outside Colab the cell must do nothing"

    commands, _ = run_install_cell(cell.source, in_colab=True)
    assert len(commands) == 2, commands
    pip, fetch = commands
    assert pip[:4] == [sys.executable, "-m", "pip", "install"], pip
    requirement = pip[-1]
    name, _, url = requirement.partition(" @ ")
    assert name.split("[")[0] == "tinyinfer", requirement
    assert url == f"git+{REPO_URL}@{BRANCH}", f"{lab.name}: installs from {url}, _config.yml says {REPO_URL}"
    assert fetch == [sys.executable, "-m", "tinyinfer", "fetch"], fetch


def test_solution_install_cells_use_the_configured_repository() -> None:
    """Solutions keep their own install cell; it must name the same repository."""
    for path in sorted((ROOT / "solutions").glob("[0-9][0-9]-*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code" and '"google.colab" in sys.modules' in cell.source:
                urls = re.findall(r"git\+(https://[^\s\"'@]+)", cell.source)
                assert urls and all(u.rstrip("/") == REPO_URL for u in urls), f"{path.name}: installs from {urls}"


def test_colab_cells_follow_the_config(tmp_path: Path) -> None:
    """The cells come from _config.yml, not from a hard-coded URL: another
    repository in the config gives other links."""
    make_labs = make_labs_module()
    config = tmp_path / "_config.yml"
    config.write_text(yaml.safe_dump({"repository": {"url": "https://github.com/someone/fork", "branch": "dev"}}))
    repo = make_labs.repository(config)
    solution = nbformat.read(ROOT / "solutions" / LABS[0].name, as_version=4)
    lab = make_labs.make_lab(solution, LABS[0].name, repo, LABS[0].name)
    text = "\n".join(c.source for c in lab.cells[:3])
    assert f"github/someone/fork/blob/dev/labs/{LABS[0].name}" in text
    assert "git+https://github.com/someone/fork@dev" in text
    assert REPO_URL not in text
    assert sum('"google.colab" in sys.modules' in c.source for c in lab.cells) == 1  # the solution's own is replaced

    config.write_text(yaml.safe_dump({"repository": {"url": "https://example.com/not-github"}}))
    with pytest.raises(ValueError, match="repository.url"):
        make_labs.repository(config)


@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.stem)
def test_colab_install_covers_what_the_lab_imports(lab: Path) -> None:
    """A package the lab imports that tinyinfer does not depend on (openai, in
    lab 8) is installed in Colab too, before the course."""
    make_labs = make_labs_module()
    nb = nbformat.read(lab, as_version=4)
    commands, _ = run_install_cell(install_cell(nb).source, in_colab=True)
    pip = commands[0]
    for name, requirement in make_labs.COLAB_EXTRA_REQUIREMENTS.items():
        imported = name in make_labs.lab_imports(nb)
        assert (requirement in pip) == imported, f"{lab.name}: imports {name}: {imported}; pip: {pip}"
    if lab.stem == "08-fleets":
        assert "openai>=1.40" in pip


# What would replace Colab's CUDA build of PyTorch with another (a CPU-only wheel, or
# a newer one built for another CUDA): a torch requirement of the cell's own, or a flag
# that upgrades what is installed or points pip at another index.
TORCH_REPLACING_FLAGS = ("-U", "--upgrade", "--force-reinstall", "--index-url", "-i", "--extra-index-url")


def torch_replacing(pip: list[str]) -> list[str]:
    """The parts of a pip command that could reinstall torch over Colab's own."""
    return [arg for arg in pip if arg in TORCH_REPLACING_FLAGS or arg.startswith(("--index-url=", "--upgrade-strategy"))
            or re.match(r"torch\b", arg) or "download.pytorch.org" in arg]


def test_the_torch_check_can_fail() -> None:
    assert torch_replacing([sys.executable, "-m", "pip", "install", "--upgrade", "tinyinfer @ git+x"]) == ["--upgrade"]
    assert torch_replacing(["pip", "install", "torch==2.4.0+cpu"]) == ["torch==2.4.0+cpu"]
    assert torch_replacing(["pip", "install", "--index-url=https://download.pytorch.org/whl/cpu", "x"])


@pytest.mark.parametrize("lab", LABS, ids=lambda p: p.stem)
def test_colab_install_keeps_colabs_cuda_torch(lab: Path) -> None:
    """On a Colab GPU runtime, torch is already installed, built for its CUDA: the cell must
    not replace it (no torch of its own, no upgrade, no other index), and the course's own
    torch requirement must be a lower bound that Colab's build meets, not a pin."""
    commands, _ = run_install_cell(install_cell(nbformat.read(lab, as_version=4)).source, in_colab=True)
    assert not torch_replacing(commands[0]), f"{lab.name}: {commands[0]}"
    project = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    torch_reqs = re.findall(r'"torch(?![\w-])\s*([^"]*)"', project)
    assert torch_reqs == [">=2.4"], \
        f"pyproject.toml: torch{torch_reqs}: a pin or an upper bound would replace Colab's torch"
