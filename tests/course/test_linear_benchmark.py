"""benchmarks/linear.py and benchmarks/engine_thread.py run end to end and print
well-formed rows. Tiny settings: this checks that the benchmarks work, not how
fast anything is (speed is never asserted in tests)."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tinyinfer import cpu_linear

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
ROW = re.compile(r"^torch\.(float32|bfloat16)\s+(\d+)\s+(F\.linear|torch\.mv|packed)"
                 r"\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x$")


@pytest.mark.slow
def test_linear_benchmark_prints_each_kernel_against_f_linear():
    out = subprocess.run([sys.executable, str(BENCH / "linear.py"), "--batches", "1,2", "--dtypes", "float32",
                          "--repeats", "1"], capture_output=True, text=True, timeout=300, check=True).stdout
    rows = [ROW.match(line) for line in out.splitlines() if line.startswith("torch.")]
    assert rows and all(rows), out
    kernels = [(int(m[2]), m[3]) for m in rows]
    expected = [(1, "F.linear"), (1, "torch.mv"), (2, "F.linear")]
    if cpu_linear.PACKED_DTYPES:
        expected = [(1, "F.linear"), (1, "torch.mv"), (1, "packed"), (2, "F.linear"), (2, "packed")]
    assert kernels == expected, out
    for m in rows:
        ms, gbs, ratio = map(float, m.group(4, 5, 6))
        assert ms > 0 and gbs > 0 and ratio > 0
        if m[3] == "F.linear":
            assert ratio == 1.0  # every row is against F.linear at its batch


@pytest.mark.slow
def test_engine_thread_benchmark_prints_both_threads_and_their_ratio():
    out = subprocess.run([sys.executable, str(BENCH / "engine_thread.py"), "--rounds", "1", "--max-tokens", "4"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    m = re.search(r"median decode step ([\d.]+) ms from the main thread, ([\d.]+) ms from a background "
                  r"thread \(([\d.]+)x\)", out)
    assert m, out
    main_ms, thread_ms, ratio = map(float, m.groups())
    assert main_ms > 0 and thread_ms > 0
    assert ratio == pytest.approx(thread_ms / main_ms, abs=0.01 + 0.06 * ratio)  # printed values are rounded
