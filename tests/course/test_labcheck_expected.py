"""Where the lab checks get their expected values, checked against independent
sources: lab 1's merge-step cases worked by hand, the hand-worked quantization cases
against tinyinfer.quant, and the answers the labs fall back to (each lab's
declared fallbacks, which the checks refuse) against the checks themselves,
with the refusal switched off."""
import sys

import pytest
import torch

from tinyinfer_course.text import bpe
from tinyinfer_course import labcheck
from tinyinfer import quant
from tinyinfer_course.labcheck import beyond, quantization, registry, tokens, watch


def test_hand_worked_merge_cases_agree_with_the_engine():
    """Lab 1's merge-step cases take their expected values from tinyinfer_course.text.bpe;
    here the first few are worked by hand."""
    c, w = tokens._chars, tokens._w
    by_hand = [
        ((b"e", b"s"), {c("low"): 5, c("lower"): 2, w("n", "e", "w", "es", "t"): 6, w("w", "i", "d", "es", "t"): 3}),
        ((b"c", b"d"), {c("ab"): 1, w("cd"): 3}),
        ((b"a", b"b"), {c("xy"): 2, w("ab"): 2}),
        ((b"a", b"b"), {c("ac"): 1, w("ab"): 1}),
        ((b"a", b"a"), {w("aa", "a"): 1}),
        ((b"a", b"a"), {w("aa", "aa"): 1}),
        ((b"z", b"z"), {w("zz", "z"): 1, c("ab"): 1}),
        ((b"a", b"b"), {w("ab", "c", "ab"): 2}),
        ((b" th", b"e"), {w(" the"): 4, w(" th", "en"): 2, w("en", "d"): 3}),
        (None, {w(" the"): 4, w("end"): 3, c("a"): 1}),
        (None, {}),
    ]
    assert len(by_hand) == len(tokens.MERGE_CASES)
    for (words, why), expected in zip(tokens.MERGE_CASES, by_hand):
        assert bpe.merge_step(words) == expected, why


def test_hand_worked_quantization_cases_agree_with_the_engine():
    (case,) = quantization._int4_cases()[:1]
    assert quantization._int4_close(quantization._engine_int4(*case.args), case.expected)


def test_the_byte_counts_choose_format_is_checked_against_are_the_storage_layouts():
    """Worked by hand from the layout the lab states: INT8 [3, 64] is 192 codes + 3 fp32
    scales = 204 bytes; INT4 g64 [2, 80] is 80 bytes of codes + 2 rows x 2 groups (the
    second one short) x (fp16 scale + fp16 zero) = 96 bytes; INT4 g128 [4, 576] is
    4 x 288 + 4 rows x 5 groups x 4 bytes = 1,232 bytes (4.28 bits per weight)."""
    cost = quantization.engine_format_cost
    assert cost(torch.randn(3, 64), "int8")[0] == 204
    assert cost(torch.randn(2, 80), "int4", 64)[0] == 96
    assert cost(torch.randn(4, 576), "int4", 128)[0] == 1232
    # and the engine's own count of a layer agrees
    w = torch.randn(960, 576)
    assert cost(w, "int4", 128)[0] == 960 * 288 + 960 * 5 * 4 == quant.model_bytes(
        quant.Int4Linear.from_weight(w, 128))["total"]


def test_constant_groups_get_code_zero_in_the_engine():
    w = torch.tensor([[0.5] * 4 + [-0.25] * 4])
    packed, scales, zeros = quant.quantize_int4(w, 4)
    assert torch.equal(quant.unpack_int4(packed), torch.zeros(1, 8, dtype=torch.uint8))
    assert zeros.float().tolist() == [[0.5, -0.25]] and bool((scales.float() <= 1e-7).all())
    q, scale = quant.quantize_int8(torch.zeros(2, 4))
    assert torch.equal(q, torch.zeros(2, 4, dtype=torch.int8)) and bool((scale <= 1e-7).all())


def test_hand_worked_mask_rows_agree_with_the_scan():
    """Lab 10's prefix-tree check takes its rows on the model's vocabulary from the
    scan; here the scan meets the rows worked by hand, on the small vocabulary and
    on the one grown by tokens that leave every choice at a digit (which must change
    no row)."""
    grown = beyond._grown_vocab()
    assert grown[:len(beyond._VOCAB)] == beyond._VOCAB and len(grown) > 10 * len(beyond._VOCAB)
    for k, (prefix, choices, want, note) in enumerate(beyond._MASK_CASES):
        assert labcheck.scan_allowed_tokens(prefix, choices, beyond._VOCAB, 0) == want, note
        if k in beyond._GROWN_ROWS:
            assert labcheck.scan_allowed_tokens(prefix, choices, grown, 0) == want, note
    for prefix, choices, want, note in beyond._SPACE_CASES:  # token 0 has text there; end-of-sequence is 6
        assert labcheck.scan_allowed_tokens(prefix, choices, beyond._SPACE_VOCAB, beyond._SPACE_EOS) == want, note


def test_count_lines_counts_work_not_time():
    """A loop over n items runs at least n lines, whatever each costs; code in C none."""
    def loop(n):
        total = 0
        for i in range(n):
            total += i
        return total

    total, lines = labcheck.count_lines(loop, 1000)
    assert total == 499500 and 2000 <= lines <= 2010  # a loop test and a body per item (the exact few: Python's)
    assert labcheck.count_lines(sum, range(1000)) == (499500, 0)
    assert sys.gettrace() is None  # the tracer is taken off


# (a check, the course's own answer that its lab falls back to), from every lab's LAB.
FALLBACKS = registry.fallbacks()


@pytest.mark.parametrize("check, answer", FALLBACKS, ids=[c for c, _ in FALLBACKS])
def test_the_labs_fallbacks_pass_their_checks_when_allowed(check, answer, tmp_path, monkeypatch, capsys):
    # A lab uses these when the learner's own function has not passed yet, so
    # they must be right; the check refuses them, so the refusal is switched off here.
    monkeypatch.setenv("TINYINFER_MY_ENGINE", str(tmp_path))
    with watch.answers_allowed():
        assert getattr(labcheck, check)(answer) is True, capsys.readouterr().out
