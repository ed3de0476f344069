"""Where torch.compile keeps its caches while an emulated CPU runs the tests."""
from __future__ import annotations


def inductor_cache_dir(environ) -> str | None:
    """The folder torch.compile's caches should use under `environ`, or None for
    torch's default. Inductor generates C++ for the vector ISA ATEN_CPU_CAPABILITY
    names, but its on-disk cache (torch 2.13) does not key on it: a graph compiled
    under ATEN_CPU_CAPABILITY=avx2 and then loaded with native kernels aborts, and
    the other way round it wrote [314, 0, 0, ...] for [314, 314, ...]. So each
    emulated CPU (make test-portable) keeps a cache of its own."""
    capability = environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if "TORCHINDUCTOR_CACHE_DIR" in environ or not capability:
        return None
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir  # torch's own name for the folder

    return f"{default_cache_dir()}_{capability}"
