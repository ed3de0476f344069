"""Mixture of experts (MoE): many MLPs per layer, a few used per token.

An MoE layer replaces the one MLP of a decoder layer by `num_experts` MLPs of
the same shape (the experts) and a router, a small linear layer that scores
every expert for every token. Each token goes through its `top_k` best-scored
experts only, and their outputs are added, weighted by the router's softmax
over those k scores. So a token does the arithmetic of k MLPs (the model's
*active* parameters) while the layer stores E of them (its *total* parameters).

What that does to decode: at batch 1 a step reads only the experts its one
token chose. A batch of B tokens chooses more, and once B is in the tens every
expert is touched and the step reads all the weights, as a dense model of the
total size would, while doing the arithmetic of the active size only. If each
token picked its k experts uniformly at random, independently of the others,
the expected number of distinct experts that B tokens touch would be

    E x (1 - (1 - k/E) ** B)

(each expert is missed by one token with probability 1 - k/E). Real routers
are neither uniform nor independent; this is the simplest model of them.

    layer = MoELayer(hidden_size=576, intermediate_size=1536, num_experts=16, top_k=2)
    out, touched = layer(torch.randn(8, 576))     # 8 tokens; touched: experts used
    expected_experts_touched(8, 16, 2)            # 10.5 on average, if routing were uniform
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .hardware import OpTime, Roofline, StepCost, StepTime, weights_critical_batch


def _check_routing(num_experts, top_k) -> None:
    if not (isinstance(num_experts, int) and num_experts >= 1):
        raise ValueError(f"num_experts={num_experts!r} is invalid: must be an integer >= 1")
    if not (isinstance(top_k, int) and 1 <= top_k <= num_experts):
        raise ValueError(f"top_k={top_k!r} is invalid: must be an integer in [1, num_experts={num_experts}]")


def expected_experts_touched(num_tokens: float, num_experts: int, top_k: int) -> float:
    """Expected distinct experts that `num_tokens` tokens route to, each token
    choosing top_k of num_experts uniformly and independently of the others."""
    _check_routing(num_experts, top_k)
    if not num_tokens >= 0:
        raise ValueError(f"num_tokens={num_tokens!r} is invalid: must be >= 0")
    return num_experts * (1 - (1 - top_k / num_experts) ** num_tokens)


# ------------------------------------------------------------------ a model's shape, and its decode step


@dataclass(frozen=True)
class MoEShape:
    """What sizes an MoE model's decode step: its experts and everything else.

    expert_params: one expert's parameters summed over the MoE layers (the
    experts of one index, in every layer); shared_params: the rest (attention,
    embeddings, norms, dense layers, always-on shared experts), used by every token."""

    name: str
    num_experts: int
    top_k: int
    expert_params: float
    shared_params: float

    @property
    def total_params(self) -> float:
        return self.shared_params + self.num_experts * self.expert_params

    @property
    def active_params(self) -> float:
        """Parameters one token goes through: the shared ones and its top_k experts."""
        return self.shared_params + self.top_k * self.expert_params

    def decode_cost(self, batch: int, bytes_per_param: float = 2) -> StepCost:
        """FLOPs and bytes of a whole decode step of `batch` tokens (KV cache left
        out, as in hardware.forward_cost given a parameter count): every token does
        2 FLOPs per active parameter; the step reads the shared weights and the
        experts the batch touches, in every layer, once (uniform routing assumed).

        These are totals: their intensity is the step's aggregate, which reaches
        the ridge (hardware.critical_batch) before the experts do, so it gives only
        a lower bound on the experts' critical batch. For the step's time use
        decode_step_time, which takes the experts on their own roofline."""
        touched = expected_experts_touched(batch, self.num_experts, self.top_k)
        flops = 2 * self.active_params * batch
        return StepCost(flops, (self.shared_params + touched * self.expert_params) * bytes_per_param)

    def expert_cost(self, batch: int, bytes_per_param: float = 2) -> StepCost:
        """FLOPs and bytes of the routed experts' matrix products alone in a decode
        step of `batch` tokens: each token runs top_k experts, and each expert the
        batch touches is read once. Their intensity is 2 x (tokens per touched
        expert) / bytes_per_param: an expert sees about batch x top_k / num_experts
        tokens once all of them are touched."""
        touched = expected_experts_touched(batch, self.num_experts, self.top_k)
        return StepCost(2 * self.top_k * self.expert_params * batch, touched * self.expert_params * bytes_per_param)

    def decode_step_time(self, roofline: Roofline, batch: int, bytes_per_param: float = 2) -> StepTime:
        """hardware.decode_step_time for an MoE model (KV cache left out): the shared
        weights' products on their own roofline (they see the whole batch), plus the
        routed experts' products on theirs (each sees its own share of the batch)."""
        if not (isinstance(batch, numbers.Integral) and batch >= 1):
            raise ValueError(f"batch={batch!r} is invalid: must be an integer >= 1")
        peak, bandwidth = roofline.peak_flops, roofline.bandwidth
        shared = OpTime(2 * self.shared_params * batch / peak, self.shared_params * bytes_per_param / bandwidth)
        routed = self.expert_cost(int(batch), bytes_per_param)
        return StepTime(weights=shared, attention=OpTime(0.0, 0.0),
                        experts=OpTime(routed.flops / peak, routed.nbytes / bandwidth))

    def expert_critical_batch(self, roofline: Roofline, bytes_per_param: float = 2) -> int:
        """The smallest batch at which the experts' products turn compute-bound:
        each expert sees batch x top_k / num_experts tokens, so it reaches the
        ridge at B* = ridge x bytes_per_param / 2 x num_experts / top_k (every
        expert touched by then). The dense answer times E / k."""
        return weights_critical_batch(roofline, bytes_per_param, self.top_k / self.num_experts)


def swiglu_expert_params(num_layers: int, hidden_size: int, intermediate_size: int) -> float:
    """One SwiGLU expert's parameters (gate, up, down), summed over num_layers layers."""
    return num_layers * 3 * hidden_size * intermediate_size


# ------------------------------------------------------------------ a router that is not uniform


def zipf_popularity(num_experts: int, exponent: float) -> np.ndarray:
    """Each expert's share of a router's choices, most popular first, if popularity
    follows a Zipf law: the expert of rank i gets a share in proportion to
    1 / i ** exponent. Exponent 0 is the uniform router of expected_experts_touched;
    the larger the exponent, the more the first experts take. An illustration of
    skew, not a measured router."""
    if not (isinstance(num_experts, int) and num_experts >= 1) or not exponent >= 0:
        raise ValueError(f"num_experts={num_experts!r}, exponent={exponent!r} are invalid: need an integer >= 1 "
                         "and an exponent >= 0")
    weights = np.arange(1, num_experts + 1, dtype=float) ** -float(exponent)
    return weights / weights.sum()


def expert_loads(tokens: float, top_k: int, popularity) -> np.ndarray:
    """Expected tokens each expert receives in a step of `tokens` tokens: each token
    makes top_k choices, and an expert gets its share of them, tokens x top_k x share.
    A token cannot pick one expert twice, so no share may exceed 1 / top_k."""
    share = np.asarray(popularity, dtype=float)
    _check_routing(len(share), top_k)
    if top_k * share.max() > 1 + 1e-12:
        raise ValueError(f"a share of {share.max():.3f} is invalid with top_k={top_k}: a token cannot choose "
                         "one expert twice, so no share may exceed 1 / top_k")
    return tokens * top_k * share


def device_loads(loads, ep: int) -> np.ndarray:
    """Tokens each of `ep` devices receives when the experts, ranked by popularity
    (most popular first, as zipf_popularity gives them), are dealt out in turn:
    device d holds the experts of rank d, d + ep, d + 2 ep, ... This spreads the
    popular experts as evenly as one copy of each allows; under expert parallelism
    the device with the most tokens sets the step, so max / mean is the slowdown."""
    loads = np.asarray(loads, dtype=float)
    if not (isinstance(ep, int) and ep >= 1) or len(loads) % ep:
        raise ValueError(f"ep={ep!r} is invalid: must be an integer >= 1 that divides the {len(loads)} experts")
    return loads.reshape(-1, ep).sum(axis=0)


# ------------------------------------------------------------------ a layer


class MoELayer(nn.Module):
    """A router and num_experts SwiGLU experts of the engine's MLP shape
    (model.MLP: down(silu(gate(x)) * up(x))), applied to tokens [T, hidden].

    The experts' weights are stacked ([E, 2I, C] and [E, C, I]), so that
    running expert e is two matrix products with slices of them. forward()
    groups the tokens by expert and runs each touched expert once on all of its
    tokens, as serving engines do: the step reads only the touched experts."""

    def __init__(self, hidden_size: int, intermediate_size: int, num_experts: int, top_k: int,
                 dtype: torch.dtype = torch.float32):
        super().__init__()
        _check_routing(num_experts, top_k)
        self.num_experts, self.top_k, self.intermediate_size = num_experts, top_k, intermediate_size
        self.router = nn.Linear(hidden_size, num_experts, bias=False, dtype=dtype)
        scale = hidden_size ** -0.5  # random weights of a sensible size: activations stay O(1)
        self.gate_up = nn.Parameter(torch.randn(num_experts, 2 * intermediate_size, hidden_size, dtype=dtype) * scale)
        self.down = nn.Parameter(torch.randn(num_experts, hidden_size, intermediate_size, dtype=dtype)
                                 * intermediate_size ** -0.5)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights [T, k], experts [T, k]): each token's top_k experts, and the
        softmax of the router's scores over those k (as Mixtral does)."""
        scores, experts = torch.topk(self.router(x), self.top_k, dim=-1)
        return F.softmax(scores.float(), dim=-1).to(x.dtype), experts

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e on tokens x [n, C]: the SwiGLU MLP of model.MLP."""
        gate, up = (x @ self.gate_up[e].T).chunk(2, dim=-1)
        return (F.silu(gate) * up) @ self.down[e].T

    @torch.inference_mode()
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """(output [T, C], the experts used): each touched expert runs once, on its tokens."""
        weights, experts = self.route(x)
        out = torch.zeros_like(x)
        touched = torch.unique(experts).tolist()
        for e in touched:
            token, slot = torch.nonzero(experts == e, as_tuple=True)  # which tokens chose e, in which slot
            out.index_add_(0, token, self.expert(e, x[token]) * weights[token, slot, None])
        return out, touched

    @torch.inference_mode()
    def forward_token_by_token(self, x: torch.Tensor) -> torch.Tensor:
        """The same layer the slow, obvious way: each token, each of its k experts
        in turn. The reference that forward() is tested against."""
        weights, experts = self.route(x)
        rows = []
        for t in range(x.shape[0]):
            row = torch.zeros_like(x[t])
            for j in range(self.top_k):
                row += weights[t, j] * self.expert(int(experts[t, j]), x[t:t + 1])[0]
            rows.append(row)
        return torch.stack(rows)
