"""Lab 3 (sampling): wrong implementations each check must reject, and the
reference each must accept. Collected by tests/course/test_labs.py."""
import math

import torch

from tinyinfer_course import labcheck
from tinyinfer import sampling

INF = float("inf")


# --- min-p


def _min_p_absolute(logits, min_p):
    probs = logits.softmax(-1)
    return logits.masked_fill(probs < min_p, -INF)  # an absolute threshold, not relative to the top


def _min_p_on_logits(logits, min_p):
    return logits.masked_fill(logits < min_p * logits.max(), -INF)  # scales the score, not the probability


def _min_p_strict(logits, min_p):
    probs = logits.softmax(-1)
    return logits.masked_fill(probs <= min_p * probs.max(), -INF)  # `<=` drops the top token at min_p = 1


def _min_p_returns_probs(logits, min_p):
    probs = logits.softmax(-1)
    return probs.masked_fill(probs < min_p * probs.max(), 0.0)  # a processor hands on logits


def _min_p_in_place(logits, min_p):
    probs = logits.softmax(-1)
    logits[probs < min_p * probs.max()] = -INF  # right numbers, but the caller's tensor is overwritten
    return logits


def _min_p_zero_not_inf(logits, min_p):
    probs = logits.softmax(-1)
    return logits.masked_fill(probs < min_p * probs.max(), 0.0)  # a score of 0 is not probability 0


# --- top-k


def _top_k_exactly_k(logits, k):
    if k == -1 or k >= logits.numel():
        return logits
    keep = torch.topk(logits, k).indices  # drops tokens tied with the k-th
    out = torch.full_like(logits, -INF)
    out[keep] = logits[keep]
    return out


def _top_k_drops_kth(logits, k):
    if k == -1 or k >= logits.numel():
        return logits
    kth = torch.topk(logits, k).values[-1]
    return logits.masked_fill(logits <= kth, -INF)  # `<=` removes the k-th itself


def _top_k_zero_keeps_nothing(logits, k):
    if k == -1 or k >= logits.numel():
        return logits.clone()
    if k == 0:
        return torch.full_like(logits, -INF)  # 0 read as "keep no token"; vLLM reads it as off
    kth = torch.topk(logits, k).values[-1]
    return logits.masked_fill(logits < kth, -INF)


def _top_k_zero_not_inf(logits, k):
    if k == -1 or k >= logits.numel():
        return logits
    kth = torch.topk(logits, k).values[-1]
    return logits.masked_fill(logits < kth, 0.0)  # a score of 0 is not probability 0


# --- top-p


def _top_p_stays_below_p(logits, p):
    # Keeps only tokens whose running total stays <= p: misses the one that
    # crosses p, and with a tiny p keeps nothing at all.
    sorted_logits, order = torch.sort(logits, descending=True)
    drop = sorted_logits.softmax(-1).cumsum(-1) > p
    return logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), -INF)


def _top_p_without_softmax(logits, p):
    # Adds up raw scores as if they were probabilities.
    sorted_logits, order = torch.sort(logits, descending=True)
    mass_before = sorted_logits.cumsum(-1) - sorted_logits
    drop = mass_before >= p
    return logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), -INF)


def _top_p_forgets_to_unsort(logits, p):
    # Decides in sorted order, then applies the mask to the unsorted logits.
    sorted_logits, _ = torch.sort(logits, descending=True)
    probs = sorted_logits.softmax(-1)
    drop = probs.cumsum(-1) - probs >= p
    return logits.masked_fill(drop, -INF)


# --- repetition penalty


def _penalty_divides_all(logits, seen, penalty):
    out = logits.clone()
    out[seen] = out[seen] / penalty  # a negative score divided goes *up*
    return out


def _penalty_once_per_occurrence(logits, seen, penalty):
    out = logits.clone()
    for t in seen.tolist():  # a token seen three times is penalized three times
        out[t] = out[t] / penalty if out[t] > 0 else out[t] * penalty
    return out


def _penalty_in_place(logits, seen, penalty):
    scores = logits[seen]
    logits[seen] = torch.where(scores > 0, scores / penalty, scores * penalty)
    return logits


# --- sampler


def _sample_argmax(logits, t, generator):
    return int(torch.argmax(logits))  # never samples


def _sample_ignores_temperature(logits, t, generator):
    if t == 0:
        return int(torch.argmax(logits))
    return int(torch.multinomial(logits.softmax(-1), 1, generator=generator))


def _sample_multiplies_temperature(logits, t, generator):
    if t == 0:
        return int(torch.argmax(logits))
    return int(torch.multinomial((logits * t).softmax(-1), 1, generator=generator))


def _sample_global_rng(logits, t, generator):
    if t == 0:
        return int(torch.argmax(logits))
    return int(torch.multinomial((logits / t).softmax(-1), 1))  # not reproducible per request


def _sample_uniform(logits, t, generator):
    if t == 0:
        return int(torch.argmax(logits))
    allowed = torch.nonzero(logits > -INF).flatten()  # any candidate, equally likely
    return int(allowed[torch.randint(len(allowed), (1,), generator=generator)])


def _sample_exp_without_max(logits, t, generator, dtype=torch.float32):
    # softmax written out, without subtracting the largest score first: right on
    # small scores, inf / inf = NaN once scores / t pass exp's range
    if t == 0:
        return int(torch.argmax(logits))
    e = (logits.to(dtype) / t).exp()
    return int(torch.multinomial(e / e.sum(), 1, generator=generator))


def _sample_math_exp(logits, t, generator):
    # the same in plain Python: math.exp raises OverflowError past exp(709)
    if t == 0:
        return int(torch.argmax(logits))
    weights = [math.exp(x / t) if x > -INF else 0.0 for x in logits.tolist()]
    total, u = sum(weights), float(torch.rand((), dtype=torch.float64, generator=generator))
    running = 0.0
    for i, w in enumerate(weights):
        running += w / total
        if u < running:
            return i
    return max(i for i, w in enumerate(weights) if w > 0)


def _sample_returns_tensor(logits, t, generator):
    # the right draws, returned as a tensor of shape [1], not an int: `token in stop_ids` is then never true
    if t == 0:
        return torch.argmax(logits, dim=-1, keepdim=True)
    return torch.multinomial((logits / t).softmax(-1), 1, generator=generator)


def _sample_divides_in_place(logits, t, generator):
    # the right draws, but `logits /= t` overwrites the caller's row (issue 56)
    if t == 0:
        return int(torch.argmax(logits))
    logits /= t
    return int(torch.multinomial(logits.softmax(-1), 1, generator=generator))


def _sample_shifts_in_place(logits, t, generator):
    # subtracts the largest score in place before exp: safe numbers, a changed row
    if t == 0:
        return int(torch.argmax(logits))
    logits.sub_(logits.max())
    e = (logits / t).exp()
    return int(torch.multinomial(e / e.sum(), 1, generator=generator))


WRONG = {
    "check_min_p": [_min_p_absolute, _min_p_on_logits, _min_p_strict, _min_p_returns_probs, _min_p_in_place,
                    _min_p_zero_not_inf],
    "check_top_k": [_top_k_exactly_k, _top_k_drops_kth, _top_k_zero_not_inf, _top_k_zero_keeps_nothing],
    "check_top_p": [_top_p_stays_below_p, _top_p_without_softmax, _top_p_forgets_to_unsort],
    "check_repetition_penalty": [_penalty_divides_all, _penalty_once_per_occurrence, _penalty_in_place],
    "check_sample": [_sample_argmax, _sample_ignores_temperature, _sample_multiplies_temperature,
                     _sample_global_rng, _sample_uniform, _sample_exp_without_max,
                     lambda x, t, g: _sample_exp_without_max(x, t, g, torch.float64), _sample_math_exp,
                     _sample_returns_tensor, _sample_divides_in_place, _sample_shifts_in_place],
}


# --- correct implementations written here, independently of the engine's sampling.py


def _min_p(logits, min_p):
    # Token by token, in plain Python: probability against min_p times the largest.
    values = logits.tolist()
    top = max(values)
    probs = [math.exp(v - top) for v in values]  # over a common denominator, which cancels
    out = logits.clone()
    for i, p in enumerate(probs):
        if p < min_p * 1.0:  # the top token's own term is exp(0) = 1
            out[i] = -INF
    return out


def _top_k(logits, k):
    out = logits.clone()
    if 0 < k < logits.numel():
        kth = sorted(logits.tolist(), reverse=True)[k - 1]
        out[logits < kth] = -INF
    return out


def _top_p(logits, p):
    probs = torch.softmax(logits, -1).tolist()
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    keep, mass = [], 0.0
    for i in order:  # add tokens, most likely first, until their mass reaches p
        keep.append(i)
        mass += probs[i]
        if mass >= p:
            break
    out = torch.full_like(logits, -INF)
    out[keep] = logits[keep]
    return out


def _repetition_penalty(logits, seen, penalty):
    out = logits.clone()
    for t in set(seen.tolist()):
        out[t] = out[t] / penalty if out[t] > 0 else out[t] * penalty
    return out


def _sample_inverse_cdf(logits, t, generator):
    if t == 0:
        return max(range(logits.numel()), key=lambda i: float(logits[i]))
    probs = torch.softmax(logits / t, -1)
    u = torch.rand((), generator=generator)
    i = int(torch.searchsorted(probs.cumsum(-1), u, right=True))
    return min(i, int(torch.nonzero(probs).max()))  # rounding can leave the total a hair below u


def _engine_sample(logits, t, generator):
    return sampling.sample(logits, sampling.SamplingParams(temperature=t), generator)


def _engine_draw(logits, t, generator):  # writes the greedy branch, borrows the engine's draw
    if t == 0:
        return int(torch.argmax(logits))
    return sampling.draw(torch.softmax(logits / t, -1), generator)


def _engine_min_p(logits, min_p):
    return sampling.process_logits(logits, sampling.SamplingParams(temperature=1.0, min_p=min_p))


def _engine_top_p(logits, p):
    return sampling.process_logits(logits, sampling.SamplingParams(temperature=1.0, top_p=p))


REFERENCE = {
    "check_min_p": lambda: _min_p,
    "check_top_k": lambda: _top_k,
    "check_top_p": lambda: _top_p,
    "check_repetition_penalty": lambda: _repetition_penalty,
    "check_sample": lambda: _sample_inverse_cdf,
}
ANSWERS = {
    "check_min_p": [sampling.apply_min_p, _engine_min_p],
    "check_top_k": [sampling.apply_top_k],
    "check_top_p": [sampling.apply_top_p, _engine_top_p],
    "check_repetition_penalty": [sampling.apply_repetition_penalty],
    "check_sample": [labcheck.reference_sample, _engine_sample, _engine_draw],
}
