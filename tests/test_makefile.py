"""The Makefile's ``setup``, run with a stand-in Python that records the pip commands it is
given: which torch a venv ends up with is decided here, not by pip's view of versions."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECORDING_PYTHON = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/../calls.log"
"""

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _setup(project: Path, *args: str) -> list[str]:
    log = project / ".venv" / "calls.log"
    log.unlink(missing_ok=True)
    subprocess.run(["make", "--no-print-directory", "setup", *args], cwd=project, check=True,
                   capture_output=True, text=True)
    return log.read_text().splitlines() if log.exists() else []


def test_setup_with_another_torch_spec_replaces_the_installed_torch(tmp_path):
    """``make setup TORCH_SPEC=<a CUDA build>`` after ``make demo`` did nothing: the venv's
    stamp followed only pyproject.toml and constraints.txt, and pip takes 2.13.0+cpu for
    ``torch==2.13.0`` from any index (audit 56). The GPU machines' recipe in README runs it."""
    for name in ("Makefile", "pyproject.toml", "constraints.txt"):
        shutil.copy(ROOT / name, tmp_path / name)
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(RECORDING_PYTHON)
    python.chmod(0o755)

    first = _setup(tmp_path)
    assert any(call.endswith("install --quiet --disable-pip-version-check torch==2.13.0") for call in first), first
    assert not any("uninstall" in call for call in first), first
    assert _setup(tmp_path) == []  # nothing changed: nothing to do
    cuda = "torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
    switched = _setup(tmp_path, f"TORCH_SPEC={cuda}")
    assert [call for call in switched if "torch" in call and "-e" not in call] == [
        "-m pip uninstall --yes --quiet torch", f"-m pip install --quiet --disable-pip-version-check {cuda}"], switched
    assert _setup(tmp_path, f"TORCH_SPEC={cuda}") == []
