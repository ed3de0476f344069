"""The machinery behind "your own engine": checks refuse the course's own
answers (labcheck.watch), and a passing exercise cell is kept for later
labs and loaded back (labcheck.my_engine)."""
import linecache
import sys

import pytest
import torch

from tinyinfer_course import labcheck
from tinyinfer_course.labcheck import my_engine
from tinyinfer_course.labcheck.core import Case, run_check


def _report(name, fn, make_cases, same=None, forbidden=(), keep=None):
    """run_check, keeping under the piece name `keep` either `fn` itself or, when keep
    is a (name, object) pair, that object (as a check that wraps the learner's code does)."""
    kw = {} if same is None else {"same": same}
    if isinstance(keep, str):
        keep = (keep, fn)
    return run_check(name, fn, make_cases, forbidden=forbidden, keep=keep, **kw)


def _cell(source: str, filename: str) -> dict:
    """Run `source` the way IPython runs a cell: its text is in linecache under
    the code's file name, which is how keep() finds the whole cell."""
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {}
    exec(compile(source, filename, "exec"), namespace)
    return namespace


def _double_cases():
    return [Case((torch.tensor([1.0, 2.0]),), torch.tensor([2.0, 4.0]), "x=[1, 2]")]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYINFER_MY_ENGINE", str(tmp_path / "mine"))
    return tmp_path / "mine"


def test_a_passing_cell_is_kept_and_loaded_back(folder, capsys):
    ns = _cell("import torch\n\n\ndef my_rope(x):\n    return x * 2\n", "/tmp/ipykernel_1/cell_a.py")
    assert _report("double", ns["my_rope"], _double_cases, same=torch.equal, keep="rope") is True
    out = capsys.readouterr().out
    assert out.startswith("✓ double") and "kept as rope.py" in out
    text = (folder / "rope.py").read_text()
    assert "def my_rope(x):" in text and "__piece__ = my_rope" in text
    loaded = my_engine.load("rope")
    assert "rope: yours (kept by lab 2)" in capsys.readouterr().out
    assert torch.equal(loaded(torch.ones(2)), torch.full((2,), 2.0))
    assert my_engine.status()["rope"] == "yours"


def test_a_failing_cell_is_not_kept(folder, capsys):
    ns = _cell("def my_rope(x):\n    return x * 3\n", "/tmp/ipykernel_1/cell_b.py")
    assert _report("double", ns["my_rope"], _double_cases, same=torch.equal, keep="rope") is False
    assert not (folder / "rope.py").exists()


def test_load_falls_back_to_the_reference_and_says_why(folder, capsys):
    assert my_engine.load("sample") is labcheck.reference_sample
    assert "the course's reference (pass lab 3's check" in capsys.readouterr().out
    folder.mkdir(parents=True)
    (folder / "sample.py").write_text("raise SyntaxError('half-finished')\n")
    assert my_engine.load("sample") is labcheck.reference_sample
    assert "failed to load: SyntaxError" in capsys.readouterr().out


def test_code_not_typed_into_a_cell_is_not_kept(folder):
    """Only a notebook cell is kept: not a function from a file on disk (this
    test file), nor one exec'd from a string that linecache never saw."""
    assert my_engine.keep("rope", lambda x: x) is False
    namespace = {}
    exec(compile("def f(x):\n    return x\n", "<exercise>", "exec"), namespace)
    assert my_engine.keep("rope", namespace["f"]) is False
    assert not (folder / "rope.py").exists()


def test_every_piece_names_a_reference_that_exists():
    for piece, (lab, reference) in my_engine.PIECES.items():
        assert lab.startswith("lab "), piece
        if reference is not None:
            assert hasattr(labcheck, reference), f"{piece}: labcheck has no {reference}"


def test_colab_with_drive_keeps_pieces_on_drive(monkeypatch, tmp_path):
    monkeypatch.delenv("TINYINFER_MY_ENGINE", raising=False)
    monkeypatch.setattr(my_engine, "COLAB_DRIVE", tmp_path)
    monkeypatch.setitem(sys.modules, "google.colab", type(sys)("google.colab"))
    assert my_engine.folder() == tmp_path / "tinyinfer-my-engine"
    monkeypatch.delitem(sys.modules, "google.colab")
    assert my_engine.folder() == my_engine.Path.home() / "tinyinfer-my-engine"


# ------------------------------------------------------------ the course's own answers


def _sdpa_cases():
    q = torch.randn(1, 2, 3, 4)
    return [Case((q, q, q), torch.nn.functional.scaled_dot_product_attention(q, q, q), "q=k=v")]


def test_a_top_level_import_of_the_fused_kernel_is_caught(capsys):
    ns = _cell("from torch.nn.functional import scaled_dot_product_attention as fast\n\n\n"
               "def attention(q, k, v):\n    return fast(q, k, v)\n", "/tmp/ipykernel_1/cell_c.py")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    assert _report("attn", ns["attention"], _sdpa_cases, same=torch.allclose, forbidden=(sdpa,)) is False
    out = capsys.readouterr().out
    assert "your code calls torch.nn.functional.scaled_dot_product_attention" in out


def test_a_wrapped_reference_and_a_subclass_are_caught(capsys):
    def wrapper(*args):
        return labcheck.reference_rope(*args)

    x = torch.randn(1, 1, 2, 4)
    cases = lambda: [Case((x, torch.arange(2), 10000.0), labcheck.reference_rope(x, torch.arange(2), 10000.0), "x")]  # noqa: E731
    assert _report("rope", wrapper, cases, same=torch.allclose, forbidden=(labcheck.reference_rope,)) is False
    assert "labcheck.reference_rope" in capsys.readouterr().out

    class Mine(labcheck.ReferenceBlockAllocator):
        pass

    make = lambda: Mine(4, 2).allocate("a", 3)  # noqa: E731
    assert _report("alloc", make, lambda: [Case((), None, "allocate")],
                   forbidden=(labcheck.ReferenceBlockAllocator,)) is False
    assert "labcheck.ReferenceBlockAllocator.__init__" in capsys.readouterr().out


def test_forbidding_a_module_class_does_not_forbid_torch(capsys):
    """Forbidding an nn.Module subclass bans its own methods, not nn.Module's,
    which every model call goes through."""
    from tinyinfer.model import RMSNorm

    layer = torch.nn.Linear(2, 2)
    cases = lambda: [Case((torch.ones(1, 2),), layer(torch.ones(1, 2)), "x")]  # noqa: E731
    assert _report("linear", layer, cases, same=torch.allclose, forbidden=(RMSNorm,)) is True
    assert sys.getprofile() is None  # the watch leaves no profiler behind


def test_a_decorated_answer_is_watched_by_its_own_code(capsys):
    """torch.inference_mode() wraps every function in the same wrapper code: the
    watch must look through it, or it would refuse every decorated function."""
    @torch.inference_mode()
    def answer(x):
        return x * 2

    @torch.inference_mode()
    def mine(x):
        return x + x

    assert _report("double", mine, _double_cases, same=torch.equal, forbidden=(answer,)) is True
    assert _report("double", lambda x: answer(x), _double_cases, same=torch.equal, forbidden=(answer,)) is False
    capsys.readouterr()


def test_a_check_may_keep_the_object_behind_its_wrapper(folder, capsys):
    ns = _cell("def my_rope(x):\n    return x * 2\n", "/tmp/ipykernel_1/cell_d.py")
    wrapper = lambda x: ns["my_rope"](x)  # noqa: E731  (what a check builds around the learner's code)
    assert _report("double", wrapper, _double_cases, same=torch.equal, keep=("rope", ns["my_rope"])) is True
    assert "__piece__ = my_rope" in (folder / "rope.py").read_text()
