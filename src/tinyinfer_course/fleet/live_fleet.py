"""A real fleet on one machine: N `tinyinfer serve` replicas behind vLLM's router.

The simulator (simulator.py, with its simulated replicas in sim_replica.py)
predicts what a load balancer does; this module starts the processes of a real
one, and live_replay.py sends requests through it and measures them. Every
replica is a `tinyinfer serve` process on a free port of 127.0.0.1, and the
router is `vllm-router` (pip install vllm-router; a Rust program, wheels for
Linux x86_64 only), which sends each request to a replica by its policy:

  round_robin    take turns
  power_of_two   two replicas at random, the one with the smaller load; the
                 router polls each replica's GET /get_load every few seconds
  cache_aware    the replica whose past prompts share the longest prefix with
                 this one (a tree of prompt text per replica), unless the
                 replicas' loads differ too much; then the least loaded

    from tinyinfer_course.fleet.live_fleet import start_fleet
    with start_fleet(2, "cache_aware", model="smollm2-135m-instruct") as fleet:
        print(fleet.url)                  # the router: an OpenAI-compatible base URL
        print(fleet.served())             # requests each replica has finished

What a replica must offer the router, `tinyinfer serve` has: GET /health (the
router waits for it before it starts, then checks it), GET /get_load
(power_of_two) and /metrics with vLLM's names.

Each process starts in a process group of its own (a new session), and stop()
signals the whole group, so the engine-core process each replica spawns goes
with it: leaving the `with` block, an exception, Ctrl-C and a failed start all
stop every process this module started.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tinyinfer.server.background import free_port

ROUTER = "vllm-router"
ROUTER_POLICIES = ("round_robin", "power_of_two", "cache_aware", "random", "consistent_hash")
# The simulator's nearest policy to each router policy (router.py). cache_aware is
# not prefix_affinity: it matches prompt text in a tree and balances on load; the
# simulator sends a prefix id to its hashed home replica.
SIM_POLICY = {"round_robin": "round_robin", "power_of_two": "power_of_two", "cache_aware": "prefix_affinity",
              "random": "power_of_two", "consistent_hash": "prefix_affinity"}
INSTALL_HINT = ("pip install 'tinyinfer[fleet]' (or pip install vllm-router==0.1.17); its wheels are for "
                "Linux on x86_64 only")


class RouterMissing(RuntimeError):
    """vllm-router is not installed (or has no wheel for this machine)."""


class FleetError(RuntimeError):
    """A replica or the router did not start; the message holds the tail of its log."""


def router_binary() -> str | None:
    """The vllm-router program: beside this Python first (a venv not on PATH), else on PATH."""
    beside = Path(sys.executable).parent / ROUTER
    if beside.exists():
        return str(beside)
    return shutil.which(ROUTER)


def split_threads(n: int, total: int | None = None) -> int:
    """Torch threads per replica: the cores shared out, at least one each. Two
    replicas with two threads each on two cores would fight over every core."""
    total = total or os.cpu_count() or 1
    return max(1, total // n)


@dataclass
class Proc:
    """One process this fleet started, with its log file."""

    name: str
    popen: subprocess.Popen
    log: Path

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


@dataclass
class Fleet:
    """A running fleet: the router's URL, each replica's, and the processes."""

    url: str  # the router
    replica_urls: list[str]
    policy: str
    threads_per_replica: int
    log_dir: Path
    procs: list[Proc] = field(default_factory=list)

    @property
    def pids(self) -> list[int]:
        return [p.popen.pid for p in self.procs]

    def metrics(self) -> list[dict[str, float]]:
        """Each replica's /metrics, as {series name: value} (histogram buckets left out)."""
        return [scrape(u) for u in self.replica_urls]

    def served(self) -> list[int]:
        """How many requests each replica has finished (vllm:request_success_total)."""
        return [int(m.get("vllm:request_success_total", 0)) for m in self.metrics()]

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM to every process group (the router first, so no new request
        reaches a dying replica), then SIGKILL to any group still there."""
        for p in reversed(self.procs):
            _signal_group(p.popen, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for p in reversed(self.procs):
            try:
                p.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(p.popen, signal.SIGKILL)  # the group's other members too (the engine core)
            p.popen.wait()
            # wait() reaps the group's leader only. A killed engine core may still be
            # running for a moment on a busy machine: stop() returns once it is gone.
            _wait_for_group(p.popen.pid, deadline=time.monotonic() + 10)
        self.procs.clear()

    def __enter__(self) -> "Fleet":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of a process group, from /proc on Linux;
    elsewhere, [pgid] while the group can still be signalled."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except (ProcessLookupError, PermissionError):
            return []
    members = []
    for stat in proc.glob("[0-9]*/stat"):
        try:
            state, _ppid, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(group) == pgid and state != "Z":
            members.append(int(stat.parent.name))
    return members


def _wait_for_group(pgid: int, deadline: float) -> None:
    while _group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _signal_group(popen: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(popen.pid, sig)  # the child leads its own group (start_new_session)
    except (ProcessLookupError, PermissionError):
        pass


def scrape(url: str) -> dict[str, float]:
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10, trust_env=False).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if "le" not in s.labels:  # sums over labels (request_success_total has one per reason)
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def serve_command(model: str, port: int, dtype: str, max_num_seqs: int, extra=()) -> list[str]:
    return [sys.executable, "-m", "tinyinfer", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--model", model, "--dtype", dtype, "--device", "cpu", "--max-num-seqs", str(max_num_seqs),
            "--log-level", "warning", *extra]


def router_command(binary: str, port: int, replica_urls: list[str], policy: str) -> list[str]:
    return [binary, "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *replica_urls,
            "--policy", policy, "--worker-startup-check-interval", "1",
            # its own metrics on a free port, so two fleets can run at once (default 29000)
            "--prometheus-port", str(free_port()), "--log-level", "warning"]


def start_fleet(n: int = 2, policy: str = "round_robin", model: str | None = None, *, dtype: str = "float32",
                threads: int | None = None, max_num_seqs: int = 8, serve_args=(), log_dir=None,
                startup_timeout_s: float = 300.0) -> Fleet:
    """Start n replicas of `model` and vllm-router in front of them; return the
    Fleet once the router answers (use it in a `with` block: it stops them all).
    threads: torch threads per replica (default: the cores shared out). Raises
    RouterMissing when vllm-router is not installed (nothing is started then)."""
    from tinyinfer.checks import check_int
    from tinyinfer.config import DEFAULT_MODEL

    check_int("n", n, 1)
    if policy not in ROUTER_POLICIES:
        raise ValueError(f"policy={policy!r} is invalid: must be one of {ROUTER_POLICIES}")
    binary = router_binary()
    if binary is None:
        raise RouterMissing(f"{ROUTER} is not installed: {INSTALL_HINT}")
    threads = threads or split_threads(n)
    check_int("threads", threads, 1)
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="tinyinfer-fleet-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
    ports = [free_port() for _ in range(n)]
    fleet = Fleet("", [f"http://127.0.0.1:{p}" for p in ports], policy, threads, log_dir)
    try:
        for i, port in enumerate(ports):
            cmd = serve_command(model or DEFAULT_MODEL, port, dtype, max_num_seqs, serve_args)
            fleet.procs.append(_spawn(f"replica {i}", cmd, log_dir / f"replica-{i}.log", env))
        deadline = time.monotonic() + startup_timeout_s
        for url, proc in zip(fleet.replica_urls, fleet.procs):
            _wait_healthy(url + "/health", proc, deadline)
        router_port = free_port()
        fleet.url = f"http://127.0.0.1:{router_port}"
        fleet.procs.append(_spawn("router", router_command(binary, router_port, fleet.replica_urls, policy),
                                  log_dir / "router.log", env))
        _wait_healthy(fleet.url + "/health", fleet.procs[-1], time.monotonic() + 60)
    except BaseException:  # a failed start, or Ctrl-C while waiting: nothing is left behind
        fleet.stop()
        raise
    return fleet


def _spawn(name: str, cmd: list[str], log: Path, env: dict) -> Proc:
    with open(log, "wb") as f:  # the child keeps its own copy of the descriptor
        popen = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                 start_new_session=True)  # its own process group: stop() signals all of it
    return Proc(name, popen, log)


def _wait_healthy(url: str, proc: Proc, deadline: float) -> None:
    import httpx

    while True:
        if proc.popen.poll() is not None:
            raise FleetError(f"{proc.name} exited with code {proc.popen.returncode} before it was ready; "
                             f"the end of its log ({proc.log}):\n{proc.tail()}")
        try:
            if httpx.get(url, timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise FleetError(f"{proc.name} did not answer {url} in time; the end of its log ({proc.log}):\n"
                             f"{proc.tail()}")
        time.sleep(0.25)


# ------------------------------------------------------------------ `tinyinfer fleet`


def add_arguments(p) -> None:
    p.description = ("Start N `tinyinfer serve` replicas and vLLM's router in front of them on 127.0.0.1, "
                     "print the router's address and keep them running until Ctrl-C, which stops them all. "
                     "Without vllm-router (Linux x86_64 only) it says so and runs the fleet simulator instead.")
    p.add_argument("--replicas", type=int, default=2, help="replicas to start (default 2)")
    p.add_argument("--policy", default="round_robin", choices=ROUTER_POLICIES, help="the router's policy")
    p.add_argument("--model", default=None, help="the model each replica serves (default: the course's)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads per replica (default: this machine's cores shared out)")
    p.add_argument("--max-num-seqs", type=int, default=8)
    p.add_argument("--requests", type=int, default=0,
                   help="send this many short requests through the router, print how many each replica "
                        "served, and stop (default 0: keep running until Ctrl-C)")


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def run(args) -> int:
    # `kill` (SIGTERM) stops the fleet as Ctrl-C does: both unwind through start_fleet or the with block.
    import threading

    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        return _run(args)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _run(args)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(args) -> int:
    try:
        fleet = start_fleet(args.replicas, args.policy, args.model, dtype=args.dtype, threads=args.threads,
                            max_num_seqs=args.max_num_seqs)
    except RouterMissing as e:
        print(f"tinyinfer fleet: {e}.\nRunning the fleet simulator instead (tinyinfer_course.fleet.simulate), with "
              f"its policy {SIM_POLICY[args.policy]!r} for the router's {args.policy!r}:\n", file=sys.stderr)
        return _simulate_instead(args)
    with fleet:
        print(f"router   {fleet.url}  (policy {fleet.policy}, pid {fleet.procs[-1].popen.pid})")
        for i, (url, p) in enumerate(zip(fleet.replica_urls, fleet.procs)):
            print(f"replica {i} {url}  (pid {p.popen.pid}, {fleet.threads_per_replica} torch threads)")
        print(f"logs in {fleet.log_dir}", flush=True)
        if args.requests:
            return _send_some(fleet, args.requests)
        print(f"OpenAI base URL: {fleet.url}/v1. Ctrl-C stops every process.", flush=True)
        try:
            while all(p.popen.poll() is None for p in fleet.procs):
                time.sleep(0.5)
        except KeyboardInterrupt:
            print("\nstopping the fleet", flush=True)
            return 130
        dead = next(p for p in fleet.procs if p.popen.poll() is not None)
        print(f"{dead.name} exited (code {dead.popen.returncode}); stopping the rest. Its log:\n{dead.tail()}",
              file=sys.stderr)
        return 1


def _send_some(fleet: Fleet, n: int) -> int:
    import httpx

    before = fleet.served()
    for i in range(n):
        body = {"prompt": f"Request {i}: the weather today is", "max_tokens": 4, "temperature": 0}
        httpx.post(fleet.url + "/v1/completions", json=body, timeout=120, trust_env=False).raise_for_status()
    counts = [b - a for a, b in zip(before, fleet.served())]
    print(f"{n} requests through the router ({fleet.policy}): " +
          ", ".join(f"replica {i} served {c}" for i, c in enumerate(counts)), flush=True)
    return 0


def _simulate_instead(args) -> int:
    from .simulator import simulate
    from .workload import make_workload

    # A workload like the live benchmark's, without text: shared prefixes, short replies.
    wl = make_workload(60, rate=2.0, prompt_len=(16, 48), output_len=8, num_prefixes=3, prefix_len=192, seed=0)
    print(simulate(wl, replicas=args.replicas, policy=SIM_POLICY[args.policy]))
    return 0
