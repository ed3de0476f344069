"""Lab 11 (your engine): the check of the learner's forward pass, the check that
their assembled engine serves a workload with the same tokens as
tinyinfer's, and the helpers the lab uses to compare the two on the real model.

The forward pass, `make_execute_model(model, num_blocks, block_size, rope,
paged_attention, attention) -> execute_model(scheduled, allocator)`, is the
model's arithmetic written out over its weights: embedding, per layer RMSNorm,
the stacked Q/K/V projection, RoPE, paged attention, the output projection and
the MLP with their residuals, then the final norm and the LM head. Its check
drives it with the course's loop, allocator and scheduler on lab 7's
workloads and compares every step's logits with tinyinfer's ModelRunner on the
same steps, handing it the course's RoPE and attention (so a slip in lab 2
cannot fail lab 11). Both checks also run a model with SmolLM2's heads, head
size and RoPE base beside the tiny one, so a constant written as a literal
fails one of them.

The learner's `serve(model, requests, num_blocks, block_size, token_budget,
max_num_seqs, eos_token_ids, paged=None) -> steps` runs their own forward pass
(their RoPE and attention over their paged cache, with the model's weights and
its RMSNorm/MLP submodules), their allocator, scheduler, loop and sampler. The
check serves lab 7's two workloads (the first with two end-of-sequence ids), the
two wider models, one workload with seeded, sampled requests, and one through
`paged=` (the course's grouped paged attention, which must be called). It
compares every request's tokens and the step count serve returns with LLM.generate's
parts (tinyinfer's Scheduler, ModelRunner and Sampler; a seeded request draws
from its own generator, seeded once), accepting for the sampled requests the
tokens the learner's kept lab 3 sampler draws with the same seeds too. It
refuses a serve that runs tinyinfer's own attention, RoPE, cache, model forward
or engine. When serve stops on a dtype error, it reruns the case to name the
first of the learner's functions that returned float64.
The model's helpers stay allowed: model.compute_logits, its embedding, norms
and MLPs are weights the learner's forward pass uses, not the answer.
"""
from __future__ import annotations

import functools
import numbers
import os
import re
import sys

import torch
import torch.nn.functional as F

from tinyinfer.block_manager import BlockManager
from tinyinfer.kv_cache import KVCache
from tinyinfer.llm import LLM
from tinyinfer.llm_engine import LLMEngine
from tinyinfer.model import Attention, DecoderLayer, LlamaForCausalLM, apply_rope, apply_rope_signed, rope_tables
from tinyinfer.model_runner import ModelRunner
from tinyinfer.paged_kv_cache import PagedKVCache
from tinyinfer.request import Request as EngineRequest
from tinyinfer.sampler import Sampler
from tinyinfer.sampling import SamplerOutput, SamplingParams
from tinyinfer.scheduler import Scheduler, SchedulerConfig
from .attention import reference_causal_gqa_attention, reference_rope
from .batching import ReferenceBlockAllocator
from . import my_engine
from .core import Case, first_difference, first_mismatch, run_check
from .fixtures import (SMOL_SHAPED, WIDE_TINY, WORKLOADS, Workload, describe_model, engine_outputs, eos_for,
                       tiny_model, tiny_prompt)
from .given import greedy
from .given import make_execute_model as engine_execute_model
from .paged_attention import reference_grouped_paged_attention, reference_paged_attention
from .records import Request
from .registry import Lab
from .sampling import reference_sample
from .scheduling_answers import reference_run_engine, reference_schedule
from .watch import paused

# What a serve may not call: the engine's forward pass and everything that runs one.
FORBIDDEN = (LlamaForCausalLM.forward, LlamaForCausalLM.rope_at, DecoderLayer, Attention, apply_rope,
             apply_rope_signed, rope_tables,
             PagedKVCache, KVCache, ModelRunner, Scheduler, BlockManager, LLMEngine, LLM,
             F.scaled_dot_product_attention)


# ---------------------------------------------------------------- the forward pass


def reference_make_execute_model(model, num_blocks: int, block_size: int, rope, paged_attention, attention):
    """The course's answer to lab 11's forward-pass exercise."""
    cfg, layers = model.config, model.model.layers
    H, Hkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    k_pools = torch.zeros(cfg.num_hidden_layers, num_blocks * block_size, Hkv, D)  # per layer, a pool of slots
    v_pools = torch.zeros_like(k_pools)

    def execute_model(scheduled, allocator) -> dict:
        ids, positions, batch = [], [], []  # batch: (new tokens, context length, block table) per request
        for req, n in scheduled:
            start = req.num_computed
            ids += req.token_ids[start : start + n]
            positions += range(start, start + n)
            batch.append((n, start + n, allocator.block_tables[req.seq_id]))
        positions = torch.tensor(positions)
        with torch.inference_mode():
            x = model.model.embed_tokens(torch.tensor(ids))  # [N, C]
            for i, layer in enumerate(layers):
                qkv = layer.self_attn.qkv_proj(layer.input_layernorm(x)).view(-1, H + 2 * Hkv, D).transpose(0, 1)
                q = rope(qkv[None, :H], positions, cfg.rope_theta)[0]  # [H, N, D]
                k = rope(qkv[None, H : H + Hkv], positions, cfg.rope_theta)[0]  # [Hkv, N, D]
                v = qkv[H + Hkv :]
                o = paged_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), k_pools[i], v_pools[i],
                                    batch, block_size, attention)  # [N, H, D]
                x = x + layer.self_attn.o_proj(o.reshape(len(ids), H * D))
                x = x + layer.mlp(layer.post_attention_layernorm(x))
            x = model.model.norm(x)
            ends = torch.tensor([n for n, _, _ in batch]).cumsum(0) - 1  # each request's last new token
            rows = [(req, int(ends[b])) for b, (req, n) in enumerate(scheduled)
                    if req.num_computed + n == req.num_tokens]  # requests that sample after this step
            logits = model.lm_head(x[[row for _, row in rows]]).float()
        return {req.seq_id: logits[j] for j, (req, _) in enumerate(rows)}

    return execute_model


class _Steps:
    """Every step's logits (seq_id -> [V]) and the greedy tokens that came of them."""

    def __init__(self, steps: list[dict], outputs: dict):
        self.steps, self.outputs = steps, outputs

    def __repr__(self):
        first = next(((k, s, sid) for k, step in enumerate(self.steps) for sid, s in step.items()), None)
        head = "" if first is None else (f"; step {first[0]}'s logits for {first[2]!r} start "
                                         f"{[round(x, 4) for x in first[1][:3].tolist()]}")
        return f"{len(self.steps)} steps, greedy tokens {self.outputs}{head}"


def _same_steps(got, expected, atol: float = 1e-4) -> bool:
    """Same steps, the same requests sampling in each, logits within atol (another
    attention's order of additions moves them in the sixth decimal)."""
    if not isinstance(got, _Steps) or len(got.steps) != len(expected.steps) or got.outputs != expected.outputs:
        return False
    for mine, theirs in zip(got.steps, expected.steps):
        if set(mine) != set(theirs):
            return False
        for sid, row in theirs.items():
            if not (isinstance(mine[sid], torch.Tensor) and mine[sid].shape == row.shape
                    and torch.allclose(mine[sid].float(), row, atol=atol)):
                return False
    return True


def _where_steps(got, expected, atol: float = 1e-4) -> str | None:
    """The first step, and the first request in it, whose logits differ."""
    if not isinstance(got, _Steps):
        return None
    for k, (mine, theirs) in enumerate(zip(got.steps, expected.steps)):
        if set(mine) != set(theirs):
            return f"step {k}: logits for requests {sorted(mine)}, expected {sorted(theirs)}"
        for sid, row in theirs.items():
            diff = first_difference(mine[sid], row, ("logit",), atol=atol, rtol=0)
            if diff:
                return f"step {k}, request {sid!r}: {diff}"
    if len(got.steps) != len(expected.steps):
        return f"{len(got.steps)} steps, expected {len(expected.steps)}"
    return _where_tokens(got.outputs, expected.outputs)


def _where_tokens(got, expected) -> str | None:
    """The first request, and the first token of it, that differ."""
    if not isinstance(got, dict):
        return None
    for sid, tokens in expected.items():
        mine = list(got.get(sid, []))
        at = first_mismatch(mine, tokens)
        if at is not None:
            return (f"request {sid!r} first differs at output token {at}: expected {tokens[at:at + 3]}..., "
                    f"got {mine[at:at + 3]}... ({len(mine)} tokens, expected {len(tokens)})")
    return None


def _forward_steps(build_execute, w, eos) -> _Steps:
    """The workload through the course's loop, allocator and scheduler (greedy),
    with `build_execute(model)`'s forward pass; every step's logits recorded."""
    requests = [Request(s, tiny_prompt(s, p), m) for s, p, m in w.requests]
    with paused():  # building the model runs DecoderLayer's and Attention's constructors
        model = w.model()
    g = torch.Generator().manual_seed(11)
    for name, p in model.named_parameters():  # norms start at all ones: make each layer's norms tell apart
        if name.endswith("norm.weight"):
            p.data = 1 + 0.3 * torch.randn(p.shape, generator=g)
    execute = build_execute(model)
    steps = []

    def recorded(scheduled, allocator):
        logits = execute(scheduled, allocator)
        steps.append({sid: row.detach().float().clone() for sid, row in dict(logits).items()})
        return logits

    reference_run_engine(requests, ReferenceBlockAllocator(w.num_blocks, w.block_size), reference_schedule,
                         recorded, greedy, w.token_budget, w.max_num_seqs, list(eos))
    return _Steps(steps, {r.seq_id: list(r.output_ids) for r in requests})


@functools.lru_cache(maxsize=1)
def _forward_cases() -> tuple[Case, ...]:
    cases = []
    for w in WORKLOADS + [SMOL_SHAPED]:
        eos = tuple(eos_for(w))
        expected = _forward_steps(lambda model: engine_execute_model(model, w.num_blocks, w.block_size), w, eos)
        show = (f"lab 7's workload ({w.why}) on {describe_model(w.model())}, served by the course's loop, "
                f"allocator and scheduler; num_blocks={w.num_blocks}, block_size={w.block_size}, "
                f"token_budget={w.token_budget}; every step's logits compared")
        cases.append(Case((w, eos), expected, show))
    return tuple(cases)


def check_forward_pass(make_execute_model) -> bool:
    """make_execute_model(model, num_blocks, block_size, rope, paged_attention,
    attention) -> execute_model(scheduled, allocator) -> {seq_id: logits [V]}:
    every step's logits against tinyinfer's ModelRunner on the same steps (given
    the course's RoPE, paged attention and attention). Kept as
    "make_execute_model" on a pass."""
    def run(w, eos):
        return _forward_steps(lambda model: make_execute_model(model, w.num_blocks, w.block_size, reference_rope,
                                                               reference_paged_attention,
                                                               reference_causal_gqa_attention), w, eos)

    return run_check("forward_pass", run, lambda: list(_forward_cases()), same=_same_steps,
                     forbidden=FORBIDDEN + (engine_execute_model, reference_make_execute_model),
                     keep=("make_execute_model", make_execute_model), explain=_where_steps)


# ---------------------------------------------------------------- the assembled engine

# One workload with two seeded, sampled requests and a greedy one between them:
# (seq_id, prompt length, max_tokens, temperature, seed).
SAMPLED = Workload(32, 4, 16, 3, [("a", 7, 8), ("b", 5, 6), ("c", 9, 8)], False,
                   "two seeded, sampled requests (temperature 0.8, seeds 1000 and 1001) and a greedy one", tiny_model)
SAMPLED_REQUESTS = (("a", 7, 8, 0.8, 1000), ("b", 5, 6, 0.0, None), ("c", 9, 8, 0.8, 1001))


def _greedy_requests(w: Workload) -> tuple:
    return tuple((s, p, m, 0.0, None) for s, p, m in w.requests)


def _engine_run(w: Workload, eos, requests, draw=None, token_budget=None, max_num_seqs=None) -> tuple[dict, int]:
    """The requests through LLM.generate's parts: tinyinfer's Scheduler, ModelRunner
    and Sampler (a seeded request draws from its own generator, seeded once with
    its seed). Returns (tokens per request, steps). draw(logits, temperature,
    generator): another sampler in the Sampler's place, with the same generators."""
    bm = BlockManager(w.num_blocks, w.block_size, enable_prefix_caching=False)
    config = SchedulerConfig(max_num_seqs or w.max_num_seqs, token_budget or w.token_budget, True, "recompute")
    sched = Scheduler(config, bm)
    runner = ModelRunner(w.model(), torch.device("cpu"), torch.float32, w.num_blocks, w.block_size)
    reqs = [EngineRequest(s, None, tiny_prompt(s, p), SamplingParams(max_tokens=m, temperature=t, seed=seed), eos)
            for s, p, m, t, seed in requests]
    for r in reqs:
        sched.add(r)
    sampler, generators, steps = Sampler(), {}, 0
    while sched.waiting or sched.running:
        out = sched.schedule()
        logits = runner.execute_model(out).logits
        if draw is None:
            sampled = sampler(logits, out.sampling)
        else:
            tokens = []
            for row, seq in zip(logits, out.sampling):
                rid, p = seq.request.request_id, seq.params
                if rid not in generators:
                    generators[rid] = None if p.seed is None else torch.Generator().manual_seed(p.seed)
                tokens.append(int(draw(row.clone(), p.temperature, generators[rid])))
            sampled = SamplerOutput(token_ids=tokens, logprobs=[None] * len(tokens))
        sched.update_from_output(out, sampled)
        steps += 1
    return {r.request_id: list(r.samples[0].output_token_ids) for r in reqs}, steps


class _Served:
    """What a serve did: every request's tokens, the steps it returned, how often
    it called the paged attention it was handed; or the error it stopped with.
    As an expected value: `also`, tokens drawn by your kept sampler instead of
    the engine's (accepted too); `greedy()`, the tokens with every request
    greedy; `swapped_steps()`, the steps with token_budget and max_num_seqs
    swapped (both worked out only to explain a failure)."""

    def __init__(self, outputs, steps, paged_calls=None, *, also=None, greedy=None, swapped_steps=None,
                 error=None, where=None):
        self.outputs, self.steps, self.paged_calls = outputs, steps, paged_calls
        self.also, self.greedy, self.swapped_steps = also, greedy, swapped_steps
        self.error, self.where = error, where

    def __repr__(self):
        if self.error:
            return f"serve raised {self.error}"
        text = f"tokens {self.outputs}, serve returned {self.steps!r} (steps)"
        if self.also is not None:
            text += f"; or, drawn by your kept sampler, tokens {self.also}"
        if self.paged_calls is True:  # expected: used at all
            text += "; the paged attention passed as paged= used"
        elif self.paged_calls is not None:
            text += f"; the paged attention passed as paged= called {self.paged_calls} times"
        return text


def _is_steps(n) -> bool:
    return isinstance(n, numbers.Integral) and not isinstance(n, bool)


def _same_served(got, expected) -> bool:
    return (isinstance(got, _Served) and got.error is None
            and got.outputs in [expected.outputs] + ([expected.also] if expected.also is not None else [])
            and _is_steps(got.steps) and got.steps == expected.steps
            and (expected.paged_calls is None or bool(got.paged_calls)))


def _where_served(got, expected) -> str | None:
    """The first thing that differs: a request's tokens, the steps, the paged attention's calls."""
    if not isinstance(got, _Served):
        return None
    if got.error is not None:
        return got.where
    if got.outputs not in [expected.outputs] + ([expected.also] if expected.also is not None else []):
        where = _where_tokens(got.outputs, expected.outputs) or f"the requests differ: {sorted(got.outputs)}"
        if expected.greedy is not None and got.outputs == expected.greedy():
            where += ("; these are the greedy tokens of every request: the sampled requests were not sampled "
                      "with their temperature")
        return where
    if not _is_steps(got.steps):
        return (f"what serve returned differs: {got.steps!r}, where the number of steps is expected "
                f"({expected.steps}): return what run_engine returns")
    if got.steps != expected.steps:
        where = (f"the step count differs: serve returned {got.steps}, tinyinfer's scheduler takes "
                 f"{expected.steps} steps with the same token budget and max_num_seqs")
        if expected.swapped_steps is not None and got.steps == expected.swapped_steps() != expected.steps:
            where += f"; {got.steps} is what it takes with the token budget and max_num_seqs swapped"
        return where
    if expected.paged_calls is not None and not got.paged_calls:
        return ("the paged attention differs: serve never called the one passed as paged=; section 6 serves "
                "with paged=grouped_paged_attention, so serve must use it when given")
    return None


_DTYPE_ERROR = re.compile(r"dtype|Double|float64")
# Code the learner did not write: what the float64 search below skips.
_NOT_YOURS = tuple(os.path.dirname(m.__file__) + os.sep for m in (torch, sys.modules["tinyinfer"],
                                                                   sys.modules["tinyinfer_course"]))


def _has_float64(value) -> bool:
    if isinstance(value, torch.Tensor):
        return value.dtype == torch.float64
    return isinstance(value, (tuple, list)) and any(isinstance(v, torch.Tensor) and v.dtype == torch.float64
                                                    for v in value)


def _first_float64(run) -> str | None:
    """Run run() again, watching what every function returns: the first function
    written outside torch and the course that returns a float64 tensor, named."""
    found = []
    skip = _NOT_YOURS + tuple({sys.prefix + os.sep, sys.base_prefix + os.sep})

    def watch(frame, event, arg):
        if event == "return" and not found and _has_float64(arg) and not frame.f_code.co_filename.startswith(skip):
            name = frame.f_code.co_name
            found.append("a lambda" if name == "<lambda>" else f"{name}()")

    previous = sys.getprofile()
    sys.setprofile(watch)
    try:
        run()
    except Exception:
        pass
    finally:
        sys.setprofile(previous)
    return found[0] if found else None


def _setup(w: Workload, requests) -> tuple:
    reqs = [Request(s, tiny_prompt(s, p), m, temperature=t, seed=seed) for s, p, m, t, seed in requests]
    with paused():  # building the model runs DecoderLayer's and Attention's constructors
        model = w.model()
    return model, reqs


def _play(serve, w: Workload, eos, requests, paged: bool) -> _Served:
    calls = [0]

    def given_paged(*args):  # the course's grouped paged attention, counted: given code, not an answer
        calls[0] += 1
        return reference_grouped_paged_attention(*args)

    def run():
        model, reqs = _setup(w, requests)
        extra = {"paged": given_paged} if paged else {}
        steps = serve(model, reqs, w.num_blocks, w.block_size, w.token_budget, w.max_num_seqs, list(eos), **extra)
        return _Served({r.seq_id: list(r.output_ids) for r in reqs}, steps, calls[0] if paged else None)

    try:
        return run()
    except NotImplementedError:
        raise
    except Exception as e:
        if isinstance(e, TypeError) and paged and "'paged'" in str(e):
            return _Served(None, None, error=f"TypeError: {e}",
                           where="the signature differs: serve takes no paged=; section 6 calls "
                                 "serve(..., paged=grouped_paged_attention), so keep the given signature")
        name = _first_float64(run) if _DTYPE_ERROR.search(str(e)) else None
        if name is None:
            raise
        return _Served(None, None, error=f"{type(e).__name__}: {e}",
                       where=f"the dtype differs: {name} returned a torch.float64 tensor, where the model's "
                             "tensors are torch.float32; each piece must return the dtype it is given")


def _engine_case(w: Workload, eos, requests, paged: bool, what: str) -> Case:
    outputs, steps = _engine_run(w, eos, requests)
    sampled = any(t > 0 for *_, t, _ in requests)

    def greedy():
        return _engine_run(w, eos, tuple((s, p, m, 0.0, None) for s, p, m, _, _ in requests))[0]

    def swapped():
        try:
            return _engine_run(w, eos, requests, token_budget=w.max_num_seqs, max_num_seqs=w.token_budget)[1]
        except Exception:  # the engine refuses the swapped settings: nothing to compare with
            return None

    expected = _Served(outputs, steps, True if paged else None, greedy=greedy if sampled else None,
                       swapped_steps=swapped)
    return _case(w, eos, requests, paged, what, expected)


def _case(w: Workload, eos, requests, paged: bool, what: str, expected: _Served) -> Case:
    reqs = ", ".join(f"{s}: prompt {p}, max_tokens {m}" + (f", temperature {t}, seed {seed}" if t else "")
                     for s, p, m, t, seed in requests)
    show = (f"{what}. On {describe_model(w.model())}; num_blocks={w.num_blocks}, block_size={w.block_size}, "
            f"token_budget={w.token_budget}, max_num_seqs={w.max_num_seqs}, eos_token_ids={list(eos)}; "
            f"requests {reqs}; tokens and the returned step count compared with LLM.generate's parts")
    return Case((w, eos, requests, paged), expected, show)


def _two_eos(w: Workload) -> tuple[int, int]:
    """Two end-of-sequence ids that each stop a request: eos_for's (request a's
    third token) and a later token of another request."""
    first = eos_for(w)[0]
    one, _ = engine_outputs(w, [first])
    for s, _, _ in w.requests[1:]:
        for t in one[s][1:-1]:  # not its last token: stopping there would change nothing
            if t != first and t not in one["a"]:  # greedy tokens do not depend on the schedule: s stops sooner
                return first, t
    raise ValueError("no second end-of-sequence id stops a request")


@functools.lru_cache(maxsize=1)
def _your_engine_cases() -> tuple[Case, ...]:
    cases = []
    for w in WORKLOADS + [SMOL_SHAPED, WIDE_TINY]:
        eos = _two_eos(w) if w.eos else tuple(eos_for(w))
        what = w.why.replace("an end-of-sequence id", "two end-of-sequence ids, each stopping a request")
        cases.append(_engine_case(w, eos, _greedy_requests(w), False, what))
    cases.append(_engine_case(SAMPLED, (), SAMPLED_REQUESTS, False, SAMPLED.why + ": the tokens of LLM.generate "
                              "with SamplingParams(temperature=0.8, seed=...), or those your kept sampler draws"))
    w, e = WORKLOADS[1], cases[1].expected  # the same requests as case 1, through paged=
    cases.append(_case(w, (), _greedy_requests(w), True, w.why + "; served with paged= the course's grouped "
                       "paged attention, which serve must use (section 6 passes yours)",
                       _Served(e.outputs, e.steps, True, swapped_steps=e.swapped_steps)))
    return tuple(cases)


def _cases_with_your_sampler() -> list[Case]:
    """The cases; where a request samples, the tokens that your kept sampler
    (lab 3) draws with the same seeds are accepted too. Lab 3 accepts any
    correct draw, and only one that draws as the engine does (its hint) gives
    the engine's tokens."""
    cases = list(_your_engine_cases())
    try:
        yours = my_engine.load("sample", quiet=True)
    except Exception:  # no sampler to load: the engine's tokens only
        return cases
    if yours is reference_sample:
        return cases
    out = []
    for case in cases:
        w, eos, requests, _ = case.args
        e = case.expected
        if e.greedy is not None:
            try:
                also = _engine_run(w, eos, requests, draw=yours)[0]
            except Exception:  # your sampler fails here: the engine's tokens are the only ones accepted
                also = None
            e = _Served(e.outputs, e.steps, e.paged_calls, also=also, greedy=e.greedy, swapped_steps=e.swapped_steps)
        out.append(Case(case.args, e, case.show))
    return out


def check_your_engine(serve) -> bool:
    """serve(model, requests, num_blocks, block_size, token_budget, max_num_seqs,
    eos_token_ids, paged=None) -> steps, filling each request's output_ids, on
    tiny random models: every request's tokens (greedy, and seeded sampled ones)
    and the returned step count against LLM.generate's parts (tinyinfer's
    Scheduler, ModelRunner and Sampler), two end-of-sequence ids, and one case
    through paged= (the given paged attention must be used)."""
    return run_check("your_engine", lambda w, eos, requests, paged: _play(serve, w, eos, requests, paged),
                     _cases_with_your_sampler, same=_same_served, forbidden=FORBIDDEN, explain=_where_served)


def compare_outputs(mine: dict, engine: dict, decode=None) -> bool:
    """Print ✓ or ✗ for every request: are your greedy tokens the engine's? Returns
    True when all are. decode (the tokenizer's) shows the text too."""
    same = 0
    for seq_id, expected in engine.items():
        got = list(mine.get(seq_id, []))
        text = f"  {decode(got)!r}" if decode else ""
        if got == list(expected):
            same += 1
            print(f"✓ request {seq_id}: {len(got)} tokens, equal to tinyinfer's{text}")
        else:
            at = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
            print(f"✗ request {seq_id}: differs from token {at} on\n    expected {list(expected)}\n    got      {got}")
    print(f"{same} of {len(engine)} requests equal token for token")
    return same == len(engine)


LAB = Lab(11, "your engine",
          exports=("check_forward_pass", "reference_make_execute_model", "check_your_engine", "compare_outputs"),
          pieces={"make_execute_model": "reference_make_execute_model"},
          fallbacks={"check_forward_pass": reference_make_execute_model})
