"""benchmarks/checkpoints.py still runs against hpsearch's trainer and prints its table
(a smoke run of one tiny round; the figures themselves are only meaningful at full size)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "checkpoints.py"


def test_the_checkpoint_benchmark_runs_every_way_and_prints_its_ratios(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--layers", "1", "--epochs", "2", "--batches", "1",
                                      "--rounds", "1"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(SCRIPT), run_name="__main__")
    assert exit_info.value.code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    rows = {line.split()[0]: line.split() for line in lines[1:-1]}
    assert set(rows) == {"plain", "hpsearch", "before:", "async:"}
    assert all(int(row[-3]) == 12 for row in rows.values())  # MB of one 1000x1000 layer with Adam
    assert lines[-1].startswith("ratios hpsearch/baseline: checkpoint time per epoch ")
    assert "; before/baseline: checkpoint time per epoch " in lines[-1]
    assert "; async/baseline: checkpoint time per epoch " in lines[-1]
    assert "; hpsearch/before: fit time " in lines[-1]
    assert "(2 epochs, 1 new bests, medians of 1 rounds)" in lines[-1]
