"""scripts/uv_args.py gives uv the package sources pip is configured with (Makefile set-up)."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "uv_args.py"
spec = importlib.util.spec_from_file_location("uv_args", SCRIPT)
uv_args = importlib.util.module_from_spec(spec)
spec.loader.exec_module(uv_args)


def test_each_pip_source_becomes_the_uv_option_of_the_same_meaning():
    settings = {"index-url": "https://mirror.example/simple",
                "extra-index-url": "file:///opt/a/simple file:///opt/b/simple",
                "find-links": "/opt/wheels", "constraint": "/etc/c.txt", "cert": "/etc/ca.crt"}
    assert uv_args.uv_args(settings) == [
        "--index-strategy", "unsafe-best-match",
        "--index-url", "https://mirror.example/simple",
        "--extra-index-url", "file:///opt/a/simple", "--extra-index-url", "file:///opt/b/simple",
        "--find-links", "/opt/wheels", "--constraint", "/etc/c.txt"]  # no counterpart for cert: left out


def test_no_index_is_passed_on_and_nothing_set_means_pypi():
    assert uv_args.uv_args({"no-index": "true"})[-1] == "--no-index"
    assert uv_args.uv_args({}) == ["--index-strategy", "unsafe-best-match"]


def test_the_environment_wins_over_pip_conf(monkeypatch):
    listed = "global.find-links='/from/file'\n:env:.find-links='/from/env'\nglobal.constraint='/c.txt'\n"
    monkeypatch.setattr(uv_args.subprocess, "run",
                        lambda *a, **k: type("Done", (), {"stdout": listed})())
    assert uv_args.pip_config() == {"find-links": "/from/env", "constraint": "/c.txt"}
