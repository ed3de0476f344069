"""Where the lab checks get their expected values, checked against independent
sources: literal counts against tiktoken, the hand-worked quantization cases
against tinyinfer.quant, and the answers the labs fall back to (each lab's
declared fallbacks, which the checks refuse) against the checks themselves,
with the refusal switched off."""
import pytest
import torch

from tinyinfer import labcheck, quant
from tinyinfer.labcheck import quantization, registry, tokens, watch


def test_literal_token_counts_are_tiktokens():
    enc = labcheck._cl100k()
    table = dict(tokens.COUNTS)
    table.update({text: counts for text, counts in tokens.COMPARE_TEXTS.values()})
    for text, (cl100k, chars, words) in table.items():
        assert (cl100k, chars, words) == (len(enc.encode(text, disallowed_special=())), len(text), len(text.split()))


def test_hand_worked_quantization_cases_agree_with_the_engine():
    by_hand_int8 = quantization._int8_cases()[:2]
    for case in by_hand_int8:
        assert quantization._int8_close(quant.quantize_int8(*case.args), case.expected), case.show
    (case,) = quantization._pack_cases()[:1]
    assert torch.equal(quant.pack_int4(*case.args), case.expected)
    (case,) = quantization._int4_cases()[:1]
    assert quantization._int4_close(quantization._engine_int4(*case.args), case.expected)


def test_constant_groups_get_code_zero_in_the_engine():
    w = torch.tensor([[0.5] * 4 + [-0.25] * 4])
    packed, scales, zeros = quant.quantize_int4(w, 4)
    assert torch.equal(quant.unpack_int4(packed), torch.zeros(1, 8, dtype=torch.uint8))
    assert zeros.float().tolist() == [[0.5, -0.25]] and bool((scales.float() <= 1e-7).all())
    q, scale = quant.quantize_int8(torch.zeros(2, 4))
    assert torch.equal(q, torch.zeros(2, 4, dtype=torch.int8)) and bool((scale <= 1e-7).all())


# (a check, the course's own answer that its lab falls back to), from every lab's LAB.
FALLBACKS = registry.fallbacks()


@pytest.mark.parametrize("check, answer", FALLBACKS, ids=[c for c, _ in FALLBACKS])
def test_the_labs_fallbacks_pass_their_checks_when_allowed(check, answer, tmp_path, monkeypatch, capsys):
    # A lab uses these when the learner's own function has not passed yet, so
    # they must be right; the check refuses them, so the refusal is switched off here.
    monkeypatch.setenv("TINYINFER_MY_ENGINE", str(tmp_path))
    with watch.answers_allowed():
        assert getattr(labcheck, check)(answer) is True, capsys.readouterr().out
