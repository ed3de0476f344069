"""kv_cache_dtype="auto" against "int8": bytes per token, the tokens a pool
holds, and quality (perplexity on the course's evaluation text, next-token and
greedy agreement), measured through the engine's paged pool. Chapter 5
renders the stored report (tinyinfer_course.reports.kv_int8).

    python benchmarks/kv_int8.py                          # fp32 and bf16, default model; prints the table
    python benchmarks/kv_int8.py --save src/tinyinfer_course/reports/data/kv-int8-DATE-CPU.json
    python benchmarks/kv_int8.py --dtypes float32 --max-tokens 32

A few minutes on 2 CPU cores (the evaluation text, 6,000 tokens, is prefilled
four times per dtype). Run it alone: nothing here is timed, but it is heavy.
"""
import argparse
import json
from pathlib import Path

from tinyinfer_course.analysis import memory
from tinyinfer_course.reports import kv_int8 as kvq


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    p.add_argument("--window", type=int, default=1024, help="tokens per scored window of the evaluation text")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per greedy reply")
    p.add_argument("--pool-mib", type=int, default=512, help="the pool whose capacity is printed")
    p.add_argument("--save", type=Path, default=None, help="write the report (JSON) here")
    args = p.parse_args()
    for dtype in args.dtypes:
        for kv in ("auto", "int8"):
            blocks, tokens = memory.pool_capacity(args.model, args.pool_mib * 2**20, dtype, kv)
            print(f"{dtype:9} {kv:5} {memory.engine_kv_bytes_per_token(args.model, dtype, kv):7,} bytes per token; "
                  f"a {args.pool_mib} MiB pool holds {blocks:,} blocks, {tokens:,} tokens")
    report = kvq.measure(args.model, args.dtypes, args.window, args.max_tokens)
    print(kvq.table(report))
    print(kvq.engine_note(report, report["meta"]["engine_stamp"]))
    if args.save:
        args.save.write_text(json.dumps(report, indent=1) + "\n")
        print(f"saved {args.save}")


if __name__ == "__main__":
    main()
