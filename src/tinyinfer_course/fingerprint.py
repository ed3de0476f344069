"""Which modules produced a stored result, and a hash of their code.

The course stores results: each solution notebook's outputs, and the `make peers`
reports that chapters 6 and 8 render. A result is stamped with the fingerprint of
the modules that produced it, and a test compares the stamp with today's code.

    modules = notebook_modules(cells)   # what a notebook's code cells import, transitively
    modules = serve_modules()           # what `tinyinfer serve` runs
    fingerprint(modules)                # 16 hex digits; module_hashes(modules) per module

Modules of both packages count, the engine's (tinyinfer) and the course's
(tinyinfer_course), found under one folder, src/. Two choices keep a stamp from
going stale for nothing:
- only the modules a result imports count: a static reading of the imports,
  relative and inside functions too, followed module by module (imports_in);
- a module is hashed as its code without docstrings and comments (code_text),
  so rewording an explanation changes no stamp.
Standard library only, so scripts/make_labs.py can load this file without torch.
"""
from __future__ import annotations

import ast
import hashlib
import re
import subprocess
from pathlib import Path

PACKAGES = ("tinyinfer", "tinyinfer_course")
ROOT = Path(__file__).resolve().parents[1]  # src/, which holds both packages
DATA = ("tinyinfer_course/data",)  # files the code reads (eval_text.txt); they count like code
CLI = ("tinyinfer.__main__",)  # what `tinyinfer ...` and `python -m tinyinfer ...` run first
# The commands the course adds to `tinyinfer` (`tinyinfer fleet`): a command's module is
# imported by name from an entry point, which a reading of the imports cannot see.
COURSE_COMMANDS = "tinyinfer_course/commands.py"
# A notebook runs the command line when a shell line (`!tinyinfer serve ...`) or a
# command string ("tinyinfer serve ...") names it, or an argument list holds
# "-m", "tinyinfer" (subprocess.Popen([sys.executable, "-m", "tinyinfer", "serve", ...])).
COMMAND = re.compile(r"(?:^|[\s;&|(]|/)(?:\S*python\S*\s+-m\s+)?tinyinfer\s+([a-z]+)")
COMMAND_STRING = re.compile(r"^\s*(?:\S*python\S*\s+-m\s+)?(?:\S*/)?tinyinfer\s+([a-z]+)")
# Not counted, and not followed, by package: what does not make a result, but
# reads or shows it. The checks: what a check prints (its ✓ or ✗, its case
# counts) is compared output by output by strict nbval (tests/book/test_notebooks.py),
# so a check that changes a stored output already fails a test; and `from
# tinyinfer_course import labcheck` imports every lab's checks, which import most
# of the engine. The stored reports' renderers and the schematics draw what is
# stored (strict nbval compares their text too); this file stamps.
NOT_COUNTED = ("tinyinfer_course.labcheck", "tinyinfer_course.reports", "tinyinfer_course.schematics",
               "tinyinfer_course.fingerprint")


def package_modules(root: Path = ROOT) -> dict[str, Path]:
    """{module name: file} for every module of both packages: 'tinyinfer.server.api'
    -> tinyinfer/server/api.py, and a package by its __init__.py ('tinyinfer.server')."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if "__pycache__" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def code_tree(source: str) -> ast.Module:
    """The syntax tree without docstrings (comments are never in it)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def code_text(path: Path) -> str:
    """A module's code as one canonical text: ast.unparse of code_tree, so a comment,
    a blank line or a docstring changes nothing. A file that does not parse counts
    by its text (a notebook importing it would fail anyway)."""
    source = path.read_text(encoding="utf-8")
    try:
        return ast.unparse(code_tree(source))
    except SyntaxError:
        return source


def _parents(name: str) -> list[str]:
    """'tinyinfer.server.api' -> ['tinyinfer', 'tinyinfer.server', 'tinyinfer.server.api']:
    importing a module runs each package's __init__ above it first."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def imports_in(tree: ast.AST, name: str, is_package: bool, modules: dict[str, Path]) -> set[str]:
    """The package's modules that this code imports, wherever the import statement is
    (a function's lazy import counts: it runs when the function does). Also counted:
    a string that names a module (importlib.import_module("tinyinfer.server"), cli's
    table of commands), and, for a module that lists its package with pkgutil, every
    module of that package (labcheck's registry imports them all)."""
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x, from ..config import y
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in modules:
            found.add(node.value)
        elif isinstance(node, ast.Attribute) and node.attr in ("iter_modules", "walk_packages") \
                and isinstance(node.value, ast.Name) and node.value.id == "pkgutil":
            found.update(m for m in modules if m.rpartition(".")[0] == package)
    return {parent for module in found if module in modules and not _not_counted(module)
            for parent in _parents(module)}


def _not_counted(name: str) -> bool:
    return any(name == skip or name.startswith(skip + ".") for skip in NOT_COUNTED)


def closure(roots, root: Path = ROOT) -> list[str]:
    """The modules that importing `roots` runs, following each module's imports
    (not counted ones neither counted nor followed)."""
    modules = package_modules(root)
    todo = [parent for name in roots if name in modules and not _not_counted(name) for parent in _parents(name)]
    seen = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = modules[name]
        try:
            tree = code_tree(path.read_text(encoding="utf-8"))
        except SyntaxError:
            continue
        todo.extend(imports_in(tree, name, path.name == "__init__.py", modules) - seen)
    return sorted(seen)


def _python_lines(source: str) -> tuple[str, list[str]]:
    """A code cell as Python (IPython's `!` and `%` lines blanked), and its shell lines."""
    if source.lstrip().startswith(("%%bash", "%%sh", "%%script")):
        return "", source.splitlines()[1:]
    python, shell = [], []
    for line in source.splitlines():
        if line.lstrip().startswith(("!", "%")):
            shell.append(line.lstrip().lstrip("!%"))
            python.append("")
        else:
            python.append(line)
    return "\n".join(python), shell


def commands_run(tree: ast.AST | None, shell: list[str]) -> set[str]:
    """The `tinyinfer` subcommands a cell runs (serve, bench, fleet, ...) in a shell or a subprocess."""
    found = {m.group(1) for line in shell for m in [COMMAND.search(line)] if m}
    for node in ast.walk(tree) if tree is not None else ():
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if m := COMMAND_STRING.match(node.value):
                found.add(m.group(1))
        if isinstance(node, (ast.List, ast.Tuple)):
            words = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            for i, word in enumerate(words):
                if (word == "tinyinfer" and (i == 0 or words[i - 1] == "-m")) and i + 1 < len(words):
                    found.add(words[i + 1] if isinstance(words[i + 1], str) else "")
    return found


def course_commands(root: Path = ROOT) -> dict[str, str]:
    """{command: module} of the commands the course adds (COURSE_COMMANDS: NAME = (module, help))."""
    path = root / COURSE_COMMANDS
    if not path.exists():
        return {}
    found = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple) and node.value.elts:
            module = node.value.elts[0]
            if isinstance(module, ast.Constant):
                found.update({t.id.lower(): module.value for t in node.targets if isinstance(t, ast.Name)})
    return found


def notebook_roots(sources, root: Path = ROOT) -> set[str]:
    """What a notebook's code cells (their source texts) import from the packages, plus
    the command line's entry point, and a course command's module, if a cell runs
    `tinyinfer ...` (lab 8 serves)."""
    modules = package_modules(root)
    commands = course_commands(root)
    roots = set()
    for source in sources:
        python, shell = _python_lines(source)
        try:
            tree = ast.parse(python)
        except SyntaxError:
            tree = None
        if tree is not None:
            roots |= imports_in(tree, "__main__", False, modules)
        run = commands_run(tree, shell)
        if run:
            roots.update(CLI)
            roots.update(commands[name] for name in run if name in commands)
    return roots


def notebook_modules(sources, root: Path = ROOT) -> list[str]:
    """The modules a notebook runs: notebook_roots, followed through their imports."""
    return closure(notebook_roots(sources, root), root)


def serve_modules(root: Path = ROOT) -> list[str]:
    """The modules `tinyinfer serve` runs (the command line, its server, and what they import)."""
    return closure([*CLI, "tinyinfer.server"], root)


def data_files(modules, root: Path = ROOT) -> list[str]:
    """The data files that the modules name ('tinyinfer_course/data/eval_text.txt' in eval.py)."""
    files = sorted(p for folder in DATA for p in (root / folder).glob("*") if p.is_file())
    if not files:
        return []
    paths = package_modules(root)
    named = set()
    for name in modules:
        text = code_text(paths[name])
        named.update(f.relative_to(root).as_posix() for f in files if f.name in text)
    return sorted(named)


def module_hashes(modules, root: Path = ROOT) -> dict[str, str]:
    """{module or data file: the first 8 hex digits of its code's sha256}, for a stamp
    that can say which module changed."""
    paths = package_modules(root)
    hashes = {name: hashlib.sha256(code_text(paths[name]).encode()).hexdigest()[:8] for name in modules}
    for rel in data_files(modules, root):
        hashes[rel] = hashlib.sha256((root / rel).read_bytes()).hexdigest()[:8]
    return dict(sorted(hashes.items()))


def fingerprint_of(hashes: dict[str, str]) -> str:
    """16 hex digits over the names and hashes of module_hashes."""
    text = "\n".join(f"{name} {digest}" for name, digest in sorted(hashes.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def fingerprint(modules, root: Path = ROOT) -> str:
    """The fingerprint of these modules' code (and the data files they name)."""
    return fingerprint_of(module_hashes(modules, root))


def _git(root: Path, *args: str) -> str | None:
    """A git command's output, run in `root`, or None (no git, not a checkout)."""
    try:
        proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def uncommitted(root: Path = ROOT, exclude: tuple[str, ...] = ()) -> list[str]:
    """`git status` lines for uncommitted changes under `root`, less its `exclude` folders."""
    status = _git(root, "status", "--porcelain", "--", ".", *[f":(exclude){name}" for name in exclude])
    return [line for line in (status or "").splitlines() if line.strip()]


def stamp(hashes: dict[str, str], root: Path = ROOT, exclude: tuple[str, ...] = ()) -> dict:
    """What a stored result keeps about the code that made it: the fingerprint of
    `hashes` (module_hashes), the commit ('+uncommitted' when `root`, less
    `exclude`, has changes; 'unknown' outside git), and the hashes themselves, so
    that a stale stamp can say which module changed."""
    commit = _git(root, "rev-parse", "--short=12", "HEAD")
    if commit and uncommitted(root, exclude):
        commit += "+uncommitted"
    return {"engine_fingerprint": fingerprint_of(hashes), "engine_commit": commit or "unknown",
            "engine_modules": hashes}


def short_name(module: str) -> str:
    """A module's name as a sentence shows it: 'tinyinfer.model' -> 'model',
    'tinyinfer_course.fleet.live_fleet' -> 'fleet.live_fleet'."""
    return module.removeprefix("tinyinfer_course.").removeprefix("tinyinfer.")


def changed(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """What differs between two module_hashes: 'tinyinfer.model (code changed)', ..."""
    out = []
    for name in sorted(set(old) | set(new)):
        if name not in new:
            out.append(f"{name} (no longer imported)")
        elif name not in old:
            out.append(f"{name} (newly imported)")
        elif old[name] != new[name]:
            out.append(f"{name} (code changed)")
    return out


def stamp_note(stamp: dict, when: str, today: dict, program: str, rows: str, remeasure: str) -> str:
    """One sentence on the code behind a stored measurement: the same as today's,
    older (naming what changed), or unknown. `stamp` is the stored stamp() result,
    `today` today's, for the same set of modules; `program` names what runs that
    code ("`tinyinfer serve`"), `rows` the measurements it concerns ("the tinyinfer
    rows") and `remeasure` how to measure today's ("`make peers` measures today's").
    Shared by every stored report a page renders (reports/peers.py, reports/gpu.py)."""
    theirs = stamp.get("engine_fingerprint", "unknown")
    if theirs == "unknown":
        return (f"These rows were measured on {when} by a tinyinfer that left no engine fingerprint "
                f"(commit {stamp.get('engine_commit', 'unknown')}), so whether today's {program} "
                f"gives the same numbers is not known: {remeasure}.")
    named = f"tinyinfer at commit {stamp.get('engine_commit', 'unknown')} (engine fingerprint {theirs})"
    if theirs == today["engine_fingerprint"]:
        return f"These rows were measured on {when} by {named}, the same code that {program} runs today."
    moved = [short_name(line.split(" (")[0])
             for line in changed(stamp.get("engine_modules") or {}, today["engine_modules"])]
    listed = ", ".join(moved[:4]) + (f" and {len(moved) - 4} more" if len(moved) > 4 else "")
    return (f"These rows were measured on {when} by {named}. The code that {program} runs has changed "
            f"since then ({len(moved)} of its modules: {listed}; today's fingerprint is "
            f"{today['engine_fingerprint']}), so {rows} show an older engine, not today's: {remeasure}.")
