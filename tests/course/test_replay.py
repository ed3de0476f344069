"""tinyinfer_course.analysis.replay: a workload replayed through a real LLMEngine, open loop."""
import time
from types import SimpleNamespace
import pytest
from tinyinfer_course.fleet import SimRequest, make_workload
from tinyinfer.scheduler import SchedulerStats
from tinyinfer.metrics import RequestRecord
from tinyinfer_course.analysis.replay import ReplayResult, StepRecord, prompt_ids, replay


class FakeEngine:
    """One token per request per step, up to `slots` requests at a time; records
    when each request was added."""

    def __init__(self, slots=2):
        self.slots, self.queue, self.running, self.added = slots, [], [], {}
        self.model_config = SimpleNamespace(vocab_size=1000)
        self.stats = SchedulerStats()
        self.start = None

    def has_unfinished_requests(self):
        return bool(self.queue or self.running)

    def add_request(self, prompt, params, request_id=None, arrival_time=None):
        assert len(prompt["prompt_token_ids"]) >= 1
        self.added[request_id] = (time.perf_counter(), arrival_time)
        self.queue.append([request_id, params.max_tokens, 0])
        return request_id

    def step(self):
        while self.queue and len(self.running) < self.slots:
            self.running.append(self.queue.pop(0))
        outs = []
        for r in self.running:
            r[2] += 1
            outs.append(SimpleNamespace(request_id=r[0], finished=r[2] == r[1]))
        self.running = [r for r in self.running if r[2] < r[1]]
        self.stats.num_running, self.stats.num_waiting = len(self.running), len(self.queue)
        return outs


def test_requests_join_no_earlier_than_they_arrive_and_all_finish():
    work = [SimRequest(i, t, 5, n) for i, (t, n) in enumerate([(0.0, 3), (0.0, 1), (0.05, 2), (0.12, 4)])]
    engine = FakeEngine()
    result = replay(engine, work)
    assert sorted(r.index for r in result.requests) == [0, 1, 2, 3]
    for rid, (added, arrival) in engine.added.items():
        assert added >= arrival  # open loop: never before its time
    for r in result.requests:
        assert r.arrival <= r.first_token <= r.finish
    by_id = {r.index: r for r in result.requests}
    assert by_id[1].first_token == by_id[1].finish  # one token: first is last
    assert [len(by_id[i].chunk_times) for i in range(4)] == [3, 1, 2, 4]  # one chunk per token
    assert result.output_tokens == 10
    assert result.duration >= 0.12  # the last request cannot start before it arrives
    assert not engine.has_unfinished_requests()


def test_replay_refuses_a_busy_engine():
    engine = FakeEngine()
    engine.queue.append(["x", 1, 0])
    with pytest.raises(ValueError, match="engine"):
        replay(engine, [SimRequest(0, 0.0, 4, 2)])


def test_metrics_of_a_result():
    reqs = [RequestRecord(0, 4, 10, arrival_time=0.0, send_time=0.0, chunk_times=[0.5, 1.0], completion_tokens=10,
                          status="ok"),
            RequestRecord(1, 4, 30, arrival_time=0.5, send_time=0.5, chunk_times=[1.0, 3.0], completion_tokens=30,
                          status="ok")]
    steps = [StepRecord(1.0, 0.1, 2, 0, 0, 2, 400, 100), StepRecord(2.0, 0.1, 1, 0, 0, 1, 200, 200)]
    res = ReplayResult(reqs, steps, duration=3.0)
    assert res.throughput == pytest.approx(40 / 3.0)
    assert res.latency(50) == pytest.approx(1.75)  # e2e 1.0 and 2.5
    assert res.kv_waste() == pytest.approx(1 - 300 / 600)


def test_prompts_are_seeded_and_differ_between_requests():
    assert prompt_ids(16, 1000, 1) == prompt_ids(16, 1000, 1)
    assert prompt_ids(16, 1000, 1) != prompt_ids(16, 1000, 2)
    assert all(100 <= t < 1000 for t in prompt_ids(50, 1000, 3))


@pytest.mark.slow
@pytest.mark.parametrize("scheduling", ["continuous", "static"])
def test_real_engine_replay(scheduling):
    from tinyinfer import LLMEngine

    engine = LLMEngine(dtype="float32", device="cpu", max_num_seqs=3, scheduling=scheduling,
                       enable_prefix_caching=False)
    work = make_workload(5, rate=50, prompt_len=(3, 20), output_len=(1, 6), seed=1)
    result = replay(engine, work)
    assert sorted(r.output_tokens for r in result.requests) == sorted(r.output_len for r in work)
    assert all(len(r.chunk_times) == r.output_tokens for r in result.requests)  # the engine streams every token
    assert result.output_tokens == sum(r.output_len for r in work)
    assert max(s.num_running for s in result.steps) <= 3
    for s in result.steps:
        assert 0 <= s.kv_bytes_used <= s.kv_bytes_reserved
    if scheduling == "continuous":
        assert result.steps[-1].kv_bytes_reserved == 0  # every block came back
    assert not engine.has_unfinished_requests()
