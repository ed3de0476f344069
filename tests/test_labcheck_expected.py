"""Where the lab checks of labs 1, 3, 6, 8, 9 and 10 get their expected values,
checked against independent sources: literal counts against tiktoken, the
hand-worked quantization cases against tinyinfer.quant, and the labcheck
references (the labs' fallbacks, which the checks now refuse) against the
checks themselves, with the refusal switched off."""
from unittest import mock

import pytest
import torch

from tinyinfer import labcheck, quant, sampling
from tinyinfer.bpe import bpe_encode_piece
from tinyinfer.labcheck import core, quantization, tokens


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


FALLBACKS = [  # a check, and the course's own answer that the labs fall back to
    ("check_bpe_encode_piece", bpe_encode_piece),
    ("check_count_tokens", labcheck.reference_count_tokens),
    ("check_compare_tokenizers", labcheck.reference_compare_tokenizers),
    ("check_temperature", sampling.apply_temperature),
    ("check_top_k", sampling.apply_top_k),
    ("check_top_p", sampling.apply_top_p),
    ("check_repetition_penalty", sampling.apply_repetition_penalty),
    ("check_sample", labcheck.reference_sample),
    ("check_quantize_int8", labcheck.reference_quantize_int8),
    ("check_pack_int4", labcheck.reference_pack_int4),
    ("check_quantize_int4", labcheck.reference_quantize_int4),
    ("check_power_of_two", labcheck.reference_power_of_two),
    ("check_p95_and_goodput", labcheck.reference_p95_and_goodput),
    ("check_accept_draft_tokens", labcheck.reference_accept_draft_tokens),
    ("check_parse_tool_call", labcheck.reference_parse_tool_call),
    ("check_run_agent", labcheck.reference_run_agent),
    ("check_select_context", labcheck.reference_select_context),
    ("check_token_costs", labcheck.reference_token_costs),
]


@pytest.mark.parametrize("check, answer", FALLBACKS, ids=[c for c, _ in FALLBACKS])
def test_the_labs_fallbacks_pass_their_checks_when_allowed(check, answer, tmp_path, monkeypatch, capsys):
    # A lab uses these when the learner's own function has not passed yet, so
    # they must be right; the check refuses them, so the refusal is switched off here.
    monkeypatch.setenv("TINYINFER_MY_ENGINE", str(tmp_path))
    watch = core._Watch
    with mock.patch.object(core, "_Watch", lambda forbidden: watch(())):
        assert getattr(labcheck, check)(answer) is True, capsys.readouterr().out
