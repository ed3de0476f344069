"""The fleet simulator: determinism, conservation, routing, faults, queueing theory,
disaggregation. All fast (pure Python, no model) except the calibrate tests, which run
the model but never compare its timings with a bound."""
import importlib
import json
import math

import pytest

from tinyinfer_course.fleet import (POLICIES, Autoscale, Failure, KVLink, ReplicaConfig, StepCostModel, calibrate,
                                    compare_disaggregation, make_chat_workload, make_workload, simulate,
                                    simulate_disaggregated, workload_from)

COST = StepCostModel(prefill_s_per_token=2e-3, decode_base_s=50e-3, decode_s_per_seq=5e-3)


def accounted(report):
    """Every request either completed or was counted as rejected: none lost."""
    return report.completed + report.rejected == report.num_requests


# --- workload and determinism ---------------------------------------------------------


def test_workload_is_seeded_and_has_the_asked_rate():
    a = make_workload(2000, rate=5.0, prompt_len=(10, 20), output_len=[1, 100], seed=7)
    b = make_workload(2000, rate=5.0, prompt_len=(10, 20), output_len=[1, 100], seed=7)
    c = make_workload(2000, rate=5.0, prompt_len=(10, 20), output_len=[1, 100], seed=8)
    assert a == b and a != c
    rate = (len(a) - 1) / a[-1].arrival_time
    assert 4.5 < rate < 5.5
    assert all(10 <= r.prompt_len <= 20 and r.output_len in (1, 100) for r in a)
    fixed = make_workload(5, rate=2.0, arrival="fixed")
    assert [r.arrival_time for r in fixed] == [0.0, 0.5, 1.0, 1.5, 2.0]


def test_session_workload_resends_each_conversation_with_its_history():
    wl = make_chat_workload(40, rate=1.0, turns=(2, 5), num_system_prompts=3, system_len=100,
                               user_len=(5, 9), output_len=(3, 7), seed=3)
    assert wl == make_chat_workload(40, rate=1.0, turns=(2, 5), num_system_prompts=3, system_len=100,
                                       user_len=(5, 9), output_len=(3, 7), seed=3)
    assert [r.request_id for r in wl] == list(range(len(wl)))
    assert all(a.arrival_time <= b.arrival_time for a, b in zip(wl, wl[1:]))
    sessions = {}
    for r in wl:
        sessions.setdefault(r.session_id, []).append(r)
    assert len(sessions) == 40 and all(2 <= len(turns) <= 5 for turns in sessions.values())
    for sid, (first, *later) in sessions.items():
        # A first turn shares only its system prompt; every later turn's prefix is
        # the previous turn's prompt and reply, which only this session has.
        assert first.prefix_id in range(3) and first.prefix_len == 100 and 105 <= first.prompt_len <= 109
        before = first
        for turn in later:
            assert turn.prefix_id == 3 + sid
            assert turn.prefix_len == before.prompt_len + before.output_len
            assert 5 <= turn.prompt_len - turn.prefix_len <= 9
            before = turn


@pytest.mark.parametrize("bad, match", [(dict(num_sessions=0), "num_sessions"), (dict(rate=0), "rate"),
                                        (dict(num_system_prompts=0), "num_system_prompts"),
                                        (dict(think_time=0), "think_time")])
def test_session_workload_refuses_bad_settings(bad, match):
    args = dict(num_sessions=5, rate=1.0) | bad
    with pytest.raises(ValueError, match=match):
        make_chat_workload(**args)


def test_keeping_sessions_on_their_replica_reuses_their_history():
    """The lab's routing task rests on this: a later turn that returns to its
    replica skips its history; power of two scatters sessions and recomputes them."""
    from tinyinfer_course.labcheck import ReferenceSessionRouter

    wl = make_chat_workload(60, rate=1.0, seed=0)
    config = ReplicaConfig(max_num_seqs=8, prefix_cache_slots=16)
    sticky = simulate(wl, 4, COST, ReferenceSessionRouter(), config)
    scattered = simulate(wl, 4, COST, "power_of_two", config)
    assert accounted(sticky) and accounted(scattered)
    assert sticky.prefix_cache_hit_tokens > 1.5 * scattered.prefix_cache_hit_tokens
    assert sticky.ttft.p95 < scattered.ttft.p95


@pytest.mark.parametrize("policy", POLICIES)
def test_same_seed_same_report(policy):
    wl = make_workload(200, rate=6.0, prompt_len=(16, 256), output_len=(4, 64), num_prefixes=4, prefix_len=64, seed=1)
    run = lambda wl, seed: simulate(wl, 3, COST, policy, failures=[Failure(2, 5.3, 12.0)], seed=seed).to_dict(True)
    assert run(wl, 0) == run(wl, 0)
    other = make_workload(200, rate=6.0, prompt_len=(16, 256), output_len=(4, 64), num_prefixes=4, prefix_len=64,
                          seed=2)
    assert run(other, 0) != run(wl, 0)


def test_report_to_dict_is_json():
    r = simulate(make_workload(20, rate=1.0, seed=0), 2, COST)
    d = json.loads(json.dumps(r.to_dict()))
    assert d["completed"] == 20 and d["ttft"]["p95"] > 0 and len(d["replicas"]) == 2
    assert {"p50", "p95", "p99"} <= set(d["e2e"]) and d["output_throughput"] > 0


def test_bad_input_names_the_field():
    wl = make_workload(5, rate=1.0)
    with pytest.raises(ValueError, match="replicas"):
        simulate(wl, 0)
    with pytest.raises(ValueError, match="policy"):
        simulate(wl, 2, policy="random")
    with pytest.raises(ValueError, match="max_num_seqs"):
        ReplicaConfig(max_num_seqs=0)
    with pytest.raises(ValueError, match="rate"):
        make_workload(5, rate=0)
    with pytest.raises(ValueError, match="Failure.replica_id"):
        simulate(wl, 2, failures=[Failure(5, 1.0)])
    with pytest.raises(ValueError, match="decode_base_s"):
        StepCostModel(decode_base_s=-1)


# --- one request, exactly -----------------------------------------------------------------


def test_a_lone_request_takes_exactly_its_steps():
    """Chunked prefill of 1000 tokens with a 512 budget is two steps; then 9 decode steps."""
    cfg = ReplicaConfig(max_num_batched_tokens=512)
    one = workload_from([{"arrival_time": 3.0, "prompt_len": 1000, "output_len": 10}])
    r = simulate(one, 1, COST, replica_config=cfg)
    prefill = COST.step_time(512) + COST.step_time(488)
    assert r.ttft.mean == pytest.approx(prefill)
    assert r.e2e.mean == pytest.approx(prefill + 9 * COST.step_time(decode_seqs=1))
    assert r.e2e.mean == pytest.approx(COST.request_latency(1000, 10, 512))
    assert r.tpot.mean == pytest.approx(COST.step_time(decode_seqs=1))


# --- conservation, failures, rejections --------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_failure_loses_nothing_and_counts_retries(policy):
    wl = make_workload(300, rate=4.0, prompt_len=(32, 256), output_len=(8, 64), num_prefixes=3, prefix_len=32, seed=3)
    healthy = simulate(wl, 3, COST, policy)
    broken = simulate(wl, 3, COST, policy, failures=[Failure(1, 20.3), Failure(2, 30.7, recover_at=50.0)],
                      health_check_interval=2.0)
    assert healthy.retries == 0 and healthy.completed == 300
    assert broken.retries > 0 and broken.completed == 300 and accounted(broken)
    assert sum(r.retries for r in broken.requests) == broken.retries
    assert not any(r.replica_id == 1 and r.arrival_time > 20.3 for r in broken.requests)


def test_slower_health_checks_mean_more_bounced_requests():
    """Between a crash and the next health check the balancer still sends traffic to
    the dead replica; each such request is refused and retried."""
    wl = make_workload(300, rate=6.0, prompt_len=64, output_len=16, seed=4)
    retries = [simulate(wl, 3, COST, "round_robin", failures=[Failure(0, 10.01)], health_check_interval=h).retries
               for h in (0.5, 8.0)]
    assert retries[1] > retries[0] + 10


def test_all_replicas_down_rejects_the_rest():
    wl = make_workload(100, rate=5.0, prompt_len=32, output_len=8, seed=0)
    r = simulate(wl, 2, COST, failures=[Failure(0, 5.0), Failure(1, 5.0)], health_check_interval=0.5)
    assert accounted(r) and r.rejected > 50 and r.completed > 10
    assert {x.rejected for x in r.requests if x.rejected} == {"no healthy replica"}


def test_bounded_queue_rejects_under_overload():
    wl = make_workload(400, rate=20.0, prompt_len=64, output_len=32, seed=0)
    cfg = ReplicaConfig(max_num_seqs=4, max_queue_len=8)
    r = simulate(wl, 2, COST, "least_outstanding", cfg)
    unbounded = simulate(wl, 2, COST, "least_outstanding", ReplicaConfig(max_num_seqs=4))
    assert accounted(r) and r.rejected > 100 and unbounded.rejected == 0
    assert r.e2e.p95 < unbounded.e2e.p95 / 5  # what is admitted waits in a short queue


def test_too_large_for_the_kv_cache_is_rejected_not_stuck():
    wl = workload_from([{"arrival_time": 0, "prompt_len": 900, "output_len": 200},
                        {"arrival_time": 0, "prompt_len": 10, "output_len": 10}])
    r = simulate(wl, 1, COST, replica_config=ReplicaConfig(kv_capacity_tokens=1000))
    assert r.completed == 1 and r.rejected == 1


def test_kv_capacity_makes_requests_wait():
    wl = make_workload(40, rate=100.0, prompt_len=100, output_len=50, seed=0)
    roomy = simulate(wl, 1, COST, replica_config=ReplicaConfig(kv_capacity_tokens=100_000))
    tight = simulate(wl, 1, COST, replica_config=ReplicaConfig(kv_capacity_tokens=300))  # two at a time
    assert tight.completed == roomy.completed == 40
    assert tight.queue_wait.mean > 3 * roomy.queue_wait.mean


def test_autoscaler_adds_a_replica_under_load_and_retires_idle_ones():
    busy = make_workload(300, rate=6.0, prompt_len=64, output_len=64, seed=0)
    rows = [{"arrival_time": r.arrival_time, "prompt_len": r.prompt_len, "output_len": r.output_len} for r in busy]
    quiet_tail = workload_from([*rows, {"arrival_time": 400.0, "prompt_len": 8, "output_len": 4}])
    scale = Autoscale(max_replicas=4, min_replicas=1, queue_threshold=2.0, startup_delay_s=5.0, idle_timeout_s=20.0)
    fixed = simulate(quiet_tail, 1, COST)
    scaled = simulate(quiet_tail, 1, COST, autoscale=scale)
    kinds = [e[0] for e in scaled.extra["scale_events"]]
    assert "up" in kinds and "down" in kinds and len(scaled.replicas) > 1
    assert scaled.e2e.p95 < fixed.e2e.p95 / 2 and accounted(scaled)


# --- routing -------------------------------------------------------------------------------


def test_least_outstanding_beats_round_robin_on_the_tail():
    """1 request in 30 is 50x longer. Round-robin keeps sending short requests to a
    replica whose two batch slots hold long ones; least-outstanding avoids it."""
    wl = make_workload(600, rate=2.0, prompt_len=64, output_len=[8] * 29 + [400], seed=1)
    cfg = ReplicaConfig(max_num_seqs=2)
    rr = simulate(wl, 4, COST, "round_robin", cfg)
    lo = simulate(wl, 4, COST, "least_outstanding", cfg)
    p2 = simulate(wl, 4, COST, "power_of_two", cfg)
    assert lo.ttft.p95 < rr.ttft.p95 / 3 and lo.e2e.p95 < rr.e2e.p95 / 3
    assert p2.ttft.p95 < rr.ttft.p95 / 2  # two random choices get most of the benefit
    assert lo.e2e.p50 == pytest.approx(rr.e2e.p50, rel=0.1)  # the typical request is not the story


def test_prefix_affinity_increases_prefix_cache_hits():
    """8 shared prefixes, 4 replicas that each keep 2: round-robin makes every replica
    see all 8 (mostly misses); affinity gives each prefix a home."""
    wl = make_workload(400, rate=2.0, prompt_len=32, output_len=16, num_prefixes=8, prefix_len=256, seed=0)
    cfg = ReplicaConfig(prefix_cache_slots=2)
    rr = simulate(wl, 4, COST, "round_robin", cfg)
    aff = simulate(wl, 4, COST, "prefix_affinity", cfg)
    assert aff.prefix_cache_hit_tokens > 2 * rr.prefix_cache_hit_tokens
    # A hit reuses one whole 256-token prefix, and each of the 8 prefixes must miss
    # once (its first request computes it) before anybody can hit it.
    assert aff.prefix_cache_hit_tokens % 256 == 0 and rr.prefix_cache_hit_tokens % 256 == 0
    assert aff.prefix_cache_hit_tokens <= (400 - 8) * 256
    assert sum(r.prefix_cache_hit_tokens for r in aff.replicas) == aff.prefix_cache_hit_tokens


def test_a_prefix_hit_skips_the_prefix_prefill():
    """Same prefix twice on one replica: the second prompt computes only its own tokens."""
    wl = workload_from([{"arrival_time": 0.0, "prompt_len": 300, "output_len": 2, "prefix_id": 7, "prefix_len": 256},
                        {"arrival_time": 10.0, "prompt_len": 300, "output_len": 2, "prefix_id": 7, "prefix_len": 256},
                        {"arrival_time": 20.0, "prompt_len": 300, "output_len": 2, "prefix_id": 8, "prefix_len": 256}])
    r = simulate(wl, 1, COST)
    ttft = [x.ttft for x in r.requests]
    assert ttft == pytest.approx([COST.step_time(300), COST.step_time(44), COST.step_time(300)])
    assert r.prefix_cache_hit_tokens == 256
    none = simulate(wl, 1, COST, replica_config=ReplicaConfig(prefix_cache_slots=0))
    assert none.prefix_cache_hit_tokens == 0 and none.requests[1].ttft == pytest.approx(COST.step_time(300))


def test_prefix_affinity_falls_back_when_home_is_down():
    wl = make_workload(200, rate=3.0, prompt_len=32, output_len=8, num_prefixes=1, prefix_len=128, seed=0)
    r = simulate(wl, 3, COST, "prefix_affinity")
    home = {x.replica_id for x in r.requests}
    assert len(home) == 1  # one prefix, one home
    (h,) = home
    down = simulate(wl, 3, COST, "prefix_affinity", failures=[Failure(h, 20.2)], health_check_interval=1.0)
    assert down.completed == 200
    assert {x.replica_id for x in down.requests if x.arrival_time > 22} - {h}
    assert not any(x.replica_id == h for x in down.requests if x.arrival_time > 22)


# --- scale is not latency -------------------------------------------------------------------


def test_more_replicas_cut_the_tail_but_not_one_requests_latency():
    wl = make_workload(400, rate=4.0, prompt_len=128, output_len=32, seed=0)
    alone = COST.request_latency(128, 32, 512)
    p95 = []
    for n in (1, 2, 4, 8):
        r = simulate(wl, n, COST, "least_outstanding")
        p95.append(r.e2e.p95)
        assert min(x.e2e for x in r.requests) >= alone - 1e-9  # never faster than alone
    assert all(a > b for a, b in zip(p95, p95[1:]))
    assert p95[-1] < 1.5 * alone and p95[0] > 10 * alone


# --- queueing theory --------------------------------------------------------------------------


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_one_replica_batch_one_matches_md1(rho):
    """Poisson arrivals, one server, a fixed service time S: the M/D/1 queue.
    Pollaczek-Khinchine gives the mean wait in the queue: Wq = rho * S / (2 (1 - rho))."""
    cfg = ReplicaConfig(max_num_seqs=1, max_num_batched_tokens=1024)
    S = COST.request_latency(100, 5)
    wl = make_workload(10000, rate=rho / S, prompt_len=100, output_len=5, seed=3)
    r = simulate(wl, 1, COST, "round_robin", cfg)
    wq = rho * S / (2 * (1 - rho))
    assert r.queue_wait.mean == pytest.approx(wq, rel=0.08)
    assert r.e2e.mean - r.queue_wait.mean == pytest.approx(S)  # service itself is deterministic
    assert r.replicas[0].utilization == pytest.approx(rho, rel=0.05)


# --- disaggregation ---------------------------------------------------------------------------


def test_kv_transfer_time_lands_between_first_and_second_token():
    link = KVLink(bandwidth_bytes_per_s=1e9, latency_s=0.01)
    wl = workload_from([{"arrival_time": 0.0, "prompt_len": 400, "output_len": 5}])
    r = simulate_disaggregated(wl, 1, 1, COST, link, kv_bytes_per_token=1e5)
    transfer = 400 * 1e5 / 1e9 + 0.01
    assert r.ttft.mean == pytest.approx(COST.step_time(400))
    assert r.e2e.mean == pytest.approx(COST.step_time(400) + transfer + 4 * COST.step_time(decode_seqs=1))
    assert r.extra["kv_transfer"]["mean"] == pytest.approx(transfer)
    assert r.extra["kv_bytes_sent"] == 400 * 1e5


def test_disaggregation_helps_decode_when_long_prompts_interfere():
    """Colocated: a 512-token prefill chunk rides in the same step as everyone's decode,
    so decoders stall for ~1 s. Split pools: decode steps carry decode only."""
    wl = make_workload(200, rate=0.5, prompt_len=(1024, 2048), output_len=(64, 128), seed=0)
    res = compare_disaggregation(wl, 2, 2, COST, KVLink(50e9, 10e-6))
    co, dis = res["colocated"], res["disaggregated"]
    assert accounted(co) and accounted(dis) and dis.completed == 200
    assert dis.tpot.p95 < 0.7 * co.tpot.p95
    assert dis.itl.p99 < 0.2 * co.itl.p99
    assert dis.ttft.p95 > co.ttft.p95  # the price: half the machines prefill


def test_disaggregation_does_not_help_short_prompts():
    """Nothing to separate: prefills are tiny, and only half the machines decode."""
    wl = make_workload(200, rate=1.5, prompt_len=(16, 64), output_len=(64, 128), seed=0)
    res = compare_disaggregation(wl, 2, 2, COST, KVLink(50e9, 10e-6))
    assert res["disaggregated"].tpot.p50 > res["colocated"].tpot.p50
    assert res["disaggregated"].e2e.p95 > res["colocated"].e2e.p95


def test_a_slow_link_eats_the_gain():
    wl = make_workload(200, rate=0.5, prompt_len=(1024, 2048), output_len=(64, 128), seed=0)
    fast = simulate_disaggregated(wl, 2, 2, COST, KVLink(50e9, 10e-6))
    slow = simulate_disaggregated(wl, 2, 2, COST, KVLink(0.05e9, 1e-3))  # 400 Mbit/s
    co = simulate(wl, 4, COST)
    assert slow.tpot.p50 > co.tpot.p50 > fast.tpot.p50
    assert slow.extra["kv_transfer"]["mean"] > 100 * fast.extra["kv_transfer"]["mean"]


# --- calibration against the real model ------------------------------------------------------


def test_calibrate_names_what_it_needs():
    with pytest.raises(ValueError, match="calibrate"):
        calibrate(object())


# No test here compares a measured time with a bound: the suite shares the cores
# with its own notebook streams (and a laptop with a browser), so a real step can
# take any time. The fit's arithmetic is checked with scripted timings; the real
# model is only asked to produce numbers. How well the fit predicts this machine
# is a benchmark's question (benchmarks/fleet_calibrate.py prints the ratios).


def _finite_positive(*xs):
    return all(math.isfinite(x) and x > 0 for x in xs)


@pytest.mark.slow
def test_calibrate_measures_the_real_model(llm):
    _fit_cost = importlib.import_module("tinyinfer_course.fleet.calibrate")._fit_cost

    cost, m = calibrate(llm, return_measurements=True)
    assert [T for T, _ in m["prefill"]] == [16, 64, 128] and [B for B, _ in m["decode"]] == [1, 4, 8]
    assert _finite_positive(*(t for _, t in m["prefill"] + m["decode"]))
    assert cost == _fit_cost(m["prefill"], m["decode"], False)  # the model is the fit of its own points
    assert math.isfinite(simulate(make_workload(20, rate=1.0), 1, cost).e2e.p95)


def test_calibrate_fits_the_lines_through_scripted_timings(monkeypatch, tiny_dir):
    """Each measured point lands on the right axis: with timings scripted on two
    known lines, the fit gives back their slopes and the decode intercept."""
    from tinyinfer import LLM

    cal = importlib.import_module("tinyinfer_course.fleet.calibrate")  # the module (the package exports the function)

    true = StepCostModel(prefill_s_per_token=3e-4, decode_base_s=0.02, decode_s_per_seq=4e-3)
    script = [0.005 + true.prefill_s_per_token * T for T in (16, 64, 128)]
    script += [true.step_time(decode_seqs=B) for B in (1, 4, 8)]
    calls = iter(script)

    def scripted_best_time(fn, device, repeats):
        fn()  # the real forward pass still runs: shapes and caches are exercised
        return next(calls)

    monkeypatch.setattr(cal, "best_time", scripted_best_time)
    llm = LLM(tiny_dir, dtype="float32", device="cpu", num_kv_blocks=64)
    cost, m = calibrate(llm, return_measurements=True)
    assert [t for _, t in m["prefill"] + m["decode"]] == script
    for name in ("prefill_s_per_token", "decode_base_s", "decode_s_per_seq"):
        assert getattr(cost, name) == pytest.approx(getattr(true, name), rel=1e-9), name


def test_fit_steps_recovers_a_plane_and_clips_noise_below_zero():
    from tinyinfer_course.fleet import fit_steps

    true = StepCostModel(prefill_s_per_token=0.5e-3, decode_base_s=0.02, decode_s_per_seq=2e-3)
    shapes = [(16, 0), (64, 0), (128, 0), (0, 1), (0, 2), (0, 8), (64, 1), (64, 8)]
    fit = fit_steps((p, d, true.step_time(prefill_tokens=p, decode_seqs=d)) for p, d in shapes)
    for name in ("prefill_s_per_token", "decode_base_s", "decode_s_per_seq"):
        assert getattr(fit, name) == pytest.approx(getattr(true, name), rel=1e-9)
    # decode steps that get cheaper with batch (pure noise) give a slope of 0, not a negative one
    flat = fit_steps([(0, 1, 0.03), (0, 4, 0.029), (0, 8, 0.028), (64, 0, 0.06)])
    assert flat.decode_s_per_seq == 0.0
    with pytest.raises(ValueError, match="at least 3"):
        fit_steps([(0, 1, 0.03)])


class _ScriptedClock:
    """A clock for calibrate_steps: read before a step, it gives the time; read
    after it, it moves on by what `true` says a step of the engine's last batch
    costs. So every timed step costs exactly its plane value, whatever the CPU does."""

    def __init__(self, engine, true: StepCostModel):
        self.engine, self.true, self.now, self.after = engine, true, 100.0, False

    def __call__(self) -> float:
        if self.after:
            s = self.engine.stats
            self.now += self.true.step_time(prefill_tokens=s.num_prefill_tokens, decode_seqs=s.num_decode_tokens)
        self.after = not self.after
        return self.now


@pytest.mark.slow
def test_calibrate_steps_times_every_kind_of_step(llm):
    from tinyinfer_course.fleet import calibrate_steps, fit_steps

    engine = llm.llm_engine
    true = StepCostModel(prefill_s_per_token=3e-4, decode_base_s=0.02, decode_s_per_seq=4e-3)
    cost, m = calibrate_steps(engine, prompt_lens=(16, 48), batch_sizes=(1, 3), repeats=2,
                              return_measurements=True, clock=_ScriptedClock(engine, true))
    assert {(p, d) for p, d, _ in m["steps"]} == {(16, 0), (48, 0), (0, 1), (0, 3), (48, 1), (48, 3)}
    kinds = {(p > 0, d > 0) for p, d, _ in m["steps"]}
    assert kinds == {(True, False), (False, True), (True, True)}  # prompts, decodes, and both at once
    assert not engine.has_unfinished_requests()
    for p, d, t in m["steps"]:  # each point carries the time of the step it names
        assert t == pytest.approx(true.step_time(prefill_tokens=p, decode_seqs=d), rel=1e-9), (p, d)
    for name in ("prefill_s_per_token", "decode_base_s", "decode_s_per_seq"):
        assert getattr(cost, name) == pytest.approx(getattr(true, name), rel=1e-6), name
    with pytest.raises(ValueError, match=r"batch_sizes=\(1, 99\) is invalid: each must be in \[1, "):
        calibrate_steps(engine, batch_sizes=(1, 99))
    # the real clock: numbers come out, and the plane is the fit of its own points
    cost, m = calibrate_steps(engine, prompt_lens=(16, 48), batch_sizes=(1, 3), repeats=1, return_measurements=True)
    assert all(math.isfinite(t) and t > 0 for _, _, t in m["steps"])
    assert cost == fit_steps(m["steps"])
    assert not engine.has_unfinished_requests()
