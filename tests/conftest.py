"""Shared fixtures: the real example experiment, shrunk for CPU, and a CLI runner.

Tests use the same experiment file the README's demo runs, with overrides that make
it small (few trials, few epochs), rather than a parallel toy configuration.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

# pytest-xdist's workers get COLUMNS=80, which piped output honours (``status_view.table_console``):
# tests that mean a width set it themselves.
os.environ.pop("COLUMNS", None)

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "digits-cnn.yaml"
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def manually_optimized(classifier: type, nan_from_epoch: int | None = None) -> type:
    """A built-in classifier that optimizes manually: its training_step returns nothing;
    from ``nan_from_epoch`` on (0-based) its loss, and so its weights, turn NaN."""

    class ManuallyOptimized(classifier):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            optimizer = self.optimizers()
            loss = super().training_step(batch, batch_idx)
            if nan_from_epoch is not None and self.current_epoch >= nan_from_epoch:
                loss = loss * float("nan")
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()

    return ManuallyOptimized


def example_dict() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def shrunk_example(storage: Path, **overrides) -> dict:
    """The demo experiment, small enough for a test: a handful of trials of a few epochs."""
    config = example_dict()
    config["storage"] = str(storage)
    config["search"].update(num_trials=4, max_concurrent=2)
    config["scheduler"].update(max_epochs=3, grace_period=1, reduction_factor=2)
    for dotted, value in overrides.items():
        node = config
        *parents, last = dotted.split("/")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value
    return config


def tensorboard_run(exp_dir: Path, number: int) -> Path:
    """The TensorBoard run directory of one trial (named by its number and values)."""
    runs = [p for p in (exp_dir / "tensorboard").glob(f"trial_{number:04d}*") if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def tensorboard_scalars(run: Path) -> dict[str, list[int]]:
    """Each scalar's steps as TensorBoard shows them: all of the trial's event files read
    in order, with what a resumed attempt purged left out."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run))
    accumulator.Reload()
    return {tag: [e.step for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def tensorboard_steps(run: Path, tag: str = "val_acc") -> list[int]:
    """The steps of one scalar as TensorBoard shows it (see ``tensorboard_scalars``)."""
    return tensorboard_scalars(run).get(tag, [])


def make_image_folder(root: Path, per_class: int = 6, size: int = 10) -> Path:
    """Three class folders (cat, dog, eel) of small JPEG and PNG images."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for label, name in enumerate(["cat", "dog", "eel"]):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = (rng.random((size, size, 3)) * 80 + label * 80).astype("uint8")
            Image.fromarray(pixels).save(root / name / f"{i}.{'png' if i % 2 else 'jpg'}")
    return root


def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def preflight_refusal(experiment: dict):
    """The one problem the preflight finds with the experiment (a dict)."""
    from hpsearch.search.components import check_components
    from hpsearch.search.config_loading import load_config
    from hpsearch.search.errors import ConfigError
    from hpsearch.search.preflight import run_preflight

    config = load_config(experiment)
    with pytest.raises(ConfigError) as caught:
        run_preflight(config, *check_components(config))
    [problem] = caught.value.problems
    return problem


def run_cli(*args: str, cwd: Path, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """The real ``hpsearch`` command in a subprocess, as a user would run it."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "hpsearch.search.cli", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


# Modules whose tests share one search (a module fixture) or one loopback cluster at a time.
SHARED_BY_MODULE = ("test_distributed.py", "test_cluster.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the suite for its two processes (``make test``: pytest-xdist's worksteal, which
    hands each process a contiguous share of this order, and lets an idle one steal from the
    back of the other's). Each share starts with its part of the slow searches, balanced
    between the shares, and ends with the quick unit tests: the run then ends on quick
    tests in both, not with one process idle while the other runs a long search it took
    last. Tests that share one search (``finished_search``, a module's fixture) or one
    cluster stay together, so that search runs once, not once in each process.
    (pytest-xdist's ``loadgroup`` would group them itself, but with pytest 9.2 it groups
    nothing: it renames ``item._nodeid``, which pytest no longer reads.)"""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        if "finished_search" in getattr(item, "fixturenames", ()):
            key = "finished_search"
        elif item.path.name in SHARED_BY_MODULE:
            key = item.path.name
        else:
            key = item.nodeid
        units.setdefault(key, []).append(item)

    def weight(unit: list[pytest.Item]) -> float:
        """Roughly, in searches: a slow test about three; a test of a search shared with its
        unit (most of them read what it left) a third of one; the unit's shared search three."""
        shared = len(unit) > 1
        return sum(3.0 if item.get_closest_marker("slow") else (0.3 if shared else 1.0)
                   if item.get_closest_marker("e2e") else 0.0 for item in unit) + (3.0 if shared else 0.0)

    heavy = sorted((unit for unit in units.values() if weight(unit)), key=lambda unit: -weight(unit))
    light = [item for unit in units.values() if not weight(unit) for item in unit]
    processes = int(getattr(config, "workerinput", {}).get("workercount", 1))
    shares: list[list[pytest.Item]] = [[] for _ in range(processes)]
    loads = [0.0] * processes
    for unit in heavy:  # the heaviest first, each to the share with the least so far
        lightest = loads.index(min(loads))
        shares[lightest] += unit
        loads[lightest] += weight(unit)
    # worksteal's split: the first process gets len // n of the items, the next len // (n - 1) of the rest, ...
    remaining = len(items)
    for number, share in enumerate(shares):
        size = remaining // (processes - number)
        while len(share) < size and light:
            share.append(light.pop(0))
        remaining -= len(share)
    shares[-1] += light
    items[:] = [item for share in shares for item in share]


@pytest.fixture
def example_config() -> dict:
    return example_dict()


@pytest.fixture(scope="session")
def finished_search(tmp_path_factory):
    """One 6-trial ASHA + TPE search on digits through the CLI, shared by the tests that read a
    finished study (end-to-end, TensorBoard, report, compare)."""
    root = tmp_path_factory.mktemp("e2e")
    config = shrunk_example(root / "runs", **{"search/num_trials": 6, "scheduler/max_epochs": 4,
                                              "search/keep_checkpoints": 3,
                                              "space/model.lr": {"type": "float", "low": 1e-5, "high": 0.1, "log": True}})
    path = write_yaml(root / "exp.yaml", config)
    result = run_cli("run", str(path), cwd=root, timeout=400)
    assert result.returncode == 0, result.stdout + result.stderr
    exp_dir = root / "runs" / config["name"]
    return exp_dir, config, result


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def pids_whose_command(matches) -> list[int]:
    """This machine's processes whose command line (as ``ps`` shows it: a Ray worker's is
    its title, say ``ray::IDLE``) satisfies ``matches``."""
    return list(commands_matching(matches))


def commands_matching(matches) -> dict[int, str]:
    """The command lines that satisfy ``matches``, by process id."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            continue
        if matches(command):
            found[int(entry.name)] = command
    return found


def stop_ray_at(port: int) -> None:
    """Stop every process of the Ray whose GCS listens on ``port`` (the head's, and the
    nodes its autoscaler started, which outlive it): not ``ray stop``, which stops every
    Ray on the machine."""
    import signal

    def processes() -> list[int]:
        return pids_whose_command(
            lambda command: "ray" in command and re.search(rf"(:|gcs_server_port=){port}\b", command) is not None)

    for stop_signal in (signal.SIGTERM, signal.SIGKILL):
        for pid in processes():
            try:
                os.kill(pid, stop_signal)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while processes() and time.monotonic() < deadline:
            time.sleep(0.5)
    current = Path("/tmp/ray/ray_current_cluster")  # `ray start --head` points later ray.init()s here
    if current.is_file() and current.read_text().strip().endswith(f":{port}"):
        current.unlink()
