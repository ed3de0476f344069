"""The two packages of one distribution: tinyinfer, the engine (what LLM,
`tinyinfer serve` and `tinyinfer bench` run), and tinyinfer_course, the course's
code. The course imports the engine; the engine never imports the course, by
any import statement (lazy ones in functions too) or by a module name in a
string (the command line finds the course's commands through an entry point).
And no module outside a package's __init__.py re-exports another's names for
old import paths' sake: a notebook imports a name from where it lives."""
import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def modules(package: str):
    for path in sorted((SRC / package).rglob("*.py")):
        if "__pycache__" not in path.parts:
            yield path, ast.parse(path.read_text(encoding="utf-8"))


def imported(tree: ast.AST) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "tinyinfer_course" in node.value:
            found.add(node.value)
    return found


def test_the_engine_never_imports_the_course():
    crossings = {f"{path.relative_to(SRC)}: {name}" for path, tree in modules("tinyinfer")
                 for name in imported(tree) if name.split(".")[0] == "tinyinfer_course"}
    assert not crossings, sorted(crossings)


def test_the_engine_ships_no_course_data_or_reports():
    files = [p.relative_to(SRC).as_posix() for p in (SRC / "tinyinfer").rglob("*") if p.is_file()
             and "__pycache__" not in p.parts]
    assert not [f for f in files if not f.endswith(".py")], files
    assert not (SRC / "tinyinfer" / "labcheck").exists() and not (SRC / "tinyinfer" / "fingerprint.py").exists()


def lab_exports(tree: ast.AST) -> set[str]:
    """The names a lab check module declares for labcheck to export (LAB = Lab(..., exports=(...)))."""
    return {node.value for assign in tree.body if isinstance(assign, ast.Assign)
            and any(getattr(t, "id", None) == "LAB" for t in assign.targets)
            for kw in getattr(assign.value, "keywords", []) if kw.arg == "exports"
            for node in ast.walk(kw.value) if isinstance(node, ast.Constant)}


def test_no_module_re_exports_names_it_does_not_use():
    """A module-level `from x import y  # noqa: F401` outside __init__.py keeps an
    old import path alive (an alias): importers must name the module that defines y.
    (A lab's declared exports are labcheck's one public list, not aliases.)"""
    found = []
    for package in ("tinyinfer", "tinyinfer_course"):
        for path, tree in modules(package):
            if path.name == "__init__.py":
                continue
            lines = path.read_text(encoding="utf-8").splitlines()
            declared = lab_exports(tree)
            for node in tree.body:
                if isinstance(node, (ast.Import, ast.ImportFrom)) and "F401" in lines[node.lineno - 1] \
                        and not {a.asname or a.name for a in node.names} & declared:
                    found.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert not found, found
