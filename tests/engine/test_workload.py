"""tinyinfer.workload: the arrivals and lengths the load generator and the fleet simulator share."""
import numpy as np
import pytest
from tinyinfer_course.fleet import make_workload


def test_shared_length_distributions_take_a_function_and_check_what_it_returns():
    from tinyinfer.workload import sample_lengths

    rng = np.random.default_rng(0)
    assert sample_lengths(lambda g, n: [7] * n, 3, rng) == [7, 7, 7]
    for bad in (lambda g, n: [7] * (n - 1), lambda g, n: [0] * n):
        with pytest.raises(ValueError, match="output_len"):
            sample_lengths(bad, 3, rng, "output_len")


def test_a_fleet_workload_and_a_benchmark_share_one_arrival_process():
    from tinyinfer.workload import arrival_times

    work = make_workload(50, rate=4.0, prompt_len=8, output_len=8, seed=5)  # fixed lengths draw nothing more
    times = arrival_times(50, 4.0, "poisson", seed=np.random.default_rng(5))
    assert [r.arrival_time for r in work] == pytest.approx(times.tolist())
    assert times[0] == 0 and (np.diff(times) >= 0).all()
