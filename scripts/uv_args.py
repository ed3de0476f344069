"""Print the `uv pip install` options that give uv the package sources pip uses here.

uv installs the course's ~180 packages in seconds where pip takes over a minute
on two cores (it fetches and unpacks them in parallel), but it does not read
pip's configuration. Machines that keep wheels on disk (an index folder, a
find-links folder, a constraints file) say so in pip.conf or PIP_* variables;
this reads them with `pip config list`, the same view pip itself has, and turns
each into the uv option of the same meaning:

    index-url        --index-url          (PyPI when unset, as for pip)
    extra-index-url  --extra-index-url    one per URL
    find-links       --find-links         one per folder or URL
    constraint       --constraint         one per file
    no-index         --no-index

Anything else pip is configured with (a proxy, a client certificate) has no
counterpart here; if uv then fails, the Makefile installs with pip instead.
"""
from __future__ import annotations

import shlex
import subprocess
import sys

# pip's key -> uv's option; a value pip lists space-separated is one option per item
OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
           "find-links": "--find-links", "constraint": "--constraint"}


def pip_config() -> dict[str, str]:
    """pip's settings, the environment's PIP_* winning over the files, as in pip."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                         capture_output=True, text=True, check=True).stdout
    settings: dict[str, str] = {}
    for line in sorted(out.splitlines(), key=lambda line: line.startswith(":env:")):  # :env: last, so it wins
        name, _, value = line.partition("=")
        settings[name.split(".", 1)[-1]] = value.strip("'\"")
    return settings


def uv_args(settings: dict[str, str]) -> list[str]:
    args = ["--index-strategy", "unsafe-best-match"]  # pick from every index, as pip does
    for key, option in OPTIONS.items():
        for value in settings.get(key, "").split():
            args += [option, value]
    if settings.get("no-index", "").lower() in {"1", "true", "yes", "on"}:
        args.append("--no-index")
    return args


if __name__ == "__main__":
    print(shlex.join(uv_args(pip_config())))
