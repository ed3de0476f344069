"""tinyinfer_course.analysis.energy: joules per token from a power figure, and RAPL counters
read from a fake /sys/class/powercap tree (the real one is rarely readable)."""
import pytest

from tinyinfer_course.analysis.energy import RaplMeter, joules_per_token, rapl_zones


def test_joules_per_token_is_power_times_time_per_token():
    assert joules_per_token(700, 0.042, 1) == pytest.approx(29.4)  # an H100's 700 W for one 42 ms token
    assert joules_per_token(700, 0.042, 64) == pytest.approx(29.4 / 64)  # one step serving a batch of 64


@pytest.mark.parametrize("args, field", [((0, 1, 1), "watts"), ((10, -1, 1), "seconds"), ((10, 1, 0), "tokens"),
                                         ((10, 1, 1.5), "tokens")])
def test_joules_per_token_names_the_bad_field(args, field):
    with pytest.raises(ValueError, match=field):
        joules_per_token(*args)


def _zone(root, name, energy, max_range=1000):
    zone = root / name
    zone.mkdir()
    (zone / "energy_uj").write_text(f"{energy}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_range}\n")
    return zone


def test_meter_sums_packages_and_skips_subzones(tmp_path):
    a, b = _zone(tmp_path, "intel-rapl:0", 100), _zone(tmp_path, "intel-rapl:1", 500)
    _zone(tmp_path, "intel-rapl:0:0", 7)  # the cores inside package 0: already counted by it
    assert [z.name for z in rapl_zones(tmp_path)] == ["intel-rapl:0", "intel-rapl:1"]
    meter = RaplMeter(tmp_path)
    meter.start()
    (a / "energy_uj").write_text("400\n")
    (b / "energy_uj").write_text("200\n")  # wrapped around at 1000: 500 -> 1000 -> 200 is 700 µJ
    assert meter.stop() == pytest.approx((300 + 700) / 1e6)


def test_meter_without_counters_says_so(tmp_path):
    meter = RaplMeter(tmp_path / "missing")
    assert not meter.available
    meter.start()
    assert meter.stop() is None
    zone = _zone(tmp_path, "intel-rapl:0", 5)
    (zone / "energy_uj").write_text("not a number")  # unreadable counters are skipped, not fatal
    assert rapl_zones(tmp_path) == []
