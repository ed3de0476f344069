"""Inputs the lab checks once never showed (issue 56, the review's kind 4 and 5): each
wrong version of that kind fails its check in tests/course/test_labs.py; here, the ✗
line says what the evidence shows, without guessing more."""
import importlib.util
from pathlib import Path

import pytest

from tinyinfer_course import labcheck

CASES = Path(__file__).resolve().parent / "lab_cases"


def _cases(name: str):
    spec = importlib.util.spec_from_file_location(f"lab_cases_{name}_inputs", CASES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("lab, check, wrong, said", [
    ("lab02", "check_rope", "_rope_in_place", "the input x differs after the call"),
    ("lab02", "check_rope", "_rope_float64", "the dtype differs: x is torch.float32, the result torch.float64"),
    ("lab02", "check_tiled_attention", "_tiled_whole_mask", "a mask the size of the whole score matrix"),
    ("lab03", "check_sample", "_sample_divides_in_place", "the input tensor was changed in place"),
    ("lab10", "check_token_trie", "_AList", "return a set of token ids"),
])
def test_the_failure_says_what_the_input_showed(lab, check, wrong, said, capsys):
    assert getattr(labcheck, check)(getattr(_cases(lab), wrong)) is False
    out = capsys.readouterr().out
    assert said in out, out


def test_an_exception_a_tool_raises_is_named_with_its_tool(capsys):
    lab10 = _cases("lab10")
    assert labcheck.check_run_agent(lambda g, t, m, n: lab10._loop(g, t, m, n, catch=TypeError)) is False
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert "the tool 'convert' raised ValueError and it left your loop" in last, last
    assert "error: ValueError: no rate for 'XYZ'" in last, last
