"""Imports without the cyclic garbage collector: paused, then frozen (for good in trial
workers, for the search's duration in the driver)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import textwrap

import pytest
from conftest import shrunk_example
from hpsearch.search.gc_pause import collector_paused, thawed_at_exit


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


def test_a_freeze_made_inside_is_undone_and_an_earlier_one_is_left_alone():
    assert gc.get_freeze_count() == 0
    with thawed_at_exit():
        gc.freeze()
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    gc.freeze()  # someone else's, e.g. a pre-forking server's
    try:
        frozen = gc.get_freeze_count()
        with thawed_at_exit():
            pass
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def test_the_users_session_is_left_as_it_was_frozen_objects_and_signal_handlers(tmp_path):
    """hpsearch.run in the user's own session (a notebook, a REPL): the imports' objects
    stay frozen only while the search runs, and Ctrl+C works again afterwards (Ray Tune
    left its own SIGINT handler, which swallowed the next one)."""
    config = shrunk_example(tmp_path, **{"search/num_trials": 2, "scheduler/max_epochs": 1})
    # Ctrl+C at its default, as in a terminal's REPL: a test run started as a background
    # job hands its processes SIGINT ignored, which hpsearch rightly puts back as it was.
    script = textwrap.dedent(f"""
        import gc, json, os, signal, time
        signal.signal(signal.SIGINT, signal.default_int_handler)
        import hpsearch
        from ray import tune
        before = {{signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGUSR1)}}
        frozen_during = []
        class Probe(tune.Callback):
            def on_trial_result(self, iteration, trials, trial, result, **info):
                frozen_during.append(gc.get_freeze_count())
        result = hpsearch.run(json.loads({json.dumps(config)!r}), callbacks=[Probe()])
        restored = all(signal.getsignal(signum) is handler for signum, handler in before.items())
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(2)
            interrupted = False
        except KeyboardInterrupt:
            interrupted = True
        print(json.dumps({{"during": min(frozen_during), "after": gc.get_freeze_count(),
                          "enabled": gc.isenabled(), "trials": len(result.trials),
                          "restored": restored, "interrupted": interrupted}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["trials"] == 2
    assert seen["during"] > 100_000
    assert seen["after"] == 0
    assert seen["enabled"] is True
    assert seen["restored"] is True and seen["interrupted"] is True


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


def test_the_gpu_test_evaluation_task_imports_the_stack_paused_and_frozen(example_config, tmp_path):
    """The test evaluation of GPU searches runs as a Ray task in a new worker: unpickling
    the task must not import torch, and the call imports it with the collector paused."""
    script = textwrap.dedent(f"""
        import gc, json, sys
        from hpsearch.search import evaluation
        torch_early = "torch" in sys.modules
        during_import = []
        gc.callbacks.append(lambda phase, info: phase == "start" and "hpsearch.search.devices" not in sys.modules
                            and during_import.append(info["generation"]))
        try:
            evaluation.evaluate_checkpoint(json.loads({json.dumps(example_config)!r}), {{}},
                                           {str(tmp_path / "missing.ckpt")!r})
        except Exception as error:
            failure = type(error).__name__ + ": " + str(error)
        print(json.dumps({{"torch_early": torch_early, "collections": len(during_import),
                          "frozen": gc.get_freeze_count(), "enabled": gc.isenabled(), "failure": failure}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert "missing.ckpt" in seen["failure"], seen["failure"]  # got as far as loading the checkpoint
    assert seen["torch_early"] is False
    assert seen["collections"] == 0
    assert seen["frozen"] > 100_000
    assert seen["enabled"] is True



def test_a_finished_cpu_trials_cycles_are_freed_before_the_next_trial_in_its_worker(monkeypatch):
    """A CPU trial's Trainer, model and DataModule, in reference cycles, stayed in its reused
    worker until the collector's next full pass: 11 earlier DataModules with their splits, a
    worker of 147 MB of data at 2.7 GB (audit 85). They are freed as the trial ends."""
    import weakref

    from hpsearch.search import trial

    class DataModule:
        def __init__(self) -> None:
            self.trainer = type("Trainer", (), {})()
            self.trainer.datamodule = self  # the cycle Lightning makes
            self.splits = bytearray(1 << 20)

    monkeypatch.setattr(trial, "_used_a_gpu", lambda: False)
    was_enabled = gc.isenabled()
    gc.disable()  # between the collector's own passes
    try:
        finished = DataModule()
        alive = weakref.ref(finished)
        del finished
        assert alive() is not None
        trial._free_for_the_next_trial()
        assert alive() is None
    finally:
        if was_enabled:
            gc.enable()
