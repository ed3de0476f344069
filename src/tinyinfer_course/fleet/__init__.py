"""tinyinfer_course.fleet: what happens between many users and many replicas.

One engine answers one question (how fast is a step?); a fleet answers the
next ones: how long do requests wait, where do they go, what happens when a
machine dies, and does splitting prefill from decode help? This package is a
discrete-event simulator of N replicas behind a load balancer, whose step
times come from a cost model fitted to the real engine (`calibrate`).

    from tinyinfer_course.fleet import make_workload, simulate
    wl = make_workload(500, rate=2.0, prompt_len=(32, 512), output_len=(16, 256), seed=0)
    print(simulate(wl, replicas=4, policy="least_outstanding"))

The real thing, on one machine: live_fleet.start_fleet runs `tinyinfer serve`
replicas behind vLLM's router (`tinyinfer fleet`), live_replay measures a policy
there and simulates the same requests, and reports/router.py renders the stored
comparison (`make fleet`, chapter 8). They are imported by name, not from here.
"""
from .calibrate import calibrate, calibrate_steps, fit_steps
from .cost import StepCostModel
from .disagg import KVLink, compare_disaggregation, simulate_disaggregated
from .sim_replica import ReplicaConfig
from .report import FleetReport, ReplicaStats, RequestResult
from .router import POLICIES, make_policy
from .simulator import Autoscale, Failure, simulate
from .workload import SimRequest, make_chat_workload, make_workload, workload_from

__all__ = [
    "SimRequest", "make_workload", "make_chat_workload", "workload_from",
    "StepCostModel", "calibrate", "calibrate_steps", "fit_steps",
    "ReplicaConfig", "POLICIES", "make_policy",
    "Failure", "Autoscale", "simulate",
    "KVLink", "simulate_disaggregated", "compare_disaggregation",
    "FleetReport", "ReplicaStats", "RequestResult",
]
