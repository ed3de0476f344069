"""Speculative decoding vs plain decoding on the default model, in one run.

    python benchmarks/speculative.py [--new-tokens 48] [--repeats 1] [--device cpu]

For each prompt, greedy decoding (EOS ignored) runs first with no draft (one
token per target pass, the same loop and cache: the baseline), then with the
n-gram draft for k in --ngram-k and the layer draft for L in --layers. Every
run must return exactly the baseline's tokens (greedy speculation changes the
cost, never the text). Prints acceptance rate, tokens per target pass (the
speed-up if drafting and verifying were free), tokens/s and the speed-up over
the baseline measured in the same run. tok/s is the best of --repeats runs.
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from tinyinfer import LLM, SamplingParams  # noqa: E402
from tinyinfer_course.speculative import SpeculativeDecoder  # noqa: E402

PROMPTS = {
    # Code that repeats a pattern: prompt lookup can copy whole stretches.
    "code": ("class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n\n"
             "class Size:\n    def __init__(self, width, height):\n        self.width = width\n"
             "        self.height = height\n\nclass Color:\n    def __init__(self, red, green, blue):\n"),
    # Plain prose: few long repeats, so lookups rarely match.
    "prose": ("The history of the lighthouse begins with fires lit on hills near harbours, "
              "and over the centuries it became a craft of lenses, clockwork and"),
}


def run(spec, ids, params, repeats):
    best = None
    for _ in range(repeats):
        out, stats = spec.generate(ids, params)
        if best is None or stats.wall_time_s < best[1].wall_time_s:
            best = (out, stats)
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--ngram-k", default="2,4,8")
    ap.add_argument("--layers", default="20,28", help="draft depths L for the layer draft")
    ap.add_argument("--layer-k", type=int, default=2, help="k for the layer draft")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    llm = LLM("smollm2-135m-instruct", dtype=args.dtype, device=args.device)
    params = SamplingParams(max_tokens=args.new_tokens, temperature=0, ignore_eos=True)
    configs = [("ngram", int(k), None) for k in args.ngram_k.split(",")]
    configs += [("layers", args.layer_k, int(L)) for L in args.layers.split(",")]
    n_layers = llm.model_config.num_hidden_layers
    print(f"{args.device} {args.dtype}, greedy, {args.new_tokens} new tokens, best of {args.repeats}; "
          f"target has {n_layers} layers")
    print(f"{'prompt':<6} {'draft':<7} {'k':>2} {'L':>3} {'accept':>7} {'tok/pass':>8} {'tok/s':>7} {'speed-up':>8}")
    for name, text in PROMPTS.items():
        ids = llm.tokenizer.encode(text)
        ref, base = run(SpeculativeDecoder(llm, draft="none"), ids, params, args.repeats)
        print(f"{name:<6} {'none':<7} {'-':>2} {'-':>3} {'-':>7} {1.0:>8.2f} "
              f"{base.tokens_per_second:>7.1f} {1.0:>7.2f}x")
        for draft, k, L in configs:
            spec = SpeculativeDecoder(llm, draft=draft, num_speculative_tokens=k, draft_layers=L)
            out, st = run(spec, ids, params, args.repeats)
            assert out == ref, f"{draft} k={k} L={L}: greedy output differs from plain decoding"
            speedup = st.tokens_per_second / base.tokens_per_second
            print(f"{name:<6} {draft:<7} {k:>2} {L or '-':>3} {st.acceptance_rate:>7.2f} "
                  f"{st.tokens_per_target_pass:>8.2f} {st.tokens_per_second:>7.1f} {speedup:>7.2f}x")


if __name__ == "__main__":
    main()
