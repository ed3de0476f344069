"""labcheck.busy_warning: one line beside a timing taken on a busy machine."""
from tinyinfer import labcheck
from tinyinfer.labcheck.busy import busy_reasons


def test_quiet_machine_prints_nothing(capsys):
    assert labcheck.busy_warning([1.0, 1.1, 1.05], load=0.5, cores=2) is False
    assert capsys.readouterr().out == ""


def test_load_above_the_cores_is_named(capsys):
    assert labcheck.busy_warning([1.0, 1.0, 1.0], load=7.5, cores=2) is True
    out = capsys.readouterr().out
    assert out.startswith("⚠ busy machine: the load average is 7.5 on 2 cores") and out.count("\n") == 1


def test_a_large_spread_between_repeats_is_named():
    assert busy_reasons([1.0, 1.2, 4.0], load=0.1, cores=2) == ["the slowest of 3 repeats took 4.0x the fastest"]
    assert busy_reasons([1.0, 4.0], load=0.1, cores=2) == []  # two repeats say too little
    assert len(busy_reasons([1.0, 1.2, 4.0], load=9.0, cores=4)) == 2


def test_odd_input_never_raises(capsys):
    assert labcheck.busy_warning([0, None, -1, 2.0], load=0.1, cores=2) is False
    assert labcheck.busy_warning("not a list", load=0.1, cores=2) is False
