"""Lab 11 (your engine): your pieces behind the calls `tinyinfer serve` makes.

`tinyinfer serve --engine file.py:build` serves any object with the calls of
server/engine_protocol.py's ServableEngine: add_request, step, abort_request,
has_unfinished_requests, and a tokenizer, a model name and a context length.
YourEngine is lab 7's loop cut into steps around the pieces you wrote (your
allocator, scheduler step, forward pass and sampler): `step()` is one turn of
your run_engine's `while` loop, and `add_request` puts a request in its
waiting queue, at any time, as a server needs. The server does the rest: the
OpenAI routes, streaming, chat templates, aborts when a client goes away.

It is given code, not an exercise: everything in it is bookkeeping that your
run_engine already does (count the computed tokens, append the sampled one,
finish on an end-of-sequence id or at max_tokens, free the blocks), plus what a
server needs on top: the reply's text, grown a few tokens at a time, and a
clear refusal of the settings your engine does not implement.
"""
from __future__ import annotations

from collections import deque

from tinyinfer.checks import check_context_window, check_prompt_ids
from tinyinfer.detokenizer import IncrementalDetokenizer
from tinyinfer.outputs import CompletionOutput, RequestOutput
from tinyinfer.sampling import SamplingParams
from .records import Request
from .registry import Lab


class YourEngine:
    """Your allocator, scheduler, forward pass and sampler, one step at a time."""

    def __init__(self, model_name: str, tokenizer, allocator, schedule, execute_model, sample, token_budget: int,
                 max_num_seqs: int, eos_token_ids, max_model_len: int):
        self.model_name, self.tokenizer = model_name, tokenizer
        self.allocator, self.schedule, self.execute_model, self.sample = allocator, schedule, execute_model, sample
        self.token_budget, self.max_num_seqs, self.eos_token_ids = token_budget, max_num_seqs, set(eos_token_ids)
        # The server refuses a prompt that cannot fit (engine_protocol.kv_capacity_tokens): tell it
        # the pool's size, not only the model's context window, so no request waits forever.
        self.num_blocks = len(allocator.free_blocks)
        self.max_model_len = min(max_model_len, self.num_blocks * allocator.block_size)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.requests: dict[str, tuple[Request, SamplingParams, IncrementalDetokenizer, list[str]]] = {}

    # ------------------------------------------------------------ requests in

    def add_request(self, prompt, params: SamplingParams, request_id: str) -> str:
        """Queue one request; a ValueError names the field of a request this engine refuses."""
        ids = self._prompt_ids(prompt)
        self._check(params, ids, request_id)
        req = Request(request_id, ids, params.max_tokens, temperature=params.temperature, seed=params.seed)
        self.requests[request_id] = (req, params, IncrementalDetokenizer(self.tokenizer.decode, req.output_ids, 0), [])
        self.waiting.append(req)
        return request_id

    def _prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        if isinstance(prompt, dict) and isinstance(prompt.get("prompt_token_ids"), list):
            return list(prompt["prompt_token_ids"])
        raise ValueError(f"prompt={prompt!r:.80} is invalid: must be a string or {{'prompt_token_ids': [...]}}")

    def _check(self, params: SamplingParams, ids: list[int], request_id: str) -> None:
        params.validate()  # the ranges every engine refuses (SamplingParams' own checks)
        if request_id in self.requests:
            raise ValueError(f"request_id={request_id!r} is already in use by an unfinished request")
        # LLMEngine's own checks: an id outside the vocabulary would fail inside a step, not here
        check_prompt_ids(ids, self.tokenizer.vocab_size, "prompt")
        check_context_window(len(ids), params.max_tokens, self.max_model_len, "max_tokens")
        # What your sampler and loop do not implement: refused by name, never silently ignored.
        unsupported = {"n": params.n != 1, "top_p": params.top_p != 1.0, "top_k": params.top_k not in (0, -1),
                       "min_p": params.min_p != 0.0, "repetition_penalty": params.repetition_penalty != 1.0,
                       "stop": bool(params.stop), "logprobs": params.logprobs is not None,
                       "prompt_logprobs": params.prompt_logprobs is not None}
        for name, used in unsupported.items():
            if used:
                raise ValueError(f"{name}={getattr(params, name)!r} is not supported by your engine (it serves "
                                 "temperature, seed, max_tokens, ignore_eos and stop_token_ids)")

    def abort_request(self, request_id: str) -> None:
        """Stop a request (a client went away) and free its blocks; an unknown id is ignored."""
        entry = self.requests.pop(request_id, None)
        if entry is None:
            return
        req = entry[0]
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
        if req.seq_id in self.allocator.block_tables:
            self.allocator.free(req.seq_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ------------------------------------------------------------ one step

    def step(self) -> list[RequestOutput]:
        """One turn of your run_engine's loop; a RequestOutput for each request that got a token."""
        step = self.schedule(self.waiting, self.running, self.allocator, self.token_budget, self.max_num_seqs)
        if not step.scheduled:
            return []
        logits = self.execute_model(step.scheduled, self.allocator)
        outputs = []
        for req, n in step.scheduled:
            req.num_computed += n
            if req.seq_id not in logits:  # a prompt chunk that is not the last
                continue
            token = self.sample(logits[req.seq_id], req.temperature, req.generator)
            req.output_ids.append(token)
            outputs.append(self._output(req, token))
        return outputs

    def _output(self, req: Request, token: int) -> RequestOutput:
        _, params, detokenizer, text = self.requests[req.seq_id]
        stops = set(params.stop_token_ids or ()) | (set() if params.ignore_eos else self.eos_token_ids)
        finish = "stop" if token in stops else "length" if len(req.output_ids) >= req.max_tokens else None
        text.append(detokenizer.add())
        if finish is not None:
            text.append(detokenizer.flush())
            self.allocator.free(req.seq_id)  # its blocks serve the queue next step
            self.running.remove(req)
            del self.requests[req.seq_id]
        stop_reason = token if finish == "stop" and token in (params.stop_token_ids or ()) else None
        sample = CompletionOutput(0, "".join(text), list(req.output_ids), None, None, finish, stop_reason)
        return RequestOutput(req.seq_id, None, req.prompt_ids, None, [sample], finish is not None)


LAB = Lab(11, "your engine", exports=("YourEngine",))
