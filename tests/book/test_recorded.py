"""Every solution was recorded (executed and committed) on the engine code it runs.

A solution's stored outputs are what the site shows: the texts, and the timings
that strict nbval masks. tests/book/test_notebooks.py proves that the outputs it
compares still come out; it cannot see a stale timing or a sentence written
about an engine that has changed since. So scripts/make_labs.py --execute
stamps each solution with the modules it runs (those its code cells import,
transitively, and the command line's when a cell runs `tinyinfer serve`), each
with a hash of its code without docstrings and comments, and their fingerprint
(tinyinfer_course/fingerprint.py). This test fails when a stamp is not what those
modules give today. A docstring edit, or a change to a module the solution does
not import, leaves it current. Finishing an engine change includes `make record`.
"""
import sys
from pathlib import Path

import nbformat
import pytest
from make_labs_module import load_make_labs  # tests/ is on sys.path
from nbformat.v4 import new_code_cell, new_notebook

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = sorted((ROOT / "solutions").glob("[0-9][0-9]-*.ipynb"))
make_labs = load_make_labs()
fingerprints = make_labs.fingerprints


def stale_message(path: Path, record: dict | None, today: dict[str, str]) -> str:
    """Why `path` is stale: which of the modules it runs changed, and how to re-record."""
    now = fingerprints.fingerprint_of(today)
    if not record:
        why = f"{path.name} stores no engine fingerprint (it was never recorded by make_labs.py --execute)"
    else:
        why = (f"{path.name} was recorded on engine {record.get('engine_fingerprint')} "
               f"(commit {record.get('engine_commit')}); the modules it runs now give {now}")
        if "engine_modules" in record:
            why += ". Changed since: " + ", ".join(fingerprints.changed(record["engine_modules"], today))
            python = "{}.{}".format(*sys.version_info[:2])
            if record.get("python", python) != python:
                why += (f" (recorded under Python {record['python']}, tested under {python}: ast.unparse, "
                        "which the hashes read, may spell the same code differently)")
        else:
            why += " (its stamp is the older whole-engine fingerprint, which lists no modules)"
    return (why + "\nRe-record every solution, in order, on an idle machine: `make record` "
            "(or one: .venv/bin/python scripts/make_labs.py --execute NN), and commit them.")


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_solution_was_recorded_on_todays_engine(path):
    nb = nbformat.read(path, as_version=4)
    record = nb.metadata.get(make_labs.RECORD_KEY)
    today = make_labs.notebook_hashes(nb)
    assert record and record.get("engine_fingerprint") == fingerprints.fingerprint_of(today), \
        stale_message(path, record, today)


# ------------------------------------------------ what the fingerprint covers, on a fake package

FAKE = {
    "tinyinfer/__init__.py": '"""The package."""\nfrom .llm import LLM\n',
    "tinyinfer/llm.py": 'class LLM:\n    """An engine."""\n\n    def run(self, x):\n'
                        '        from . import model  # a lazy import counts\n        return model.f(x)\n',
    "tinyinfer/model.py": 'def f(x):\n    """Add one."""\n    return x + 1\n',
    "tinyinfer/__main__.py": "from .cli import main\n\nmain()\n",
    "tinyinfer/cli.py": 'PLUGINS = {"serve": "tinyinfer.server"}  # imported by name\n\n\ndef main():\n'
                        '    import importlib\n    return importlib.import_module(PLUGINS["serve"])\n',
    "tinyinfer/server/__init__.py": "from ..llm import LLM\nfrom .api import app\n",
    "tinyinfer/server/api.py": "def app():\n    return 200\n",
    "tinyinfer_course/__init__.py": "",
    "tinyinfer_course/analysis/__init__.py": "",
    "tinyinfer_course/analysis/eval.py": 'from importlib import resources\n\n\ndef text():\n'
                                         '    files = resources.files("tinyinfer_course")\n'
                                         '    return files.joinpath("data/eval_text.txt").read_text()\n',
    "tinyinfer_course/data/eval_text.txt": "some text\n",
    "tinyinfer_course/fleet/__init__.py": "from .simulator import simulate\n",
    "tinyinfer_course/fleet/simulator.py": "def simulate(x):\n    return x\n",
    "tinyinfer_course/fleet/live.py": "from tinyinfer.server import app\n",
    "tinyinfer_course/commands.py": 'FLEET = ("tinyinfer_course.fleet.live", "replicas behind a router")\n',
    "tinyinfer_course/labcheck/__init__.py": "from ..fleet import simulate\nCASES = 3\n",
    "tinyinfer_course/reports/__init__.py": "",
    "tinyinfer_course/reports/peers.py": "from ..fingerprint import stamp\nfrom tinyinfer import LLM\n",
    "tinyinfer_course/fingerprint.py": "def stamp():\n    return 1\n",
}
LAB_1 = ["from tinyinfer import LLM\nprint(LLM().run(1))"]
LAB_SERVES = ["import subprocess, sys\nfrom tinyinfer import LLM",
              'server = subprocess.Popen([sys.executable, "-m", "tinyinfer", "serve", "--port", "8000"])']


@pytest.fixture
def fake(tmp_path):
    """Both packages, `tinyinfer` and `tinyinfer_course`, in tmp_path (a fake src/),
    and a function: notebook sources -> its stamp."""
    root = tmp_path
    for name, text in FAKE.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)

    def stamp(sources):
        nb = new_notebook(cells=[new_code_cell(source) for source in sources])
        return make_labs.notebook_fingerprint(nb, root), make_labs.notebook_hashes(nb, root)
    stamp.root = root
    return stamp


def edit(root: Path, name: str, old: str, new: str) -> None:
    path = root / name
    assert old in path.read_text()
    path.write_text(path.read_text().replace(old, new))


def test_the_modules_a_notebook_runs(fake):
    """Its imports, the packages above them, lazy and relative imports, transitively,
    in both packages; not the modules it never imports, nor the checks."""
    _, hashes = fake(LAB_1)
    assert sorted(hashes) == ["tinyinfer", "tinyinfer.llm", "tinyinfer.model"]
    _, hashes = fake(LAB_1 + ["from tinyinfer_course import labcheck\nfrom tinyinfer_course.analysis import eval"])
    assert sorted(hashes) == ["tinyinfer", "tinyinfer.llm", "tinyinfer.model", "tinyinfer_course",
                              "tinyinfer_course.analysis", "tinyinfer_course.analysis.eval",
                              "tinyinfer_course/data/eval_text.txt"]


def test_docstrings_and_comments_leave_the_fingerprint(fake):
    before, _ = fake(LAB_1)
    edit(fake.root, "tinyinfer/model.py", '"""Add one."""', '"""Add one to x, reworded\n    over two lines."""')
    edit(fake.root, "tinyinfer/llm.py", "# a lazy import counts", "# a comment reworded")
    edit(fake.root, "tinyinfer/llm.py", '"""An engine."""\n', "")  # a docstring removed, a blank line added
    assert fake(LAB_1)[0] == before


def test_a_code_change_in_an_imported_module_changes_it(fake):
    before, _ = fake(LAB_1)
    edit(fake.root, "tinyinfer/model.py", "return x + 1", "return x + 2")  # reached only through a lazy import
    assert fake(LAB_1)[0] != before
    edit(fake.root, "tinyinfer/model.py", "return x + 2", "return x + 1")
    assert fake(LAB_1)[0] == before


def test_a_module_the_notebook_does_not_import_leaves_it(fake):
    before, _ = fake(LAB_1)
    edit(fake.root, "tinyinfer_course/fleet/simulator.py", "return x", "return x * 2")
    edit(fake.root, "tinyinfer/server/api.py", "return 200", "return 500")
    edit(fake.root, "tinyinfer_course/labcheck/__init__.py", "CASES = 3", "CASES = 4")  # strict nbval compares them
    (fake.root / "tinyinfer" / "sampling.py").write_text("X = 1\n")  # a new module nobody imports
    assert fake(LAB_1)[0] == before


def test_the_course_tooling_stales_nothing_by_package(fake):
    """The checks, the stored reports' renderers, the schematics and the
    fingerprint itself count for no stamp (fingerprint.NOT_COUNTED), by package:
    a notebook that renders a report is stamped with the engine it reads, not
    with the renderer; an edit to fingerprint.py or the fleet simulator stales
    only a notebook that runs the simulator."""
    sources = LAB_1 + ["from tinyinfer_course.reports import peers"]
    before, hashes = fake(sources)
    assert not [m for m in hashes if "reports" in m or "fingerprint" in m], hashes
    edit(fake.root, "tinyinfer_course/fingerprint.py", "return 1", "return 2")
    edit(fake.root, "tinyinfer_course/reports/peers.py", "import stamp", "import stamp as stamped")
    assert fake(sources)[0] == before
    simulating = LAB_1 + ["from tinyinfer_course.fleet import simulate"]
    ran, _ = fake(simulating)
    edit(fake.root, "tinyinfer_course/fleet/simulator.py", "return x", "return x * 2")
    assert fake(simulating)[0] != ran and fake(sources)[0] == before


def test_the_server_counts_for_a_notebook_that_runs_tinyinfer_serve(fake):
    before, hashes = fake(LAB_SERVES)
    assert {"tinyinfer.__main__", "tinyinfer.cli", "tinyinfer.server", "tinyinfer.server.api"} <= set(hashes)
    quiet, _ = fake(LAB_1)
    edit(fake.root, "tinyinfer/server/api.py", "return 200", "return 500")
    assert fake(LAB_SERVES)[0] != before
    assert fake(LAB_1)[0] == quiet
    for shell in ("!tinyinfer serve --port 8000 &", "!python -m tinyinfer serve &",
                  'subprocess.Popen("tinyinfer serve --port 8000", shell=True)'):
        assert "tinyinfer.server.api" in fake([shell])[1], shell
    assert "tinyinfer.server" not in fake(['print("start tinyinfer serve yourself")  # tinyinfer serve'])[1]


def test_a_course_command_counts_its_module(fake):
    """`tinyinfer fleet` runs a module the course adds through an entry point
    (tinyinfer_course/commands.py): it counts for a notebook that runs the command."""
    _, hashes = fake(["!tinyinfer fleet --replicas 2 &"])
    assert {"tinyinfer.cli", "tinyinfer_course.fleet.live", "tinyinfer.server.api"} <= set(hashes)
    assert "tinyinfer_course.fleet.live" not in fake(LAB_SERVES)[1]


def test_packaged_data_counts_for_the_module_that_reads_it(fake):
    before, _ = fake(["from tinyinfer_course.analysis.eval import text"])
    (fake.root / "tinyinfer_course" / "data" / "eval_text.txt").write_text("other text\n")
    assert fake(["from tinyinfer_course.analysis.eval import text"])[0] != before


def test_a_stale_stamp_names_the_changed_module(fake):
    _, old = fake(LAB_1)
    edit(fake.root, "tinyinfer/model.py", "return x + 1", "return x + 2")
    _, new = fake(LAB_1)
    message = stale_message(Path("01-tokens.ipynb"), {"engine_fingerprint": "x", "engine_modules": old}, new)
    assert "tinyinfer.model (code changed)" in message and "tinyinfer.llm" not in message


def test_the_solutions_run_what_their_labs_say():
    """The real notebooks: lab 8 and lab 11 start `tinyinfer serve`, so the server
    counts for them; lab 1 does not, so it does not; no stamp holds the checks."""
    modules = {path.name[:2]: make_labs.notebook_hashes(nbformat.read(path, as_version=4)) for path in SOLUTIONS}
    for lab in ("08", "11"):
        assert {"tinyinfer.cli", "tinyinfer.server.api", "tinyinfer.server.engine_core"} <= set(modules[lab]), lab
    assert "tinyinfer.server.api" not in modules["01"] and "tinyinfer_course.text.bpe" in modules["01"]
    assert not [m for hashes in modules.values() for m in hashes
                if ".labcheck" in m or ".schematics" in m or ".reports" in m or "fingerprint" in m]


def test_labs_carry_no_fingerprint():
    """The labs are generated byte for byte (make_labs.py --check), and carry no stamp:
    re-recording a solution changes its lab only if its sources changed."""
    for path in SOLUTIONS:
        lab = nbformat.read(ROOT / "labs" / path.name, as_version=4)
        assert make_labs.RECORD_KEY not in lab.metadata, path.name
