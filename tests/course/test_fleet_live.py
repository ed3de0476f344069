"""`tinyinfer fleet`: real `tinyinfer serve` replicas of the tiny model behind vllm-router.

Each test checks that the router spread the requests (both replicas served
some) and that nothing the fleet started is left running afterwards: not the
replicas, not the router, not the engine-core process each replica spawns.
Skipped where vllm-router is not installed (it has wheels for Linux x86_64
only); the fallback to the simulator is tested everywhere.
"""
import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("httpx")
import httpx  # noqa: E402

from tinyinfer.cli import main  # noqa: E402
from tinyinfer_course.fleet import live_fleet  # noqa: E402

needs_router = pytest.mark.skipif(
    live_fleet.router_binary() is None,
    reason="vllm-router is not installed (pip install 'tinyinfer[fleet]'; wheels for Linux x86_64 only)")


def descendants(pid: int) -> set[int]:
    """Every process below pid, read from /proc (parent ids)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.add(c)
            todo.append(c)
    return found


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's zombie waits for init to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def group_members(pgid: int) -> list[int]:
    """The processes of a process group (field 5 of /proc/PID/stat), zombies included."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                members.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return members


def started_by(fleet) -> set[int]:
    """The fleet's processes and everything they started (the replicas' engine cores)."""
    pids = set(fleet.pids)
    for pid in fleet.pids:
        pids |= descendants(pid)
    return pids


def complete(url: str, i: int, stream: bool = False) -> str:
    body = {"prompt": f"Request {i} asks about", "max_tokens": 3, "temperature": 0, "stream": stream}
    r = httpx.post(url + "/v1/completions", json=body, timeout=60, trust_env=False)
    assert r.status_code == 200, r.text
    return r.text


@needs_router
def test_two_replicas_behind_the_router_share_the_requests_and_stop(tiny_dir):
    with live_fleet.start_fleet(2, "round_robin", model=tiny_dir, threads=1, max_num_seqs=4) as fleet:
        pids = started_by(fleet)
        assert len(pids) >= 5, pids  # two replicas, their two engine cores, the router
        before = fleet.served()
        for i in range(6):
            complete(fleet.url, i, stream=bool(i % 2))
        served = [b - a for a, b in zip(before, fleet.served())]
        assert sum(served) == 6 and min(served) > 0, served
        assert all(httpx.get(u + "/get_load", trust_env=False).json() == {"load": 0} for u in fleet.replica_urls)
    assert not [p for p in pids if running(p)]


@needs_router
def test_the_command_stops_everything_on_ctrl_c(tiny_dir):
    cmd = [sys.executable, "-m", "tinyinfer", "fleet", "--model", tiny_dir, "--threads", "1", "--max-num-seqs", "4"]
    # The child gets SIGINT's default, as a command typed in a terminal does. Run from a
    # shell's background job, this test inherited SIGINT ignored, Python keeps an ignored
    # SIGINT ignored, and the fleet never saw the Ctrl-C (the hang of two make test runs).
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    pids = set()
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("OpenAI base URL"):
                break
        assert lines and lines[-1].startswith("OpenAI base URL"), lines
        url = lines[0].split()[1]
        complete(url, 0)
        pids = descendants(proc.pid)
        assert len(pids) >= 5, (lines, pids)
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        assert proc.wait(60) == 130  # Fleet.stop() gives up after 20 s, plus 10 s per process
    finally:
        if proc.poll() is None:  # the fleet did not stop: nor will its replicas and router, so kill them too
            left = {p for p in pids | descendants(proc.pid) if running(p)}
            proc.kill()
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    assert not [p for p in pids if running(p)]


@needs_router
def test_a_failed_start_is_a_clear_error_and_leaves_nothing(tiny_dir, monkeypatch):
    """The replicas come up, then the router fails to start: the replicas must not be left behind."""
    monkeypatch.setattr(live_fleet, "router_command", lambda *a: [sys.executable, "-c", "print('no router'); exit(3)"])
    # The replicas' processes, seen when the router starts: each replica's server and
    # its engine core, in the replica's own process group. (Not "every new process
    # below this one": under `make test` this process runs notebooks and the book
    # build at the same time, whose processes come and go meanwhile.)
    replicas, spawn = [], live_fleet._spawn

    def spawn_and_watch(name, *args):
        if name == "router":
            replicas.extend(p for proc in started for p in group_members(proc.popen.pid))
        proc = spawn(name, *args)
        started.append(proc)
        return proc

    started = []
    monkeypatch.setattr(live_fleet, "_spawn", spawn_and_watch)
    with pytest.raises(live_fleet.FleetError, match="router exited with code 3(.|\n)*no router"):
        live_fleet.start_fleet(2, model=tiny_dir, threads=1, max_num_seqs=4)
    assert len(replicas) >= 4, replicas  # two servers and their two engine cores were up
    assert not [p for p in replicas if running(p)]


def test_without_the_router_the_command_says_so_and_simulates(monkeypatch, capsys):
    monkeypatch.setattr(live_fleet, "router_binary", lambda: None)
    with pytest.raises(live_fleet.RouterMissing, match="pip install"):
        live_fleet.start_fleet(2)
    assert main(["fleet", "--policy", "cache_aware"]) == 0
    out, err = capsys.readouterr()
    assert "vllm-router is not installed" in err and "'prefix_affinity'" in err
    assert "completed" in out and "utilisation" in out  # the simulator's report


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="policy='least_busy' is invalid"):
        live_fleet.start_fleet(2, "least_busy")
    with pytest.raises(ValueError, match="n="):
        live_fleet.start_fleet(0)
    split = live_fleet.split_threads
    assert split(2, 2) == 1 and split(3, 2) == 1 and split(2, 8) == 4


# --- the session workload and the stored router report (no router needed) -------------------


@pytest.fixture(scope="module")
def tokenizer():
    from tinyinfer.bench.prompts import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


def test_session_workload_shares_system_prompts_and_grows_turn_by_turn(tokenizer):
    from tinyinfer_course.fleet.sessions import make_session_workload, to_sim_requests

    turns = make_session_workload(tokenizer, num_sessions=5, turns=3, num_system_prompts=2, system_len=40,
                                  user_len=8, seed=1)
    assert turns == make_session_workload(tokenizer, num_sessions=5, turns=3, num_system_prompts=2, system_len=40,
                                          user_len=8, seed=1)  # seeded
    assert [t.request_id for t in turns] == list(range(15))
    assert [t.arrival_time for t in turns] == sorted(t.arrival_time for t in turns)
    by_session = {}
    for t in turns:
        by_session.setdefault(t.session, []).append(t)
    for session in by_session.values():
        assert [t.turn for t in session] == [0, 1, 2]
        for prev, t in zip(session, session[1:]):
            assert t.prompt.startswith(prev.prompt + "\nUser: ")  # each turn re-sends the earlier ones
            assert t.history_len == prev.prompt_len and t.system_id == prev.system_id
    assert {t.system_id for t in turns} == {0, 1}
    for t in turns:
        assert t.prompt_len == len(tokenizer.encode(t.prompt, add_special_tokens=False))
    sims = to_sim_requests(turns)
    assert all(s.prefix_id == t.system_id and s.prefix_len % 16 == 0 and 0 < s.prefix_len <= t.system_len
               for s, t in zip(sims, turns))
    with pytest.raises(ValueError, match="turns=0 is invalid"):
        make_session_workload(tokenizer, turns=0)


def test_stored_router_report_renders_real_rows_beside_the_simulator():
    from tinyinfer_course.reports import router as R

    report = R.load(R.STORED)
    assert report["stored"] and set(report["runs"]) == {"round_robin", "power_of_two", "cache_aware"}
    m = report["meta"]
    assert m["cpu"] and m["engine_stamp"]["engine_fingerprint"] and m["router"].startswith("vllm-router")
    for run in report["runs"].values():
        assert run["real"]["failed"] == 0 and run["real"]["completed"] == report["workload"]["requests"]
        assert sum(run["real"]["served"]) == report["workload"]["requests"] == sum(run["sim"]["served"])
    text = R.render(report)
    assert "| round_robin (round_robin) |" in text and "| cache_aware (prefix_affinity) |" in text
    assert "stored copy" in text and m["cpu"] in text and "Vector units" in text
    for policy, run in report["runs"].items():
        r, s = run["real"], run["sim"]
        assert f"{r['ttft_p95_s'] * 1e3:,.0f} / {s['ttft_p95_s'] * 1e3:,.0f}" in text


def test_the_sentences_follow_the_numbers():
    import copy

    from tinyinfer_course.reports import router as R

    report = R.load(R.STORED)
    changed = copy.deepcopy(report)
    rr = changed["runs"]["round_robin"]
    rr["real"]["share"], rr["sim"]["share"] = [0.8, 0.2], [0.5, 0.5]
    assert "Under round_robin the busier replica took 80%" in R.share_sentence(changed)
    for run in changed["runs"].values():
        run["real"]["prefix_hit_rate"] = run["sim"]["prefix_hit_rate"] + 0.3
    assert "more than 10 points higher under round_robin, power_of_two, cache_aware" in R.hit_sentence(changed)
    ranks = {"round_robin": 1, "power_of_two": 2, "cache_aware": 3}
    for p, run in changed["runs"].items():
        run["real"]["ttft_p95_s"] = run["sim"]["ttft_p95_s"] = ranks[p]
    assert R.rank_sentence(changed).startswith("Both rank the policies the same way")
    changed["meta"]["load_average"] = 0.4
    assert R.load_text(changed).endswith("0.4 on 2 cores.")
    changed["meta"]["load_average"] = 3.0
    assert "other work shared the cores" in R.load_text(changed)


def test_engine_note_says_when_the_code_has_changed():
    from tinyinfer_course.reports import router as R

    report = R.load(R.STORED)
    stamp = report["meta"]["engine_stamp"]
    assert "the same code that runs today" in R.REPORT.note(report, today=stamp)
    other = {"engine_fingerprint": "0" * 16,
             "engine_modules": {**stamp["engine_modules"], "tinyinfer_course.fleet.live_fleet": "changed"}}
    note = R.REPORT.note(report, today=other)
    assert "has changed since then (1 of its modules: fleet.live" in note and "`make fleet`" in note


def test_replay_runs_where_an_event_loop_already_runs():
    """Lab 8 replays turns from a notebook, whose kernel runs an event loop in its
    thread: replay must not call asyncio.run there (it would refuse to nest)."""
    import asyncio

    from tinyinfer_course.fleet.live_replay import replay

    async def inside_a_loop():
        return replay("http://127.0.0.1:9", [], "m")  # no turns: nothing is sent

    assert asyncio.run(inside_a_loop()) == []
