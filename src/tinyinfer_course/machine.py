"""The CPU a measurement ran on, as the course's reports, benchmarks and labs record it.

    from tinyinfer_course import machine
    machine.facts()         # {"cpu": "Intel(R) Xeon(R) ...", "cores": 2, "vector_units": {...}}
    machine.bf16_units()    # True, False, or None where the CPU's flags cannot be read

Which number format is fast depends on the CPU: bf16 halves fp32's bytes, but a
CPU without BF16 units (no `avx512_bf16` or `amx_bf16` in /proc/cpuinfo)
converts every bf16 number to fp32 before it multiplies. So every stored
measurement names its CPU and its vector units, and the pages' sentences read
them from here, one way for all. The engine keeps its own probe
(tinyinfer.kernel_choice.cpu_key), which keys the one-row kernel it picks.
"""
from __future__ import annotations

import os
import platform
from pathlib import Path

VECTOR_UNITS = ("avx512_bf16", "amx_bf16", "avx512f", "avx2")  # /proc/cpuinfo flag names
# The settings that make torch run a smaller instruction set than the CPU has
# (the course's way of imitating an older CPU, `make test-portable`).
EMULATION_SETTINGS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
# oneDNN instruction-set caps that still include the BF16 units (AVX512_CORE_BF16,
# AVX512_CORE_FP16, AVX512_CORE_AMX, AVX10_*, ALL, DEFAULT); any other cap is below them.
BF16_CAPS = ("BF16", "AMX", "FP16", "AVX10", "ALL", "DEFAULT")


def _cpuinfo() -> str | None:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux
        return None


def cpu_name() -> str:
    """'Intel(R) Xeon(R) ...' from /proc/cpuinfo; elsewhere what platform says, or 'unknown CPU'."""
    for line in (_cpuinfo() or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def vector_units(cpuinfo: str | None = None) -> dict:
    """{flag: True/False} for the vector units that decide which format is fast;
    {} when the CPU's flags cannot be read (not Linux x86). `cpuinfo`: the text of
    /proc/cpuinfo, read from this machine when not given."""
    for line in (cpuinfo if cpuinfo is not None else _cpuinfo() or "").splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            return {unit: unit in flags for unit in VECTOR_UNITS}
    return {}


def emulated_isa(env=os.environ) -> dict:
    """The settings that make torch run a smaller instruction set than the CPU has."""
    return {k: env[k] for k in EMULATION_SETTINGS if env.get(k)}


def bf16_units(units: dict | None = None, emulation: dict | None = None) -> bool | None:
    """Whether bf16 products run on BF16 hardware (AVX-512 BF16 or AMX), as torch will
    use it: False where the CPU has none, or where ONEDNN_MAX_CPU_ISA caps oneDNN below
    them (then it converts to fp32 whatever the CPU has); None where the flags are
    unknown. `units` and `emulation` are a stored report's (vector_units(),
    emulated_isa()), this machine's when not given. Without BF16 units a bf16 matmul
    is fp32 arithmetic with conversions on the way in and out: it saves bytes, not work."""
    units = vector_units() if units is None else units
    emulation = emulated_isa() if emulation is None else emulation
    cap = emulation.get("ONEDNN_MAX_CPU_ISA", "").upper()
    if cap and not any(word in cap for word in BF16_CAPS):
        return False
    if not units:
        return None
    return bool(units.get("avx512_bf16") or units.get("amx_bf16"))


def facts() -> dict:
    """What a stored report's meta says about the machine: its CPU, cores and vector units."""
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "vector_units": vector_units()}
