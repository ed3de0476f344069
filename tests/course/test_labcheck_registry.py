"""labcheck's structure: one registry of labs (labcheck/registry.py) from which
the package's names, my_engine.PIECES and the tests' fallbacks all come, so a
new lab is its own labcheck module, its tests/course/lab_cases/ file and its notebook;
and the forbidden-call watch (labcheck/watch.py), which the harness can pause
for its own code."""
import ast
import importlib
import inspect
import re
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tinyinfer_course import labcheck
from tinyinfer_course.labcheck import Case, my_engine, registry, run_check, watch

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "tinyinfer_course" / "labcheck"


def _code_names(path: Path) -> set[str]:
    """Identifiers and string constants a file's code uses (not its docstrings or comments)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            names.update(re.findall(r"\w+", node.value))
    return names


# ------------------------------------------------------------------ the registry


@pytest.mark.parametrize("path", [PACKAGE / "__init__.py", PACKAGE / "my_engine.py",
                                  ROOT / "tests" / "course" / "test_labcheck_expected.py"], ids=lambda p: p.name)
def test_no_hand_kept_list_of_labs_remains(path):
    """The re-exports, PIECES and the fallbacks are read from the labs'
    declarations: these files name no check, reference or piece of any lab."""
    lab_names = {n for n in registry.exports() if re.match(r"(check_|reference_|Reference)", n)}
    lab_names |= set(registry.pieces())
    assert not _code_names(path) & lab_names, sorted(_code_names(path) & lab_names)


def test_a_new_lab_module_is_found_by_itself(tmp_path, monkeypatch):
    """A module that declares LAB is all it takes: its exports, pieces and
    fallbacks appear without any other file changing."""
    package = tmp_path / "morelabs"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "helpers.py").write_text("def shared():\n    return 1\n")  # no LAB: not a lab
    (package / "lab12.py").write_text(textwrap.dedent("""
        from tinyinfer_course.labcheck.registry import Lab

        def check_twice(fn):
            return fn(2) == 4

        def reference_twice(x):
            return 2 * x

        LAB = Lab(12, "a new lab", exports=("check_twice", "reference_twice"),
                  pieces={"twice": "reference_twice"}, fallbacks={"check_twice": reference_twice})
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    found = registry.collect(importlib.import_module("morelabs"))
    assert [lab.number for _, lab in found] == [12]
    assert set(registry.exports(found)) == {"check_twice", "reference_twice"}
    assert registry.pieces(found) == {"twice": ("lab 12", "reference_twice")}
    ((check, answer),) = registry.fallbacks(found)
    assert check == "check_twice" and answer(2) == 4
    for name in [n for n in sys.modules if n.startswith("morelabs")]:
        monkeypatch.delitem(sys.modules, name)


def test_two_labs_may_not_export_the_same_name(tmp_path):
    one = type(sys)("one")
    one.f, one.LAB = (lambda: 1), registry.Lab(1, "one", exports=("f",))
    two = type(sys)("two")
    two.f, two.LAB = (lambda: 2), registry.Lab(2, "two", exports=("f",))
    with pytest.raises(ValueError, match="exports 'f'"):
        registry.exports([(one, one.LAB), (two, two.LAB)])


def test_the_package_offers_exactly_what_the_labs_export():
    for name, obj in registry.exports().items():
        assert getattr(labcheck, name) is obj, name
    assert my_engine.PIECES == registry.pieces()


def test_every_check_and_reference_a_lab_module_defines_is_exported():
    exported = set(registry.exports())
    for module, lab in registry.labs():
        for name, obj in vars(module).items():
            defined_here = getattr(obj, "__module__", None) == module.__name__
            if defined_here and re.match(r"(check_|reference_|Reference)", name):
                assert name in exported, f"{module.__name__}.{name} is not in lab {lab.number}'s exports"


def test_every_reference_is_the_fallback_of_a_check():
    """So test_labcheck_expected runs every reference through its check."""
    fallbacks = [answer for _, answer in registry.fallbacks()]
    for name, obj in registry.exports().items():
        if re.match(r"(reference_|Reference)", name):
            assert any(obj is answer for answer in fallbacks), f"{name} is no check's fallback"
    for check, _ in registry.fallbacks():
        assert check in registry.exports(), check


def test_every_piece_is_kept_by_a_check_of_its_own_lab():
    for piece, (lab, reference) in registry.pieces().items():
        modules = [m for m, declared in registry.labs() if f"lab {declared.number}" == lab]
        assert any(f'keep=("{piece}",' in inspect.getsource(m) for m in modules), f"no check of {lab} keeps {piece}"
        if reference is not None:
            assert reference in registry.exports(), reference


def _imports(path: Path):
    """(node, inside a function?) for every import statement of a file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []

    def walk(node, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, in_function))
            walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    walk(tree, False)
    return found


def test_no_labcheck_module_imports_another_modules_private_name():
    """Shared fixtures live in fixtures.py under public names. (The package's
    __init__ re-exports core's _report, run_check's old name, for old notebooks.)"""
    for path in sorted(PACKAGE.glob("*.py")):
        if path.name == "__init__.py":
            continue
        for node, _ in _imports(path):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.name} imports {private} from .{node.module}"


def test_imports_are_at_the_top_of_labcheck_modules():
    """Imports inside functions are kept for what would be slow or circular at
    import time (the real model's engine, an optional package)."""
    inside = [(path.name, node.lineno) for path in sorted(PACKAGE.glob("*.py"))
              for node, in_function in _imports(path) if in_function]
    assert len(inside) < 30, inside


# ------------------------------------------------------------------ the watch


def _answer(x):
    return x * 2


def _mine(x):
    return x + x


def _cases():
    return [Case((torch.ones(2),), torch.full((2,), 2.0), "x=ones(2)")]


def test_a_paused_watch_sees_nothing_and_resumes_after(capsys):
    def harness_then_learner(x):
        with watch.paused():  # the check's own code may use the answer
            _answer(x)
        return _mine(x)

    assert run_check("double", harness_then_learner, _cases, same=torch.equal, forbidden=(_answer,)) is True

    def learner_after_pause(x):
        with watch.paused():
            pass
        return _answer(x)  # the watch is back on

    assert run_check("double", learner_after_pause, _cases, same=torch.equal, forbidden=(_answer,)) is False
    assert "your code calls" in capsys.readouterr().out
    assert sys.getprofile() is None


def test_given_code_runs_paused_but_the_learners_code_around_it_is_watched(capsys):
    given = watch.pausing(_answer)  # what a check hands the learner

    assert run_check("double", lambda x: given(x), _cases, same=torch.equal, forbidden=(_answer,)) is True
    assert run_check("double", lambda x: _answer(given(x) / 2), _cases, same=torch.equal,
                     forbidden=(_answer,)) is False
    assert "your code calls" in capsys.readouterr().out


def test_paused_leaves_a_foreign_profiler_alone():
    def other(frame, event, arg):
        pass

    sys.setprofile(other)
    try:
        with watch.paused():
            assert sys.getprofile() is other  # not a Watch: nothing to pause
    finally:
        sys.setprofile(None)


def test_answers_allowed_switches_the_refusal_off_for_its_block_only(capsys):
    with watch.answers_allowed():
        assert run_check("double", _answer, _cases, same=torch.equal, forbidden=(_answer,)) is True
    with pytest.raises(RuntimeError), watch.answers_allowed():
        raise RuntimeError("the switch must still be reset")
    assert run_check("double", _answer, _cases, same=torch.equal, forbidden=(_answer,)) is False
    assert "the course's own answer" in capsys.readouterr().out


def test_forbidding_a_method_leaves_the_classes_helpers_allowed(capsys):
    """Lab 11 forbids LlamaForCausalLM.forward, not the class: a learner's
    forward pass may still call model.compute_logits."""
    from tinyinfer_course.labcheck.capstone import FORBIDDEN
    from tinyinfer_course.labcheck.fixtures import tiny_model
    from tinyinfer.model import LlamaForCausalLM

    model = tiny_model()
    hidden = torch.randn(2, model.config.hidden_size)
    cases = lambda: [Case((hidden,), model.lm_head(hidden).float(), "hidden [2, C]")]  # noqa: E731
    assert run_check("logits", model.compute_logits, cases, same=torch.allclose, forbidden=FORBIDDEN) is True
    assert run_check("logits", model.compute_logits, cases, same=torch.allclose,
                     forbidden=(LlamaForCausalLM,)) is False  # the whole class: its helpers too
    assert "LlamaForCausalLM.compute_logits" in capsys.readouterr().out
