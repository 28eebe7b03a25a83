"""The command line starts the same way by every entry point: ``adaspec`` (the console script), ``python -m adaspec``
and ``python -m adaspec.cli`` (what ``adaspec.server.loadtest`` spawns)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import adaspec.cli

ROOT = Path(__file__).resolve().parents[1]


def _help(module: str) -> str:
    path = os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])  # this checkout, not an install
    env = {**os.environ, "COLUMNS": "120", "PYTHONPATH": path}
    run = subprocess.run([sys.executable, "-m", module, "serve", "--help"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout


def test_console_script_is_cli_main():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    module, _, name = scripts["adaspec"].partition(":")
    assert module == "adaspec.cli" and getattr(adaspec.cli, name) is adaspec.cli.main


def test_python_m_adaspec_and_adaspec_cli_give_the_same_parser():
    text = _help("adaspec.cli")
    assert text.startswith("usage: adaspec serve") and "--max-batch" in text
    assert _help("adaspec") == text
