"""StoredReport (tinyinfer_course.reports.stored), the one anatomy of every stored report,
and tinyinfer_course.machine, the CPU facts they record: on made-up files and stamps."""
from __future__ import annotations

import json

import pytest

from tinyinfer_course import machine
from tinyinfer_course.reports.stored import Age, StoredReport

STAMP = {"engine_fingerprint": "a" * 16, "engine_commit": "abc1234",
         "engine_modules": {"tinyinfer.model": "11111111", "tinyinfer.cli": "22222222"}}
OLDER = {**STAMP, "engine_fingerprint": "b" * 16, "engine_modules": {**STAMP["engine_modules"], "tinyinfer.model": "0"}}


def never():
    raise AssertionError("today's modules were fingerprinted, but nothing needed them")


def report_file(folder, name="r.json", **meta):
    path = folder / name
    path.write_text(json.dumps({"meta": {"date": "2027-01-02", **meta}, "rows": []}))
    return path


def test_load_prefers_a_path_then_the_env_var_then_build_then_the_stored_copy(tmp_path, monkeypatch):
    stored = report_file(tmp_path, "stored.json")
    kind = StoredReport("a test report", stored, never, saved_name="mine.json", env_var="TEST_REPORT",
                        keys=("meta", "rows"), made_by="make one with `make test-report`")
    monkeypatch.delenv("TEST_REPORT", raising=False)
    monkeypatch.chdir(tmp_path)
    assert kind.load()["stored"] and kind.find_saved() is None
    (tmp_path / "_build").mkdir()
    mine = report_file(tmp_path / "_build", "mine.json")
    (tmp_path / "chapters").mkdir()
    monkeypatch.chdir(tmp_path / "chapters")  # a chapter runs in its own folder: _build is one up
    assert kind.load()["source"] == str(mine) and not kind.load()["stored"]
    other = report_file(tmp_path, "other.json")
    monkeypatch.setenv("TEST_REPORT", str(other))
    assert kind.find_saved() == other and kind.load(stored)["stored"]
    (tmp_path / "bad.json").write_text(json.dumps({"meta": {}}))
    with pytest.raises(ValueError, match=r"not a test report \(no 'rows'\); make one with `make test-report`"):
        kind.load(tmp_path / "bad.json")


def test_the_note_is_stamp_notes_unless_the_report_has_words_of_its_own(tmp_path):
    plain = StoredReport("a test report", tmp_path / "x.json", never, program="`LLM`",
                         remeasure="`make it` measures today's")
    current, older = {"meta": {"date": "2027-01-02", "engine_stamp": STAMP}}, {"meta": {"engine_stamp": OLDER}}
    assert "the same code that `LLM` runs today" in plain.note(current, STAMP)
    note = plain.note(older, STAMP)
    assert "1 of its modules: model;" in note and "an unknown date" in note and "`make it` measures today's" in note
    assert "not known" in plain.note({"meta": {}})  # no stamp: nothing to compare, today's is not computed

    def words(report: dict, age: Age) -> str:
        return f"{age.when}: {'same' if age.same else 'older'}, {age.named('fp')}, changed {age.listed(1)}"

    own = StoredReport("a test report", tmp_path / "x.json", never, words=words)
    assert own.note(current, STAMP) == f"2027-01-02: same, tinyinfer at commit abc1234 (fp {'a' * 16}), changed "
    assert own.note(older, STAMP).endswith("older, tinyinfer at commit abc1234 (fp " + "b" * 16 + "), changed model")


def test_bf16_units_follow_the_flags_unless_onednn_is_capped_below_them():
    server = machine.vector_units("flags\t: avx2 avx512f avx512_bf16\n")
    assert machine.bf16_units(server, {}) is True
    assert machine.bf16_units(server, {"ONEDNN_MAX_CPU_ISA": "AVX2"}) is False
    assert machine.bf16_units(server, {"ONEDNN_MAX_CPU_ISA": "avx512_core_fp16"}) is True  # FP16 includes BF16
    assert machine.bf16_units(machine.vector_units("flags\t: avx2\n"), {}) is False
    assert machine.bf16_units({}, {}) is None  # flags unknown
    facts = machine.facts()
    assert facts["cpu"] and facts["cores"] >= 1 and isinstance(facts["vector_units"], dict)


def test_every_stored_stamp_fingerprints_the_modules_it_lists():
    """A stamp's fingerprint is the hash of the module list beside it, so comparing it with
    today's says truly whether the engine changed. Renaming modules in a stored stamp (as
    the split into two packages did) must recompute it."""
    from importlib import resources

    from tinyinfer_course.fingerprint import fingerprint_of

    checked = 0
    for path in sorted(resources.files("tinyinfer_course.reports").joinpath("data").iterdir()):
        if not path.name.endswith(".json"):
            continue
        meta = json.loads(path.read_text()).get("meta")
        stamp = meta.get("engine_stamp") if isinstance(meta, dict) else None
        if stamp and stamp.get("engine_fingerprint") != "unknown":
            assert fingerprint_of(stamp["engine_modules"]) == stamp["engine_fingerprint"], path.name
            checked += 1
    assert checked >= 5
