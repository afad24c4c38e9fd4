"""``hpsearch.load_trial``: a finished trial's trained model back in the user's session,
built as its trial built it and holding its best epoch's weights."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

pytestmark = pytest.mark.e2e


def accuracy_on_test_split(loaded) -> float:
    """The loaded model's accuracy over its DataModule's test split, by hand (no Lightning)."""
    import torch

    correct = seen = 0
    with torch.inference_mode():
        for images, labels in loaded.datamodule.test_dataloader():
            correct += int((loaded.model(images).argmax(dim=1) == labels).sum())
            seen += len(labels)
    return correct / seen


def test_the_best_trials_model_scores_on_the_test_split_what_its_evaluation_did(finished_search):
    """The study's evaluation ran Lightning's test loop on best.ckpt; the loaded model,
    run by hand over the test split, gets the same accuracy, so it holds those weights."""
    import hpsearch

    exp_dir, _, _ = finished_search
    best = json.loads((exp_dir / "best.json").read_text())
    loaded = hpsearch.load_trial(exp_dir)
    assert (loaded.trial, loaded.params, loaded.value) == (best["trial"], best["params"], best["value"])
    import numpy

    # by a NumPy number, as a pandas table of result.trials gives it: refused as no int (audit 51)
    assert hpsearch.load_trial(exp_dir, numpy.int64(best["trial"])).trial == best["trial"]
    assert not loaded.model.training and loaded.checkpoint.name == "best.ckpt"
    assert loaded.precision == best["precision"]  # what its values are of (audit 80)
    assert loaded.model.hparams["lr"] == best["params"]["model.lr"]  # built with its sampled values
    loaded.datamodule.setup("test")
    assert accuracy_on_test_split(loaded) == pytest.approx(best["test_metrics"]["test_acc"], abs=1e-6)


def test_a_trial_without_a_checkpoint_to_load_is_said_why(finished_search, tmp_path):
    from hpsearch import HpsearchError, load_trial

    exp_dir, config, _ = finished_search
    with pytest.raises(HpsearchError, match=r"has no trial 99 \(its trials: 0-5\)"):
        load_trial(exp_dir, trial=99)
    with pytest.raises(TypeError, match=r"trial is a trial's number, an int \(got '3'\)"):
        load_trial(exp_dir, trial="3")  # it said "has no trial 3 (its trials: 0-5)" (audit 43)
    removed = next(number for number in range(6) if not (exp_dir / "trials" / f"trial_{number:04d}" / "checkpoints"
                                                         / "best.ckpt").exists())
    with pytest.raises(HpsearchError, match=rf"trial {removed} has no best.ckpt any more \(search.keep_checkpoints "
                                            r"is 3: the other ended trials' best.ckpt are removed\)"):
        load_trial(exp_dir, trial=removed)
    # A DeepSpeed trial's checkpoint is a directory of shards, which this cannot load.
    copy = tmp_path / "study"
    shutil.copytree(exp_dir, copy, symlinks=True)
    # A reader: the journal's lock file of a search running on the study stays where it is
    (copy / "optuna.journal.lock").symlink_to("held-by-a-running-search")
    best = json.loads((copy / "best.json").read_text())["trial"]
    checkpoint = copy / "trials" / f"trial_{best:04d}" / "checkpoints" / "best.ckpt"
    checkpoint.unlink()
    checkpoint.mkdir()
    with pytest.raises(HpsearchError, match="directory of DeepSpeed shards"):
        load_trial(copy)
    assert load_trial(copy, trial=next(number for number in range(6) if number not in (best, removed) and (
        copy / "trials" / f"trial_{number:04d}" / "checkpoints" / "best.ckpt").is_file())).model is not None
    assert (copy / "optuna.journal.lock").is_symlink()


def test_a_data_split_by_the_global_generator_is_the_trials_in_the_evaluation_and_in_load_trial(tmp_path,
                                                                                                monkeypatch):
    """SplitsWithTheGlobalRNG splits in setup with torch's global generator: unseeded, the
    study's test evaluation and load_trial each drew another split than the trial trained
    on, whose test samples held some of its training samples (audit 43); and a model that
    builds its layers in configure_model took no weights (it has none before that hook)."""
    import torch

    from conftest import FIXTURES, run_cli, write_yaml

    import hpsearch

    shutil.copytree(FIXTURES / "userpkg", tmp_path / "userpkg")
    splits = tmp_path / "splits.txt"
    write_yaml(tmp_path / "exp.yaml", {
        "name": "global-rng", "metric": "val_acc", "mode": "max", "storage": "runs",
        "model": {"class_path": "userpkg.global_rng:LayersInConfigureModel"},
        "data": {"class_path": "userpkg.global_rng:SplitsWithTheGlobalRNG", "init_args": {"record_to": str(splits)}},
        "space": {"model.lr": {"type": "float", "low": 0.005, "high": 0.05, "log": True}},
        "search": {"num_trials": 2, "sampler": "random", "seed": 3},
        "scheduler": {"type": "none", "max_epochs": 2}})
    result = run_cli("run", "exp.yaml", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    best = json.loads((tmp_path / "runs" / "global-rng" / "best.json").read_text())
    records = [line.split() for line in splits.read_text().splitlines()]
    [trained] = [digest for trial, stage, digest in records if trial == str(best["trial"])]
    evaluated = [digest for trial, stage, digest in records if trial == "driver" and "TEST" in stage][-1]
    assert evaluated == trained, records

    monkeypatch.chdir(tmp_path)  # the user's classes import from where the search ran
    for name in [name for name in sys.modules if name.partition(".")[0] == "userpkg"]:
        monkeypatch.delitem(sys.modules, name)  # other tests' userpkg (tests/fixtures'), put back after
    import random

    import numpy

    random.seed(1), numpy.random.seed(1), torch.manual_seed(1)  # the caller's own generators
    before = (random.getstate(), numpy.random.get_state()[1].tolist(), torch.get_rng_state())
    try:
        loaded = hpsearch.load_trial("runs/global-rng")
    finally:  # this copy's, which later tests would import in its place
        for name in [name for name in sys.modules if name.partition(".")[0] == "userpkg"]:
            del sys.modules[name]
    after = (random.getstate(), numpy.random.get_state()[1].tolist(), torch.get_rng_state())
    assert before[:2] == after[:2] and torch.equal(before[2], after[2])  # as they were (audit 44)
    assert splits.read_text().splitlines()[-1].split()[2] == trained
    assert accuracy_on_test_split(loaded) == pytest.approx(best["test_metrics"]["test_acc"], abs=1e-6)



def test_a_model_that_builds_its_layers_in_setup_is_loaded_with_its_weights(tmp_path, monkeypatch, example_config):
    """The search's test evaluation runs the model's ``setup`` before loading its weights,
    as Lightning's test loop does; load_trial did not, and failed on the weights of a model
    that builds (or compiles) its layers there: "Unexpected key(s) in state_dict" (audit 63)."""
    import torch

    from conftest import FIXTURES
    from hpsearch.search.config_loading import load_config
    from hpsearch.search.trained import _built_with_weights

    monkeypatch.syspath_prepend(str(FIXTURES))
    from userpkg.global_rng import LayersInSetup

    example_config["model"] = {"class_path": "userpkg.global_rng:LayersInSetup"}
    example_config["space"] = {"model.lr": {"type": "float", "low": 0.005, "high": 0.05, "log": True}}
    trained = LayersInSetup()
    trained.setup("fit")
    torch.save({"state_dict": trained.state_dict()}, tmp_path / "best.ckpt")
    model, _ = _built_with_weights(load_config(example_config), {}, tmp_path / "best.ckpt", "cpu", None, seed=0)
    assert all(torch.equal(model.state_dict()[key], value) for key, value in trained.state_dict().items())
