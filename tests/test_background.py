"""background.py: a test run in the background run ends, in the full run's report,
as it ended there (passed, failed in any phase, skipped), and one it never reported
fails instead of passing."""
import json
import subprocess
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

import background  # tests/ is on sys.path


def report(nodeid, when, outcome, longrepr=None):
    return SimpleNamespace(nodeid=nodeid, when=when, outcome=outcome, longrepr=longrepr,
                           passed=outcome == "passed", skipped=outcome == "skipped")


def test_each_outcome_is_replayed(tmp_path, monkeypatch):
    path = tmp_path / "outcomes.jsonl"
    with monkeypatch.context() as env:  # only while recording: this test's own reports are not written
        env.setenv(background.OUTCOMES, str(path))
        for r in [report("t::ok", "setup", "passed"), report("t::ok", "call", "passed"),
                  report("t::bad", "call", "failed", "assert 1 == 2"),
                  report("t::late", "call", "passed"), report("t::late", "teardown", "failed", "teardown broke"),
                  report("t::skip", "setup", "skipped", ("t.py", 3, "Skipped: no GPU"))]:
            background.record(r)
    outcomes = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(outcomes) == 5  # a passed setup or teardown is not written
    done = Future()
    done.set_result((subprocess.CompletedProcess([], 1, "out", "err"), outcomes))
    monkeypatch.setattr(background, "_RUN", [done])

    background.replay("t::ok")  # passes
    with pytest.raises(pytest.fail.Exception, match="assert 1 == 2"):
        background.replay("t::bad")
    with pytest.raises(pytest.fail.Exception, match=r"\(teardown\):\nteardown broke"):
        background.replay("t::late")
    with pytest.raises(pytest.skip.Exception, match="^no GPU$"):
        background.replay("t::skip")
    with pytest.raises(pytest.fail.Exception, match="did not report this test .exit code 1"):
        background.replay("t::lost")  # e.g. the background run crashed before it


def test_nothing_is_written_outside_the_background_run(tmp_path, monkeypatch):
    monkeypatch.delenv(background.OUTCOMES, raising=False)
    monkeypatch.chdir(tmp_path)
    background.record(report("t::bad", "call", "failed", "x"))
    assert list(tmp_path.iterdir()) == []
