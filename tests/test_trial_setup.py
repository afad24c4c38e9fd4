"""How a trial is put together: arguments filled in, devices, precision fallback, preflight."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import types
import warnings
from pathlib import Path

import pytest
import torch

from conftest import FIXTURES, commands_matching, pids_whose_command, preflight_refusal, write_yaml
from hpsearch.search.components import build_datamodule, build_model, check_components, user_code_roots
from hpsearch.search.config_loading import load_config
from hpsearch.search.devices import loader_options, resolve_precision
from hpsearch.search.errors import ConfigError
from hpsearch.search.outcome import FAILURE, FINISHED
from hpsearch.search.preflight import run_preflight
from hpsearch.search.yaml_io import dump_yaml


def test_sampled_values_override_init_args_and_data_fills_model_shape(example_config):
    config = load_config(example_config)
    model_class, data_class = check_components(config)
    params = {"model.lr": 0.02, "model.channels": 8, "data.batch_size": 48}
    dm = build_datamodule(config, data_class, params, {"num_workers": 3, "pin_memory": False,
                                                       "persistent_workers": True, "prefetch_factor": None})
    model = build_model(config, model_class, params, dm)
    assert dm.batch_size == 48 and dm.requested_num_workers == 3
    assert model.hparams.channels == 8 and model.hparams.lr == 0.02
    assert tuple(model.hparams.input_shape) == (1, 8, 8) and model.hparams.num_classes == 10


def test_persistent_workers_and_prefetching_follow_the_workers_the_datamodule_gets(example_config):
    """Given on while the user's own init_args (or a sampled value) set num_workers: 0,
    they failed every trial: torch refuses both without workers (audit 31)."""
    import pytorch_lightning as pl

    class PassesThemOn(pl.LightningDataModule):
        def __init__(self, num_workers: int = 2, persistent_workers: bool = False, prefetch_factor=None):
            super().__init__()
            self.options = {"num_workers": num_workers, "persistent_workers": persistent_workers,
                            "prefetch_factor": prefetch_factor}

    class NoWorkerCount(PassesThemOn):  # its parent's num_workers, reached through **kwargs
        def __init__(self, persistent_workers: bool = False, **kwargs):
            super().__init__(persistent_workers=persistent_workers, **kwargs)

    hpsearchs = {"num_workers": 1, "pin_memory": False, "persistent_workers": True, "prefetch_factor": 4}
    config = load_config({**example_config, "loader": {"prefetch_factor": 4},
                          "data": {**example_config["data"], "init_args": {}}})
    built = build_datamodule(config, PassesThemOn, {}, hpsearchs)
    assert built.options == {"num_workers": 1, "persistent_workers": True, "prefetch_factor": 4}
    config.data.init_args["num_workers"] = 0
    built = build_datamodule(config, PassesThemOn, {}, hpsearchs)
    assert built.options == {"num_workers": 0, "persistent_workers": False, "prefetch_factor": None}
    built = build_datamodule(config, PassesThemOn, {"data.num_workers": 3}, {**hpsearchs, "num_workers": 0,
                                                                            "persistent_workers": False})
    assert built.options == {"num_workers": 3, "persistent_workers": True, "prefetch_factor": 4}  # loader's own
    del config.data.init_args["num_workers"]
    built = build_datamodule(config, NoWorkerCount, {}, hpsearchs)
    assert built.options == {"num_workers": 2, "persistent_workers": False, "prefetch_factor": None}  # its own


def _preflight_in_a_child(config, start_together, results) -> None:
    """One trial's set-up as Lightning runs it: the DataModule, the model, one validation
    batch; started with the other child's, once both have imported everything."""
    try:
        model_class, data_class = check_components(config)
        start_together.wait(timeout=120)
        run_preflight(config, model_class, data_class)
        results.put("ok")
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        results.put(f"{type(exc).__name__}: {exc}")


def test_trials_on_one_node_run_prepare_data_one_at_a_time(example_config, tmp_path, monkeypatch):
    # Two trials start at once on a node whose data is not there yet: the second must
    # neither download into the first one's file nor read it half-written.
    monkeypatch.syspath_prepend(str(FIXTURES))
    example_config["data"] = {"class_path": "userpkg.downloading:DownloadingDigits", "init_args": {"root": str(tmp_path)}}
    config = load_config(example_config)
    context = multiprocessing.get_context("spawn")  # a fork of this torch-using process can deadlock
    results, start_together = context.Queue(), context.Barrier(2)
    children = [context.Process(target=_preflight_in_a_child, args=(config, start_together, results))
                for _ in range(2)]
    for child in children:
        child.start()
    outcomes = [results.get(timeout=120) for _ in children]
    for child in children:
        child.join(timeout=60)
    assert outcomes == ["ok", "ok"], outcomes
    calls = sorted((json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()),
                   key=lambda call: call["start"])
    assert len({call["pid"] for call in calls}) == 2, calls  # Lightning called it in both trials
    assert all(later["start"] >= earlier["end"] for earlier, later in zip(calls, calls[1:])), calls


def test_loader_options_follow_the_trial_resources(example_config):
    config = load_config(example_config, ["resources.cpus_per_trial=4"])
    assert loader_options(config.loader, config.resources, on_gpu=False)["num_workers"] == 3
    gpu = loader_options(config.loader, config.resources, on_gpu=True)
    assert gpu["num_workers"] == 4 and gpu["pin_memory"] is True
    fixed = load_config(example_config, ["loader.num_workers=1", "loader.pin_memory=false"])
    assert loader_options(fixed.loader, fixed.resources, on_gpu=True)["num_workers"] == 1
    assert loader_options(fixed.loader, fixed.resources, on_gpu=True)["pin_memory"] is False


def test_loader_options_with_no_worker_processes_are_valid_for_a_plain_dataloader(example_config):
    # A user's DataModule that passes hpsearch's options straight to DataLoader: with the
    # default 1 CPU per trial there are no worker processes, and torch refuses
    # persistent_workers or prefetch_factor then (every trial failed).
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    config = load_config(example_config, ["resources.cpus_per_trial=1", "loader.prefetch_factor=4"])
    options = loader_options(config.loader, config.resources, on_gpu=False)
    assert options["num_workers"] == 0 and options["persistent_workers"] is False and options["prefetch_factor"] is None
    batches = list(DataLoader(TensorDataset(torch.arange(6.0)), batch_size=4, **options))
    assert [len(b[0]) for b in batches] == [4, 2]
    with_workers = load_config(example_config, ["resources.cpus_per_trial=3", "loader.prefetch_factor=4"])
    kept = loader_options(with_workers.loader, with_workers.resources, on_gpu=False)
    assert (kept["num_workers"], kept["persistent_workers"], kept["prefetch_factor"]) == (2, True, 4)


def test_trials_csv_gets_what_the_training_dataloaders_use_not_hpsearchs_options():
    # A DataModule may fix its own num_workers or ignore hpsearch's; torch pins memory only
    # where an accelerator exists (a CPU trial's pin_memory=True pinned nothing).
    import torch
    from pytorch_lightning.utilities import CombinedLoader
    from torch.utils.data import DataLoader, TensorDataset

    from hpsearch.search.devices import loader_in_use

    data = TensorDataset(torch.arange(8.0))
    own = DataLoader(data, batch_size=4, num_workers=1, pin_memory=True)
    pinned = torch.cuda.is_available()
    assert loader_in_use(own) == {"hps_num_workers": 1, "hps_pin_memory": pinned}
    # several: the count of one, which best.json's loader.num_workers gives each in a retraining
    several = {"a": own, "b": [DataLoader(data, num_workers=2)]}
    assert loader_in_use(several) == {"hps_num_workers": 2, "hps_pin_memory": pinned}
    assert loader_in_use(CombinedLoader(several, "max_size_cycle"))["hps_num_workers"] == 2
    alike = [DataLoader(data, num_workers=2), DataLoader(data, num_workers=2)]
    assert loader_in_use(alike)["hps_num_workers"] == 2
    assert loader_in_use(iter([1, 2])) == {}  # not a DataLoader: nothing to say


def test_a_datamodules_own_loader_workers_beyond_a_trials_cpus_are_warned_of(example_config, monkeypatch):
    """A DataLoader that fixes its own num_workers takes nothing hpsearch sizes to the trial:
    more workers than its CPUs shared them with training, unseen (audit 45)."""
    from hpsearch.search.components import check_components
    from hpsearch.search.preflight import run_preflight

    monkeypatch.syspath_prepend(str(FIXTURES))
    example_config["data"] = {"class_path": "userpkg.conditional:OwnLoaderWorkers", "init_args": {}}
    for cpus, warned in ((1, True), (2, False)):
        config = load_config(example_config, [f"resources.cpus_per_trial={cpus}"])
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run_preflight(config, *check_components(config))
        said = [str(w.message) for w in caught if "loader processes of its own" in str(w.message)]
        assert said == (["OwnLoaderWorkers's training DataLoader starts 2 loader processes of its own, which share "
                         "the 1 CPU(s) each trial worker holds with its training: pass a num_workers argument of its "
                         "constructor to its DataLoaders, and hpsearch sizes it to the trial (loader.num_workers)"]
                        if warned else []), said
    # training batches that are no DataLoader (an iterable, which Lightning takes) have no workers to count
    example_config["data"] = {"class_path": "userpkg.conditional:BatchesOfItsOwn", "init_args": {}}
    config = load_config(example_config, ["resources.cpus_per_trial=1"])
    assert "val_acc" in run_preflight(config, *check_components(config))


def test_loader_settings_that_cannot_act_are_warned_of(example_config, monkeypatch):
    from hpsearch.search.components import check_components
    from hpsearch.search.devices import loader_setting_warnings

    config = load_config(example_config, ["loader.pin_memory=true", "loader.num_workers=8",
                                          "resources.cpus_per_trial=2"])
    with pytest.warns(UserWarning) as caught:
        loader_setting_warnings(config.loader, config.resources)
    said = [str(w.message) for w in caught]
    assert any("loader.pin_memory: true does nothing for these trials: they run on CPU" in m for m in said), said
    assert any("loader.num_workers: 8 loader processes share the 2 CPU(s)" in m for m in said), said
    # the DataModule's own num_workers, set in init_args or searched, share the CPUs as well (audit 31)
    from hpsearch.search.devices import datamodule_worker_counts

    for overrides, said in ((["data.init_args.num_workers=4"], "data.init_args.num_workers: 4 loader processes"),
                            (["data.init_args.num_workers=1", "space.data.num_workers={type: int, low: 0, high: 6}"],
                             "space.data.num_workers: up to 6 loader processes")):
        own = load_config(example_config, [*overrides, "resources.cpus_per_trial=2"])
        with pytest.warns(UserWarning, match=re.escape(f"{said} share the 2 CPU(s)")):
            loader_setting_warnings(own.loader, own.resources, datamodule_worker_counts(own.data.init_args, own.space))
    two = load_config(example_config, ["data.init_args.num_workers=2"])
    assert datamodule_worker_counts(two.data.init_args, two.space) == {"data.init_args.num_workers": 2}
    half = load_config(example_config, ["loader.num_workers=1", "resources.cpus_per_trial=0.5"])
    with pytest.warns(UserWarning, match=r"1 loader processes share the 0\.5 CPU\(s\)"):  # said "the 0 CPU(s)"
        loader_setting_warnings(half.loader, half.resources)
    # The built-in in-memory data runs no loader workers: said so, not that they share the CPUs (audit 35)
    from hpsearch.models.digits import DigitsDataModule

    with pytest.warns(UserWarning) as caught:
        loader_setting_warnings(config.loader, config.resources, {"data.init_args.num_workers": 1}, DigitsDataModule)
    said = [str(w.message) for w in caught]
    assert "loader.num_workers: 8 loader processes are asked for, but DigitsDataModule loads its in-memory data " \
           "in the trial's own process: none run" in said, said
    assert any(m.startswith("data.init_args.num_workers: 1 loader processes are asked for") for m in said), said
    assert not any("share the" in m for m in said), said
    # The built-in digits takes the loader options; a DataModule without them does not.
    monkeypatch.syspath_prepend(str(FIXTURES))
    example_config["data"] = {"class_path": "userpkg.regression:NoisyLinearData"}
    example_config["space"] = {"model.lr": {"type": "float", "low": 0.01, "high": 0.1}}
    config = load_config(example_config, ["loader.num_workers=1"])
    with pytest.warns(UserWarning, match="loader.num_workers is not passed on: NoisyLinearData takes no argument "
                                         "'num_workers', so its own DataLoaders decide"):
        check_components(config)
    # one taking **kwargs does take it, but hpsearch does not pass it there: said so (audit 26)
    example_config["data"] = {"class_path": "synthetic-images"}
    config = load_config(example_config, ["loader.num_workers=1"])
    with pytest.warns(UserWarning, match="loader.num_workers is not passed on: SyntheticImagesDataModule names no "
                                         r"argument 'num_workers' \(its \*\*kwargs get none of hpsearch's loader"):
        check_components(config)


def test_fp16_on_cpu_falls_back_to_bf16_silently_in_the_trial():
    # The one warning is the driver's (tests/test_resources.py); trials only record it.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert resolve_precision("16-mixed", on_gpu=False) == "bf16-mixed"
    assert caught == []
    assert resolve_precision("bf16-mixed", on_gpu=False) == "bf16-mixed"
    assert resolve_precision("32-true", on_gpu=False) == "32-true"


def test_the_default_precision_is_mixed_on_a_gpu_and_full_on_a_cpu(example_config, monkeypatch):
    """Mixed precision is on by default where it is the proven gain, a GPU (audit 35: the
    default was 32-true everywhere, though the technique is one of the six)."""
    import torch

    from hpsearch.search.devices import trial_device
    from hpsearch.search.tuner import planned_columns

    example_config.pop("trainer", None)
    config = load_config(example_config)
    assert config.trainer.precision == "auto"
    assert resolve_precision("auto", on_gpu=False) == "32-true"
    assert trial_device(config.trainer, config.loader, config.resources).precision == "32-true"
    assert planned_columns(config)({"hps_trial_number": 0})["precision"] == "32-true"
    for bf16, expected in ((True, "bf16-mixed"), (False, "16-mixed")):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, bf16=bf16, **kwargs: bf16)
        assert resolve_precision("auto", on_gpu=True) == expected
    gpu = load_config(example_config, ["resources.gpus_per_trial=1"])
    assert planned_columns(gpu)({"hps_trial_number": 0})["precision"] == "bf16-mixed"  # until its reports say what ran


def test_bf16_mixed_trains_on_cpu(tmp_path, example_config):
    from hpsearch.search.devices import trial_device
    from hpsearch.search.lightning_trainer import build_trainer

    example_config["trainer"].update(precision="bf16-mixed", limit_train_batches=2, limit_val_batches=1)
    config = load_config(example_config)
    model_class, data_class = check_components(config)
    device = trial_device(config.trainer, config.loader, config.resources)
    dm = build_datamodule(config, data_class, {}, device.loader_options)
    model = build_model(config, model_class, {}, dm)
    trainer = build_trainer(config.trainer, device=device, metric="val_acc", mode="max", max_epochs=1,
                            trial_dir=tmp_path / "trial", tensorboard_run=tmp_path / "tb" / "trial", callbacks=[])
    trainer.fit(model, datamodule=dm)
    assert device.precision == "bf16-mixed" and str(trainer.precision) == "bf16-mixed"
    assert (tmp_path / "trial" / "checkpoints" / "epoch-0000.ckpt").is_file()


def test_a_model_tuned_by_lightnings_batch_size_finder_trains_on_as_plain_lightning_does(tmp_path, example_config,
                                                                                         monkeypatch):
    """The finder restores a checkpoint of its own after its trial runs, and the trial's
    random state went back to before them with it (the state a resume restores), where
    plain Lightning trains on from after them: other batches, other values (audit 63)."""
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.callbacks import BatchSizeFinder

    from conftest import FIXTURES
    from hpsearch.search.devices import trial_device
    from hpsearch.search.lightning_trainer import build_trainer

    monkeypatch.syspath_prepend(str(FIXTURES))
    from userpkg.ddp_probe import IndexedData, RankProbe  # a shuffling DataLoader: its order draws from torch's

    class DrawAtFirstEpoch(pl.Callback):
        def on_train_epoch_start(self, trainer, pl_module):  # after every callback's on_train_start
            self.drawn = torch.rand(3).tolist()

    example_config["trainer"].update(limit_train_batches=2, limit_val_batches=1)
    config = load_config(example_config)
    device = trial_device(config.trainer, config.loader, config.resources)
    drawn = []
    for plain in (False, True):
        pl.seed_everything(7, verbose=False)
        probe = DrawAtFirstEpoch()
        callbacks = [BatchSizeFinder(mode="power", init_val=4, max_trials=2, steps_per_trial=1), probe]
        if plain:
            trainer = pl.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, logger=False,
                                 enable_checkpointing=False, enable_progress_bar=False, callbacks=callbacks,
                                 default_root_dir=tmp_path / "plain")
        else:
            trainer = build_trainer(config.trainer, device=device, metric="val_loss", mode="min", max_epochs=1,
                                    trial_dir=tmp_path / "trial", tensorboard_run=tmp_path / "tb" / "trial",
                                    callbacks=callbacks)
        trainer.fit(RankProbe(str(tmp_path)), datamodule=IndexedData(batch_size=4))
        drawn.append(probe.drawn)
    assert drawn[0] == drawn[1]


def test_preflight_names_a_metric_the_model_never_logs(example_config):
    example_config["metric"] = "val_f1"
    config = load_config(example_config)
    with pytest.raises(ConfigError) as caught:
        run_preflight(config, *check_components(config))
    [problem] = caught.value.problems
    assert problem.field == "metric" and "'val_f1' is not logged at the first validation" in problem.message
    assert "val_acc" in problem.message


@pytest.mark.parametrize("precision, searched", [("bf16-mixed", False), ("32-true", True)])
def test_preflight_trains_in_the_cpu_trials_precision_and_every_searched_one(example_config, monkeypatch, precision,
                                                                            searched):
    """It always trained in 32-true: a training step that fails only under bf16 autocast
    passed check, then failed every trial."""
    monkeypatch.syspath_prepend(str(FIXTURES))
    example_config["model"]["class_path"] = "userpkg.grad_probe:Float32Tally"
    example_config["trainer"] = {"precision": precision}
    if searched:
        example_config["space"]["trainer.precision"] = {"type": "categorical", "choices": ["32-true", "16-mixed"]}
    config = load_config(example_config)
    with pytest.raises(ConfigError) as caught:
        run_preflight(config, *check_components(config))
    [problem] = caught.value.problems
    assert problem.field == ("space.trainer.precision" if searched else "model.class_path"), problem
    assert "training batch 1 failed (in bf16-mixed precision, the trials')" in problem.message, problem.message
    assert "index_add_" in problem.message
    # 32-true alone trains it fine
    example_config["trainer"] = {"precision": "32-true"}
    example_config["space"].pop("trainer.precision", None)
    config = load_config(example_config)
    assert "val_acc" in run_preflight(config, *check_components(config))


def test_preflight_refuses_a_metric_logged_only_in_training(example_config, monkeypatch):
    """A loss logged at training steps passed for a metric logged at validation, and
    trials then reported the last training batch's value as each epoch's result."""
    monkeypatch.syspath_prepend(str(FIXTURES))
    example_config["model"]["class_path"] = "userpkg.step_logged:StepLoggedCNN"
    example_config["metric"], example_config["mode"] = "step_loss", "min"
    config = load_config(example_config)
    with pytest.raises(ConfigError) as caught:
        run_preflight(config, *check_components(config))
    [problem] = caught.value.problems
    assert problem.field == "metric" and "'step_loss' is not logged at the first validation" in problem.message
    assert "only in training" in problem.message and "val_acc" in problem.message



def test_preflight_tells_a_metric_logged_at_validation_batches_only_to_log_the_epochs_value(example_config,
                                                                                            monkeypatch):
    """It was said not to be logged at all, though the model logs it (audit 74)."""
    monkeypatch.syspath_prepend(str(FIXTURES))
    example_config["model"]["class_path"] = "userpkg.step_logged:ValidationStepLoggedCNN"
    example_config["metric"] = "batch_acc"
    config = load_config(example_config)
    with pytest.raises(ConfigError) as caught:
        run_preflight(config, *check_components(config))
    [problem] = caught.value.problems
    assert problem.field == "metric" and "'batch_acc' at each validation batch only, logged with on_step=True and " \
        "on_epoch=False: log it with on_epoch=True" in problem.message, problem.message


def test_preflight_reports_a_constructor_that_raises(example_config):
    # The message names the argument with its value, so the argument is named, not init_args.
    example_config["model"]["init_args"]["optimizer"] = "lbfgs"
    config = load_config(example_config)
    with pytest.raises(ConfigError) as caught:
        run_preflight(config, *check_components(config))
    assert caught.value.problems[0].field == "model.init_args.optimizer" and "lbfgs" in str(caught.value)


def test_the_other_values_stop_being_built_when_their_time_budget_is_spent(example_config, monkeypatch):
    """A DataModule that loads its data in its constructor pays a load for each value."""
    import time

    from hpsearch.models.digits import DigitsDataModule
    from hpsearch.search import preflight

    built = []

    class SlowToBuild(DigitsDataModule):
        def __init__(self, *args, **kwargs):
            built.append(kwargs.get("batch_size"))
            time.sleep(0.3)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(preflight, "OTHER_VALUES_BUDGET_S", 0.5)
    example_config["space"]["data.batch_size"] = {"type": "categorical", "choices": [16, 32, 64, 128, 256, 512]}
    config = load_config(example_config)
    with pytest.warns(UserWarning, match=r"ran out; not checked: some values of space\.data\.batch_size"):
        assert "val_acc" in run_preflight(config, check_components(config)[0], SlowToBuild)
    # the sampled one, then one or two more: not the largest batch size too, which this loader
    # (no drop_last) cannot leave without a batch (audit 79)
    assert built[0] == 16 and 1 <= len(built[1:]) <= 2 and 512 not in built[1:2], built


def test_on_a_driver_without_a_gpu_a_value_refused_for_gpu_trials_is_a_warning(example_config, monkeypatch):
    """The builds run on the driver's CPU; for trials that get a GPU, a value that needs one
    (a CUDA kernel choice) must not stop the search from a laptop or a CPU head node."""
    from hpsearch.models.cnn import CNNClassifier
    from hpsearch.models.digits import DigitsDataModule as data_class
    from hpsearch.search import preflight

    class NeedsCuda(CNNClassifier):
        def __init__(self, *args, kernel: str = "eager", **kwargs):
            if kernel == "fused_cuda":
                raise RuntimeError("kernel 'fused_cuda' needs a CUDA device")
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(preflight, "_driver_has_gpu", lambda: False)
    example_config["space"]["model.kernel"] = {"type": "categorical", "choices": ["eager", "fused_cuda"]}
    with pytest.raises(ConfigError, match="'fused_cuda' can be sampled"):
        run_preflight(load_config(example_config), NeedsCuda, data_class)  # CPU trials: an error
    example_config["resources"]["gpus_per_trial"] = 1
    with pytest.warns(UserWarning, match="'fused_cuda' can be sampled.*which has no GPU; the trials have one"):
        assert "val_acc" in run_preflight(load_config(example_config), NeedsCuda, data_class)


def test_a_constructor_error_shows_the_searched_values_it_was_given(example_config):
    example_config["space"]["model.dropout"] = {"type": "float", "low": 1.5, "high": 2.0}
    config = load_config(example_config)
    with pytest.raises(ConfigError) as caught:
        run_preflight(config, *check_components(config))
    [problem] = caught.value.problems
    assert problem.field == "space.model.dropout"  # torch names it with its value
    assert "CNNClassifier(..., searched: lr=0.00316228, channels=8, dropout=1.5) raised ValueError" in problem.message


def test_preflight_names_the_class_whose_method_failed(example_config):
    from hpsearch.models.cnn import CNNClassifier
    from hpsearch.models.digits import DigitsDataModule

    class BrokenSetup(DigitsDataModule):
        def setup(self, stage=None):
            raise RuntimeError("setup exploded")

    class BrokenValidation(CNNClassifier):
        def validation_step(self, batch, batch_idx):
            raise RuntimeError("validation exploded")

    class BrokenTraining(CNNClassifier):  # validates fine: only a training step finds it
        def training_step(self, batch, batch_idx):
            raise RuntimeError("training exploded")

    class BrokenTrainLoader(DigitsDataModule):
        def train_dataloader(self):
            raise RuntimeError("train loader exploded")

    class BrokenTest(CNNClassifier):  # trains and validates: only the final evaluation would find it
        def test_step(self, batch, batch_idx):
            return self.undefined_helper(batch)

    class StepPlateau(CNNClassifier):  # a per-step scheduler: at the end of a batch that is not the last
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.01)
            scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
            return {"optimizer": optimizer,
                    "lr_scheduler": {"scheduler": scheduler, "monitor": "val_acc", "interval": "step"}}

    class PlateauTypo(CNNClassifier):  # an epoch scheduler asks for its metric after validation
        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=0.01)
            scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "val_accuracy"}}

    class SavesBatchSize(CNNClassifier):  # Lightning merges both classes' saved hparams when logging
        def __init__(self, batch_size: int = 7, **kwargs):
            super().__init__(**kwargs)
            self.save_hyperparameters()

    class ReadsARelativePath(DigitsDataModule):
        def setup(self, stage=None):
            open("data/missing.npz", "rb")

    class SavesItsArguments(DigitsDataModule):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.save_hyperparameters()

    class NoTestSplitYet(DigitsDataModule):  # Lightning sets the test split up before on_test_start
        def setup(self, stage=None):
            if stage == "test":
                raise FileNotFoundError("test split not downloaded")
            super().setup(stage)

    class UnreadableSample(torch.utils.data.Dataset):  # a corrupt image file, say
        def __len__(self):
            return 4

        def __getitem__(self, index):
            raise ValueError(f"cannot identify image file 'emu/{index}.png'")

    class UnreadableValidationData(DigitsDataModule):  # the Dataset raises: the data's fault (audit 30)
        def val_dataloader(self):
            return torch.utils.data.DataLoader(UnreadableSample(), batch_size=2, num_workers=1)

    class TwoValidationLoaders(DigitsDataModule):  # the model's validation_step takes no dataloader_idx
        def val_dataloader(self):
            return [super().val_dataloader(), super().val_dataloader()]

    config = load_config(example_config)
    model_class, data_class = check_components(config)
    for model, data, field, said in (
            (model_class, BrokenSetup, "data.class_path", "the set-up before the first batch failed: RuntimeError: setup"),
            (model_class, TwoValidationLoaders, "model.class_path",
             "the validation's set-up (val_dataloader, validation_step's arguments) failed: RuntimeError: You "
             "provided multiple `val_dataloader`"),
            (BrokenValidation, data_class, "model.class_path", "one validation batch failed: RuntimeError: validation"),
            (model_class, UnreadableValidationData, "data.class_path",
             "one validation batch failed: ValueError: Caught ValueError in DataLoader worker process 0"),
            (BrokenTraining, data_class, "model.class_path", "training batch 1 failed: RuntimeError: training exploded"),
            (model_class, BrokenTrainLoader, "data.class_path", "before the first batch failed: RuntimeError: train loader"),
            (BrokenTest, data_class, "model.class_path", "one test batch (the best trial's final evaluation runs "
                                                         "test_step) failed: AttributeError"),
            (model_class, NoTestSplitYet, "data.class_path", "the test split's set-up (setup('test'), "
                                                             "test_dataloader) failed: FileNotFoundError"),
            (StepPlateau, data_class, "model.class_path", "training batch 1 failed: MisconfigurationException: "
                                                          "ReduceLROnPlateau conditioned on metric val_acc"),
            (PlateauTypo, data_class, "model.class_path", "the epoch's end, after validation (LR schedulers, "
                                                          "epoch-end hooks) failed: MisconfigurationException"),
            (SavesBatchSize, SavesItsArguments, "space.data.batch_size",
             "Error while merging hparams: the keys ['batch_size']"),
            (model_class, ReadsARelativePath, "data.class_path", "No such file or directory: 'data/missing.npz' "
                                                                 "(a relative path, looked for from the current directory")):
        with pytest.raises(ConfigError) as caught:
            run_preflight(config, model, data)
        [problem] = caught.value.problems
        assert problem.field == field and said in problem.message, problem
        if model is BrokenValidation or data is BrokenSetup:  # the user's code that raised, as trials say it
            assert re.search(rf"\(at {re.escape(__file__)}:\d+ in (validation_step|setup)\)", problem.message), problem


def test_preflight_says_the_searched_values_a_failed_batch_ran_with(example_config):
    """A choice of channels 0 failed the first training batch, blamed on the model with no
    word of the value it was given (audit 36)."""
    example_config["space"]["model.channels"] = {"type": "categorical", "choices": [0, 16]}
    config = load_config(example_config)
    with pytest.raises(ConfigError) as caught:
        run_preflight(config, *check_components(config))
    [problem] = caught.value.problems
    assert problem.field == "model.class_path" and "training batch 1 failed: RuntimeError" in problem.message
    assert problem.message.endswith("; it ran with the searched values model.lr=0.00316228, model.channels=0, "
                                    "data.batch_size=32"), problem.message


@pytest.mark.parametrize("name, which", [("limit_train_batches", "training"), ("limit_val_batches", "validation")])
def test_preflight_refuses_a_fraction_of_the_batches_that_leaves_none(example_config, name, which):
    """0.01 of 17 batches passed the check (its own batches are two and one), and Lightning
    refused it in every trial (audit 36)."""
    del example_config["space"]["data.batch_size"]  # (the space's largest: the next test)
    example_config["trainer"] = {name: 0.01}
    config = load_config(example_config)
    with pytest.raises(ConfigError) as caught:
        run_preflight(config, *check_components(config))
    [problem] = caught.value.problems
    assert problem.field == f"trainer.{name}", problem
    assert re.fullmatch(rf"0\.01 of the (\d+) {which} batches with the searched values .* is none, which Lightning "
                        rf"refuses in a trial: give at least [\d.]+ \(more where a larger batch size gives fewer "
                        rf"batches\), or a whole number of batches \(an int\)",
                        problem.message), problem.message
    example_config["trainer"] = {name: 0.5}
    config = load_config(example_config)
    assert config.metric in run_preflight(config, *check_components(config))


@pytest.mark.parametrize("name, which, limit, batches", [("limit_train_batches", "training", 0.15, 5),
                                                         ("limit_val_batches", "validation", 0.34, 1)])
def test_preflight_refuses_a_fraction_that_leaves_no_batch_at_the_spaces_largest_batch_size(example_config, name,
                                                                                           which, limit, batches):
    """The preflight ran at one batch size: a fraction that left batches there left none
    at the space's largest, and every trial that sampled it failed (audit 69). (The digits
    data's validation batches are 4x the training's.)"""
    example_config["space"]["data.batch_size"] = {"type": "categorical", "choices": [32, 256]}
    example_config["trainer"] = {name: limit}  # which leaves batches at 32
    config = load_config(example_config)
    with pytest.raises(ConfigError) as caught:
        run_preflight(config, *check_components(config))
    [problem] = caught.value.problems
    assert (problem.field, problem.message) == (
        f"trainer.{name}", f"{limit} of the {batches} {which} batches at data.batch_size=256 (the space's largest) is "
                           f"none, which Lightning refuses in a trial: give at least {1 / batches:.3g}, or a whole "
                           f"number of batches (an int)")
    example_config["space"]["data.batch_size"] = {"type": "categorical", "choices": [32, 64]}
    example_config["trainer"] = {name: 0.5}  # 1 of the 2 validation batches at 64
    config = load_config(example_config)
    assert config.metric in run_preflight(config, *check_components(config))


def test_the_largest_batch_size_is_tried_as_the_datamodule_batches_with_it(example_config):
    """A conditional batch size the preflight's values do not sample was not tried (2 of 8
    trials failed), and a fixed eval_batch_size was scaled with the batch size as if it
    followed it (a valid experiment refused; audit 70)."""
    example_config["data"]["init_args"]["eval_batch_size"] = 64  # 6 validation batches at any batch size
    example_config["trainer"] = {"limit_val_batches": 0.3}
    config = load_config(example_config)
    assert config.metric in run_preflight(config, *check_components(config))
    example_config["data"]["init_args"].pop("eval_batch_size")
    example_config["space"]["data.batch_size"] = {"type": "categorical", "choices": [32, 256],
                                                  "when": {"model.channels": [16]}}  # the preflight's is 8
    example_config["trainer"] = {"limit_train_batches": 0.15}
    problem = preflight_refusal(example_config)
    assert problem.field == "trainer.limit_train_batches" and problem.message.startswith(
        "0.15 of the 5 training batches at data.batch_size=256 (the space's largest) is none"), problem
    # a searched limit's smallest, at the largest batch size: only its first choice was tried (audit 73)
    example_config["space"]["data.batch_size"].pop("when")
    example_config["trainer"] = {}
    example_config["space"]["trainer.limit_train_batches"] = {"type": "categorical", "choices": [0.5, 0.1]}
    problem = preflight_refusal(example_config)
    assert problem.field == "space.trainer.limit_train_batches" and problem.message.startswith(
        "0.1 of the 5 training batches at data.batch_size=256 (the space's largest) is none"), problem


def test_preflight_names_the_trainer_setting_a_manually_optimized_model_cannot_use(example_config, tmp_path):
    from conftest import manually_optimized, write_yaml

    from hpsearch.models.cnn import CNNClassifier

    example_config["space"]["trainer.accumulate_grad_batches"] = {"type": "categorical", "choices": [2, 4]}
    config = load_config(write_yaml(tmp_path / "exp.yaml", example_config))
    with pytest.raises(ConfigError) as caught:
        run_preflight(config, manually_optimized(CNNClassifier), check_components(config)[1])
    [problem] = caught.value.problems
    assert problem.field == "space.trainer.accumulate_grad_batches" and problem.line is not None, problem
    assert "gradient accumulation is not supported for manual optimization" in problem.message, problem


@pytest.mark.parametrize("name, space", [
    ("gradient_clip_val", {"type": "float", "low": 0.0, "high": 1.0}),
    ("gradient_clip_val", {"type": "categorical", "choices": [0.0, 0.5]}),
    ("accumulate_grad_batches", {"type": "int", "low": 1, "high": 4}),
])
def test_a_searched_setting_a_manually_optimized_model_refuses_at_a_later_value_is_named(example_config, tmp_path,
                                                                                        name, space):
    # The preflight's batches train with the range's low end or first choice, which is off
    # here: the other end failed every trial that sampled it.
    from conftest import manually_optimized, write_yaml

    from hpsearch.models.cnn import CNNClassifier

    example_config["space"][f"trainer.{name}"] = space
    config = load_config(write_yaml(tmp_path / "exp.yaml", example_config))
    with pytest.raises(ConfigError) as caught:
        run_preflight(config, manually_optimized(CNNClassifier), check_components(config)[1])
    [problem] = caught.value.problems
    assert problem.field == f"space.trainer.{name}" and problem.line is not None, problem
    assert "can be sampled, and ManuallyOptimized optimizes manually" in problem.message, problem


def test_ctrl_c_during_the_preflight_batch_is_an_interrupt_not_an_exit(example_config):
    # Lightning turns Ctrl+C inside validate() into sys.exit(1); the driver must see Ctrl+C.
    import signal

    config = load_config(example_config)
    model_class, data_class = check_components(config)

    class PressesCtrlC(model_class):
        def validation_step(self, batch, batch_idx):
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_preflight(config, PressesCtrlC, data_class)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # not left ignoring Ctrl+C
    finally:
        signal.signal(signal.SIGINT, previous)


def test_preflight_blames_a_searched_value_an_error_quotes_without_its_name(example_config):
    """torch's optimizers refuse a learning rate as "Invalid learning rate: -0.1": the
    problem was pinned on model.class_path, not on the searched model.lr."""
    example_config["space"]["model.lr"] = {"type": "float", "low": -0.1, "high": 0.1}
    config = load_config(example_config)
    with pytest.raises(ConfigError) as caught:
        run_preflight(config, *check_components(config))
    [problem] = caught.value.problems
    assert problem.field == "space.model.lr" and "Invalid learning rate: -0.1" in problem.message, problem


def test_preflight_names_every_sampleable_value_a_constructor_refuses(example_config, tmp_path):
    from conftest import write_yaml

    example_config["space"].update({
        "model.optimizer": {"type": "categorical", "choices": ["adamw", "sgdd", "sgd"]},
        "model.dropout": {"type": "float", "low": 0.0, "high": 1.5},  # torch's Dropout refuses p > 1
        "data.batch_size": {"type": "categorical", "choices": [64, 0]},
    })
    config = load_config(write_yaml(tmp_path / "exp.yaml", example_config))
    with pytest.raises(ConfigError) as caught:
        run_preflight(config, *check_components(config))
    found = {(p.field, p.message.split(",")[0]) for p in caught.value.problems}
    assert found == {("space.model.optimizer", "'sgdd' can be sampled"),
                     ("space.model.dropout", "1.5 can be sampled"),
                     ("space.data.batch_size", "0 can be sampled")}, caught.value
    assert all(p.line is not None for p in caught.value.problems)  # located in the file


def test_preflight_builds_a_model_that_needs_real_tensors_on_the_cpu(example_config):
    """The other values are built on the meta device; a constructor that reads a tensor's
    value cannot run there, and must not be reported for it."""
    import torch

    from hpsearch.models.cnn import CNNClassifier

    class ReadsATensor(CNNClassifier):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if float(torch.ones(1).sum()) != 1.0:  # raises on the meta device
                raise AssertionError("unreachable")

    example_config["space"]["model.dropout"] = {"type": "float", "low": 0.0, "high": 0.5}
    config = load_config(example_config)
    assert "val_acc" in run_preflight(config, ReadsATensor, check_components(config)[1])


def test_preflight_accepts_the_example(example_config):
    config = load_config(example_config)
    assert "val_acc" in run_preflight(config, *check_components(config))


def test_the_preflight_trains_the_same_batches_each_time_and_keeps_the_callers_generators(example_config,
                                                                                           monkeypatch):
    """Seeded as trial 0 is: unseeded, a bad file in the training split was met by one
    ``check`` in six, and ``run`` refused what ``check`` had passed (audit 48)."""
    import random

    import numpy

    from hpsearch.models.tensor_data import TensorBatches

    taken = []
    getitems = TensorBatches.__getitems__
    monkeypatch.setattr(TensorBatches, "__getitems__", lambda self, indices: (
        taken.append(list(indices)), getitems(self, indices))[1])
    config = load_config(example_config)
    random.seed(1), numpy.random.seed(1), torch.manual_seed(1)  # the caller's own generators
    before = (random.getstate(), numpy.random.get_state()[1].tolist(), torch.get_rng_state().tolist())
    run_preflight(config, *check_components(config))
    first = list(taken)
    assert (random.getstate(), numpy.random.get_state()[1].tolist(), torch.get_rng_state().tolist()) == before
    taken.clear()
    torch.manual_seed(2)
    run_preflight(config, *check_components(config))
    assert first and taken == first, (first, taken)


def test_user_code_outside_site_packages_is_shipped_to_workers(example_config, monkeypatch):
    monkeypatch.chdir(FIXTURES)
    example_config["model"] = {"class_path": "userpkg.regression:LinearRegressor", "init_args": {"in_features": 4}}
    config = load_config(example_config | {"space": {"model.lr": {"type": "float", "low": 0.01, "high": 0.1}}})
    assert user_code_roots(config) == [str(FIXTURES / "userpkg")]
    for name in [name for name in sys.modules if name.partition(".")[0] == "userpkg"]:  # other tests import it
        monkeypatch.delitem(sys.modules, name)
    assert user_code_roots(load_config(example_config | {"model": {"class_path": "cnn"}})) == []



def test_a_script_read_from_stdin_is_not_shipped(example_config, tmp_path, monkeypatch):
    """``python - <<EOF`` names its script ``<stdin>``, in the folder it runs from, also
    under ``__mp_main__``: Ray refused that as a py_modules entry, with a traceback, and
    the search never started (audit 26)."""
    import types

    script = types.ModuleType("__mp_main__")
    script.__file__ = str(tmp_path / "<stdin>")
    monkeypatch.setitem(sys.modules, "__mp_main__", script)
    monkeypatch.chdir(tmp_path)
    assert user_code_roots(load_config(example_config)) == []

def test_the_current_directorys_packages_that_the_classes_import_are_shipped_too(example_config, tmp_path,
                                                                                 monkeypatch):
    """Only the classes' own package was shipped: a helper package beside it, which the
    model imports, came on another machine from whatever sat at the driver's path there."""
    for name, text in {"apkg/__init__.py": "", "apkg/models.py": "import ahelper\nfrom ahelper.layers import Net\n",
                       "ahelper/__init__.py": "", "ahelper/layers.py": "from hpsearch.models.cnn import CNNClassifier"
                       " as Net\n", "unrelated/__init__.py": "", "script.py": ""}.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    example_config["model"] = {"class_path": "apkg.models:Net"}
    config = load_config(example_config)
    try:
        check_components(config)  # the driver imports the classes before it ships them
        assert user_code_roots(config) == [str(tmp_path / "apkg"), str(tmp_path / "ahelper")]
    finally:
        for name in [name for name in sys.modules if name.partition(".")[0] in ("apkg", "ahelper")]:
            del sys.modules[name]


def test_hpsearch_imported_from_the_checkout_finds_its_subpackages():
    """A Ray worker started in the checkout imports its hpsearch/ folder ahead of an installed
    (non-editable) copy; that folder must still give hpsearch.search and hpsearch.models."""
    import site
    import subprocess
    import sys

    from conftest import REPO

    # -S: no site processing, so no editable-install finder: only the checkout and the
    # third-party packages, as a worker sees them under a plain `pip install .`.
    probe = ("import sys; sys.path[:0] = [''] ; sys.path += %r; "
             "import hpsearch.search.config, hpsearch.models.cnn; "
             "print(hpsearch.search.config.__file__); print(hpsearch.models.cnn.__file__)") % site.getsitepackages()
    result = subprocess.run([sys.executable, "-S", "-c", probe], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(REPO / "search" / "config.py"), str(REPO / "models" / "cnn.py")]


def test_a_required_argument_nobody_provides_is_an_error(example_config, monkeypatch):
    monkeypatch.chdir(FIXTURES)
    example_config["model"] = {"class_path": "userpkg.regression:LinearRegressor"}
    example_config["space"] = {"model.lr": {"type": "float", "low": 0.01, "high": 0.1}}
    with pytest.raises(ConfigError) as caught:
        check_components(load_config(example_config))
    assert "needs argument 'in_features'" in str(caught.value)


def test_only_a_cluster_started_elsewhere_gets_the_ray_settings_through_a_runtime_env(monkeypatch):
    import socket

    from hpsearch.search.components import DRIVER_HOST_ENV
    from hpsearch.search.tuner import RAY_DEFAULTS, RAY_ENV, worker_runtime_env

    for name in RAY_DEFAULTS:
        monkeypatch.delenv(name, raising=False)
    assert worker_runtime_env([], joins_cluster=False) == {}
    # the driver's host too: a worker on another machine puts the shipped code first (shipped_code_first)
    assert worker_runtime_env([], joins_cluster=True) == {"env_vars": {**RAY_DEFAULTS, **RAY_ENV,
                                                                       DRIVER_HOST_ENV: socket.gethostname()}}
    assert worker_runtime_env(["/code/userpkg"], joins_cluster=False) == {"py_modules": ["/code/userpkg"]}
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "5")  # the user's own setting wins
    assert worker_runtime_env([], joins_cluster=True)["env_vars"]["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] == "5"


def test_a_local_rays_workers_inherit_the_ray_settings_and_trials_run_in_the_workers_ray_started_with(
        example_config, monkeypatch, tmp_path):
    """No runtime env for a local Ray with built-in classes: its workers must still see
    RAY_ENV (a trial would otherwise run in its trial folder, or under Train V1) and
    RAY_DEFAULTS (a distributed trial's end would otherwise be seen seconds late).
    Ray Tune's trial actors, too, get its settings from the local Ray rather than in a
    runtime env: so Ray hands them the idle workers it started with, not new processes."""
    import os
    import signal

    import ray
    from ray import tune

    from hpsearch.search.tuner import RAY_DEFAULTS, RAY_ENV, start_ray, trial_actors_inherit_tune_env, tune_trial_env

    for name in RAY_ENV:  # restored after the test; start_ray sets them for this process
        monkeypatch.setenv(name, "unset")
    for name in RAY_DEFAULTS:  # unset, and unset again after the test
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    expected = {**RAY_DEFAULTS, **RAY_ENV}
    assert not ray.is_initialized()
    search_ray = start_ray(load_config(example_config), None, verbose=False)
    try:
        programs = _ray_session_programs()
        assert {"gcs_server", "raylet"} <= programs  # this Ray's processes, found by its session
        # what a local search's Ray starts without (README, Performance): they only cost its start
        assert not programs & {"dashboard.py", "monitor.py", "log_monitor.py"}

        @ray.remote(num_cpus=1)
        def environment():
            return {name: os.environ.get(name) for name in expected}, ray.get_runtime_context().runtime_env

        seen, runtime_env = ray.get(environment.remote())
        assert seen == expected
        assert not runtime_env  # so a new worker skips Ray's runtime-env agent

        def trial(config):
            tune.report({"pid": os.getpid(), "no_fork": os.environ.get("PL_DISABLE_FORK"),
                         "runtime_env_vars": sorted((ray.get_runtime_context().runtime_env or {}).get("env_vars", {}))})

        idle = set(pids_whose_command(lambda command: command.startswith("ray::IDLE")))  # Ray's idle workers
        assert idle
        handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
        try:
            with trial_actors_inherit_tune_env(search_ray.local_environment):
                trial_saw = tune.Tuner(trial, run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0)).fit()[0]
        finally:  # Tune's fit leaves its own handlers in place
            for number, handler in handlers.items():
                signal.signal(number, handler)
        assert trial_saw.metrics["no_fork"] == "1"  # Ray Tune's setting, inherited
        assert trial_saw.metrics["runtime_env_vars"] == []
        assert trial_saw.metrics["pid"] in idle
        assert tune_trial_env()["PL_DISABLE_FORK"] == "1"  # Ray Tune's own again after the search
    finally:
        ray.shutdown()


def test_a_search_gives_this_process_its_environment_back(example_config, monkeypatch):
    """``hpsearch.run`` left its Ray Tune settings in the user's Python session: a plain
    Tuner run after it wrote none of its result files (audit 22). Ray stays up for the
    next search, which sets them again."""
    import ray

    from hpsearch.search.tuner import RAY_ENV, ray_for_search, ray_settings

    for name in [*ray_settings(), "RAY_ADDRESS"]:  # unset, and as they were again after the test
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)
    monkeypatch.setenv("RAY_CHDIR_TO_TRIAL_DIR", "1")  # one the user had set
    assert not ray.is_initialized()
    try:
        with ray_for_search(load_config(example_config), None, verbose=False):
            assert {name: os.environ.get(name) for name in RAY_ENV} == RAY_ENV
        assert os.environ["RAY_CHDIR_TO_TRIAL_DIR"] == "1"
        assert [name for name in ray_settings() if name in os.environ] == ["RAY_CHDIR_TO_TRIAL_DIR"]
    finally:
        ray.shutdown()


def test_with_verbose_a_local_rays_workers_output_still_reaches_the_driver(example_config, capfd, monkeypatch):
    """``-v`` keeps Ray's log monitor, which streams the workers' output to the driver."""
    import logging

    import ray

    from hpsearch.search.tuner import ray_settings, start_ray

    for name in [*ray_settings(), "RAY_ADDRESS"]:  # start_ray sets them for this process: unset again after
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)
    ray_logger_level = logging.getLogger("ray").level  # Ray's INFO lines, with -v, for this process
    assert not ray.is_initialized()
    start_ray(load_config(example_config), None, verbose=True)
    try:
        assert {"log_monitor.py", "raylet"} <= _ray_session_programs()
        assert "monitor.py" not in _ray_session_programs()

        @ray.remote(num_cpus=1)
        def speak():
            print("a line from a worker", flush=True)

        ray.get(speak.remote())
        seen = ""
        for _ in range(100):
            time.sleep(0.1)
            seen += "".join(capfd.readouterr())
            if "a line from a worker" in seen:
                break
        assert "a line from a worker" in seen
    finally:
        ray.shutdown()
        logging.getLogger("ray").setLevel(ray_logger_level)


def _ray_session_programs() -> set[str]:
    """The programs (script or binary names) of the processes of the Ray this process runs."""
    import ray

    session = ray._private.worker._global_node.get_session_dir_path()
    commands = commands_matching(lambda command: session in command).values()
    return {Path(word).name for command in commands for word in command.split()[:3] if not word.startswith("-")}


def test_trial_actors_get_ray_tunes_runtime_env_unless_the_local_ray_inherited_the_same(monkeypatch):
    from hpsearch.search.tuner import trial_actors_inherit_tune_env, tune_trial_env

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "set after Ray started")
    at_ray_start = {**tune_trial_env(), "AWS_ACCESS_KEY_ID": "at Ray's start"}
    with trial_actors_inherit_tune_env(at_ray_start):  # Tune ships the new credentials
        assert tune_trial_env()["AWS_ACCESS_KEY_ID"] == "set after Ray started"
    with trial_actors_inherit_tune_env(None):  # a cluster, or a Ray that this search did not start
        assert tune_trial_env()["PL_DISABLE_FORK"] == "1"
    with trial_actors_inherit_tune_env(tune_trial_env()):
        assert tune_trial_env() == {}
    restored = tune_trial_env()
    assert (restored["PL_DISABLE_FORK"], restored["AWS_ACCESS_KEY_ID"]) == ("1", "set after Ray started")


def test_trials_on_another_machine_import_the_user_code_the_search_shipped_not_what_sits_at_the_drivers_path(
        example_config, tmp_path, monkeypatch):
    """Ray puts the driver's working directory first on every worker's ``sys.path``. On
    another machine that path may hold other code of the same name (an older copy baked
    into the nodes' image); here the file at that path changes once the search has shipped
    it, and a worker is told it runs on another machine than the driver. On the driver's
    machine, the path holds the user's code itself (a notebook's edit before its next
    search, on the Ray its first search started): Ray's order stays there."""
    import socket

    import ray

    from hpsearch.search.components import DRIVER_HOST_ENV, shipped_code_first
    from hpsearch.search.tuner import start_ray

    package = tmp_path / "shippedpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "parts.py").write_text("from hpsearch.models.mlp import MLPClassifier as Model\nWHICH = 'shipped'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the driver's own cwd entry goes with the test
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    example_config["model"] = {"class_path": "shippedpkg.parts:Model"}
    assert not ray.is_initialized()
    start_ray(load_config(example_config), None, verbose=False)
    try:
        (package / "parts.py").write_text("WHICH = 'what sits at the path'\n")

        @ray.remote(num_cpus=1, max_calls=1)  # a new worker process for each call
        def imported(put_shipped_first: bool, driver_host: str | None = None) -> tuple[str, str]:
            import os

            if driver_host is not None:
                os.environ[DRIVER_HOST_ENV] = driver_host
            seen_host = os.environ.get(DRIVER_HOST_ENV)
            if put_shipped_first:
                shipped_code_first()
            from shippedpkg import parts

            return parts.WHICH, seen_host

        assert ray.get(imported.remote(False)) == ("what sits at the path", socket.gethostname())  # Ray's order
        assert ray.get(imported.remote(True))[0] == "what sits at the path"  # on the driver's machine
        assert ray.get(imported.remote(True, "another-machine"))[0] == "shipped"
    finally:
        ray.shutdown()
        sys.modules.pop("shippedpkg", None)


def test_trainers_still_get_entry_point_callbacks_once_the_lookup_is_remembered(tmp_path, monkeypatch):
    import pytorch_lightning as pl
    from lightning_fabric.utilities import registry

    from hpsearch.search.lightning_trainer import remember_callback_factories

    monkeypatch.setattr(registry, "entry_points", registry.entry_points)  # undone after the test
    # An installed package that adds a callback to every Trainer through Lightning's entry point.
    (tmp_path / "extra_callbacks_pkg.py").write_text(
        "import pytorch_lightning as pl\n"
        "class Added(pl.Callback):\n    pass\n"
        "def factory():\n    return [Added()]\n")
    dist = tmp_path / "extra_callbacks_pkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: extra-callbacks-pkg\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[pytorch_lightning.callbacks_factory]\nadded = extra_callbacks_pkg:factory\n")

    def added_callbacks():
        trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                             enable_model_summary=False)
        return [cb for cb in trainer.callbacks if type(cb).__name__ == "Added"]

    remember_callback_factories()
    remember_callback_factories()  # idempotent: one layer of remembering
    remembered = registry.entry_points.remembered
    assert added_callbacks() == []
    monkeypatch.syspath_prepend(str(tmp_path))  # a new sys.path is looked up afresh
    first, second = added_callbacks(), added_callbacks()
    assert len(first) == len(second) == 1 and first[0] is not second[0]  # the factory runs per Trainer
    assert len(remembered) == 2  # one lookup per sys.path, not per Trainer


def _raise(exc: BaseException) -> None:
    raise exc


def test_an_unreadable_image_is_not_retried_and_is_named():
    """PIL's UnidentifiedImageError is an OSError, which is retried: every trial of a
    folder with one broken file failed twice the same way, the search's whole budget spent
    on it (audit 26). Raised in a loader worker, torch re-raises it with the worker's
    traceback as its message, which ends with the original's."""
    from PIL import UnidentifiedImageError

    from hpsearch.search.trial import _failure_reason

    direct = UnidentifiedImageError("cannot identify image file 'imgs/dog/broken.png'")
    assert _failure_reason(direct) == ("unreadable file: cannot identify image file 'imgs/dog/broken.png'; "
                                       "not retried: the same file would fail again")
    from_a_worker = UnidentifiedImageError("Caught UnidentifiedImageError in DataLoader worker process 0.\n"
                                           "Original Traceback (most recent call last):\n  File ...\n"
                                           "PIL.UnidentifiedImageError: cannot identify image file 'imgs/dog/x.png'\n")
    assert _failure_reason(from_a_worker).startswith(
        "unreadable file: cannot identify image file 'imgs/dog/x.png'; not retried")
    # a message over two lines was cut to its last (audit 73)
    two_lines = UnidentifiedImageError("Caught UnidentifiedImageError in DataLoader worker process 0.\n"
                                       "Original Traceback (most recent call last):\n  File ...\n"
                                       "PIL.UnidentifiedImageError: cannot decode /data/cat/7.png:\n"
                                       "truncated at byte 4096\n")
    assert _failure_reason(two_lines).startswith(
        "unreadable file: cannot decode /data/cat/7.png: truncated at byte 4096; not retried")
    in_a_worker = ValueError("Caught ValueError in DataLoader worker process 0.\nOriginal Traceback (most recent "
                             "call last):\n  File ...\nValueError: a label out of range\n")
    assert _failure_reason(in_a_worker).startswith("ValueError: a label out of range"), _failure_reason(in_a_worker)


@pytest.mark.parametrize("exc, retried", [
    (RuntimeError("NCCL communicator was aborted"), True),   # a lost peer, a killed loader worker
    (OSError(5, "Input/output error"), True),
    (ImportError("No module named 'mypkg'"), True),          # a package missing on one node
    (TypeError("unsupported operand"), False),
    (KeyError("image"), False),
    (ValueError("Expected input batch_size (32) to match target batch_size (16)"), False),
])
def test_a_fault_the_same_code_would_raise_again_is_not_retried(exc, retried):
    from pytorch_lightning.utilities.exceptions import MisconfigurationException

    from hpsearch.search.trial import _failure_reason

    with pytest.raises(type(exc)) as caught:
        _raise(exc)
    reason = _failure_reason(caught.value)
    if retried:
        assert reason is None, reason
    else:  # named with the user's line that raised (this file's, here), not Lightning's or hpsearch's
        assert reason.startswith(f"{type(exc).__name__}: ") and f"{__file__}:" in reason, reason
        assert "in _raise); not retried" in reason, reason
    assert _failure_reason(MisconfigurationException("ReduceLROnPlateau conditioned on metric val/loss "
                                                     "which is not available")) is not None


@pytest.mark.parametrize("device", [
    "cpu taken for a gpu",
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                     reason="needs CUDA")])])
def test_a_trial_on_a_gpu_leaves_nothing_alive_for_the_next_trial_in_its_worker(example_config, tmp_path, device):
    """A reused worker runs trial after trial. Lightning's Trainer, the model and its
    optimizer hold one another in reference cycles, which only Python's cyclic collector
    frees: a finished trial's weights and optimizer state stayed on the GPU into the next
    trials until a full collection came. Without CUDA, the trial runs on CPU taken for
    one that used a GPU (whose cache is then emptied). In a process of its own, as in a
    worker: a trial sets up its process (the collector, Lightning's lookups, threads)."""
    from conftest import write_yaml

    (tmp_path / "tracked_model.py").write_text(
        "import weakref\n"
        "from hpsearch.models.cnn import CNNClassifier\n"
        "TRAINED = []\n"
        "class Tracked(CNNClassifier):\n"
        "    def on_fit_start(self):\n"
        "        TRAINED.append(weakref.ref(self))\n")
    example_config["model"]["class_path"] = "tracked_model:Tracked"
    example_config["scheduler"]["max_epochs"] = 1
    if device == "cuda":
        example_config["resources"]["gpus_per_trial"] = 1
    config = load_config(write_yaml(tmp_path / "exp.yaml", example_config))
    (tmp_path / "experiment.json").write_text(json.dumps(config.model_dump(mode="json")))
    (tmp_path / "one_trial.py").write_text(f"""
import gc, json, sys
import torch
from ray import tune
from hpsearch.search import trial as trial_module
from hpsearch.search.outcome import TRIAL_NUMBER

reports, freed_when_emptied = [], []
tune.report = reports.append
if {device != "cuda"!r}:
    trial_module._used_a_gpu = lambda: True
    torch.cuda.empty_cache = lambda: freed_when_emptied.append(
        all(ref() is None for ref in sys.modules["tracked_model"].TRAINED))
allocated_before = torch.cuda.memory_allocated() if {device == "cuda"!r} else 0
gc.disable()  # only the trial's own collection may free the model
trial_module.train_trial({{"params": {{"model.lr": 0.01, "model.channels": 8, "data.batch_size": 64}},
                          TRIAL_NUMBER: 0}}, experiment=json.load(open("experiment.json")), experiment_dir="study")
import tracked_model
[model] = tracked_model.TRAINED
print(json.dumps({{"reported": any({config.metric!r} in r for r in reports), "device": reports[-1]["hps_device"],
                  "model_alive": model() is not None, "freed_when_emptied": freed_when_emptied,
                  "allocated": torch.cuda.memory_allocated() if {device == "cuda"!r} else 0,
                  "allocated_before": allocated_before}}))
""")
    done = subprocess.run([sys.executable, "one_trial.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["reported"] and not seen["model_alive"], seen  # it trained, and its model is gone
    if device == "cuda":
        assert seen["device"] == "gpu" and seen["allocated"] == seen["allocated_before"], seen
    else:
        assert seen["freed_when_emptied"][-1], seen  # (Lightning's teardown empties the cache too)


@pytest.mark.parametrize("torch_call", [
    lambda: torch.nn.Linear(10, 5)(torch.randn(4, 12)),  # a sampled width that does not fit the next layer
    lambda: torch.nn.Conv2d(1, 4, 9)(torch.randn(2, 1, 8, 8)),  # a sampled kernel larger than the feature map
    lambda: torch.nn.functional.max_pool2d(torch.randn(1, 1, 2, 2), 3),  # pooled below one pixel
    lambda: torch.nn.Conv2d(3, 4, 3)(torch.randn(2, 1, 8, 8)),
    lambda: torch.randn(4, 6).view(5, -1),
    lambda: torch.randn(4, 6) + torch.randn(4, 5),
    lambda: torch.cat([torch.randn(2, 3), torch.randn(2, 4)]),
    lambda: torch.nn.Linear(4, 2)(torch.randn(3, 4, dtype=torch.float64)),
    lambda: torch.nn.BatchNorm1d(4).eval()(torch.randn(3, 5)),
    lambda: torch.nn.LSTM(4, 8)(torch.randn(3, 2, 5)),
], ids=["linear", "kernel", "pool", "channels", "view", "broadcast", "cat", "dtype", "batchnorm", "lstm"])
def test_pytorchs_shape_and_dtype_checks_are_not_retried(torch_call):
    """PyTorch raises these as RuntimeError, as it does faults a retry may outlive; each
    retry of one cost a new worker process and the imports (README, "Failing trials")."""
    from hpsearch.search.trial import _failure_reason

    with pytest.raises(RuntimeError) as caught:
        torch_call()
    reason = _failure_reason(caught.value)
    assert reason is not None and reason.startswith("RuntimeError: "), reason
    assert reason.endswith("not retried: the same code would raise it again"), reason


def _trials_in_a_process(tmp_path: Path, example_config: dict, loop: str):
    """Trials run by ``train_trial`` in a process of its own, as in a Ray worker, with Ray
    Tune's ``report`` recorded in ``reports``: ``loop`` is the script's rest, which runs
    them. The validated config, and the finished process."""
    from conftest import write_yaml

    config = load_config(write_yaml(tmp_path / "exp.yaml", example_config))
    (tmp_path / "experiment.json").write_text(json.dumps(config.model_dump(mode="json")))
    (tmp_path / "one_trial.py").write_text(
        "import json, os\n"
        "from ray import tune\n"
        "from hpsearch.search import trial as trial_module\n"
        "from hpsearch.search.outcome import TRAINING_SEED, TRIAL_NUMBER\n"
        "reports = []\n"
        "tune.report = reports.append\n" + textwrap.dedent(loop))
    return config, subprocess.run([sys.executable, "one_trial.py"], cwd=tmp_path, capture_output=True, text=True,
                                  timeout=300)


def _reports_printed(done) -> list[dict]:
    """The last reports a script of ``_trials_in_a_process`` printed, one "REPORT {json}" line each."""
    return [json.loads(line.removeprefix("REPORT ")) for line in done.stdout.splitlines()
            if line.startswith("REPORT ")]


def test_a_datamodule_that_cannot_read_a_file_in_its_constructor_fails_its_trial_at_once(example_config, tmp_path):
    """``UnreadableDataFile`` from a constructor was retried, as any OSError there is, though
    README promised a DataModule may raise it to end its trial (audit 50); an I/O error is
    still left to a retry. In a process of its own, as in a worker."""
    (tmp_path / "reading_data.py").write_text(
        "import errno, os\n"
        "from hpsearch.models.digits import DigitsDataModule\n"
        "from hpsearch.search.errors import UnreadableDataFile\n"
        "class Reading(DigitsDataModule):\n"
        "    def __init__(self, **kwargs):\n"
        "        if os.environ['FAULT'] == 'unreadable':\n"
        "            raise UnreadableDataFile('cannot read labels.csv: bad row 3')\n"
        "        raise OSError(errno.EIO, 'Input/output error')\n")
    example_config["data"]["class_path"] = "reading_data:Reading"
    _, done = _trials_in_a_process(tmp_path, example_config, """
        for number, fault in enumerate(("unreadable", "io")):
            os.environ["FAULT"] = fault
            try:
                trial_module.train_trial({"params": {"model.lr": 0.01, "model.channels": 8, "data.batch_size": 64},
                                          TRIAL_NUMBER: number}, experiment=json.load(open("experiment.json")),
                                         experiment_dir="study")
                print("REPORT", json.dumps(reports[-1], default=str))
            except OSError as exc:
                print("RAISED", type(exc).__name__, exc)
    """)
    assert done.returncode == 0, done.stdout + done.stderr
    [report] = _reports_printed(done)
    # named by the user's line, its traceback kept, as a fault in training is (audit 61: neither)
    traceback = tmp_path / "study" / "trials" / "trial_0000" / "error.txt"
    assert report[FINISHED] and report[FAILURE] == (
        "building the trial's Reading raised UnreadableDataFile: cannot read labels.csv: bad row 3 "
        f"(at {tmp_path / 'reading_data.py'}:7 in __init__) (traceback: {traceback})"), report
    assert "raise UnreadableDataFile('cannot read labels.csv: bad row 3')" in traceback.read_text()
    assert "RAISED OSError [Errno 5] Input/output error" in done.stdout, done.stdout  # for Ray Tune to retry


def test_a_trial_whose_training_loader_gives_no_batch_fails_saying_so(example_config, tmp_path):
    """Its fit ran no epoch, and it ended as "PRUNED (stopped before its first result)",
    the cause only in its output.log (audit 77). In a process of its own, as in a worker."""
    (tmp_path / "empty_data.py").write_text(
        "from torch.utils.data import DataLoader\n"
        "from hpsearch.models.digits import DigitsDataModule\n"
        "class DropsEveryBatch(DigitsDataModule):\n"
        "    def train_dataloader(self):\n"
        "        return DataLoader(self._splits['train'], batch_size=100_000, drop_last=True)\n")
    example_config["data"]["class_path"] = "empty_data:DropsEveryBatch"
    _, done = _trials_in_a_process(tmp_path, example_config, """
        trial_module.train_trial({"params": {"model.lr": 0.01, "model.channels": 8, "data.batch_size": 64},
                                  TRIAL_NUMBER: 0}, experiment=json.load(open("experiment.json")),
                                 experiment_dir="study")
        print("REPORT", json.dumps(reports[-1], default=str))
    """)
    assert done.returncode == 0, done.stdout + done.stderr
    [report] = _reports_printed(done)
    assert report[FINISHED] and report[FAILURE].startswith(
        "the training DataLoader gave no batch: a batch size larger than the training split with drop_last"), report


def test_preflight_refuses_a_fraction_of_the_batches_of_a_loader_without_a_length(example_config):
    """The preflight trains two batches, by an int of its own: ``limit_train_batches: 0.5``
    with an IterableDataset passed ``check``, and Lightning refused it in every trial (audit 77)."""
    from torch.utils.data import DataLoader, IterableDataset

    from hpsearch.models.cnn import CNNClassifier
    from hpsearch.models.digits import DigitsDataModule

    class Streamed(IterableDataset):
        def __init__(self, items):
            self.items = items

        def __iter__(self):
            return iter(self.items)

    class StreamsItsTraining(DigitsDataModule):
        def train_dataloader(self):
            return DataLoader(Streamed(self._splits["train"]), batch_size=self.batch_size,
                              collate_fn=self.collate_for(self.batch_size))

    example_config["trainer"] = {"limit_train_batches": 0.5}
    config = load_config(example_config)
    with pytest.raises(ConfigError) as caught:
        run_preflight(config, CNNClassifier, StreamsItsTraining)
    [problem] = caught.value.problems
    assert problem.field == "trainer.limit_train_batches" and "0.5 is a fraction of the training batches, and the " \
        "training DataLoader has no length (an IterableDataset)" in problem.message, problem
    example_config["trainer"] = {"limit_train_batches": 3}
    assert "val_acc" in run_preflight(load_config(example_config), CNNClassifier, StreamsItsTraining)

    # read by every loader worker of a trial: each epoch would hold each item twice (audit 77)
    example_config["loader"] = {"num_workers": 2}
    example_config["resources"] = {"cpus_per_trial": 2}
    said = (r"StreamsItsTraining's training data is an IterableDataset, and a trial's DataLoader can read it with 2 "
            r"loader processes: each reads all of it unless")
    with pytest.warns(UserWarning, match=said):
        run_preflight(load_config(example_config), CNNClassifier, StreamsItsTraining)
    # a count the space can sample, whatever the preflight's (audit 79)
    example_config["loader"] = {"num_workers": 0}
    example_config["space"]["data.num_workers"] = {"type": "categorical", "choices": [0, 2]}
    with pytest.warns(UserWarning, match=said):
        run_preflight(load_config(example_config), CNNClassifier, StreamsItsTraining)

    class ShardsItself(Streamed):
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            return iter(self.items) if info is None else itertools.islice(self.items, info.id, None, info.num_workers)

    class StreamsShards(StreamsItsTraining):
        def train_dataloader(self):
            return DataLoader(ShardsItself(self._splits["train"]), batch_size=self.batch_size,
                              collate_fn=self.collate_for(self.batch_size))

    with warnings.catch_warnings():  # none said of a dataset that shards itself (audit 79)
        warnings.simplefilter("error", UserWarning)
        run_preflight(load_config(example_config), CNNClassifier, StreamsShards)


@pytest.mark.parametrize("searched", [False, True], ids=["at-its-values", "at-the-largest-batch-size"])
def test_preflight_refuses_a_training_loader_that_gives_no_batch(example_config, searched):
    """``check`` passed, and every trial ended with no result; at the preflight's own values
    the metric was blamed, as no validation ran (audit 77)."""
    from torch.utils.data import DataLoader

    from hpsearch.models.cnn import CNNClassifier
    from hpsearch.models.digits import DigitsDataModule

    class DropsTheLastBatch(DigitsDataModule):
        def train_dataloader(self):
            return DataLoader(self._splits["train"], batch_size=self.batch_size, drop_last=True,
                              collate_fn=self.collate_for(self.batch_size))

    example_config["space"]["data.batch_size"] = {"type": "int", "low": 16, "high": 4096} if searched \
        else {"type": "categorical", "choices": [4096]}
    example_config["space"]["data.split_seed"] = {"type": "categorical", "choices": [3, 4]}
    config = load_config(example_config)
    with pytest.raises(ConfigError) as caught:
        run_preflight(config, CNNClassifier, DropsTheLastBatch)
    [problem] = caught.value.problems
    # with the data's other values it was built with, the preflight's (audit 79)
    said = ("at data.batch_size=4096 (the space's largest, with data.split_seed=3) the training DataLoader gives no "
            "batch") if searched else "the training DataLoader gave no batch with the searched values"
    assert problem.field == "space.data.batch_size" and said in problem.message, problem


def test_an_empty_training_loader_is_put_on_the_training_batch_size():
    """It was put on the first argument whose name held "batch" and not "eval":
    val_batch_size, or drop_last_batch (audit 79)."""
    from types import SimpleNamespace

    from hpsearch.search.preflight import _batch_size_field

    def config(space=(), **init_args):
        return SimpleNamespace(space=dict.fromkeys(space), data=SimpleNamespace(init_args=init_args))

    assert _batch_size_field(config(val_batch_size=512, drop_last_batch=True, batch_size=16)) == \
        "data.init_args.batch_size"
    assert _batch_size_field(config(["data.val_batch_size", "data.train_batch_size"])) == \
        "space.data.train_batch_size"
    assert _batch_size_field(config(drop_last_batch=True)) == "data.class_path"


def test_a_trial_whose_code_calls_sys_exit_fails_with_that_reason_and_recorded_its_settings(example_config, tmp_path):
    """``sys.exit(4)`` in a training step ended the Ray worker with exit code 4, which the
    driver took for a process killed by the out-of-memory killer or a native crash, and
    retried, to the same end each time (audit 21). ``sys.exit(0)`` was taken for Tune's stop
    at a report, and Ray's complaint that the trial ended unasked was its reason, after a
    retry (audit 27). In a process of its own, as in a worker."""
    (tmp_path / "exiting_model.py").write_text(
        "import os, sys\n"
        "from hpsearch.models.cnn import CNNClassifier\n"
        "class Exiting(CNNClassifier):\n"
        "    def training_step(self, batch, batch_idx):\n"
        "        sys.exit(int(os.environ['EXIT_CODE']))\n")
    example_config["model"]["class_path"] = "exiting_model:Exiting"
    example_config["scheduler"]["max_epochs"] = 1
    config, done = _trials_in_a_process(tmp_path, example_config, """
        for number, code in enumerate(("4", "0")):
            os.environ["EXIT_CODE"] = code
            seed = {TRAINING_SEED: 12345} if number == 0 else {}  # trial 0's fixed when first handed out
            trial_module.train_trial({"params": {"model.lr": 0.01, "model.channels": 8, "data.batch_size": 64,
                                                 "trainer.gradient_clip_val": 0.5}, TRIAL_NUMBER: number, **seed},
                                     experiment=json.load(open("experiment.json")), experiment_dir="study")
            print("REPORT", json.dumps(reports[-1], default=str))
            print("SEEDED", os.environ.get("PL_GLOBAL_SEED"))
    """)
    assert done.returncode == 0, done.stdout + done.stderr  # the worker lives on, for the next trial
    lasts = _reports_printed(done)
    assert len(lasts) == 2, done.stdout + done.stderr  # the second trial ended too, and the worker lived on
    # a trial trains with the seed its config carries, else the one the study's seed gives it
    from hpsearch.search.seeding import training_seed

    seeded = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("SEEDED ")]
    assert seeded == ["12345", str(training_seed(config.search.seed, 1))], done.stdout
    for code, last in zip((4, 0), lasts):
        assert last[FINISHED] and last[FAILURE].startswith(f"SystemExit({code}): sys.exit() called at "), last
        assert "exiting_model.py:5" in last[FAILURE] and "not retried" in last[FAILURE], last
    # The trial's own record of its settings holds its sampled trainer values (it held the
    # experiment's defaults; audit 21): the best trial is evaluated and described by it.
    recorded = json.loads((tmp_path / "study/trials/trial_0000/experiment.json").read_text())
    assert recorded["trainer"]["gradient_clip_val"] == 0.5
    assert recorded["model"] == config.model_dump(mode="json")["model"]


def test_a_keyboard_interrupt_raised_by_a_trials_code_is_named_not_lightnings_failure_to_handle_it():
    """A trial trains outside the main thread, where Lightning's handler of a
    KeyboardInterrupt fails ("signal only works in main thread"): that ValueError was the reason."""
    import threading

    from hpsearch.search.trial import _failure_reason

    caught = []

    def training_thread() -> None:
        try:
            try:
                _raise(KeyboardInterrupt())
            except KeyboardInterrupt:  # as Lightning's _call_and_handle_interrupt does
                signal.signal(signal.SIGINT, signal.SIG_IGN)
        except ValueError as exc:
            caught.append(exc)

    thread = threading.Thread(target=training_thread)
    thread.start()
    thread.join()
    assert "main thread" in str(caught[0])
    line = _raise.__code__.co_firstlineno + 1
    assert _failure_reason(caught[0]) == (f"KeyboardInterrupt raised at {__file__}:{line} in _raise; "
                                          f"not retried: the same code would raise it again")


class TwoArgumentError(Exception):
    def __init__(self, code: int, detail: str) -> None:
        super().__init__(f"{code}: {detail}")


def test_an_exception_ray_cannot_copy_reaches_it_as_a_runtime_error_naming_it_with_its_traceback(tmp_path):
    """Ray copies every failure of a trial (``skip_exceptions``); one whose constructor
    takes other arguments than its ``args`` raised a TypeError there about that
    constructor, which became the trial's error (audit 27)."""
    from ray.air._internal.util import skip_exceptions

    from hpsearch.search.trial import _stand_in_ray_can_copy
    from hpsearch.search.trial_faults import last_error_line

    with pytest.raises(TwoArgumentError) as caught:
        _raise(TwoArgumentError(42, "the batch is broken"))
    with pytest.raises(TypeError, match="missing 1 required positional argument"):
        skip_exceptions(caught.value)
    stand_in = _stand_in_ray_can_copy(caught.value)
    assert skip_exceptions(stand_in) is not None  # Ray copies it
    assert str(stand_in).startswith(f"{__name__}.TwoArgumentError: 42: the batch is broken\n"), str(stand_in)
    # The trial's error line and file:line, as the driver reads them from Ray's text of it
    (tmp_path / "error.txt").write_text(f"Failure # 1 (occurred at 2026-12-06_10-30-00)\nRuntimeError: {stand_in}")
    trial = types.SimpleNamespace(error_file=str(tmp_path / "error.txt"))
    assert last_error_line(trial) == f"{__name__}.TwoArgumentError: 42: the batch is broken"
    assert f"line {_raise.__code__.co_firstlineno + 1}, in _raise" in str(stand_in)  # the traceback, whole
    try:
        _raise(ValueError("plain"))
    except ValueError as plain:
        assert _stand_in_ray_can_copy(plain) is None
        try:
            raise RuntimeError("wrapped") from caught.value  # Ray copies the causes too
        except RuntimeError as wrapped:
            assert _stand_in_ray_can_copy(wrapped) is not None


@pytest.mark.parametrize("message", [
    "DataLoader worker (pid(s) 4242) exited unexpectedly",
    "CUDA error: an illegal memory access was encountered",
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:41235",
    "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error",
])
def test_other_runtime_errors_are_still_retried(message):
    from hpsearch.search.trial import _failure_reason

    with pytest.raises(RuntimeError) as caught:
        _raise(RuntimeError(message))
    assert _failure_reason(caught.value) is None


def test_a_misspelt_argument_passed_on_through_kwargs_is_named_as_the_field(example_config, tmp_path):
    # The class takes **kwargs, so the signature check lets it through; its parent refuses.
    from conftest import write_yaml

    from hpsearch.models.cnn import CNNClassifier
    from hpsearch.models.digits import DigitsDataModule

    class TakesAnything(CNNClassifier):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)

    example_config["model"]["init_args"]["hiden"] = 3
    config = load_config(write_yaml(tmp_path / "exp.yaml", example_config))
    with pytest.raises(ConfigError) as caught:
        run_preflight(config, TakesAnything, DigitsDataModule)
    [problem] = caught.value.problems
    assert problem.field == "model.init_args.hiden" and problem.line is not None, problem
    assert "unexpected keyword argument 'hiden'" in problem.message, problem


def test_a_sampleable_value_that_makes_the_saved_hparams_clash_is_refused(example_config):
    # The representative batch size (the range's low end, 32) agrees with the model's; the
    # high end does not, and Lightning refuses such a pair as a trial starts.
    from hpsearch.models.cnn import CNNClassifier
    from hpsearch.models.digits import DigitsDataModule

    class SavesBatchSize(CNNClassifier):
        def __init__(self, batch_size: int = 32, **kwargs):
            super().__init__(**kwargs)
            self.save_hyperparameters()

    class SavesItsArguments(DigitsDataModule):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.save_hyperparameters()

    config = load_config(example_config)
    assert config.space["data.batch_size"].low == 32
    with pytest.raises(ConfigError) as caught:
        run_preflight(config, SavesBatchSize, SavesItsArguments)
    [problem] = caught.value.problems
    assert problem.field == "space.data.batch_size" and problem.message.startswith(
        "256 can be sampled, but then SavesBatchSize and SavesItsArguments save different values of batch_size"), problem


@pytest.mark.parametrize("value,said", [
    ("1e-4x", "'1e-4x' does not suit CNNClassifier's weight_decay: float (Input should be a valid number"),
    ("1e-4", "'1e-4' is a string, and CNNClassifier's weight_decay takes float: write it without quotes"),
])
def test_an_init_arg_of_the_wrong_type_is_named_before_anything_runs(example_config, value, said, tmp_path):
    """Checked against the constructor's annotations: the value used to reach the model as
    a string and fail in the preflight, blamed on model.class_path. Advice on quotes is for
    a file's value; a Python caller is told what to pass."""
    example_config["model"]["init_args"]["weight_decay"] = value
    written = tmp_path / "exp.yaml"
    written.write_text(dump_yaml(example_config))  # quotes a string that reads as a number ('1e-4')
    for source, told in ((written, said),
                         (example_config, said.replace("write it without quotes", "pass a number"))):
        config = load_config(source)
        with pytest.raises(ConfigError) as caught:
            check_components(config)
        [problem] = caught.value.problems
        assert problem.field == "model.init_args.weight_decay" and told in problem.message, problem


def test_a_conditional_arguments_init_args_value_is_checked_too(example_config):
    """It was never checked, and is used where the condition is not met: a raw TypeError in
    the preflight (audit 69). One the space always gives is never used, and a study that
    holds one (``lr: null``) was locked out of resume and load_trial (audit 72)."""
    example_config["model"]["init_args"]["weight_decay"] = "high"
    example_config["space"]["model.weight_decay"] = {"type": "float", "low": 0.0, "high": 0.1,
                                                     "when": {"model.channels": [8]}}
    config = load_config(example_config)
    with pytest.raises(ConfigError) as caught:
        check_components(config)
    [problem] = caught.value.problems
    assert problem.field == "model.init_args.weight_decay" and "'high' does not suit CNNClassifier's weight_decay" \
        in problem.message, problem
    example_config["space"]["model.weight_decay"].pop("when")
    check_components(load_config(example_config))


@pytest.mark.parametrize("name, param", [("split_seed", {"type": "int", "low": 0, "high": 5}),
                                         ("val_fraction", {"type": "float", "low": 0.1, "high": 0.3})])
def test_a_built_in_datas_split_is_not_searched(example_config, name, param):
    """Each trial would have been scored on other validation samples (audit 71); a study
    begun before is not locked out of resume and load_trial, which check its own config
    with ``check_components`` (audit 73)."""
    from hpsearch.search.api import prepare

    example_config["space"][f"data.{name}"] = param
    config = load_config(example_config)
    with pytest.raises(ConfigError) as caught:
        prepare(config, preflight=False, new_study=True)
    [problem] = caught.value.problems
    assert problem.field == f"space.data.{name}" and problem.message.startswith(
        f"DigitsDataModule's {name} decides which samples each split holds"), problem
    check_components(config)
    prepare(config, preflight=False)


def test_the_preflight_refuses_a_loss_that_is_not_finite_before_any_step(example_config):
    """Data holding NaN passed check, and every trial failed at its first loss check, named
    by its loss alone (audit 71)."""
    example_config["data"] = {"class_path": "synthetic-images",
                              "init_args": {"noise": float("nan"), "image_size": 8, "channels": 1, "num_samples": 64}}
    example_config["space"].pop("data.batch_size")
    config = load_config(example_config)
    with pytest.raises(ConfigError) as caught:
        run_preflight(config, *check_components(config))
    [problem] = caught.value.problems
    assert "training batch 1 failed: ValueError: its loss is nan on the model's initial weights: the batch holds NaN" \
        in problem.message, problem


def test_values_of_the_annotated_type_or_converted_without_loss_pass(example_config):
    example_config["model"]["init_args"].update(weight_decay=0, lr=1e-3)  # an int where a float goes
    check_components(load_config(example_config))


def test_a_value_the_set_up_refuses_by_name_and_value_is_blamed_on_its_argument(example_config):
    example_config["model"]["init_args"]["weight_decay"] = -1e-4  # the optimizer refuses it in the set-up
    config = load_config(example_config)
    with pytest.raises(ConfigError) as caught:
        run_preflight(config, *check_components(config))
    [problem] = caught.value.problems
    assert problem.field == "model.init_args.weight_decay" and "Invalid weight_decay value: -0.0001" in problem.message


def test_a_class_count_below_the_datas_labels_is_blamed_on_that_argument_and_says_how_many(example_config):
    """torch's "Target 9 is out of bounds" names no argument: ``num_classes: 5`` on the
    10-class digits was blamed on model.class_path."""
    example_config["model"]["init_args"]["num_classes"] = 5
    config = load_config(example_config)
    with pytest.raises(ConfigError) as caught:
        run_preflight(config, *check_components(config))
    [problem] = caught.value.problems
    assert problem.field == "model.init_args.num_classes", problem.message
    assert re.search(r"holds the label \d, and the model's output has fewer classes.*at least \d+", problem.message)


def test_the_preflight_writes_nothing_into_a_folder_the_models_own_checkpoint_names_and_warns_of_it(
        example_config, tmp_path, monkeypatch):
    """A ModelCheckpoint(dirpath=...) of the model's: ``check`` (which creates nothing)
    left its two-step checkpoint there, and every trial wrote the same names into it over
    each other's (audit 82); each trial's go into its own folder, which the warning names."""
    monkeypatch.syspath_prepend(str(FIXTURES))
    named = tmp_path / "ckpts"
    example_config["model"] = {"class_path": "userpkg.own_checkpoint:CNNWithCheckpointFolder",
                               "init_args": {"own_dir": str(named)}}
    config = load_config(example_config)
    with pytest.warns(UserWarning) as caught:
        run_preflight(config, *check_components(config))
    assert not named.exists()
    said = [str(w.message) for w in caught if "names dirpath=" in str(w.message)]
    assert said and f"dirpath={named}, into which every trial would write" in said[0] \
        and "trials/trial_NNNN/model_checkpoints/ckpts/" in said[0], said


def test_a_test_step_that_makes_gradients_passes_the_preflight_which_says_it_runs_without_inference_mode(
        example_config, monkeypatch):
    """Its validation ran under no_grad, its test batch under inference mode failed, and
    ``run`` refused the search, not saying why (audit 82)."""
    monkeypatch.syspath_prepend(str(FIXTURES))
    example_config["model"]["class_path"] = "userpkg.grad_probe:InputGradientAtEvaluation"
    example_config["model"]["init_args"]["log_to"] = os.devnull
    config = load_config(example_config)
    with pytest.warns(UserWarning, match="InputGradientAtEvaluation's test_step makes gradients, which "
                                         "torch.inference_mode refuses: .* runs it under torch.no_grad"):
        run_preflight(config, *check_components(config))


def test_a_whole_number_is_blamed_where_it_stands_alone_not_where_a_shape_holds_it(example_config):
    """Tensors of shape (8, 8) in a model of 8 channels: the convolution's error says
    "channels" and holds an 8, and ``channels`` was blamed (audit 71)."""
    from hpsearch.search.preflight import _arguments_mentioned

    config = load_config(example_config)
    shape_error = RuntimeError("Given groups=1, weight of size [8, 1, 3, 3], expected input[1, 64, 8, 8] to have "
                               "1 channels, but got 64 channels instead")
    assert _arguments_mentioned(config, shape_error, {"model.channels": 8, "model.lr": 0.01}) == []
    for said in ("channels=8 is too few", "Invalid channels value: 8", "channels (8) must be even",
                 "channels must be even (or left out), got 8", "channels must be a power of 2, got 8.",
                 "Invalid value for channels=8. Must be 16", "channels: expected 16, got 8 [8, 16]"):
        assert _arguments_mentioned(config, ValueError(said), {"model.channels": 8, "model.lr": 0.01}) \
            == ["space.model.channels"], said
    for said in ("channels=80", "128 channels", "channels of shape (8, 8)"):  # not a number of its own
        assert _arguments_mentioned(config, ValueError(said), {"model.channels": 8, "model.lr": 0.01}) == [], said


def test_a_value_set_by_hand_named_beside_a_searched_one_is_blamed_not_the_searched_one(example_config):
    """The split's check names both fractions with their values; the searched one was blamed,
    though the value set by hand was out of range (audit 21)."""
    from hpsearch.models.cnn import CNNClassifier
    from hpsearch.models.digits import DigitsDataModule

    example_config["data"]["init_args"]["test_fraction"] = 0.95
    example_config["space"]["data.val_fraction"] = {"type": "float", "low": 0.1, "high": 0.3}
    config = load_config(example_config)
    with pytest.raises(ConfigError) as caught:  # (the checks refuse a built-in's searched split: audit 71)
        run_preflight(config, CNNClassifier, DigitsDataModule)
    [problem] = caught.value.problems
    assert problem.field == "data.init_args.test_fraction" and "and test_fraction (0.95) leave no samples" in \
        problem.message, problem


@pytest.mark.parametrize("param,said", [
    ({"type": "float", "low": 8, "high": 32},
     "type: float samples floats such as 8.0, and CNNClassifier's channels takes int: use type: int"),
    ({"type": "categorical", "choices": ["8", "16"]},
     "'8' is a string, and CNNClassifier's channels takes int: write it without quotes"),
])
def test_a_searched_value_of_the_wrong_type_is_named_by_its_space_key(example_config, param, said, tmp_path):
    """Checked against the constructor's annotations, as init_args are: the float reached
    the model and failed there, blamed on model.init_args, shown as channels=8."""
    example_config["space"]["model.channels"] = param
    with pytest.raises(ConfigError) as caught:
        check_components(load_config(write_yaml(tmp_path / "exp.yaml", example_config)))
    [problem] = caught.value.problems
    assert problem.field == "space.model.channels" and said in problem.message, problem


def test_a_searched_value_the_set_up_refuses_by_name_and_value_is_blamed_on_its_space_key(example_config):
    """No annotation to check it by: the DataLoader refuses the float, naming it."""
    from torch.utils.data import DataLoader

    from hpsearch.models.cnn import CNNClassifier
    from hpsearch.models.digits import DigitsDataModule

    class UnannotatedBatchSize(DigitsDataModule):
        def __init__(self, batch_size=32, **kwargs):
            super().__init__(**kwargs)
            self.loader_batch_size = batch_size

        def train_dataloader(self):
            return DataLoader(self._splits["train"], batch_size=self.loader_batch_size)

    example_config["space"]["data.batch_size"] = {"type": "float", "low": 16, "high": 64}
    config = load_config(example_config)
    with pytest.raises(ConfigError) as caught:
        run_preflight(config, CNNClassifier, UnannotatedBatchSize)
    [problem] = caught.value.problems
    assert problem.field == "space.data.batch_size" and "batch_size=16.0" in problem.message, problem


def test_the_searched_values_beside_a_constructors_error_show_a_float_as_a_float(example_config):
    from hpsearch.search.preflight import _searched

    assert _searched(load_config(example_config), {"model.hidden": 16.0, "model.lr": 0.001732051, "data.batch_size": 32, "model.act": "relu"},
                     "model") == ", searched: hidden=16.0, lr=0.00173205, act='relu'"


def test_a_warning_from_building_another_value_names_that_value(example_config):
    import warnings

    from hpsearch.models.cnn import CNNClassifier
    from hpsearch.models.digits import DigitsDataModule

    class WarnsWhenWideOrNarrow(CNNClassifier):
        def __init__(self, channels: int = 16, **kwargs):
            if channels in (8, 32):
                warnings.warn(f"{channels} channels are slow here")
            super().__init__(channels=channels, **kwargs)

    config = load_config(example_config)
    assert config.space["model.channels"].choices == [8, 16, 32]  # 8 is built first
    with pytest.warns(UserWarning) as heard:
        run_preflight(config, WarnsWhenWideOrNarrow, DigitsDataModule)
    said = [str(warning.message) for warning in heard]
    assert "space.model.channels = 32 (a value the search can sample): 32 channels are slow here" in said, said
    assert any(message.startswith("WarnsWhenWideOrNarrow(..., searched: ") and "channels=8" in message
               and message.endswith("): 8 channels are slow here") for message in said), said


def test_a_librarys_own_deprecation_is_not_said_of_the_value_a_class_was_built_with(example_config):
    """torch's first ``torch.compile`` imports parts of torch that warn of their own
    deprecations, and the preflight said one of the value the model compiled with (audit
    63). The class's own deprecations, and any other warning, are still said."""
    import warnings

    import torch

    from hpsearch.models.cnn import CNNClassifier
    from hpsearch.models.digits import DigitsDataModule

    class CompilesWhenWide(CNNClassifier):
        def __init__(self, channels: int = 16, **kwargs):
            if channels == 32:
                warnings.warn_explicit("torch.jit.script_method is deprecated", DeprecationWarning,
                                       str(Path(torch.__file__).parent / "jit" / "_script.py"), 365)
                warnings.warn("channels=32 is deprecated here", DeprecationWarning)
            super().__init__(channels=channels, **kwargs)

    config = load_config(example_config)
    with pytest.warns(UserWarning) as heard:
        run_preflight(config, CompilesWhenWide, DigitsDataModule)
    said = [str(warning.message) for warning in heard]
    assert not any("script_method" in message for message in said), said
    assert "space.model.channels = 32 (a value the search can sample): channels=32 is deprecated here" in said, said


def test_annotations_other_than_plain_values_are_left_to_the_constructor():
    """A constructor annotated with ``Path``, an ``Enum``, ``Sequence[int]`` or a class may
    convert what the file gives (a string, a number) or map a name to a value, as the
    README advises for lists: refusing such values refused configs that work."""
    import enum
    from collections.abc import Sequence
    from pathlib import Path
    from typing import Optional

    import numpy as np

    from hpsearch.search.components import _sampled_wrong_type, _wrong_type
    from hpsearch.search.config import CategoricalParam, FloatParam

    class Net:
        pass

    class Act(str, enum.Enum):
        relu = "relu"

    floats, names = FloatParam(type="float", low=0.5, high=2.0), CategoricalParam(type="categorical",
                                                                                  choices=["wide", "deep"])
    assert _wrong_type(Net, "data_dir", Path, "/data/cache") is None
    assert _wrong_type(Net, "act", Act, "relu") is None
    assert _sampled_wrong_type(Net, "layers", Sequence[int], names) is None
    assert _sampled_wrong_type(Net, "layers", tuple[int, ...], names) is None
    assert _sampled_wrong_type(Net, "dtype", torch.dtype, names) is None
    assert _sampled_wrong_type(Net, "lr", np.float32, floats) is None
    assert _sampled_wrong_type(Net, "lr", Optional[np.float32], floats) is None
    # Plain values are still judged, and named by their full type.
    assert "takes int: use type: int" in _sampled_wrong_type(Net, "hidden", int, floats)
    assert _wrong_type(Net, "hidden", Optional[int], 16.0) == \
        "16.0 is a float, and Net's hidden takes Optional[int]: write 16"
    floats_as_choices = CategoricalParam(type="categorical", choices=[16.0, 32.0])
    assert _sampled_wrong_type(Net, "hidden", int, floats_as_choices) == \
        "16.0 is a float, and Net's hidden takes int: write 16"
    assert _sampled_wrong_type(Net, "hidden", float, CategoricalParam(type="categorical", choices=[16, 32])) is None
    assert _wrong_type(Net, "act", str, "relu") is None
    assert _wrong_type(Net, "tag", str, 3) == "3 is a number, and Net's tag takes str: put it in quotes ('3')"



def test_a_yaml_boolean_where_the_argument_takes_none_is_named():
    """YAML reads off, no, on and yes as booleans: ``augment: off`` for a
    ``Literal["off", "light"]`` passed the check and gave the model False (audit 23)."""
    from typing import Literal, Optional

    from hpsearch.search.components import _sampled_wrong_type, _wrong_type
    from hpsearch.search.config import CategoricalParam

    class Net:
        pass

    said = _wrong_type(Net, "augment", Literal["off", "light"], False)
    assert said.startswith("False is a boolean, and Net's augment takes Literal['off', 'light']") \
        and said.endswith("if you meant the word, put it in quotes"), said
    assert "True is a boolean, and Net's hidden takes int" in _wrong_type(Net, "hidden", int, True)
    assert "False is a boolean, and Net's optimizer takes str" in \
        _sampled_wrong_type(Net, "optimizer", str, CategoricalParam(type="categorical", choices=["adam", False]))
    assert _wrong_type(Net, "shuffle", bool, True) is None
    assert _wrong_type(Net, "shuffle", Optional[bool], False) is None
    assert _wrong_type(Net, "mode", Literal[True, "auto"], True) is None

def test_an_argument_whose_default_is_none_takes_none():
    """``x: int = None`` is common, and Python no longer reads it as Optional[int]."""
    from hpsearch.search.components import _sampled_wrong_type, _type_hints
    from hpsearch.search.config import CategoricalParam

    class Net:
        def __init__(self, width: int = None, depth: int = 2):
            pass

    hints = _type_hints(Net)
    choices = CategoricalParam(type="categorical", choices=[None, 2])
    assert _sampled_wrong_type(Net, "width", hints["width"], choices) is None
    assert "None does not suit Net's depth: int" in _sampled_wrong_type(Net, "depth", hints["depth"], choices)


def test_one_annotation_that_does_not_evaluate_leaves_the_others_checked():
    """A name imported only under TYPE_CHECKING turned the check off for every argument."""
    from hpsearch.search.components import _sampled_wrong_type, _type_hints
    from hpsearch.search.config import FloatParam

    source = (
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING, Optional\n"
        "if TYPE_CHECKING:\n"
        "    from somewhere_else import Thing\n"
        "class Net:\n"
        "    def __init__(self, hidden: Optional[int] = 3, thing: Thing = None, lr: float = 0.1):\n"
        "        pass\n")
    namespace = {"__name__": "user_module"}
    exec(compile(source, "user_module.py", "exec"), namespace)
    net = namespace["Net"]
    hints = _type_hints(net)
    assert set(hints) == {"hidden", "lr"}
    assert "use type: int" in _sampled_wrong_type(net, "hidden", hints["hidden"],
                                                 FloatParam(type="float", low=16, high=64))


def test_a_class_this_machine_cannot_import_is_an_import_error_naming_the_machine(example_config):
    """The driver imported the classes before the search: a worker that cannot has a
    machine at fault, and said "invalid experiment config, 1 problem" on the console."""
    import socket

    from hpsearch.search.trial import load_training_stack

    config = load_config(example_config)
    missing = config.model_copy(update={"data": config.data.model_copy(update={"class_path": "nosuchpkg.data:Data"})})
    with pytest.raises(ImportError) as caught:
        load_training_stack(missing)
    assert str(caught.value).startswith(f"on {socket.gethostname()}: data.class_path: cannot import module "
                                        f"'nosuchpkg.data'"), caught.value


def test_the_line_named_for_a_failure_is_the_users_not_a_frozen_standard_modules():
    """A hook reading a variable the preflight does not set failed 'at <frozen os>:679 in
    __getitem__', the lookup inside os.environ, not the user's line."""
    import os

    from hpsearch.search.components import raised_at

    def on_fit_start():
        return os.environ["HPSEARCH_NO_SUCH_VARIABLE_X7"]

    try:
        on_fit_start()
    except KeyError as exc:
        assert raised_at(exc).startswith(f"{__file__}:") and raised_at(exc).endswith(" in on_fit_start")
    else:
        raise AssertionError("the variable exists")


def test_the_driver_leaves_lightnings_loggers_and_the_warning_filters_as_it_found_them(example_config, tmp_path):
    """The driver may be the user's own Python session: after ``check`` (the preflight, as
    ``run`` and ``resume`` run it) Lightning's loggers stayed at ERROR and six warning
    filters stayed, and the user's own Trainers said nothing of their devices or their end
    (audit 25). The test evaluation quiets Lightning the same way."""
    import logging
    import warnings

    import hpsearch
    from hpsearch.search.lightning_trainer import LIGHTNING_LOGGERS, LIGHTNING_NOISE, lightning_quieted

    def hpsearchs_filters() -> list:  # (the first imports of Ray and torch add filters of their own)
        return [f for f in warnings.filters if f[1] is not None and f[1].pattern in LIGHTNING_NOISE]

    example_config["storage"] = str(tmp_path / "runs")
    levels = {name: logging.getLogger(name).level for name in LIGHTNING_LOGGERS}
    filters = hpsearchs_filters()
    hpsearch.check(example_config)
    assert {name: logging.getLogger(name).level for name in LIGHTNING_LOGGERS} == levels
    assert hpsearchs_filters() == filters
    with lightning_quieted():
        assert logging.getLogger("pytorch_lightning").level == logging.ERROR
    assert logging.getLogger("pytorch_lightning").level == levels["pytorch_lightning"]


def test_what_a_trial_prints_is_copied_to_its_output_log_and_the_streams_are_given_back(tmp_path, capsys,
                                                                                        monkeypatch):
    """Where the streams are not the descriptors (pytest's capsys here), Python's are copied."""
    import sys

    from hpsearch.search.trial_output import output_kept

    before = sys.stdout, sys.stderr
    with output_kept(tmp_path / "trials" / "trial_0000"):  # made at the first write
        print("to stdout")
        print("to stderr", file=sys.stderr)
    assert (sys.stdout, sys.stderr) == before
    assert (tmp_path / "trials" / "trial_0000" / "output.log").read_text().splitlines() == ["to stdout", "to stderr"]
    shown = capsys.readouterr()
    assert (shown.out, shown.err) == ("to stdout\n", "to stderr\n")  # still where it went before
    (tmp_path / "a-file").write_text("")
    with output_kept(tmp_path / "a-file" / "trial_0001"):  # cannot be written: the print still works
        print("only here")
    assert capsys.readouterr().out == "only here\n"
    with output_kept(tmp_path / "trial_0002"):
        pass
    assert not (tmp_path / "trial_0002").exists()  # a trial that prints nothing leaves no file
    # A handler made in the trial keeps its stream past it: it writes on, to the stream only
    # ("--- Logging error --- ValueError: I/O operation on closed file" at every record after).
    with output_kept(tmp_path / "trial_0003"):
        kept_stream = sys.stderr
        print("in the trial", file=kept_stream)
    print("after it", file=kept_stream)
    assert (tmp_path / "trial_0003" / "output.log").read_text() == "in the trial\n"
    assert capsys.readouterr().err == "in the trial\nafter it\n"
    # a process started without a standard stream (sys.stderr is None) keeps it so: code that
    # checks for it (as logging's last resort does) writes nothing, and raised nothing before
    monkeypatch.setattr(sys, "stderr", None)
    with output_kept(tmp_path / "trial_0004"):
        assert sys.stderr is None
        print("to stdout")
    assert sys.stderr is None and capsys.readouterr().out == "to stdout\n"
    assert (tmp_path / "trial_0004" / "output.log").read_text() == "to stdout\n"


_WRITES_AT_EVERY_LEVEL = """
import os, signal, subprocess, sys, threading, warnings
from pathlib import Path
from hpsearch.search.trial_output import output_kept

trial_dir = Path(sys.argv[1])
with output_kept(trial_dir / "trial_0000"):
    print("a print")
    warnings.warn("a warning")
    os.write(1, b"below Python, to stdout\\n")
    os.write(2, b"below Python, to stderr\\n")
    subprocess.run(["sh", "-c", "echo from a child process"], check=True)
    # a process the trial starts that outlives it (torch's shared-memory manager, a
    # tracker's service) holds the pipe, and writes after the trial has ended
    outlives = subprocess.Popen(["sh", "-c", "read line; echo from a process that outlived the trial"],
                                stdin=subprocess.PIPE)
print("after the trial", flush=True)
outlives.communicate(b"go\\n")
for thread in threading.enumerate():
    if thread.name == "hpsearch-output-copier":
        thread.join(timeout=30)
children = [int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]) == os.getpid()
            for pid in os.listdir("/proc") if pid.isdigit() and os.path.exists(f"/proc/{pid}/stat")]
print(f"children left: {sum(children)}", flush=True)
with output_kept(trial_dir / "trial_0001"):
    pass
# Ray's worker has other threads: one that holds the GIL as a trial's block ends (audit 33's review)
busy = True


def spin():
    while busy:
        pass


threading.Thread(target=spin, daemon=True).start()
for number in range(3, 43):
    (trial_dir / f"trial_{number:04d}").mkdir()
    with output_kept(trial_dir / f"trial_{number:04d}"):
        os.write(1, f"trial {number}\\n".encode())
busy = False
# a worker's descriptors numbered past select()'s 1024 (audit 33's review)
import resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if soft < 1200:
    resource.setrlimit(resource.RLIMIT_NOFILE, (1200, hard))
many = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
(trial_dir / "trial_0043").mkdir()
with output_kept(trial_dir / "trial_0043"):
    print("past 1024", flush=True)
for descriptor in many:
    os.close(descriptor)
with output_kept(trial_dir / "trial_0002"):
    print("then killed", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_trials_output_is_copied_at_its_descriptors_and_survives_a_kill(tmp_path):
    """What a C library, a CUDA kernel's assert or a child process writes reaches the
    trial's output.log too, in the order written, as does what was written just before the
    process was killed; the descriptors go back as they were after the trial, whose copier
    ends though a process it started holds the pipe."""
    for number in range(3):
        (tmp_path / f"trial_000{number}").mkdir()
    ran = subprocess.run([sys.executable, "-c", _WRITES_AT_EVERY_LEVEL, str(tmp_path)], capture_output=True,
                         text=True, timeout=60)
    assert ran.returncode == -9, ran.stderr
    kept = (tmp_path / "trial_0000" / "output.log").read_text().splitlines()
    assert kept[0] == "a print" and "UserWarning: a warning" in kept[1], kept
    assert kept[-3:] == ["below Python, to stdout", "below Python, to stderr", "from a child process"], kept
    # While the trial ran, both streams went where its standard output went; then as before.
    # What a process it started writes after its end goes there too, not into a broken
    # pipe, and not into the trial's file; that process gone, no copier is left.
    assert ran.stdout.splitlines() == kept + ["after the trial", "from a process that outlived the trial",
                                              "children left: 0"] + [f"trial {n}" for n in range(3, 43)] + \
        ["past 1024", "then killed"], ran.stdout
    assert ran.stderr == ""
    assert not (tmp_path / "trial_0001" / "output.log").exists()  # a trial that prints nothing leaves no file
    assert [(tmp_path / f"trial_{n:04d}" / "output.log").read_text() for n in range(3, 43)] == \
        [f"trial {n}\n" for n in range(3, 43)]
    assert (tmp_path / "trial_0043" / "output.log").read_text() == "past 1024\n"
    assert (tmp_path / "trial_0002" / "output.log").read_text() == "then killed\n"


def test_ray_tunes_list_of_trials_that_did_not_complete_stays_off_the_console():
    """When a trial ends in Tune's ERROR state (one whose worker could not import its
    function, say), Tune logs an ERROR line listing its trial objects; hpsearch's display
    has named each failed trial already (audit 32)."""
    import inspect
    import logging

    import ray.tune.tune as tune_module

    from hpsearch.search.tuner import TUNE_INCOMPLETE_NOTICE, _message_dropped

    logger_name, text = TUNE_INCOMPLETE_NOTICE
    assert tune_module.logger.name == logger_name and f'logger.error("{text}: %s"' in inspect.getsource(tune_module)
    logger, shown = logging.getLogger(logger_name), []
    handler = logging.Handler()
    handler.emit = lambda record: shown.append(record.getMessage())  # what any of the logger's handlers would get
    logger.addHandler(handler)
    level, disabled = logger.level, logger.disabled  # (as other tests in this process may have left them)
    logger.setLevel(logging.ERROR)
    logger.disabled = False
    try:
        with _message_dropped(TUNE_INCOMPLETE_NOTICE, True):
            logger.error("Trials did not complete: %s", ["train_trial_a1b2c3"])
            logger.error("another error")
        logger.error("Trials did not complete: %s", ["outside"])
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.disabled = disabled
    assert shown == ["another error", "Trials did not complete: ['outside']"], shown


@pytest.mark.parametrize("verbose", [False, True])
def test_rays_unhandled_trial_errors_stay_off_the_console_during_a_search(monkeypatch, verbose):
    """A session stopped as a trial's try failed (failures in a row) left Ray to log that
    try's error, unfetched, with its whole traceback: about 80 lines on a console where a
    failure is one line (audit 56). Inside a search they are dropped unless ``-v``; Ray's
    own handler is what logs them, and after the search it logs again."""
    import logging

    import ray._private.worker as ray_worker

    from hpsearch.search import tuner

    logger, shown = logging.getLogger(tuner.RAY_UNHANDLED_ERROR_NOTICE[0]), []
    assert ray_worker.logger is logger
    handler = logging.Handler()
    handler.emit = lambda record: shown.append(record.getMessage())
    logger.addHandler(handler)
    level, disabled = logger.level, logger.disabled
    logger.setLevel(logging.INFO)
    logger.disabled = False
    monkeypatch.setattr(tuner, "start_ray", lambda config, address, verbose: tuner.SearchRay(started=False))
    try:
        with tuner.ray_for_search(None, None, verbose=verbose):
            ray_worker._unhandled_error_handler(RuntimeError("flaky fault"))
            logger.error("another error")
        ray_worker._unhandled_error_handler(RuntimeError("after the search"))
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.disabled = disabled
    during = [line for line in shown[:-1] if "flaky fault" in line]
    assert len(during) == (1 if verbose else 0) and "another error" in shown, shown
    assert "Unhandled error" in shown[-1] and "after the search" in shown[-1], shown


def test_tunes_log_of_a_full_disk_met_as_a_trial_ended_stays_off_the_console():
    """A full disk met by the trials table's write as a trial ended: Ray Tune logged
    "Error stopping trial" with 40 lines of traceback, then the search stopped at its next
    write with hpsearch's own message (audit 55). Its other errors there stay shown."""
    import logging
    import sys

    from hpsearch.search.errors import DiskFullError
    from hpsearch.search.trial_faults import TRIAL_TRACEBACKS

    def record(error: Exception) -> logging.LogRecord:
        try:
            raise error
        except Exception:
            return logging.LogRecord("ray.tune.execution.tune_controller", logging.ERROR, __file__, 1,
                                     "Trial %s: Error stopping trial.", ("t",), sys.exc_info())

    assert not TRIAL_TRACEBACKS.filter(record(DiskFullError("disk full while writing trials.csv")))
    assert TRIAL_TRACEBACKS.filter(record(RuntimeError("a callback's own bug")))


def test_a_full_disk_anywhere_in_a_trial_pauses_it_and_a_handled_one_does_not():
    """Met in a trial's set-up (its folder, its settings file), a full disk was retried,
    then FAILED for good (audit 59). An error the user's code raised while handling an
    ENOSPC of its own is that error: it paused its trial at every resume (audit 59)."""
    import errno

    from hpsearch.search import trial
    from hpsearch.search.errors import DiskFullError
    from hpsearch.search.outcome import DISK_FULL, TRIAL_NUMBER

    def full() -> OSError:
        return OSError(errno.ENOSPC, "No space left on device", "trials/trial_0003")

    def handled_then_own_error():
        try:
            raise full()
        except OSError:
            raise ValueError("lr too high for this width")

    def written_over_a_full_disk():
        try:
            raise full()
        except OSError as exc:
            raise DiskFullError("disk full while writing experiment.json") from exc

    for fault, pauses in ((lambda: (_ for _ in ()).throw(full()), True), (written_over_a_full_disk, True),
                          (handled_then_own_error, False)):
        reports = []
        original = trial._fit_trial
        trial._fit_trial = lambda *args, **kwargs: fault()
        try:
            if pauses:
                trial.fit_trial({TRIAL_NUMBER: 3}, {}, "/study", report=reports.append)
                assert reports and reports[0][TRIAL_NUMBER] == 3 and reports[0][DISK_FULL].startswith("disk full: ")
            else:
                with pytest.raises(ValueError):
                    trial.fit_trial({TRIAL_NUMBER: 3}, {}, "/study", report=reports.append)
                assert reports == []
        finally:
            trial._fit_trial = original
    # a rank of a distributed trial reports it too: its report raises it (distributed.RankEndedTrial),
    # which ends the other ranks as well (audit 60 retried it instead; audit 61)
    original = trial._fit_trial
    trial._fit_trial = lambda *args, **kwargs: (_ for _ in ()).throw(full())
    reports = []
    try:
        trial.fit_trial({TRIAL_NUMBER: 3}, {}, "/study", report=reports.append, parallel=trial.Parallelism(2))
    finally:
        trial._fit_trial = original
    assert [report[DISK_FULL][:10] for report in reports] == ["disk full:"]


def test_a_traceback_that_meets_a_full_disk_leaves_the_earlier_one_whole(tmp_path, monkeypatch):
    """It left error.txt empty, the earlier try's traceback gone (audit 59)."""
    import errno

    from hpsearch.search import experiment, trial

    (tmp_path / "error.txt").write_text("the earlier try's traceback")

    def no_room(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(experiment.os, "fsync", no_room)
    assert trial._save_traceback(RuntimeError("this try"), tmp_path, None) is None
    assert (tmp_path / "error.txt").read_text() == "the earlier try's traceback"
