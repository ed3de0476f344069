"""Write every lab as an otter-grader assignment, for instructors (`make assignments`).

Why otter-grader and not nbgrader: otter grades a notebook from a zip and a
plain Python process (`otter run`, no database, no JupyterHub, no Docker), and
its tests are Python functions, so a test can call the course's checks as
they are. nbgrader needs its course database and exchange folder before a
single notebook is graded.

One mapping, applied to every lab (solutions/NN-*.ipynb, the conventions of
scripts/make_labs.py):
- the notebook is the lab as make_labs.make_lab writes it (predictions and
  quiz answers blanked, the Colab cell), with each exercise cell put back as
  the solution's, whose `# BEGIN SOLUTION` / `# END SOLUTION` markers are
  otter's too. Each block gets the lab's stub as otter's prompt
  (`with_lab_prompt`), so the student copy shows what the lab shows
  (`# YOUR CODE HERE` and a `raise NotImplementedError`), not otter's bare `...`;
- each exercise and its check cell become one otter question of 2 points,
  named after the exercise's function, with two tests that run the lab's own
  check call (`labcheck.check_*(...)`): a public test on the first half of the
  check's cases and a hidden test on the rest (labcheck.core.only_cases). The
  student copy holds only the public test; the autograder zip holds both. So a
  function tuned to the cases a student can see loses the hidden point;
- the check cell itself stays, under only_cases("public"), since later cells
  read the name it assigns (`ok_bpe`, used to fall back to the course's answer).
  It prints the lab's ✓ or ✗, so the student copy needs no otter cells
  (no `grader.check`): a student needs only the course installed, not otter.

Hidden cases come from the checks' own case lists, not from the wrong versions
in tests/course/lab_cases/: those are functions a check must refuse, so they
test the check, not the student, and every one of them already fails the
public and hidden tests together.

A lab whose exercise or check cell does not fit (a check cell that is not a
single `name = labcheck.check_*(...)` or bare call) is skipped with the reason
printed. Writes OUT/NN-name/{autograder,student}/ (otter's layout: the student
notebook, and the autograder's notebook and zip) and OUT/NN-name/source/NN-name.ipynb
(otter's input).
"""
from __future__ import annotations

import argparse
import ast
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import make_labs  # noqa: E402  (scripts/ is not a package)

POINTS = 2  # per exercise: 1 for the public half of the check's cases, 1 for the hidden half

CONFIG = """# ASSIGNMENT CONFIG
name: {name}
init_cell: false
check_all_cell: false
export_cell: false
run_tests: false
requirements: requirements.txt
tests:
  ok_format: false
generate:
  pdf: false
"""

TEST = '''""" # BEGIN TEST CONFIG
hidden: {hidden}
""" # END TEST CONFIG
def test_{part}_cases(env):
    import contextlib
    import io
    from tinyinfer_course.labcheck.core import only_cases
    printed = io.StringIO()
    with only_cases("{part}"), contextlib.redirect_stdout(printed):
        ok = eval({call!r}, dict(env))
    assert ok is True, printed.getvalue()
'''

KEPT_CHECK = """from tinyinfer_course.labcheck.core import only_cases

with only_cases("public"):  # the {name} check on its public cases; its hidden ones grade the submission
    {line}
"""


def check_call(source: str) -> tuple[str | None, str]:
    """(the name a check cell assigns or None, the source of its check call);
    ValueError for any other shape."""
    body = ast.parse(source).body
    if len(body) != 1:
        raise ValueError(f"check cell has {len(body)} statements, not one: {source[:80]!r}")
    statement = body[0]
    target = None
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name):
        target, call = statement.targets[0].id, statement.value
    elif isinstance(statement, ast.Expr):
        call = statement.value
    else:
        raise ValueError(f"check cell is neither a call nor `name = call`: {source[:80]!r}")
    if not (isinstance(call, ast.Call) and ast.unparse(call.func).startswith("labcheck.check_")):
        raise ValueError(f"check cell does not call labcheck.check_*: {source[:80]!r}")
    return target, ast.unparse(call)


def question_name(exercise_source: str, n: int) -> str:
    """The exercise's first function or class name (`my_encode_piece`), else qN."""
    for node in ast.parse(exercise_source).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            return node.name
    return f"q{n + 1}"


def with_lab_prompt(source: str) -> str:
    """An exercise cell for otter: before each solution block, the lab's stub as a
    prompt. Otter drops the lines that end in `# BEGIN PROMPT` / `# END PROMPT` and
    the `NO PROMPT` block from the student copy and keeps what lies between; in
    the autograder's copy the prompt is a string literal, which does nothing."""
    lines, out = source.splitlines(), []
    for n, line in enumerate(lines):
        if line.strip() == make_labs.BEGIN:
            indent = line[: len(line) - len(line.lstrip())]
            out += [f'{indent}""" # BEGIN PROMPT', *make_labs.stub_lines(lines[:n], indent),
                    f'{indent}""" # END PROMPT', f"{indent}{make_labs.BEGIN} NO PROMPT"]
        else:
            out.append(line)
    return "\n".join(out)


def raw(source: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_raw_cell(source)


def question_cells(name: str, exercise: nbformat.NotebookNode, check_source: str) -> list:
    """An otter question: the solution's exercise cell, a public and a hidden test,
    then the check cell on public cases (so the name it assigns still exists)."""
    target, call = check_call(check_source)
    solution = nbformat.v4.new_code_cell(with_lab_prompt(exercise.source))
    tests = [nbformat.v4.new_code_cell(TEST.format(hidden=hidden, part=part, call=call))
             for part, hidden in (("public", "false"), ("hidden", "true"))]
    line = f"{target} = {call}" if target else call
    return [raw(f"# BEGIN QUESTION\nname: {name}\npoints: {POINTS}\ncheck_cell: false"),
            raw("# BEGIN SOLUTION"), solution, raw("# END SOLUTION"),
            raw("# BEGIN TESTS"), *tests, raw("# END TESTS"), raw("# END QUESTION"),
            nbformat.v4.new_code_cell(KEPT_CHECK.format(name=name, line=line))]


def master_notebook(path: Path) -> nbformat.NotebookNode:
    """The otter-assign source of one lab (ValueError if the lab does not fit)."""
    solution = nbformat.read(path, as_version=4)
    lab = make_labs.make_lab(solution, path.name)
    solved_pairs, lab_pairs = make_labs.exercise_pairs(solution, path.name), make_labs.exercise_pairs(lab, path.name)
    if len(solved_pairs) != len(lab_pairs) or not lab_pairs:
        raise ValueError(f"{len(solved_pairs)} exercises in the solution, {len(lab_pairs)} in the lab")
    replace, names = {}, []
    for n, ((i, j), (li, lj)) in enumerate(zip(solved_pairs, lab_pairs)):
        if lj != li + 1:
            raise ValueError(f"exercise {n + 1}'s check is not the cell right after it")
        names.append(question_name(solution.cells[i].source, n))
        replace[li] = question_cells(names[-1], solution.cells[i], solution.cells[j].source)
    cells = [raw(CONFIG.format(name=path.stem))]
    checks = {lj for _, lj in lab_pairs}
    for k, cell in enumerate(lab.cells):
        if k in replace:
            cells.extend(replace[k])
        elif k not in checks:
            cells.append(cell)
    master = nbformat.v4.new_notebook(cells=cells, metadata=lab.metadata)
    if len(set(names)) != len(names):
        raise ValueError(f"two exercises share a name: {names}")
    return master


def assign(path: Path, out: Path, run_tests: bool = False) -> Path:
    """Write one lab's assignment into out/<stem>/ with `otter assign`; return that folder."""
    folder = out / path.stem
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    master = folder / "source" / path.name  # otter names its outputs after it
    master.parent.mkdir()
    repo = make_labs.repository()  # the grading image installs the course as Colab does
    (master.parent / "requirements.txt").write_text(f"tinyinfer @ git+{repo['url']}@{repo['branch']}\n")
    nbformat.write(master_notebook(path), master)
    otter = Path(sys.executable).parent / "otter"
    command = [str(otter), "assign", str(master), str(folder), "--no-pdfs"] + ([] if run_tests else ["--no-run-tests"])
    result = subprocess.run(command, capture_output=True, text=True, cwd=folder)
    if result.returncode != 0:
        raise RuntimeError(f"otter assign failed on {path.name}:\n{result.stdout}\n{result.stderr}")
    return folder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "assignments")
    parser.add_argument("--labs", nargs="*", default=None, help="lab numbers (01 03 ...); default: every lab")
    parser.add_argument("--run-tests", action="store_true",
                        help="let otter run the solution against its tests (executes each notebook)")
    args = parser.parse_args(argv)
    paths = sorted((ROOT / "solutions").glob("[0-9][0-9]-*.ipynb"))
    if args.labs:
        paths = [p for p in paths if p.name[:2] in args.labs]
    written = 0
    for path in paths:
        try:
            folder = assign(path, args.out, args.run_tests)
        except ValueError as e:
            print(f"skipped {path.name}: {e}")
            continue
        print(f"{path.stem}: {folder}")
        written += 1
    print(f"{written} of {len(paths)} labs written to {args.out}")
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
