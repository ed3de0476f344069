"""Every stored report says how it was made, and that command still runs today.

A stored report (src/tinyinfer_course/reports/data/*.json) keeps the command that
made it (`meta.command`, or `command` at the top), and its renderer says how to
make a new one (StoredReport's `made_by` and `remeasure`). A page shows both to
the reader, so each must name something that exists today:
- `python benchmarks/NAME.py ...` or `python scripts/NAME.py ...`: the script exists,
  each `--option` is one the script defines, and the folder of a `--save PATH` exists
  (a report saved where the reports no longer live cannot be remade by copying it);
- `python -m MODULE ...`: the module can be imported;
- `make TARGET`: the Makefile has the target;
- `tinyinfer COMMAND`: the CLI has the command.
Commands joined with `&&` are checked one by one. A report made by a script that is
gone is listed in GONE with what replaced it, until a new run replaces the report.
"""
from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "src" / "tinyinfer_course" / "reports" / "data"
REPORT_MODULES = ("gpu", "kv_int8", "peers", "router", "tool_calls", "tp_gloo")

# Stored reports whose command names a script that no longer exists: (file, why it stays).
GONE = {
    "gpu-2026-12-04-h200.json": "transcribed from the README's H200 run of benchmarks/cuda_check.py (commit "
                                "298d09d), which 2a64111 removed for benchmarks/gpu_check.py; a new run of "
                                "`python benchmarks/gpu_check.py engine` on a GPU replaces this report",
}


def report_commands(report: dict) -> list[str]:
    """The command a stored report says made it (empty when it says none)."""
    found = [report.get("meta", {}).get("command"), report.get("command")]
    return [c for c in found if isinstance(c, str)]


def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


def cli_commands() -> set[str]:
    from tinyinfer.cli import plugins

    return {"generate", "chat", "fetch"} | set(plugins())


def command_problems(command: str, root: Path = ROOT) -> list[str]:
    """Why each part of a shell command would not run today (empty: it would)."""
    problems = []
    for part in (p.strip() for p in command.split("&&")):
        words = shlex.split(part)
        if words[:1] == ["python"] and words[1:2] == ["-m"]:
            if len(words) < 3 or importlib.util.find_spec(words[2]) is None:
                problems.append(f"{part!r}: no module {words[2] if len(words) > 2 else ''!r}")
        elif words[:1] == ["python"]:
            script = root / words[1] if len(words) > 1 else root
            if not script.is_file():
                problems.append(f"{part!r}: {words[1] if len(words) > 1 else '(no script)'} does not exist")
                continue
            source = script.read_text()
            for i, word in enumerate(words[2:], 2):
                option = word.split("=")[0]
                if option.startswith("--") and f'"{option}"' not in source and f"'{option}'" not in source:
                    problems.append(f"{part!r}: {words[1]} has no option {option}")
                if option in ("--save", "--out") and i + 1 < len(words) and "/" in words[i + 1]:
                    folder = (root / words[i + 1]).parent
                    if not folder.is_dir():
                        problems.append(f"{part!r}: {option} writes into {folder.relative_to(root)}, "
                                        "which does not exist")
        elif words[:1] == ["make"]:
            problems += [f"{part!r}: the Makefile has no target {t!r}" for t in words[1:2] if t not in make_targets()]
        elif words[:1] == ["tinyinfer"]:
            problems += [f"{part!r}: tinyinfer has no command {c!r}" for c in words[1:2] if c not in cli_commands()]
        else:
            problems.append(f"{part!r}: not a script, a module, a make target or a tinyinfer command")
    return problems


def renderer_commands(text: str) -> list[str]:
    """The commands a renderer's made_by or remeasure names: `code` spans that run something,
    and a bare `benchmarks/NAME.py ...` as kv_int8's 'benchmarks/kv_int8.py --save makes one'."""
    spans = [s for s in re.findall(r"`([^`]+)`", text) if re.match(r"(python|make|tinyinfer)\b", s)]
    bare = re.findall(r"(?<![\w/`])((?:benchmarks|scripts)/[\w-]+\.py(?: --?[\w-]+)*)", re.sub(r"`[^`]*`", "", text))
    return spans + [f"python {b}" for b in bare]


@pytest.mark.parametrize("path", sorted(DATA.glob("*.json")), ids=lambda p: p.name)
def test_a_stored_reports_command_runs_today(path):
    problems = [p for c in report_commands(json.loads(path.read_text())) for p in command_problems(c)]
    if path.name in GONE:
        assert problems, f"{path.name} is listed in GONE but its command runs today: remove it from GONE"
        return
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", REPORT_MODULES)
def test_a_renderer_says_how_to_make_its_report_with_a_command_that_exists(name):
    report = importlib.import_module(f"tinyinfer_course.reports.{name}").REPORT
    commands = renderer_commands(f"{report.made_by or ''} {report.remeasure or ''}")
    problems = [p for c in commands for p in command_problems(c)]
    assert not problems, "\n".join(problems)


def test_gone_lists_stored_reports():
    assert set(GONE) <= {p.name for p in DATA.glob("*.json")}, set(GONE) - {p.name for p in DATA.glob("*.json")}


def test_the_command_check_can_fail(tmp_path):
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "run.py").write_text('ap.add_argument("--save")\n')
    assert command_problems("python benchmarks/run.py --save benchmarks/out.json", tmp_path) == []
    assert command_problems("python benchmarks/gone.py", tmp_path) == [
        "'python benchmarks/gone.py': benchmarks/gone.py does not exist"]
    assert command_problems("python benchmarks/run.py --seed 1", tmp_path) == [
        "'python benchmarks/run.py --seed 1': benchmarks/run.py has no option --seed"]
    assert command_problems("python benchmarks/run.py --save old/data/r.json", tmp_path) == [
        "'python benchmarks/run.py --save old/data/r.json': --save writes into old/data, which does not exist"]
    assert command_problems("make no-such-target && tinyinfer serve")[0].startswith("'make no-such-target'")
    assert renderer_commands("`make peers` measures today's") == ["make peers"]
    assert renderer_commands("benchmarks/kv_int8.py --save makes one") == ["python benchmarks/kv_int8.py --save"]
