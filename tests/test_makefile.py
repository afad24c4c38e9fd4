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
case "$*" in *cu128*) [ -f "$(dirname "$0")/../cuda-index-down" ] && exit 1;; esac
exit 0
"""

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _setup(project: Path, *args: str, env: dict | None = None, fails: bool = False) -> list[str]:
    import os

    log = project / ".venv" / "calls.log"
    log.unlink(missing_ok=True)
    environment = {name: value for name, value in os.environ.items() if name != "TORCH_SPEC"}
    done = subprocess.run(["make", "--no-print-directory", "setup", *args], cwd=project,
                          capture_output=True, text=True, env={**environment, **(env or {})})
    assert (done.returncode != 0) == fails, done.stdout + done.stderr
    assert not list(project.glob("=*")), "a spec's '>' made a file"
    return log.read_text().splitlines() if log.exists() else []


def _torch_calls(calls: list[str]) -> list[str]:
    return [call for call in calls if "torch" in call and "-e" not in call]


def _project(root: Path) -> Path:
    for name in ("Makefile", "pyproject.toml", "constraints.txt"):
        shutil.copy(ROOT / name, root / name)
    python = root / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(RECORDING_PYTHON)
    python.chmod(0o755)
    return root


def test_a_venv_set_up_before_the_spec_was_recorded_keeps_its_torch(tmp_path):
    """Its torch may be a CUDA build installed by hand: with no spec given, none is taken out."""
    project = _project(tmp_path)
    (project / ".venv" / ".installed").touch()
    assert not any("uninstall" in call for call in _setup(project))


def test_setup_with_another_torch_spec_replaces_the_installed_torch(tmp_path):
    """``make setup TORCH_SPEC=<a CUDA build>`` after ``make demo`` did nothing: the venv's
    stamp followed only pyproject.toml and constraints.txt, and pip takes 2.13.0+cpu for
    ``torch==2.13.0`` from any index (audit 56). The GPU machines' recipe in README runs it."""
    _project(tmp_path)
    first = _setup(tmp_path)
    assert any(call.endswith("install --quiet --disable-pip-version-check torch==2.13.0") for call in first), first
    assert not any("uninstall" in call for call in first), first
    assert _setup(tmp_path) == []  # nothing changed: nothing to do
    cuda = "torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
    switched = _setup(tmp_path, f"TORCH_SPEC={cuda}")
    assert _torch_calls(switched) == [
        "-m pip uninstall --yes --quiet torch", f"-m pip install --quiet --disable-pip-version-check {cuda}"], switched
    assert _setup(tmp_path, f"TORCH_SPEC={cuda}") == []
    # The default is no request: `make test` after the GPU recipe kept the CUDA build only
    # until this fix's first version, which put the CPU one back (audit 57).
    assert _setup(tmp_path) == []
    # A spec from the environment counts as given; its '<' and '>' are no redirections
    # (audit 57: "cannot open 2.14"; audit 59: and a file named "=2.13,")
    ranged = _setup(tmp_path, env={"TORCH_SPEC": "torch>=2.13,<2.14"})
    assert _torch_calls(ranged) == [
        "-m pip uninstall --yes --quiet torch", "-m pip install --quiet --disable-pip-version-check torch>=2.13,<2.14"]


def test_a_failed_cuda_install_is_not_taken_for_an_installed_one(tmp_path):
    """After the GPU recipe failed (its index down), a plain `make setup` put the CPU build
    in and recorded the CUDA spec as installed; the recipe again then did nothing (audit 59)."""
    project = _project(tmp_path)
    assert _torch_calls(_setup(project))[-1].endswith("torch==2.13.0")
    cuda = "torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
    index_down = project / ".venv" / "cuda-index-down"
    # the first fails with the CPU build in; the second after the CUDA build's uninstall, which
    # left the CPU build recorded as the CUDA one, and the recipe then did nothing (audit 60)
    for failing in (cuda, cuda.replace("cu128", "cu128-other")):
        index_down.touch()
        _setup(project, f"TORCH_SPEC={failing}", fails=True)
        assert _torch_calls(_setup(project)) == ["-m pip install --quiet --disable-pip-version-check torch==2.13.0"]
        index_down.unlink()
        assert _torch_calls(_setup(project, f"TORCH_SPEC={cuda}")) == [
            "-m pip uninstall --yes --quiet torch", f"-m pip install --quiet --disable-pip-version-check {cuda}"]
