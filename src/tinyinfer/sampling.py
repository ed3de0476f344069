"""SamplingParams and the sampler: how a row of logits becomes one token.

The pipeline, in vLLM's order:
  logits -> repetition penalty -> temperature -> min-p -> top-k -> top-p -> draw
Temperature 0 means greedy: take the highest score (after the penalty).
Every step is a small function, so a lab can swap in its own and a chapter can
show the distribution after each step. The Sampler at the end runs them for a
whole step's batch, for the engine and for speculative decoding alike.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .checks import is_int, is_number, require
from .outputs import Logprob, PositionLogprobs

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

    def __post_init__(self):
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
    cdf = weights.double().cumsum(-1)  # float64: the last entries of a 49,152-term sum stay exact enough
    u = torch.rand(1, dtype=torch.float64, generator=generator, device=weights.device) * cdf[-1]
    i = int(torch.searchsorted(cdf, u, right=True))
    if i == weights.numel():  # u rounded up to the total (about 1 in 2**53): the last entry with weight
        i = int(torch.nonzero(weights)[-1])
    return i


def make_generator(seed: int | None, device) -> torch.Generator | None:
    """A private random stream per seeded sequence, so its draws do not depend on
    what else is in the batch. Unseeded sequences share torch's global stream."""
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


# --- the batched sampler: a step's logits in, one token per sequence out -------------


@dataclass
class SamplingState:
    """What the sampler keeps about one sequence from step to step."""

    generator: torch.Generator | None  # a seeded sequence's own random stream (None: torch's global one)
    seen: torch.Tensor | None = None  # [V] mask of the tokens the repetition penalty counts as seen
    num_seen: int = 0  # how many of the sequence's tokens are marked in it


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


class Sampler:
    """Samples every row of a step at once where the rows allow it: greedy rows
    by one argmax over the batch, logprobs by one log_softmax. Rows with a
    temperature draw one by one (a seeded request must draw from its own
    generator, whatever else is in the batch), through the processors above.

    It keeps each sequence's SamplingState (its generator and repetition-penalty
    mask) from its first draw until free(); the engine frees a request's
    sequences when the request leaves it."""

    def __init__(self, decode=None):
        self.decode = decode  # token id -> text for Logprob.decoded_token (None: no text)
        self.states: dict[str, SamplingState] = {}  # seq_id -> its state, for live sequences that need one

    def state(self, seq, device) -> SamplingState:
        """seq's state, made on first use. Sample i of a seeded request draws from
        seed + i (vLLM's rule), so each equals a lone request with that seed."""
        st = self.states.get(seq.seq_id)
        if st is None:
            seed = seq.params.seed
            st = self.states[seq.seq_id] = SamplingState(make_generator(None if seed is None else seed + seq.index,
                                                                        device))
        return st

    def generator(self, seq, device) -> torch.Generator | None:
        return self.state(seq, device).generator if seq.params.seed is not None else None

    def free(self, seqs) -> None:
        """Forget the state of sequences that are done."""
        for seq in seqs:
            self.states.pop(seq.seq_id, None)

    @torch.inference_mode()
    def __call__(self, logits: torch.Tensor, seqs: list, prompt_logits: list | None = None) -> SamplerOutput:
        """logits [M, V]: row i is seqs[i]'s. prompt_logits: model_runner.PromptLogits
        records, the logits of the prompt positions a step computed."""
        raw = logits.float()
        processed = raw
        for i, seq in enumerate(seqs):
            if seq.params.repetition_penalty != 1.0:
                if processed is raw:
                    processed = raw.clone()
                processed[i] = apply_repetition_penalty(raw[i], self.seen_mask(seq, raw.shape[-1], raw.device),
                                                        seq.params.repetition_penalty)
        tokens = [0] * len(seqs)
        greedy = [i for i, s in enumerate(seqs) if s.params.greedy]
        if greedy:
            for i, t in zip(greedy, processed[greedy].argmax(-1).tolist()):
                tokens[i] = t
        for i, seq in enumerate(seqs):  # row order: unseeded rows share torch's stream in a fixed order
            if not seq.params.greedy:
                tokens[i] = sample(processed[i], seq.params, self.generator(seq, raw.device))
        prompt = [PromptLogprobs(p.seq, p.start, self.prompt_logprobs(p.seq, p.start, p.logits))
                  for p in prompt_logits or []]
        return SamplerOutput(tokens, self._logprobs(raw, seqs, tokens), prompt)

    @torch.inference_mode()
    def draft_target_probs(self, logits: torch.Tensor, seq, drafts: list[int]) -> torch.Tensor:
        """Speculative decoding: logits[j] is the target's output after seq's tokens
        and drafts[:j]. Returns the probabilities sample() would draw from at each
        row, with the repetition penalty counting the drafts before it as seen."""
        penalty = seq.params.repetition_penalty != 1.0
        mask = self.seen_mask(seq, logits.shape[-1], logits.device) if penalty else None
        rows = []
        for j in range(logits.shape[0]):
            if mask is not None and j:
                mask = mask.clone()
                mask[drafts[j - 1]] = True
            rows.append(processed_probs(logits[j], seq.params, mask))
        return torch.stack(rows)

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
        return self.decode([token]) if self.decode else None


def seen_token_ids(token_ids: list[int], params: SamplingParams, device=None) -> torch.Tensor | None:
    """The tokens the repetition penalty counts as seen (prompt + output), as ids;
    None when the penalty is off."""
    if params.repetition_penalty == 1.0:
        return None
    return torch.tensor(sorted(set(token_ids)), device=device)


# --- inspection helpers for chapters and labs (the engine never calls these) ---


@torch.no_grad()  # not inference_mode: its tensors refuse in-place edits later, which would puzzle a learner
def next_token_logits(llm, prompt) -> torch.Tensor:
    """The raw scores the model gives every vocabulary entry as the token after
    `prompt` (a string, or a list of token ids): one forward pass, no sampling.
    Returned as a 1-D fp32 tensor on the CPU, so it can be examined anywhere."""
    from .forward import forward_hidden  # here, not at the top: the sampler itself needs no model

    ids = llm.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    hidden = forward_hidden(llm.model, ids)  # one prefill on a fresh cache
    return llm.model.compute_logits(hidden[-1]).float().cpu()  # only the last position predicts the next


def next_token_distribution(llm, prompt, params: SamplingParams, top: int = 10):
    """The distribution the sampler would draw the next token from, returned for
    inspection: (probs over the whole vocabulary after every processor in
    `params`, the `top` most likely entries as (token_id, text, probability)).

    As in the engine, the repetition penalty counts the prompt's tokens as seen.
    At temperature 0 the draw is greedy, so all the probability sits on one token."""
    ids = llm.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
    probs = processed_probs(next_token_logits(llm, ids), params, seen_token_ids(ids, params))
    values, order = torch.topk(probs, top)
    pairs = [(int(i), float(v)) for v, i in zip(values, order) if v > 0]  # cut tokens are not candidates
    return probs, [(i, llm.tokenizer.decode([i]), v) for i, v in pairs]


def processed_probs(logits: torch.Tensor, params: SamplingParams, seen: torch.Tensor | None = None) -> torch.Tensor:
    """The probabilities `sample` draws from, for one row of raw logits. At
    temperature 0 (greedy) all of it sits on the highest processed score."""
    processed = process_logits(logits.float(), params, seen)
    if params.greedy:
        probs = torch.zeros_like(processed)
        probs[torch.argmax(processed)] = 1.0
        return probs
    return processed.softmax(-1)
