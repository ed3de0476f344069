"""What an int8 KV cache costs in quality: kv_cache_dtype="auto" against "int8"
on one engine configuration, measured through the paged pool
(benchmarks/kv_int8.py runs it and stores a report; chapter 5 renders it).

    from tinyinfer_course.reports import kv_int8 as kvq
    report = kvq.load()            # the stored copy beside this file
    print(kvq.table(report))       # one row per dtype: perplexity and agreement, auto vs int8
    print(kvq.engine_note(report)) # which engine measured it, and whether it is today's (REPORT.note)

Three measures, all through the engine (not eval.perplexity, whose contiguous
cache holds keys in the model's dtype whatever kv_cache_dtype says):
- perplexity on the course's evaluation text (eval.eval_text), scored in
  windows of `window` tokens, each window its own prompt (prompt_logprobs);
- next-token agreement: at every position of the same text, whether the two
  caches' most likely next token is the same (the same context for both, so
  one early difference does not spoil the rest);
- greedy agreement: a few prompts decoded greedily with each cache; the share
  of positions where the replies hold the same token, and the position of the
  first difference. One near-tie settles everything after it, so this is the
  harshest of the three.

A report is JSON: meta (date, cpu, cores, threads, model, window, max_tokens,
prompts, engine_stamp: REPORT.stamp(), of the modules a measurement runs);
rows, one per dtype: {dtype, bytes_per_token: {auto, int8}, perplexity: {auto,
int8}, scored_tokens, next_token_agreement, greedy: {agreement,
first_difference}}; and reference: the same two agreements between each
further dtype's "auto" run and the first dtype's, for scale (how far bf16
parts from fp32 with no int8 involved).
"""
from __future__ import annotations

import datetime
import math
import os
from pathlib import Path

from .. import machine
from .stored import Age, StoredReport, closure_of

DATA = Path(__file__).resolve().parent / "data"  # measurements, not engine code: see peers.py
STORED = DATA / "kv-int8-2026-12-05-xeon-2core.json"
PROMPTS = ("The capital of France is", "A recipe for bread starts with flour, water and",
           "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three laws of thermodynamics say that")
# What a measurement runs: the offline API and the evaluation text (this file, which
# stamps do not count, only drives them and renders the result).
ROOTS = ("tinyinfer.llm", "tinyinfer_course.analysis.eval")


def _note(report: dict, age: Age) -> str:
    """The note in chapter 5's words: the engine that measured the report is today's, or an older one."""
    meta = report["meta"]
    where = f"on {age.when}, on the {meta.get('cpu', 'CPU not recorded')} with {meta.get('threads', '?')} threads"
    if age.same:
        return f"Measured {where}, by {age.named()}: the same code as today's engine."
    return (f"Measured {where}, by {age.named()}. The engine has changed since then ({age.listed()}), so these rows "
            "show an older engine: `python benchmarks/kv_int8.py` measures today's.")


REPORT = StoredReport("an int8 KV cache report", STORED, closure_of(*ROOTS), keys=("meta", "rows"),
                      made_by="benchmarks/kv_int8.py --save makes one", words=_note)
load, engine_note = REPORT.load, REPORT.note  # chapter 5 calls them


# ------------------------------------------------------------------ the three measures


def prompt_scores(llm, ids: list[int], window: int) -> tuple[list[float], list[int]]:
    """For every token of ids after the first of its window: its logprob, and
    the engine's most likely token at that position. Windows of `window`
    tokens, each its own prompt, so each is prefilled through the paged pool."""
    from tinyinfer.sampling import SamplingParams

    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=1)
    windows = [ids[i : i + window] for i in range(0, len(ids), window) if len(ids[i : i + window]) > 1]
    logprobs, best = [], []
    for out in llm.generate([{"prompt_token_ids": w} for w in windows], params, use_tqdm=False):
        for token, position in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:]):
            logprobs.append(position[token].logprob)
            best.append(next(t for t, lp in position.items() if lp.rank == 1))
    return logprobs, best


def greedy_replies(llm, prompts, max_tokens: int) -> list[list[int]]:
    from tinyinfer.sampling import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    return [list(o.outputs[0].token_ids) for o in llm.generate(list(prompts), params, use_tqdm=False)]


def greedy_agreement(want: list[list[int]], got: list[list[int]]) -> tuple[float, list[int]]:
    """(share of positions with the same token, position of each reply's first
    difference, its length if none)."""
    same = sum(a == b for w, g in zip(want, got) for a, b in zip(w, g))
    first = [next((i for i, (a, b) in enumerate(zip(w, g)) if a != b), len(w)) for w, g in zip(want, got)]
    return same / sum(map(len, want)), first


def measure(model: str = "smollm2-135m-instruct", dtypes=("float32", "bfloat16"), window: int = 1024,
            max_tokens: int = 64, prompts=PROMPTS, text: str | None = None) -> dict:
    """Run every measure for auto and int8 in each dtype; return the report."""
    import torch

    from ..analysis.eval import eval_text
    from tinyinfer.llm import LLM

    rows, autos = [], {}
    for dtype in dtypes:
        runs = {}
        for kv in ("auto", "int8"):
            torch.manual_seed(0)
            llm = LLM(model, dtype=dtype, device="cpu", kv_cache_dtype=kv, max_model_len=window + max_tokens)
            ids = llm.tokenizer.encode(text or eval_text())
            logprobs, best = prompt_scores(llm, ids, window)
            runs[kv] = dict(bytes_per_token=llm.llm_engine.kv_bytes_per_token, logprobs=logprobs, best=best,
                            replies=greedy_replies(llm, prompts, max_tokens))
            del llm
        autos[dtype] = runs["auto"]
        rows.append({"dtype": dtype, "bytes_per_token": {kv: r["bytes_per_token"] for kv, r in runs.items()},
                     "perplexity": {kv: math.exp(-sum(r["logprobs"]) / len(r["logprobs"])) for kv, r in runs.items()},
                     "scored_tokens": len(runs["auto"]["logprobs"]), **agreements(runs["auto"], runs["int8"])})
    # For scale: how far two model dtypes part, both with the "auto" cache.
    reference = [{"compared": f"{d} vs {dtypes[0]}, both auto", **agreements(autos[dtypes[0]], autos[d])}
                 for d in dtypes[1:]]
    meta = {"date": datetime.date.today().isoformat(), "cpu": machine.cpu_name(), "cores": os.cpu_count(),
            "threads": torch.get_num_threads(), "model": model, "window": window, "max_tokens": max_tokens,
            "prompts": list(prompts), "engine_stamp": REPORT.stamp()}
    return {"meta": meta, "rows": rows, "reference": reference}


def agreements(a: dict, b: dict) -> dict:
    """Next-token and greedy agreement between two runs of measure()."""
    agreement, first = greedy_agreement(a["replies"], b["replies"])
    return {"next_token_agreement": sum(x == y for x, y in zip(a["best"], b["best"])) / len(a["best"]),
            "greedy": {"agreement": agreement, "first_difference": first}}


# ------------------------------------------------------------------ reading a report


def table(report: dict) -> str:
    """A Markdown table: one row per dtype."""
    lines = ["| dtype | perplexity, auto | perplexity, int8 | next token agrees | greedy tokens agree | "
             "first difference (per prompt) |", "|---|---:|---:|---:|---:|---|"]
    for r in report["rows"]:
        ppl, g = r["perplexity"], r["greedy"]
        lines.append(f"| {r['dtype']} | {ppl['auto']:.3f} | {ppl['int8']:.3f} | {r['next_token_agreement']:.1%} | "
                     f"{g['agreement']:.0%} | {', '.join(map(str, g['first_difference']))} |")
    for r in report.get("reference", []):
        g = r["greedy"]
        lines.append(f"| {r['compared']} | | | {r['next_token_agreement']:.1%} | {g['agreement']:.0%} | "
                     f"{', '.join(map(str, g['first_difference']))} |")
    return "\n".join(lines)
