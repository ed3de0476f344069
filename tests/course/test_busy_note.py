"""labcheck.busy_note / warn_if_busy: the one-line warning labs print beside a timing."""
from tinyinfer_course import labcheck


def test_a_quiet_machine_gets_no_note():
    assert labcheck.busy_note(load=0.5, cores=2) == ""
    assert labcheck.busy_note([1.0, 1.1, 1.2], load=1.9, cores=2) == ""  # repeats within 1.5x


def test_a_load_above_the_cores_is_named():
    note = labcheck.busy_note(load=12.8, cores=2)
    assert note.startswith("⚠ busy machine") and "load average is 12.8 on 2 cores" in note


def test_repeats_that_disagree_are_named():
    note = labcheck.busy_note([0.030, 0.031, 0.090], load=0.2, cores=4)
    assert "differ 3.0-fold" in note and "load average" not in note
    both = labcheck.busy_note([1, 2], load=5, cores=1)
    assert "5.0 on 1 core and" in both and "2.0-fold" in both


def test_no_load_average_and_odd_times_are_not_signs(monkeypatch):
    monkeypatch.setattr("tinyinfer_course.labcheck.machine._load", lambda: None)  # as on Windows
    assert labcheck.busy_note([None, 0, 1.0], cores=2) == ""  # one real repeat only
    assert labcheck.busy_note([0, 5.0], load=0.0, cores=2) == ""  # a zero is no repeat
    assert "differ" in labcheck.busy_note([1.0, 5.0], cores=2)


def test_warn_if_busy_prints_only_when_busy_and_never_raises(capsys, monkeypatch):
    monkeypatch.setattr("tinyinfer_course.labcheck.machine._load", lambda: 0.1)
    # None in every case: a cell ending in the call must print nothing on a quiet machine (no stray False)
    assert labcheck.warn_if_busy([1.0, 1.0]) is None
    assert capsys.readouterr().out == ""
    assert labcheck.warn_if_busy([1.0, 9.0]) is None
    assert capsys.readouterr().out.startswith("⚠ busy machine")
    assert labcheck.warn_if_busy(["not a number"]) is None  # the course's odd input: no exception
    assert capsys.readouterr().out == ""
    monkeypatch.setattr("tinyinfer_course.labcheck.machine._load", lambda: 99.0)
    assert labcheck.warn_if_busy() is None
    assert capsys.readouterr().out.startswith("⚠ busy machine")


def test_no_stored_output_is_a_stray_bool():
    """A cell whose last line returns a bool (once, warn_if_busy) shows a bare
    True or False that no text explains (content review 2026-12-04, error 25)."""
    import nbformat
    from pathlib import Path

    stray = []
    for path in sorted((Path(__file__).resolve().parents[2] / "solutions").glob("[0-9][0-9]-*.ipynb")):
        for n, cell in enumerate(nbformat.read(path, as_version=4).cells):
            for out in cell.get("outputs", []):
                if out.get("output_type") == "execute_result" and \
                        out.get("data", {}).get("text/plain", "").strip() in ("True", "False"):
                    stray.append(f"{path.name} cell {n}: {cell.source.splitlines()[-1]}")
    assert not stray, "a bare True/False is printed by: " + "; ".join(stray)
