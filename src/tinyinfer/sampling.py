"""SamplingParams and sampling: how a row of logits becomes one token.

The pipeline, in vLLM's order:
  logits -> repetition penalty -> temperature -> min-p -> top-k -> top-p -> draw
Temperature 0 means greedy: take the highest score (after the penalty).
Every step is a small function on one row, so a lab can swap in its own and a
chapter can show the distribution after each step. processed_probs_batch is
the same pipeline for many rows at once; the engine's Sampler (sampler.py) runs
it over a step's batch. The helpers that show a chapter the next-token
distribution live in inspect.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .checks import is_int, is_number, require
from .outputs import PositionLogprobs
from .structured_output import StructuredOutputsParams

_INF = float("inf")


@dataclass
class SamplingParams:
    """Per-request generation settings; field names and meanings follow vLLM."""

    n: int = 1  # parallel samples of the same prompt (they share its KV blocks)
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0: no top-k cut (vLLM accepts both; its default is now 0)
    min_p: float = 0.0  # keep tokens with probability >= min_p * the top token's; 0: off
    repetition_penalty: float = 1.0
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    logprobs: int | None = None  # top-N logprobs per generated token
    prompt_logprobs: int | None = None  # top-N logprobs per prompt token
    ignore_eos: bool = False
    structured_outputs: StructuredOutputsParams | None = None  # a grammar the reply must follow (structured_output.py)

    def __post_init__(self):
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams.from_dict(self.structured_outputs)
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        self.validate()

    def validate(self) -> None:
        def check(ok: bool, name: str, allowed: str) -> None:
            require(ok, f"SamplingParams.{name}", getattr(self, name), allowed)

        check(is_int(self.n) and self.n >= 1, "n", "an integer >= 1")
        check(is_int(self.max_tokens) and self.max_tokens >= 1, "max_tokens", "an integer >= 1")
        check(is_number(self.temperature) and self.temperature >= 0, "temperature", ">= 0 (0 means greedy)")
        check(is_number(self.top_p) and 0 < self.top_p <= 1, "top_p", "in (0, 1]")
        check(is_int(self.top_k) and self.top_k >= -1, "top_k", "-1 or 0 (off), or an integer >= 1")
        check(is_number(self.min_p) and 0 <= self.min_p <= 1, "min_p", "in [0, 1] (0 means off)")
        check(is_number(self.repetition_penalty) and self.repetition_penalty > 0, "repetition_penalty",
              "> 0 (1 means off)")
        check(all(isinstance(s, str) and s for s in self.stop), "stop", "non-empty strings")
        check(self.seed is None or is_int(self.seed), "seed", "None or an integer")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            check(value is None or (is_int(value) and value >= 0), name, "None or an integer >= 0")
        check(self.structured_outputs is None or isinstance(self.structured_outputs, StructuredOutputsParams),
              "structured_outputs", "None or a StructuredOutputsParams")
        if self.structured_outputs is not None:
            self.structured_outputs.validate()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


# --- logits processors: each takes and returns a 1-D row of logits ------------


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """Make already-seen tokens less likely: positive scores are divided by the
    penalty, negative ones multiplied (dividing a negative would *raise* it).
    `seen` holds the seen token ids, or is a [V] mask of them."""
    if penalty == 1.0 or seen.numel() == 0:
        return logits
    logits = logits.clone()
    scores = logits[seen]
    logits[seen] = torch.where(scores > 0, scores / penalty, scores * penalty)
    return logits


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Divide by T: T < 1 sharpens the distribution, T > 1 flattens it."""
    return logits / temperature


def apply_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """Keep the tokens whose probability is at least min_p times the most
    likely token's (Nguyen et al., 2024; vLLM's min_p). The cut follows the
    model's confidence: a sure top token leaves few others, a flat
    distribution many. p_i >= min_p * p_max is z_i - z_max >= log(min_p) in
    logits (softmax's common denominator cancels), so no softmax is needed."""
    if min_p <= 0:
        return logits
    threshold = logits.max() + math.log(min_p)
    return logits.masked_fill(logits < threshold, -_INF)


def apply_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k highest scores (ties at the k-th score are kept too);
    k = -1 or 0 means off, as in vLLM."""
    if k <= 0 or k >= logits.numel():
        return logits
    kth = torch.topk(logits, k).values[-1]
    return logits.masked_fill(logits < kth, -_INF)


def apply_top_p(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probabilities sum to >= p."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, descending=True)
    probs = sorted_logits.softmax(-1)
    # Drop a token when the mass *before* it already reaches p; the top token always stays.
    mass_before = probs.cumsum(-1) - probs
    drop_sorted = mass_before >= p
    drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
    return logits.masked_fill(drop, -_INF)


def process_logits(logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor | None = None) -> torch.Tensor:
    """All processors in order; returns the logits the draw will use."""
    if seen is not None:
        logits = apply_repetition_penalty(logits, seen, params.repetition_penalty)
    if params.greedy:
        return logits
    logits = apply_temperature(logits, params.temperature)
    logits = apply_min_p(logits, params.min_p)  # after temperature, before top-k/top-p, as vLLM V1
    logits = apply_top_k(logits, params.top_k)
    return apply_top_p(logits, params.top_p)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None,
           seen: torch.Tensor | None = None) -> int:
    """Choose one token id from a row of raw logits."""
    logits = process_logits(logits.float(), params, seen)
    if params.greedy:
        return int(torch.argmax(logits))
    return draw(logits.softmax(-1), generator)


def draw(weights: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """One index of a row of non-negative weights [V], with probability weight /
    sum: the same distribution as torch.multinomial(weights, 1).

    It inverts the running sum (the cumulative distribution): one uniform number
    u in [0, total), and the first index whose running sum exceeds u, found by
    binary search. A zero weight adds nothing to the sum, so it is never chosen.
    torch.multinomial, on a CPU, draws a random number for every one of the
    49,152 entries; this draws one number and searches, many times faster per
    row, which matters when every row of a decode step samples. Time both on
    your machine:
        python -m timeit -s "import torch; from tinyinfer.sampling import draw; w = torch.rand(49152)" "draw(w)"
        python -m timeit -s "import torch; w = torch.rand(49152)" "torch.multinomial(w, 1)"
    """
    u = torch.rand(1, dtype=torch.float64, generator=generator, device=weights.device)
    return _invert_running_sum(weights, u)


def draw_rows(weights: torch.Tensor, generator: torch.Generator | None = None,
              batched: bool | None = None) -> list[int]:
    """draw() for every row of weights [M, V]: the M uniform numbers in one call,
    then each row's running sum on its own. One row's float64 sum (384 KiB) stays
    in cache and its memory is reused; a [M, V] sum is a new, M times larger block
    each step (the sampler took 2-4x as long at M = 16, 2-core Intel Xeon VM, 2026-12-05).
    On a GPU it is the other way round: each row's int() makes the host wait for
    the device (20-50 us, as long as a small model's whole step), so CUDA rows go
    through _invert_running_sums, which waits once for all of them. batched=True
    or False picks a path by hand (None: by the device). On a CPU both give the
    same indices for the same u; on a GPU a one-row and a many-row running sum
    may round differently in the last bit, so a u within rounding of a step of
    the sum can pick the neighbouring token (same distribution, other token)."""
    u = torch.rand(weights.shape[0], 1, dtype=torch.float64, generator=generator, device=weights.device)
    if batched is None:
        batched = weights.is_cuda
    if batched:
        return _invert_running_sums(weights, u)
    return [_invert_running_sum(row, u_row) for row, u_row in zip(weights, u)]


def _invert_running_sum(weights: torch.Tensor, u: torch.Tensor) -> int:
    """The first index whose running sum exceeds u * total, for u in [0, 1)."""
    cdf = weights.double().cumsum(-1)  # float64: the last entries of a 49,152-term sum stay exact enough
    i = int(torch.searchsorted(cdf, u * cdf[-1], right=True))
    if i == weights.numel():  # u rounded up to the total (about 1 in 2**53): the last entry with weight
        i = int(torch.nonzero(weights)[-1])
    return i


def _invert_running_sums(weights: torch.Tensor, u: torch.Tensor) -> list[int]:
    """_invert_running_sum for every row of weights [M, V] at once, u [M, 1]: one
    [M, V] running sum, one search per row in one call, one read to the host."""
    cdf = weights.double().cumsum(-1)
    i = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)  # [M, 1]
    # u rounded up to the total: the last entry with weight, as in the one-row
    # version. Worked out for every row, because asking which rows need it
    # would be a read to the host of its own.
    positions = torch.arange(weights.shape[-1], device=weights.device)
    last = torch.where(weights != 0, positions, -1).amax(-1, keepdim=True)
    return torch.where(i == weights.shape[-1], last, i).squeeze(-1).tolist()


def make_generator(seed: int | None, device) -> torch.Generator | None:
    """A private random stream per seeded sequence, so its draws do not depend on
    what else is in the batch. Unseeded sequences share torch's global stream."""
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def processed_probs(logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor | None = None) -> torch.Tensor:
    """The probabilities `sample` draws from, for one row of raw logits. At
    temperature 0 (greedy) all of it sits on the highest processed score."""
    processed = process_logits(logits.float(), params, seen)
    if params.greedy:
        probs = torch.zeros_like(processed)
        probs[torch.argmax(processed)] = 1.0
        return probs
    return processed.softmax(-1)


def processed_probs_batch(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """processed_probs for M rows at once, each with its own settings and none
    greedy: logits [M, V], penalty already applied -> probabilities [M, V].
    The same steps as process_logits, with each setting turned into a column of
    M values, so every row goes through the same few tensor operations. A step
    that no row asks for is skipped, as the one-row processors skip it. Which
    steps run is decided from the Python settings, never by reading a tensor:
    on a GPU each such read makes the host wait for the device."""
    top_k = [p.top_k if 0 < p.top_k < logits.shape[-1] else 0 for p in params]  # 0: no cut
    temperature, min_p, top_p, k = _columns(params, top_k, logits)
    if any(p.temperature != 1 for p in params):
        logits = logits / temperature
    if any(p.min_p > 0 for p in params):  # log(0) = -inf: a row with min_p = 0 keeps every token
        threshold = logits.amax(-1, keepdim=True) + min_p.log()
        logits = logits.masked_fill(logits < threshold, -_INF)
    if any(top_k):  # one topk, as deep as the largest k; ties with a row's k-th score stay; k = 0 keeps all
        kth = logits.topk(max(top_k), -1).values.gather(-1, (k - 1).clamp(min=0))
        logits = logits.masked_fill((logits < kth) & (k > 0), -_INF)
    if any(p.top_p < 1 for p in params):  # as apply_top_p, row by row
        ranked, order = logits.sort(-1, descending=True)
        probs = ranked.softmax(-1)
        mass_before = probs.cumsum(-1) - probs
        drop = mass_before >= top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), -_INF)
    return logits.softmax(-1)


def _columns(params: list[SamplingParams], top_k: list[int], logits: torch.Tensor):
    """The settings as [M, 1] columns on logits' device: temperature, min_p,
    top_p and top_k. One table and one copy, not a copy per setting: on a GPU a
    copy from ordinary (pageable) host memory waits for the device, one from
    pinned memory with non_blocking=True does not (vLLM copies its settings so).
    float64 holds every setting exactly; each is then rounded as torch.tensor
    would round it straight to logits' dtype."""
    # top_p = 1 is off: compare with inf, so rounding in the sum never cuts a tail token.
    table = torch.tensor([[p.temperature for p in params], [p.min_p for p in params],
                          [p.top_p if p.top_p < 1 else _INF for p in params], top_k],
                         dtype=torch.float64, pin_memory=logits.is_cuda)
    temperature, min_p, top_p, k = table.to(logits.device, non_blocking=True)[:, :, None]
    return temperature.to(logits.dtype), min_p.to(logits.dtype), top_p.to(logits.dtype), k.long()


# --- what a step's sampling hands the scheduler (sampler.py makes it) -----------------


@dataclass
class PromptLogprobs:
    """The logprobs of the prompt positions one step computed for one sequence."""

    seq: object  # the Sequence (its Request collects them)
    start: int  # entries[j] scores prompt token start + j + 1
    entries: list[PositionLogprobs]


@dataclass
class SamplerOutput:
    token_ids: list[int]  # one per row: row i is the i-th sequence handed to the sampler
    logprobs: list[PositionLogprobs | None]  # per row: the chosen token + top N, when asked for
    prompt_logprobs: list[PromptLogprobs] = field(default_factory=list)
