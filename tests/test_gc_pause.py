"""Imports without the cyclic garbage collector: paused in the driver, paused and then
frozen in trial workers."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap

import pytest
from hpsearch.search.api import prepare
from hpsearch.search.config_loading import load_config
from hpsearch.search.gc_pause import collector_paused


class Collections:
    """Counts the collector's runs while active."""

    def __init__(self) -> None:
        self.started: list[int] = []

    def __enter__(self) -> Collections:
        gc.callbacks.append(self._count)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._count)

    def _count(self, phase, info) -> None:
        if phase == "start":
            self.started.append(info["generation"])


def _make_cycles():
    for _ in range(50_000):
        node: dict = {}
        node["self"] = node  # garbage only the cyclic collector can free


def test_no_collection_runs_inside_and_the_collector_comes_back_on():
    assert gc.isenabled()
    with Collections() as unpaused:
        _make_cycles()
    assert unpaused.started  # the workload does trigger collections
    with Collections() as counted, collector_paused():
        assert not gc.isenabled()
        _make_cycles()
        inside = len(counted.started)
    assert inside == 0
    assert gc.isenabled()


def test_a_disabled_collector_stays_disabled_and_an_error_still_restores_it():
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(ValueError), collector_paused():
        raise ValueError("an import failed")
    assert gc.isenabled()


def test_the_driver_pauses_but_freezes_nothing(example_config):
    config = load_config(example_config)
    frozen_before = gc.get_freeze_count()
    prepare(config, preflight=False)
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen_before  # the driver may be the user's own session


def test_a_trial_worker_imports_the_training_stack_without_collections_then_freezes_it(example_config):
    """In a fresh interpreter, as a Ray worker starts: the trial module alone must not pull
    in torch (or the import would happen before the pause), the training stack's import
    runs no collection, and what it leaves is frozen once."""
    script = textwrap.dedent(f"""
        import gc, json, sys
        from hpsearch.search.config_loading import load_config
        from hpsearch.search import trial
        torch_early = "torch" in sys.modules
        config = load_config(json.loads({json.dumps(example_config)!r}))
        collections = []
        gc.callbacks.append(lambda phase, info: phase == "start" and collections.append(info["generation"]))
        trial.load_training_stack(config)
        during = len(collections)
        frozen = gc.get_freeze_count()
        garbage = [[] for _ in range(10_000)]
        freeze_count, walks = gc.get_freeze_count, []
        gc.get_freeze_count = lambda: walks.append(1) or freeze_count()  # walks every frozen object
        trial.load_training_stack(config)
        gc.get_freeze_count = freeze_count
        print(json.dumps({{"torch_early": torch_early, "collections": during, "frozen": frozen,
                          "frozen_again": gc.get_freeze_count(), "walks": len(walks),
                          "enabled": gc.isenabled(), "lightning": "pytorch_lightning" in sys.modules}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["torch_early"] is False
    assert seen["lightning"] is True
    assert seen["collections"] == 0
    assert seen["frozen"] > 100_000  # torch and Lightning leave about half a million objects
    assert seen["frozen_again"] == seen["frozen"]  # once per process: later trials' garbage stays collectable
    assert seen["walks"] == 0  # a later trial pays nothing (counting frozen objects took 50 ms)
    assert seen["enabled"] is True
