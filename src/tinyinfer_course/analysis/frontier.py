"""Cost per token against each user's speed: the latency-throughput Pareto frontier.

Two choices set how a model is served: how many chips hold one copy of it (the
tensor-parallel degree) and how many sequences share each decode step (the
batch). Each pair gives two numbers. A user sees the speed of their own stream,
one token per step: 1 / step time tokens per second. The operator pays for chip
time: a step costs all the copy's chips for its duration and makes one token per
sequence. A bigger batch makes tokens cheaper and every stream slower, so no
configuration wins on both; the ones worth running are those that no other beats
on both, the Pareto frontier (chapter 8, after the scaling book's inference chapter).

    points = serving_points(llama_70b, CHIPS["H100 SXM"], LINKS["nvlink"], tp_degrees=(1, 2, 4, 8),
                            batches=(1, 8, 64, 256), context=2048, price_per_chip_hour=2.50)
    for p in pareto_frontier(points):
        print(p.chips, p.batch, p.tokens_per_s_per_user, p.cost_per_million)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from tinyinfer.config import ModelConfig, kv_bytes_per_token

from .hardware import Chip, Link, Roofline, allreduce_time, decode_step_time


@dataclass(frozen=True)
class ServingPoint:
    """One way to serve: `chips` chips holding one copy of the model, `batch`
    sequences in every decode step, each step taking `step_s` seconds, each chip
    rented at `price_per_chip_hour` dollars."""

    chips: int
    batch: int
    step_s: float
    price_per_chip_hour: float = 0.0

    @property
    def tokens_per_s_per_user(self) -> float:
        """Each user's stream: one token per step."""
        return 1 / self.step_s

    @property
    def tokens_per_s(self) -> float:
        """All users together: one token per sequence per step."""
        return self.batch / self.step_s

    @property
    def chip_seconds_per_million(self) -> float:
        """Chip time per million output tokens: chips x step time / batch x 10^6.
        Whatever the price, this is what a token costs in rented time (on a CPU,
        with chips=1, the machine's seconds)."""
        return self.chips * self.step_s / self.batch * 1e6

    @property
    def cost_per_million(self) -> float:
        """Dollars per million output tokens:
        chips x price per hour / (3,600 x batch x tokens/s per user) x 10^6."""
        return self.chip_seconds_per_million * self.price_per_chip_hour / 3600


def tp_decode_step_time(model: ModelConfig, roofline: Roofline, n: int, link: Link, batch: int = 1,
                        context: int = 0, bytes_per_param: float = 2, activation_bytes: float = 2) -> float:
    """Seconds of one decode step of `model` split n ways by tensor parallelism:
    each chip's 1/n share of `decode_step_time` (a slice of every weight matrix
    and, with the KV heads split among the chips, of every sequence's cache),
    plus the two ring all-reduces per layer of `tensor_parallel_step`, each
    summing batch x hidden_size activations (`allreduce_time`). It is
    `tensor_parallel_step` with the KV cache added, which the frontier needs:
    at a large batch the caches' reads are most of the step. Compute and
    communication do not overlap; the ring leans pessimistic for 8 chips."""
    share = decode_step_time(model, roofline, batch, context, bytes_per_param=bytes_per_param).total / n
    message = batch * model.hidden_size * activation_bytes
    return share + 2 * model.num_hidden_layers * allreduce_time(message, n, link)


def fits(model: ModelConfig, chip: Chip, n: int, batch: int, context: int, bytes_per_param: float = 2,
         reserve: float = 0.1) -> bool:
    """Whether n chips hold the weights and `batch` caches of `context` tokens,
    with a share `reserve` of their memory kept back for activations, buffers
    and the runtime (a tenth, as chapters 5 and 8 assume)."""
    weights = model.num_parameters() * bytes_per_param
    caches = batch * context * kv_bytes_per_token(model, bytes_per_param)
    return weights + caches <= (1 - reserve) * n * chip.memory_bytes


def serving_points(model: ModelConfig, chip: Chip, link: Link, tp_degrees: Iterable[int],
                   batches: Iterable[int], context: int, price_per_chip_hour: float,
                   bytes_per_param: float = 2, reserve: float = 0.1) -> list[ServingPoint]:
    """Every (tensor-parallel degree, batch) pair whose weights and caches fit
    (`fits`), with its step time from `tp_decode_step_time`. A pair that does not
    fit is left out, so a degree too small to hold the weights has no point."""
    batches = list(batches)
    return [ServingPoint(n, b, tp_decode_step_time(model, chip.roofline, n, link, b, context, bytes_per_param),
                         price_per_chip_hour)
            for n in tp_degrees for b in batches
            if fits(model, chip, n, b, context, bytes_per_param, reserve)]


def pareto_frontier(points: Iterable, speed: Callable = lambda p: p.tokens_per_s_per_user,
                    cost: Callable = lambda p: p.chip_seconds_per_million) -> list:
    """The points that no other point beats on both counts (faster for each user
    and no dearer, or cheaper and no slower), fastest last.

    Sort from the fastest down; walking towards slower points, a point is worth
    having only if it is cheaper than every faster one seen so far. Of two equal
    points one is kept. By default the cost is chip time, which ranks the points
    as dollars do at any one price per chip."""
    frontier, cheapest = [], float("inf")
    for p in sorted(points, key=lambda p: (-speed(p), cost(p))):
        if cost(p) < cheapest:
            frontier.append(p)
            cheapest = cost(p)
    return frontier[::-1]


def cheapest_at(points: Iterable, min_speed: float, speed: Callable = lambda p: p.tokens_per_s_per_user,
                cost: Callable = lambda p: p.chip_seconds_per_million):
    """The cheapest point that gives every user at least `min_speed`, or None:
    a serving choice read off the frontier (it is always on it)."""
    fast_enough = [p for p in points if speed(p) >= min_speed]
    return min(fast_enough, key=lambda p: (cost(p), -speed(p)), default=None)
