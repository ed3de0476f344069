"""The engine's Sampler: a step's logits in, one token per sequence out.

It runs sampling.py's pipeline over the whole batch at once, keeps what each
sequence needs from step to step (its random stream, its penalty mask, its
grammar's matcher) in a slot on the sequence, and reports logprobs when a
request asks for them. A request with structured_outputs gets a mask first:
every token its grammar does not allow scores -inf (structured_output.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .outputs import Logprob, PositionLogprobs
from .sampling import (PromptLogprobs, SamplerOutput, draw_rows, make_generator, processed_probs_batch,
                       sample)


def select_rows(x: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """x[rows] for sorted, distinct rows, without making the host wait for a GPU.
    x[[0, 2]] would copy the Python list to the device from ordinary (pageable)
    memory, a copy the host waits for. Consecutive rows (all of them, say) are a
    slice, a view that copies nothing; other rows are picked with an index copied
    from pinned memory with non_blocking=True, which the host does not wait for."""
    first, last = rows[0], rows[-1]
    if last - first + 1 == len(rows):
        return x[first : last + 1]
    index = torch.tensor(rows, pin_memory=x.is_cuda).to(x.device, non_blocking=True)
    return x.index_select(0, index)


@dataclass
class SamplingState:
    """What the sampler keeps about one sequence from step to step. It lives on
    the sequence (seq.sampling_state), so it is gone when the sequence is."""

    generator: torch.Generator | None  # a seeded sequence's own random stream (None: torch's global one)
    seen: torch.Tensor | None = None  # [V] mask of the tokens the repetition penalty counts as seen
    num_seen: int = 0  # how many of the sequence's tokens are marked in it
    matcher: object | None = None  # structured output: the grammar's automaton, moved on by each token drawn


class Sampler:
    """Samples every row of a step, in three groups:
      greedy rows    one argmax over all of them;
      unseeded rows  one batched filter, then one call for their random numbers
                     (torch's global stream);
      seeded rows    one by one, each from its own generator, so a seeded
                     request gets the same tokens whatever else is in the batch.
    On a GPU the host waits for the device once per group (its .tolist()), and
    once per seeded row: not once per row, which would cost as much as the step.
    The repetition penalty comes first, for all of them at once, then the
    grammar mask of the rows that ask for structured output."""

    def __init__(self, decode=None, structured_output=None):
        self.decode = decode  # token ids -> text, for Logprob.decoded_token (None: no text)
        self.structured_output = structured_output  # a StructuredOutputManager (None: no grammars)

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, seqs: list, prompt_logits: list | None = None) -> SamplerOutput:
        """logits [M, V]: row i is seqs[i]'s. prompt_logits: outputs.PromptLogits
        records, the logits of the prompt positions a step computed."""
        raw = logits.float()
        processed = self.apply_grammar(self.apply_penalties(raw, seqs), raw, seqs)
        tokens = [0] * len(seqs)
        greedy = [i for i, s in enumerate(seqs) if s.params.greedy]
        unseeded = [i for i, s in enumerate(seqs) if not s.params.greedy and s.params.seed is None]
        seeded = [i for i, s in enumerate(seqs) if not s.params.greedy and s.params.seed is not None]
        if greedy:  # one argmax for all of them, one read to the host
            for i, t in zip(greedy, select_rows(processed, greedy).argmax(-1).tolist()):
                tokens[i] = t
        if unseeded:  # one filter for all of them; draw_rows takes their random numbers in one call
            probs = processed_probs_batch(select_rows(processed, unseeded), [seqs[i].params for i in unseeded])
            for i, t in zip(unseeded, draw_rows(probs)):
                tokens[i] = t
        # Seeded rows one at a time, each from its own stream, which no other row
        # touches. On a GPU each still makes the host wait once (draw's int()).
        # That is kept: a seeded request must get the same tokens alone or in any
        # batch, and the one-row pipeline computes exactly the same thing wherever
        # the row sits, where a batched kernel's rounding can change with the batch.
        for i in seeded:
            tokens[i] = sample(processed[i], seqs[i].params, self.state(seqs[i], raw.device).generator)
        self.advance_grammar(seqs, tokens)
        prompt = [PromptLogprobs(p.seq, p.start, self.prompt_logprobs(p.seq, p.start, p.logits))
                  for p in prompt_logits or []]
        return SamplerOutput(tokens, self._logprobs(raw, seqs, tokens), prompt)

    def state(self, seq, device) -> SamplingState:
        """seq's state, made on first use. Sample i of a seeded request draws from
        seed + i (vLLM's rule), so each equals a lone request with that seed."""
        if seq.sampling_state is None:
            seed = seq.params.seed
            seq.sampling_state = SamplingState(make_generator(None if seed is None else seed + seq.index, device))
        return seq.sampling_state

    def apply_penalties(self, raw: torch.Tensor, seqs: list) -> torch.Tensor:
        """apply_repetition_penalty for every row that asks for it, in one operation."""
        rows = [i for i, s in enumerate(seqs) if s.params.repetition_penalty != 1.0]
        if not rows:
            return raw
        seen = torch.stack([self.seen_mask(seqs[i], raw.shape[-1], raw.device) for i in rows])
        penalty = torch.tensor([seqs[i].params.repetition_penalty for i in rows], device=raw.device)[:, None]
        scores = raw[rows]
        processed = raw.clone()
        processed[rows] = torch.where(seen, torch.where(scores > 0, scores / penalty, scores * penalty), scores)
        return processed

    def apply_grammar(self, processed: torch.Tensor, raw: torch.Tensor, seqs: list) -> torch.Tensor:
        """-inf for every token a structured row's grammar does not allow next,
        one [rows, V] mask for all of them. raw stays as it was: logprobs are
        reported from the model's own distribution, as vLLM does."""
        rows = [i for i, s in enumerate(seqs) if s.params.structured_outputs is not None]
        if not rows:
            return processed
        if self.structured_output is None:
            raise ValueError("structured_outputs: this sampler has no StructuredOutputManager")
        allowed = self.structured_output.allowed([self.matcher(seqs[i], raw.device) for i in rows])
        if processed is raw:
            processed = raw.clone()
        processed[rows] = processed[rows].masked_fill(~allowed.to(processed.device), -float("inf"))
        return processed

    def matcher(self, seq, device):
        """seq's grammar matcher, made on first use: each of n samples has its own."""
        st = self.state(seq, device)
        if st.matcher is None:
            st.matcher = self.structured_output.matcher(seq.params.structured_outputs)
        return st.matcher

    def advance_grammar(self, seqs: list, tokens: list[int]) -> None:
        """Move each structured row's matcher on by the token it drew."""
        for seq, token in zip(seqs, tokens):
            if seq.params.structured_outputs is not None:
                seq.sampling_state.matcher.consume_token(token)

    def seen_mask(self, seq, vocab_size: int, device=None) -> torch.Tensor:
        """The tokens the repetition penalty counts as seen (prompt + output), as a
        [V] mask kept in seq's state and extended by the tokens added since the
        last call: O(1) per step, not O(context)."""
        st = self.state(seq, device)
        if st.seen is None:
            st.seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        if st.num_seen < len(seq.token_ids):
            st.seen[torch.tensor(seq.token_ids[st.num_seen :], device=device)] = True
            st.num_seen = len(seq.token_ids)
        return st.seen

    def _logprobs(self, raw: torch.Tensor, seqs: list, tokens: list[int]) -> list[PositionLogprobs | None]:
        out = [None] * len(seqs)
        rows = [i for i, s in enumerate(seqs) if s.params.logprobs is not None]
        if rows:  # from the model's own distribution, before any processor (as vLLM reports them)
            lp = torch.log_softmax(raw[rows], -1)
            for j, i in enumerate(rows):
                out[i] = self.top_logprobs(lp[j], tokens[i], seqs[i].params.logprobs)
        return out

    def prompt_logprobs(self, seq, start: int, logits: torch.Tensor) -> list[PositionLogprobs]:
        """logits[j] is position start+j's output, which scores prompt token start+j+1."""
        lp = torch.log_softmax(logits.float(), -1)
        k = seq.params.prompt_logprobs
        return [self.top_logprobs(lp[j], seq.token_ids[start + j + 1], k) for j in range(lp.shape[0])]

    def top_logprobs(self, lp: torch.Tensor, token: int, n: int) -> PositionLogprobs:
        """The chosen token plus the n most likely ones, each with its rank."""
        out = {}
        if n:
            values, ids = torch.topk(lp, n)
            for rank, (v, t) in enumerate(zip(values.tolist(), ids.tolist()), start=1):
                out[t] = Logprob(v, rank, self._text(t))
        if token not in out:
            rank = int((lp > lp[token]).sum()) + 1
            out[token] = Logprob(float(lp[token]), rank, self._text(token))
        return out

    def _text(self, token: int) -> str | None:
        # One decode per candidate: tokenizers' decode_batch is slower for a
        # handful of single tokens (it starts threads), so there is no batch call.
        return self.decode([token]) if self.decode else None
