"""What lab 11's engine check says when it fails: the first thing that differs,
and the cause only where the evidence shows it (issue 56)."""
import importlib.util
from pathlib import Path

import pytest
import torch

from tinyinfer_course import labcheck

_spec = importlib.util.spec_from_file_location("lab11_cases", Path(__file__).parent / "lab_cases" / "lab11.py")
lab11 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lab11)


@pytest.mark.parametrize("flags, said", [
    ({"rope_dtype": torch.float64}, ["the dtype differs: _rope() returned a torch.float64 tensor", "float32"]),
    ({"swap_budget": True}, ["the step count differs", "with the token budget and max_num_seqs swapped"]),
    ({"returns": False}, ["what serve returned differs: None", "return what run_engine returns"]),
    ({"sampler": "argmax"}, ["first differs at output token", "these are the greedy tokens of every request"]),
    ({"eos": "first"}, ["first differs at output token", "eos_token_ids=["]),
    ({"use_paged": False}, ["the paged attention differs: serve never called the one passed as paged="]),
])
def test_the_engine_check_names_what_differs(flags, said, capsys):
    assert labcheck.check_your_engine(lab11.make_serve(**flags)) is False
    out = capsys.readouterr().out
    for text in said:
        assert text in out, out


def test_a_sampled_request_may_follow_your_kept_sampler(tmp_path, monkeypatch, capsys):
    """A kept lab 3 sampler that draws another correct way (torch.multinomial) gives
    other tokens than LLM.generate; an engine that uses it is still accepted, and
    one that draws the engine's way too."""
    monkeypatch.setenv("TINYINFER_MY_ENGINE", str(tmp_path))
    source = (
        "import torch\n\n\ndef multinomial_sample(logits, temperature, generator):\n"
        "    if temperature == 0:\n        return int(logits.argmax())\n"
        "    probs = torch.softmax(logits / temperature, -1)\n"
        "    return int(torch.multinomial(probs, 1, generator=generator))\n\n\n"
        "__piece__ = multinomial_sample\n")
    (tmp_path / "sample.py").write_text(source)
    kept = labcheck.my_engine.load("sample", quiet=True)
    (tmp_path / "sample.py").unlink()  # not kept: only LLM.generate's tokens count
    assert labcheck.check_your_engine(lab11.make_serve(sampler=kept)) is False
    assert "first differs at output token" in capsys.readouterr().out
    (tmp_path / "sample.py").write_text(source)  # kept again
    assert labcheck.check_your_engine(lab11.make_serve(sampler=kept)) is True, capsys.readouterr().out
    assert labcheck.check_your_engine(lab11.make_serve()) is True, capsys.readouterr().out
