"""`make assignments` (scripts/make_assignments.py): lab 1 as an otter-grader
assignment, graded end to end by `otter run` (no Docker) on the solved notebook
and on one with a wrong exercise from tests/course/lab_cases/."""
import ast
import contextlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tinyinfer_course.labcheck.core import Case, _part_of, only_cases, run_check

ROOT = Path(__file__).resolve().parents[2]
OTTER = Path(sys.executable).parent / "otter"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_public_and_hidden_cases_split_every_check_in_two(capsys):
    cases = list(range(5))
    assert _part_of(cases, "public") == [0, 1] and _part_of(cases, "hidden") == [2, 3, 4]
    assert _part_of([0], "public") == _part_of([0], "hidden") == [0]  # one case: both tests run it
    assert _part_of(cases, None) == cases
    make = lambda: [Case((x,), x, f"x={x}") for x in range(4)]  # noqa: E731
    wrong_on_3 = lambda x: 0 if x == 3 else x  # noqa: E731
    with only_cases("public"):
        assert run_check("id", wrong_on_3, make) is True
    with only_cases("hidden"):
        assert run_check("id", wrong_on_3, make) is False
    assert run_check("id", wrong_on_3, make) is False
    assert "✓ id: 2 cases passed" in capsys.readouterr().out
    with pytest.raises(ValueError):
        with only_cases("all"):
            pass


def test_every_lab_becomes_an_otter_source_with_two_tests_per_exercise():
    make_assignments = _load(ROOT / "scripts" / "make_assignments.py", "make_assignments")
    make_labs = make_assignments.make_labs
    for path in sorted((ROOT / "solutions").glob("[0-9][0-9]-*.ipynb")):
        master = make_assignments.master_notebook(path)
        sources = [c.source for c in master.cells]
        solution = nbformat.read(path, as_version=4)
        checks = {solution.cells[j].source for _, j in make_labs.exercise_pairs(solution, path.name)}
        questions = sum(s.startswith("# BEGIN QUESTION") for s in sources)
        assert questions >= 1, path.name
        assert sum("hidden: true" in s for s in sources) == questions, path.name
        assert sum("hidden: false" in s for s in sources) == questions, path.name
        assert not checks & set(sources), path.name  # each check cell replaced by its tests


def test_the_student_copy_shows_the_labs_stub_and_the_autograder_runs_the_solution():
    """Each exercise cell as otter writes it: the student sees exactly the lab's
    cell (`# YOUR CODE HERE`, `raise NotImplementedError`), not a bare `...`; the
    autograder's copy behaves as the solution (the prompt is a string literal)."""
    solutions = pytest.importorskip("otter.assign.solutions", reason="otter-grader is not installed")
    make_assignments = _load(ROOT / "scripts" / "make_assignments.py", "make_assignments")
    make_labs = make_assignments.make_labs
    for path in sorted((ROOT / "solutions").glob("[0-9][0-9]-*.ipynb")):
        solution = nbformat.read(path, as_version=4)
        for i, _ in make_labs.exercise_pairs(solution, path.name):
            source = solution.cells[i].source
            otter_source = make_assignments.with_lab_prompt(source)
            student = "\n".join(solutions.replace_solutions(otter_source.splitlines(), "python"))
            assert student == make_labs.stub_source(source, path.name).rstrip("\n"), path.name
            assert _without_prompts(otter_source) == ast.dump(ast.parse(source)), path.name


def _without_prompts(source: str) -> str:
    """The code otter's autograder runs, less the prompts' string literals (which do nothing)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            node.body = [n for n in body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
                                                 and "# YOUR CODE HERE" in str(n.value.value))]
    return ast.dump(tree)


def _passes(wrong, part: str) -> bool:
    """The merge-step check on one half of its cases, its message swallowed."""
    from tinyinfer_course import labcheck

    with only_cases(part), contextlib.redirect_stdout(io.StringIO()):
        return labcheck.check_bpe_merge_step(wrong)


def _score(results: Path) -> dict:
    return {t["name"]: t["score"] for t in json.loads(results.read_text())["tests"] if "score" in t}


def _grade(zip_path: Path, notebook: Path, out: Path, env: dict) -> dict:
    out.mkdir()
    result = subprocess.run([str(OTTER), "run", "-a", str(zip_path), "-o", str(out), "--no-logo", str(notebook)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return _score(out / "results.json")


@pytest.mark.slow
@pytest.mark.skipif(not OTTER.exists(), reason="otter-grader is not installed (the test extra has it)")
def test_otter_grades_a_solved_lab_in_full_and_a_wrong_one_lower(tmp_path):
    env = dict(os.environ, TINYINFER_MY_ENGINE=str(tmp_path / "engine"))
    make_assignments = _load(ROOT / "scripts" / "make_assignments.py", "make_assignments")
    folder = make_assignments.assign(ROOT / "solutions" / "01-tokens.ipynb", tmp_path / "assignments")
    student = nbformat.read(folder / "student" / "01-tokens.ipynb", as_version=4)
    assert not any("BEGIN SOLUTION" in c.source or 'only_cases("hidden")' in c.source for c in student.cells)
    stub = 'raise NotImplementedError("Exercise: write the body of my_'  # the lab's stub, not otter's `...`
    stubs = [c.source for c in student.cells if stub in c.source]
    assert len(stubs) == 2 and not any(line.strip() == "..." for s in stubs for line in s.splitlines())
    tests = student.metadata["otter"]["tests"]
    assert set(tests) == {"my_encode_piece", "my_merge_step"} and not any("hidden=True" in t for t in tests.values())
    (zip_path,) = (folder / "autograder").glob("*.zip")
    solved = folder / "autograder" / "01-tokens.ipynb"  # the solutions, as otter wrote them

    assert _grade(zip_path, solved, tmp_path / "solved", env) == {"my_encode_piece": 2.0, "my_merge_step": 2.0}

    # One exercise replaced by a wrong version from the lab's cases: it scores what the check gives it on
    # each half of its cases, the other exercise keeps its two points. Preferred: a version that passes the
    # public half and fails the hidden one, which only the hidden test catches (lab01's
    # _merge_loses_the_table_when_done, with today's cases: 1 point of 2).
    lab_cases = ROOT / "tests" / "course" / "lab_cases" / "lab01.py"
    lab01 = _load(lab_cases, "lab_cases_lab01")
    named = [w for w in lab01.WRONG["check_bpe_merge_step"] if getattr(lab01, getattr(w, "__name__", ""), None) is w]
    halves = {w: [_passes(w, part) for part in ("public", "hidden")] for w in named}
    wrong = next((w for w in named if halves[w] == [True, False]), named[0])
    nb = nbformat.read(solved, as_version=4)
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith("def my_merge_step")]
    cell.source = lab_cases.read_text() + f"\n\nmy_merge_step = {wrong.__name__}\n"
    submission = tmp_path / "wrong" / "01-tokens.ipynb"
    submission.parent.mkdir()
    nbformat.write(nb, submission)
    scores = _grade(zip_path, submission, tmp_path / "wrong-results", env)
    assert scores == {"my_encode_piece": 2.0, "my_merge_step": float(sum(halves[wrong]))}, (wrong.__name__, scores)
    assert scores["my_merge_step"] < 2.0
    shutil.rmtree(tmp_path / "assignments")
