"""scripts/make_labs.py loaded as a module, for the tests that use its functions
(the exercise pairs, the stamps' fingerprints). scripts/ is not a package: the
script is loaded from its file, once per test process."""
from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def load_make_labs():
    spec = importlib.util.spec_from_file_location("make_labs", ROOT / "scripts" / "make_labs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
