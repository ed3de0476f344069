"""benchmarks/decode.py runs end to end and prints one well-formed row per setting.

Tiny settings (4 new tokens, two repeats): this checks that the benchmark works,
not how fast anything is (speed is never asserted in tests)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "decode.py"
ROW = re.compile(r"^(float32|bfloat16)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)-([\d.]+)\s+(\d+)%\s+(\d+)%$")


@pytest.mark.slow
def test_decode_benchmark_prints_a_row_per_dtype_and_batch():
    out = subprocess.run([sys.executable, str(SCRIPT), "--new-tokens", "4", "--repeats", "2",
                          "--batches", "1,2", "--dtypes", "float32"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    rows = [ROW.match(line) for line in out.splitlines() if line.startswith(("float32", "bfloat16"))]
    assert len(rows) == 2 and all(rows), out
    for m, batch in zip(rows, (1, 2)):
        assert int(m[2]) == batch
        ours, theirs, ratio, lo, hi = map(float, m.group(3, 4, 5, 6, 7))
        assert ours > 0 and theirs > 0
        # best against best; the printed tok/s are rounded to 0.1, which matters when a loaded
        # machine makes them small, so the ratio must lie within what the rounding allows
        assert (ours - 0.05) / (theirs + 0.05) * 0.99 <= ratio <= (ours + 0.05) / (theirs - 0.05) * 1.01
        assert 0 < lo <= hi  # the per-pair spread
