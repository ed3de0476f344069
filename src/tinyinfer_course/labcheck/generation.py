"""Lab 4 (prefill and decode): the check of the learner's generation loop.

The loop is the heart of an inference engine: prefill the prompt once, then
decode one token at a time on the KV cache, sampling each token and stopping on
a stop id or at max_tokens. The check runs the learner's loop greedily on the
course's real model and requires the engine's own tokens (LLM.generate), token
for token, and the engine's way of getting them: one pass over the prompt, then
one one-token pass per further token.
"""
from __future__ import annotations

import functools

import torch

from tinyinfer.kv_cache import KVCache
from tinyinfer.llm import LLM
from tinyinfer.llm_engine import LLMEngine
from tinyinfer.block_manager import BlockManager
from tinyinfer.model_runner import ModelRunner
from tinyinfer.request import Request
from tinyinfer.sampling import SamplerOutput, SamplingParams
from tinyinfer.scheduler import Scheduler, SchedulerConfig
from .core import Case, first_mismatch, run_check
from .fixtures import tiny_model
from .registry import Lab


# ---------------------------------------------------------------- the course's answer


def reference_generate(model, prompt_ids: list[int], max_tokens: int, sample, stop_ids=(),
                       cache_class=None) -> list[int]:
    """The course's answer to lab 4's generate exercise."""
    cache_class = cache_class or KVCache
    weight = model.model.embed_tokens.weight  # its dtype and device are the activations'
    cache = cache_class(model.config, 1, len(prompt_ids) + max_tokens, weight.dtype, weight.device)
    ids = torch.tensor([list(prompt_ids)], device=weight.device)  # [1, T]: the whole prompt, once
    positions = torch.arange(len(prompt_ids), device=weight.device)[None]
    out: list[int] = []
    with torch.inference_mode():  # no autograd bookkeeping
        while True:
            hidden = model(ids, positions, cache)  # [1, T, C]; the cache keeps every K and V
            token = sample(model.compute_logits(hidden[:, -1])[0])  # only the last position predicts
            out.append(token)
            if token in stop_ids or len(out) >= max_tokens:
                return out
            ids = torch.tensor([[token]], device=weight.device)  # decode: the new token only
            positions = positions[:, -1:] + 1


# ---------------------------------------------------------------- the check


@functools.lru_cache(maxsize=1)
def _engine():
    """The engine on the course's default model, fp32 on the CPU: the expected
    tokens come from its LLM.generate. Loaded once per process (a few seconds);
    a small KV pool, since the check's requests are short."""
    return LLM(dtype="float32", device="cpu", kv_cache_memory_bytes=16 * 2**20)


class _CountingModel:
    """The model, with a note of each forward pass: how many tokens it was
    given, the position of the first, and whether autograd was recording
    (a loop outside torch.inference_mode() or torch.no_grad())."""

    def __init__(self, model):
        self._model, self.passes, self.recorded = model, [], 0

    def __call__(self, input_ids, positions, *args, **kwargs):
        first = int(positions.flatten()[0]) if isinstance(positions, torch.Tensor) and positions.numel() else None
        self.passes.append((int(input_ids.shape[1]), first))
        self.recorded += torch.is_grad_enabled()
        return self._model(input_ids, positions, *args, **kwargs)

    forward = __call__

    def __getattr__(self, name):  # config, compute_logits, parameters(), ...
        return getattr(self._model, name)


class _CountingCache:
    """Makes the engine's KVCache and counts the caches made (a case passes it as cache_class)."""

    made: list = []

    def __new__(cls, config, batch_size, max_len, dtype, device):
        cls.made.append((batch_size, max_len, dtype))
        return KVCache(config, batch_size, max_len, dtype, device)


def _greedy(logits) -> int:
    """The sampler the check hands your loop: greedy, on one row of scores."""
    if not (isinstance(logits, torch.Tensor) and logits.dim() == 1):
        shape = list(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"sample(logits) takes one row of scores, shape [vocab_size]; your loop passed {shape}")
    return int(torch.argmax(logits))


class _Raised:
    """What the loop raised, in place of its tokens."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self):
        return self.text


class _Outcome:
    def __init__(self, tokens, passes, caches=None, recorded=0):
        self.tokens, self.passes, self.caches = tokens, passes, caches
        self.recorded = recorded  # passes run with autograd recording

    def __eq__(self, other):
        return (isinstance(other, _Outcome) and isinstance(self.tokens, list) and self.tokens == other.tokens
                and self.passes == other.passes and self.caches == other.caches and self.recorded == other.recorded)

    def __repr__(self):
        shown = ", ".join(f"{t} token{'s' if t > 1 else ''} at {p}" for t, p in self.passes[:6])
        passes = f"{len(self.passes)} forward passes: {shown}" + (", ..." if len(self.passes) > 6 else "")
        cache = "" if self.caches is None else f", {self.caches} cache(s) made from cache_class"
        grad = ("; autograd off in every pass" if not self.recorded else
                f"; autograd recording in {self.recorded} pass(es) (outside torch.inference_mode())")
        return f"tokens {self.tokens}; {passes}{cache}{grad}"


def _where(got, expected) -> str | None:
    """The first reply token or forward pass where the loop differs from the engine's."""
    if isinstance(got, _Outcome) and isinstance(got.tokens, _Raised):
        return f"first difference: your loop {got.tokens.text}, after {len(got.passes)} forward pass(es) began"
    if not isinstance(got, _Outcome) or not isinstance(got.tokens, list):
        return None
    at = first_mismatch(got.tokens, expected.tokens)
    if at is not None:
        return (f"the tokens first differ at reply token {at} "
                f"({len(got.tokens)} tokens, expected {len(expected.tokens)})")
    at = first_mismatch(got.passes, expected.passes)
    if at is not None:
        mine = got.passes[at] if at < len(got.passes) else "none"
        theirs = expected.passes[at] if at < len(expected.passes) else "none"
        return f"forward pass {at} differs: (tokens, first position) {mine}, expected {theirs}"
    if got.recorded:
        return "right tokens and passes, but autograd recorded them: run the loop under torch.inference_mode()"
    return None


def _run(generate):
    def run(model, prompt_ids, max_tokens, stop_ids, counted_cache):
        counting = _CountingModel(model)
        _CountingCache.made = []
        try:
            tokens = generate(counting, list(prompt_ids), max_tokens, _greedy, stop_ids,
                              *([_CountingCache] if counted_cache else []))
        except NotImplementedError:
            raise
        except Exception as e:  # shown against the expected outcome, with the caches the loop made
            weight = str(model.model.embed_tokens.weight.dtype).removeprefix("torch.")
            made = ", ".join(str(m[2]).removeprefix("torch.") for m in _CountingCache.made) or "none"
            tokens = _Raised(f"raised {type(e).__name__}: {str(e)[:120]} (weights {weight}, "
                             f"caches made from cache_class: {made})")
        tokens = [int(t) for t in tokens] if isinstance(tokens, (list, tuple)) else tokens
        return _Outcome(tokens, counting.passes, len(_CountingCache.made) if counted_cache else None,
                        counting.recorded)
    return run


def _generate_cases() -> list[Case]:
    return list(_engine_cases()) + list(_bf16_cases())


@functools.lru_cache(maxsize=1)
def _engine_cases() -> tuple[Case, ...]:
    """The cases, with the engine's tokens: computed once per process."""
    llm = _engine()
    tok, eos = llm.tokenizer, tuple(llm.eos_token_ids)

    def engine_tokens(ids, max_tokens, stop_token_ids=()):
        params = SamplingParams(temperature=0, max_tokens=max_tokens, stop_token_ids=list(stop_token_ids))
        return list(llm.generate([{"prompt_token_ids": ids}], params)[0].outputs[0].token_ids)

    chat = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}], True)
    story = tok.encode("The lighthouse keeper climbed the stairs")
    counting = tok.encode("One, two, three, four,")
    stop_id = 2976  # ' six': the greedy reply to `counting` is ' five', ',', ' six', ...
    rows = [  # prompt, what it is, max_tokens, extra stop ids, pass a cache_class?
        (chat, "a chat question; the reply ends with the end-of-sequence token", 16, (), False),
        (story, "a story opening; stops at max_tokens", 6, (), False),
        (counting, f"counting; stop_ids also hold {stop_id} ({tok.decode([stop_id])!r})", 8, (stop_id,), True),
        (story, "max_tokens=1: the prefill's token only", 1, (), True),
    ]
    cases = []
    for ids, what, max_tokens, extra, counted in rows:
        tokens = engine_tokens(ids, max_tokens, extra)
        passes = [(len(ids), 0)] + [(1, len(ids) + i) for i in range(len(tokens) - 1)]
        expected = _Outcome(tokens, passes, 1 if counted else None)
        stop_ids = eos + tuple(extra)
        show = (f"prompt {tok.decode(ids)!r} ({len(ids)} tokens; {what}), max_tokens={max_tokens}, "
                f"stop_ids={stop_ids}, sample=greedy" + (", cache_class=a KVCache maker" if counted else ""))
        cases.append(Case((llm.model, ids, max_tokens, stop_ids, counted), expected, show))
    return tuple(cases)


@functools.lru_cache(maxsize=1)
def _bf16_cases() -> tuple[Case, ...]:
    """A tiny random model in bfloat16 (issue 56): a loop that makes its cache in
    float32, whatever the weights, fails here (the lab says: the weights' dtype and
    device). The expected tokens come from the engine's own scheduler and model
    runner, in the model's dtype."""
    model = tiny_model(seed=3, init_std=0.3).to(torch.bfloat16)
    ids = torch.randint(0, model.config.vocab_size, (9,), generator=torch.Generator().manual_seed(11)).tolist()
    cases = []
    for max_tokens, stop_ids in ((6, ()),):
        tokens = _engine_tokens_on(model, ids, max_tokens, stop_ids)
        passes = [(len(ids), 0)] + [(1, len(ids) + i) for i in range(len(tokens) - 1)]
        show = (f"a tiny random model in bfloat16 (2 layers, vocabulary {model.config.vocab_size}): prompt {ids}, "
                f"max_tokens={max_tokens}, stop_ids={stop_ids}, sample=greedy, cache_class=a KVCache maker "
                "(make the cache in the dtype and on the device of the model's weights)")
        cases.append(Case((model, ids, max_tokens, stop_ids, True), _Outcome(tokens, passes, 1), show))
    return tuple(cases)


def _engine_tokens_on(model, prompt_ids: list[int], max_tokens: int, stop_ids) -> list[int]:
    """Greedy tokens of tinyinfer's own Scheduler, BlockManager and ModelRunner, in the
    dtype and on the device of the model's weights (LLM.generate without the tokenizer)."""
    weight = model.model.embed_tokens.weight
    num_blocks, block_size = -(-(len(prompt_ids) + max_tokens) // 4) + 1, 4
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
    scheduler = Scheduler(SchedulerConfig(1, len(prompt_ids) + max_tokens, True, "recompute"), bm)
    runner = ModelRunner(model, weight.device, weight.dtype, num_blocks, block_size)
    request = Request("bf16", None, list(prompt_ids), SamplingParams(max_tokens=max_tokens, temperature=0.0),
                      stop_ids)
    scheduler.add(request)
    with torch.inference_mode():
        while scheduler.waiting or scheduler.running:
            out = scheduler.schedule()
            tokens = [int(row.argmax()) for row in runner.execute_model(out).logits]
            scheduler.update_from_output(out, SamplerOutput(token_ids=tokens, logprobs=[None] * len(tokens)))
    return list(request.samples[0].output_token_ids)


def check_generate(generate) -> bool:
    """generate(model, prompt_ids, max_tokens, sample, stop_ids=(), cache_class=None)
    -> the reply's token ids, the stop token included (as LLM.generate reports
    them). Greedy, on the course's model, against LLM.generate token for token;
    it must run one pass over the prompt (positions 0..) and then one
    one-token pass per further token, at the next position, each with autograd
    off (torch.inference_mode())."""
    forbidden = (reference_generate, LLM.generate, LLM.chat, LLM.stream, LLMEngine.step)
    return run_check("generate", _run(generate), _generate_cases, forbidden=forbidden, keep=("generate", generate),
                     explain=_where)


LAB = Lab(4, "prefill and decode", exports=("check_generate", "reference_generate"),
          pieces={"generate": "reference_generate"}, fallbacks={"check_generate": reference_generate})
