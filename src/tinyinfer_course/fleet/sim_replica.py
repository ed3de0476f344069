"""One simulated serving replica: a continuous-batching engine reduced to its timing.
(The real replicas, `tinyinfer serve` processes, are live_fleet.py's.)

The real scheduler (tinyinfer.scheduler, like vLLM's) decides every step which
sequences run. Here a simpler set of rules with the same budgets decides, and
the StepCostModel's estimate of how long the step takes replaces the forward
pass. The rules, in order:

  1. every running sequence that has finished its prompt decodes one token
     (running requests go first: starving them would stall replies mid-stream);
  2. partly prefilled prompts continue, in chunks, while the step's token
     budget (max_num_batched_tokens) lasts; this is chunked prefill;
  3. waiting requests are admitted first-come-first-served while there is
     budget, a free batch slot (max_num_seqs) and room in the KV cache.

Where the real scheduler differs: it walks the running requests oldest first,
giving each its decode token or its next prefill chunk, so an old prompt's
chunk can come before a younger request's decode; here every decode goes first.
And here KV space is reserved for prompt + output when a request is admitted, so a running request
can never run out of cache and nothing needs preempting. (tinyinfer and vLLM
allocate blocks as tokens arrive and preempt when they run out; reserving up
front errs on the side of admitting fewer requests.)
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from tinyinfer.checks import check_int, is_int, require
from tinyinfer.config import EngineConfig
from .cost import StepCostModel
from .workload import SimRequest

ROLES = ("both", "prefill", "decode")
_ENGINE_DEFAULTS = EngineConfig()  # a simulated replica starts from the real engine's defaults


@dataclass(frozen=True)
class ReplicaConfig:
    max_num_seqs: int = _ENGINE_DEFAULTS.max_num_seqs  # batch slots: sequences running at once
    max_num_batched_tokens: int = _ENGINE_DEFAULTS.max_num_batched_tokens  # token budget per step
    kv_capacity_tokens: int = 65536  # KV cache size, in tokens, all sequences together
    max_queue_len: int | None = None  # waiting requests before new ones are refused; None: unbounded
    prefix_cache_slots: int = 8  # distinct shared prefixes whose KV the replica keeps (LRU)

    def __post_init__(self):
        for name in ("max_num_seqs", "max_num_batched_tokens", "kv_capacity_tokens"):
            check_int(f"ReplicaConfig.{name}", getattr(self, name), 1)
        q = self.max_queue_len
        require(q is None or (is_int(q) and q >= 0), "ReplicaConfig.max_queue_len", q, "None or an integer >= 0")
        check_int("ReplicaConfig.prefix_cache_slots", self.prefix_cache_slots, 0)


@dataclass(eq=False)
class RequestState:
    """A request's progress. One object follows a request across retries; the
    per-attempt fields are reset by `restart` when its replica dies."""

    req: SimRequest
    retries: int = 0
    rejected: str | None = None  # why, if the fleet refused it
    replica_id: int | None = None  # where it is (or was last) served
    prefill_left: int = 0
    generated: int = 0
    kv_reserved: int = 0
    admit_time: float | None = None  # first time a replica scheduled it (end of queueing)
    token_times: list[float] = field(default_factory=list)
    finish_time: float | None = None

    def __post_init__(self):
        self.prefill_left = self.req.prompt_len

    def restart(self) -> None:
        """The replica died with our KV cache in it: the prompt must be computed
        again. The client sees a fresh attempt (the failed one's tokens are dropped),
        but its clock keeps running from the original arrival."""
        self.retries += 1
        self.prefill_left, self.generated, self.kv_reserved = self.req.prompt_len, 0, 0
        self.admit_time, self.token_times = None, []

    @property
    def done(self) -> bool:
        return self.finish_time is not None or self.rejected is not None


@dataclass
class Batch:
    """What one step computes."""

    decodes: list[RequestState]
    prefills: list[tuple[RequestState, int]]  # (request, chunk of prompt tokens)
    duration: float = 0.0


class Replica:
    def __init__(self, replica_id: int, config: ReplicaConfig, cost: StepCostModel,
                 role: str = "both", start_time: float = 0.0):
        if role not in ROLES:
            raise ValueError(f"role={role!r} is invalid: must be one of {ROLES}")
        self.id, self.config, self.cost, self.role = replica_id, config, cost, role
        self.waiting: deque[RequestState] = deque()
        self.running: list[RequestState] = []
        self.kv_used = 0
        self.prefix_cache: OrderedDict[int, None] = OrderedDict()
        self.alive = True  # the truth; the load balancer only learns it at health checks
        self.retired = False  # removed by the autoscaler
        self.stepping = False  # a forward pass is in flight
        self.step_started = 0.0
        self.epoch = 0  # bumped on failure, so a dead pass's completion event is ignored
        self.idle_since = start_time
        # Statistics for the report.
        self.busy_time = 0.0
        self.alive_time = 0.0
        self.alive_since = start_time
        self.steps = 0
        self.completed = 0
        self.prefix_hit_tokens = 0

    # --- what the load balancer can see ----------------------------------------

    @property
    def outstanding(self) -> int:
        """Requests sent here and not yet finished: what least-outstanding routing counts."""
        return len(self.waiting) + len(self.running)

    def queue_full(self) -> bool:
        return self.config.max_queue_len is not None and len(self.waiting) >= self.config.max_queue_len

    def kv_needed(self, state: RequestState) -> int:
        if self.role == "prefill":  # the prompt's KV only; it leaves with the request
            return state.req.prompt_len
        return state.req.prompt_len + state.req.output_len

    def can_ever_fit(self, state: RequestState) -> bool:
        return self.kv_needed(state) <= self.config.kv_capacity_tokens

    # --- scheduling ----------------------------------------------------------------

    def schedule(self, now: float) -> Batch:
        """Choose this step's work (the three rules in the module docstring)."""
        budget = self.config.max_num_batched_tokens
        decodes = [s for s in self.running if s.prefill_left == 0][:budget]
        budget -= len(decodes)
        prefills = []
        for s in self.running:
            if s.prefill_left > 0 and budget > 0:
                chunk = min(s.prefill_left, budget)
                prefills.append((s, chunk))
                budget -= chunk
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            s = self.waiting[0]
            need = self.kv_needed(s)
            if self.kv_used + need > self.config.kv_capacity_tokens:
                break  # first come, first served: later requests wait behind it too
            self.waiting.popleft()
            self._admit(s, need, now)
            if s.prefill_left == 0:  # arrived with its prompt done (a decode-pool replica)
                decodes.append(s)
                budget -= 1
            else:
                chunk = min(s.prefill_left, budget)
                prefills.append((s, chunk))
                budget -= chunk
        return Batch(decodes, prefills)

    def _admit(self, s: RequestState, need: int, now: float) -> None:
        self.kv_used += need
        s.kv_reserved = need
        if s.admit_time is None:
            s.admit_time = now
        pid = s.req.prefix_id
        if (self.role != "decode" and pid is not None and pid in self.prefix_cache
                and s.prefill_left == s.req.prompt_len):
            # A cache hit: the shared prefix's keys and values are already here.
            s.prefill_left -= s.req.prefix_len
            self.prefix_hit_tokens += s.req.prefix_len
            self.prefix_cache.move_to_end(pid)
        self.running.append(s)

    def complete(self, batch: Batch, now: float) -> tuple[list[RequestState], list[RequestState]]:
        """Apply a finished step: every decode adds a token; a prompt whose last
        chunk ran produces its first token. Returns (finished, prefilled) where
        `prefilled` are the requests a prefill-pool replica hands on."""
        finished, prefilled = [], []
        for s in batch.decodes:
            s.generated += 1
            s.token_times.append(now)
        for s, chunk in batch.prefills:
            s.prefill_left -= chunk
            if s.prefill_left == 0:
                self._remember_prefix(s.req)
                s.generated += 1  # the last prompt position's logits give token 1
                s.token_times.append(now)
                if self.role == "prefill":
                    prefilled.append(s)
        for s in batch.decodes + [s for s, _ in batch.prefills]:
            if s.generated >= s.req.output_len and s not in finished:
                finished.append(s)
        for s in finished + [p for p in prefilled if p not in finished]:
            self.running.remove(s)
        for s in finished:
            self.release(s.kv_reserved)
            s.finish_time = now
            self.completed += 1
        return finished, [p for p in prefilled if p not in finished]

    def _remember_prefix(self, req: SimRequest) -> None:
        if req.prefix_id is None or req.prefix_len == 0 or self.config.prefix_cache_slots == 0:
            return
        self.prefix_cache[req.prefix_id] = None
        self.prefix_cache.move_to_end(req.prefix_id)
        while len(self.prefix_cache) > self.config.prefix_cache_slots:
            self.prefix_cache.popitem(last=False)  # evict the least recently used

    def release(self, kv_tokens: int) -> None:
        self.kv_used -= kv_tokens

    def step_time(self, batch: Batch) -> float:
        context = sum(s.req.prompt_len + s.generated for s in batch.decodes)
        return self.cost.step_time(sum(c for _, c in batch.prefills), len(batch.decodes), context)

    # --- failure -------------------------------------------------------------------

    def fail(self, now: float) -> list[RequestState]:
        """The process dies: every request on it is stranded, its cache is gone."""
        stranded = list(self.running) + list(self.waiting)
        self.running, self.waiting = [], deque()
        self.kv_used = 0
        self.prefix_cache.clear()
        self.alive, self.stepping = False, False
        self.epoch += 1
        self.alive_time += now - self.alive_since
        return stranded

    def recover(self, now: float) -> None:
        self.alive, self.alive_since, self.idle_since = True, now, now

    def close(self, now: float) -> None:
        """Stop the clock for utilisation (end of the run, or retired)."""
        if self.alive and not self.retired:
            self.alive_time += now - self.alive_since
            self.alive_since = now

    @property
    def utilization(self) -> float:
        return self.busy_time / self.alive_time if self.alive_time > 0 else 0.0
