"""How long one engine step takes: a linear model fitted to the real engine.

A continuous-batching engine runs one forward pass per step. That pass carries
some prompt tokens being prefilled (in chunks) and one token for each sequence
being decoded. Its time is, to a good first approximation, linear:

    step_time = decode_base_s                       # read every weight once
              + prefill_s_per_token * prefill_tokens  # prefill is compute-bound
              + decode_s_per_seq    * decode_seqs     # each extra decode row is cheap
              + decode_s_per_context_token * context  # attention reads the KV cache

The base term is why batching pays: the weights are read once per step, however
many sequences share it. The prefill term is why a long prompt landing in a
step slows down every sequence decoding in the same step (the interference that
disaggregated serving removes). `calibrate.py` measures these numbers on the
real model; the defaults below are round figures of the same order as the
135M model on a 2-core CPU, for tests that must not load a model.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class StepCostModel:
    prefill_s_per_token: float = 2e-3
    decode_base_s: float = 50e-3
    decode_s_per_seq: float = 5e-3
    decode_s_per_context_token: float = 0.0  # per cached token read by decoding sequences

    def __post_init__(self):
        for name, value in asdict(self).items():
            if not (value >= 0):
                raise ValueError(f"StepCostModel.{name}={value!r} is invalid: must be >= 0 seconds")
        if self.decode_base_s + self.prefill_s_per_token + self.decode_s_per_seq <= 0:
            raise ValueError("StepCostModel: a step must take some time (all costs are 0)")

    def step_time(self, prefill_tokens: int = 0, decode_seqs: int = 0, context_tokens: int = 0) -> float:
        """Seconds for one forward pass with this much work in it (0 if there is none)."""
        if prefill_tokens == 0 and decode_seqs == 0:
            return 0.0
        return (self.decode_base_s + self.prefill_s_per_token * prefill_tokens
                + self.decode_s_per_seq * decode_seqs + self.decode_s_per_context_token * context_tokens)

    def request_latency(self, prompt_len: int, output_len: int, max_num_batched_tokens: int | None = None) -> float:
        """One request alone on an idle replica: its prefill (in chunks of at most
        max_num_batched_tokens, one step each) then output_len - 1 decode steps.
        No number of replicas can make a request faster than this."""
        chunk = max_num_batched_tokens or prompt_len
        t, left = 0.0, prompt_len
        while left > 0:
            n = min(chunk, left)
            t += self.step_time(prefill_tokens=n)
            left -= n
        for i in range(output_len - 1):
            t += self.step_time(decode_seqs=1, context_tokens=prompt_len + i + 1)
        return t

    def to_dict(self) -> dict:
        return asdict(self)


def roofline_cost_model(params: float, roofline, bytes_per_param: float = 2,
                        kv_bytes_per_token: float = 0) -> StepCostModel:
    """A StepCostModel from a chip's datasheet instead of a measurement: the
    roofline's two bounds as the linear model's terms.

    - prefill is compute-bound: 2 x params FLOPs per prompt token at peak;
    - a decode step reads every weight once (the base) and each sequence's
      KV cache (per context token), at the full bandwidth, and does
      2 x params FLOPs per sequence at peak.
    The roofline takes the larger of time for bytes and time for FLOPs; the
    linear model adds them, so it errs on the slow side (by the arithmetic's
    time while the weights' products wait for memory, by the weights' reading
    time once they are compute-bound). It exists to give the fleet simulator a
    StepCostModel for a chip it cannot measure. The worked problems do not use
    it: they price a step with hardware.decode_step_time, the course's one
    per-operation step-time model. `roofline` is a hardware.Roofline (for a
    server split n ways, multiply both figures by n)."""
    if not params > 0:
        raise ValueError(f"params={params!r} is invalid: must be > 0")
    per_token = 2 * params / roofline.peak_flops
    return StepCostModel(prefill_s_per_token=per_token,
                         decode_base_s=params * bytes_per_param / roofline.bandwidth,
                         decode_s_per_seq=per_token,
                         decode_s_per_context_token=kv_bytes_per_token / roofline.bandwidth)
