"""What a trial reports about its own speed: time waiting on data, and the data-starved flag."""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import time
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

from conftest import manually_optimized
from hpsearch.models.mlp import MLPClassifier
from hpsearch.models.synthetic import SyntheticImagesDataModule

BATCHES = 6  # training batches per epoch (48 samples of 8)


class SlowItems(torch.utils.data.Dataset):
    """A dataset whose items take ``seconds`` each to load: a loader that starves training."""

    def __init__(self, dataset, seconds: float) -> None:
        self.dataset, self.seconds = dataset, seconds

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        if self.seconds:
            time.sleep(self.seconds)
        return self.dataset[index]


class SlowLoadingData(SyntheticImagesDataModule):
    def __init__(self, item_seconds: float) -> None:
        super().__init__(num_samples=80, image_size=4, channels=1, batch_size=8, val_fraction=0.2,
                         test_fraction=0.2)
        self.item_seconds = item_seconds

    def setup(self, stage=None):
        super().setup(stage)
        if not isinstance(self._splits["train"], SlowItems):
            self._splits["train"] = SlowItems(self._splits["train"], self.item_seconds)


class SlowBetweenSteps(MLPClassifier):
    """Steps of 10 ms, and 20 ms of work after every step that is not data loading (as a
    heavy logging hook would be)."""

    def training_step(self, batch, batch_idx):
        time.sleep(0.01)
        return super().training_step(batch, batch_idx)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        time.sleep(0.02)


class BusySteps(MLPClassifier):
    """Steps that each burn 20 ms of this process's CPU."""

    def training_step(self, batch, batch_idx):
        until = time.process_time() + 0.02
        while time.process_time() < until:
            pass
        return super().training_step(batch, batch_idx)


class SlowEpochEnd(MLPClassifier):
    """0.4 s of the model's own work at each epoch's end (an EMA update, epoch metrics)."""

    def on_train_epoch_end(self):
        time.sleep(0.4)


def reports_of(tmp_path, model, datamodule, epochs: int = 2, metric: str = "val_acc", resume_from=None,
               reports_expected: int | None = None, patience: int | None = 10, known_epochs: int = 0,
               logger_resumed_at=None, static_fields: dict | None = None, **reporter_options) -> list[dict]:
    from hpsearch.search.checkpoints import resumed_at
    from hpsearch.search.config import LoaderConfig, ResourcesConfig, TrainerConfig
    from hpsearch.search.devices import trial_device
    from hpsearch.search.lightning_trainer import build_trainer
    from hpsearch.search.reporting import TuneReporter
    from hpsearch.search.trial_logger import after_earlier_event_files

    if resume_from is not None:  # as a trial resumes (trial.py)
        after_earlier_event_files(tmp_path / "tb" / "run")
    reports: list[dict] = []
    reporter = TuneReporter(metric, "max", epochs, report=reports.append, static_fields=static_fields or {},
                            known_epochs=known_epochs, **reporter_options)
    settings = TrainerConfig(early_stopping_patience=patience)
    device = trial_device(settings, LoaderConfig(), ResourcesConfig())
    trainer = build_trainer(settings, device=device, metric=metric, mode="max", max_epochs=epochs,
                            trial_dir=tmp_path / "trial", tensorboard_run=tmp_path / "tb" / "run",
                            callbacks=[reporter], profiler=reporter.phase_timer,
                            resumed_at=logger_resumed_at or (resumed_at(Path(resume_from)) if resume_from else None))
    trainer.fit(model, datamodule=datamodule, ckpt_path=resume_from)
    reporter.send_final(trainer)
    assert len(reports) == (epochs if reports_expected is None else reports_expected)
    return reports


class LogsEachStep(MLPClassifier):
    """Logs a value in training_step with Lightning's default there (every step, not the
    epoch's mean), as most models log their training loss."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("step_loss", loss)
        return loss


def test_a_metric_logged_at_steps_has_a_point_every_epoch_when_epochs_are_short(tmp_path):
    """Lightning writes such values every 10 steps: a trial of 6 batches an epoch had a
    point at step 10 only, and one pruned after its first epoch none at all."""
    from conftest import tensorboard_scalars

    data = SlowLoadingData(item_seconds=0.0)  # 6 training batches an epoch
    reports_of(tmp_path, mlp_for(data, LogsEachStep), data, epochs=2)
    assert len(tensorboard_scalars(tmp_path / "tb" / "run" / "steps")["step_loss"]) == 2


def test_epoch_metrics_are_stepped_by_the_epoch_and_step_metrics_by_the_batch(tmp_path):
    """Lightning stepped every scalar by the batches trained: with a searched batch size
    the same epoch of two trials fell at steps far apart, and TensorBoard drew their
    curves apart. What is logged once an epoch now sits at the epoch's number; what is
    logged at steps goes to the trial's steps run, at the batch count."""
    from conftest import tensorboard_scalars

    data = SlowLoadingData(item_seconds=0.0)  # 6 training batches an epoch
    reports = reports_of(tmp_path, mlp_for(data, LogsEachStep), data, epochs=3)
    epochs = tensorboard_scalars(tmp_path / "tb" / "run")
    learning_rate = next(tag for tag in epochs if tag.startswith("lr-"))
    for tag in ("val_acc", "val_loss", "train_loss", "hp/val_acc", "speed/epoch_time_s", learning_rate):
        assert epochs[tag] == [1, 2, 3], (tag, epochs)
    assert "step_loss" not in epochs and "epoch" not in epochs, epochs  # (the x-axis is the epoch)
    steps = tensorboard_scalars(tmp_path / "tb" / "run" / "steps")
    assert set(steps) == {"step_loss", "epoch"}, steps  # Lightning's epoch of each step, kept there
    assert len(steps["step_loss"]) == 3 and steps["step_loss"] == sorted(steps["step_loss"]), steps
    assert max(steps["step_loss"]) > 3 * BATCHES // 2, steps  # batches trained, not epochs
    # The HParams column of a metric logged at steps is read from the steps run.
    assert [r["hps_step_metrics"] for r in reports] == ["step_loss"] * 3, reports

    # A resume from the second epoch's checkpoint redoes the third: each run hides what
    # the first attempt wrote from there on, so every curve keeps one point per step.
    second = tmp_path / "trial" / "checkpoints" / "epoch-0001.ckpt"
    resumed = reports_of(tmp_path, mlp_for(data, LogsEachStep), data, epochs=3, resume_from=str(second),
                         reports_expected=3)  # the two epochs its checkpoint holds, again, and the third
    assert [r["epoch"] for r in resumed] == [1, 2, 3], resumed
    epochs_now = tensorboard_scalars(tmp_path / "tb" / "run")
    for tag in ("val_acc", "val_loss", "train_loss", "hp/val_acc", "speed/epoch_time_s", learning_rate):
        assert epochs_now[tag] == [1, 2, 3], (tag, epochs_now)
    steps_now = tensorboard_scalars(tmp_path / "tb" / "run" / "steps")["step_loss"]
    assert steps_now == steps["step_loss"], steps_now


def test_a_models_own_hparams_record_leaves_the_trials_record_its_place(tmp_path):
    """Lightning's docs have a model call ``self.logger.log_hyperparams(self.hparams,
    {"hp/x": 0})`` in ``on_train_start``: its HParams record sorted before the one hpsearch
    writes at the trial's end, and TensorBoard, which shows a run's first, lost the trial's
    values, state and epochs (audit 63). Its values and metrics are still kept."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from conftest import tensorboard_scalars
    from hpsearch.search.trial_logger import TrialLogger

    logger = TrialLogger(tmp_path / "run")
    logger.log_hyperparams({"hidden": 16, "lr": 0.1}, {"hp/custom": 0.5})
    logger.save()
    logger.finalize("success")
    accumulator = EventAccumulator(str(tmp_path / "run"))
    accumulator.Reload()
    with pytest.raises(KeyError):  # no HParams record at all
        accumulator.PluginTagToContent("hparams")
    assert "hp/custom" in tensorboard_scalars(tmp_path / "run")
    assert dict(logger.hparams) == {"hidden": 16, "lr": 0.1} and (tmp_path / "run" / "hparams.yaml").is_file()


class MonitorsItsLearningRate(MLPClassifier):
    def __init__(self, interval: str, **kwargs):
        super().__init__(**kwargs)
        self.interval = interval

    def configure_callbacks(self):
        from pytorch_lightning.callbacks import LearningRateMonitor

        return [LearningRateMonitor(logging_interval=self.interval)]


@pytest.mark.parametrize("interval", ["step", "epoch", None])
def test_a_models_own_learning_rate_monitor_runs_beside_the_trials(tmp_path, interval):
    """Lightning drops a Trainer callback of the class a model's configure_callbacks returns:
    the trial's run had no learning rate at its epochs, an HParams column (audit 63). One
    that logs at epochs itself had each epoch's twice (audit 65)."""
    from conftest import tensorboard_scalars

    data = SlowLoadingData(item_seconds=0.0)
    model = MonitorsItsLearningRate(interval, input_shape=data.input_shape, num_classes=data.num_classes)
    reports_of(tmp_path, model, data, epochs=2)
    epochs = tensorboard_scalars(tmp_path / "tb" / "run")
    assert [steps for tag, steps in epochs.items() if tag.startswith("lr-")] == [[1, 2]], epochs
    steps = tmp_path / "tb" / "run" / "steps"  # made only for a model that logs at steps
    at_steps = tensorboard_scalars(steps) if steps.is_dir() else {}
    assert any(tag.startswith("lr-") for tag in at_steps) == (interval != "epoch"), at_steps  # the model's


def test_an_attempt_that_starts_over_hides_what_the_attempts_before_it_wrote(tmp_path):
    """A trial retried, or resumed, without a checkpoint (its attempt failed or was stopped
    in the first epoch) starts over: every point of the attempt before it was there twice,
    steps [9, 9, 19, ...] (audit 22)."""
    from conftest import tensorboard_scalars

    data = SlowLoadingData(item_seconds=0.0)  # 6 training batches an epoch
    for _ in range(2):  # the second attempt finds no checkpoint of the first to resume from
        shutil.rmtree(tmp_path / "trial", ignore_errors=True)
        reports_of(tmp_path, mlp_for(data, LogsEachStep), data, epochs=2)
    epochs = tensorboard_scalars(tmp_path / "tb" / "run")
    learning_rate = next(tag for tag in epochs if tag.startswith("lr-"))
    for tag in ("val_acc", "train_loss", "hp/val_acc", "speed/epoch_time_s", learning_rate):
        assert epochs[tag] == [1, 2], (tag, epochs)
    steps = tensorboard_scalars(tmp_path / "tb" / "run" / "steps")["step_loss"]
    assert len(steps) == 2 and steps == sorted(set(steps)), steps


def test_a_trial_checkpointed_when_runs_were_stepped_by_the_batch_resumes_stepping_its_run_so(tmp_path):
    """Its earlier attempts' events are at batch steps: stepped by the epoch from its
    resume on, it would hide them (the purge step counts epochs) and put the rest of its
    curve at steps before them."""
    from conftest import tensorboard_scalars
    from hpsearch.search.checkpoints import ResumedAt

    data = SlowLoadingData(item_seconds=0.0)  # 6 training batches an epoch
    # an attempt of that time: everything at batch steps, no mark in its checkpoints
    reports_of(tmp_path, mlp_for(data, LogsEachStep), data, epochs=2,
               logger_resumed_at=ResumedAt(epoch=1, batch=0, by_epoch=False))
    before = tensorboard_scalars(tmp_path / "tb" / "run")
    second = tmp_path / "trial" / "checkpoints" / "epoch-0001.ckpt"
    reports_of(tmp_path, mlp_for(data, LogsEachStep), data, epochs=3, resume_from=str(second), reports_expected=3)
    after = tensorboard_scalars(tmp_path / "tb" / "run")
    assert not (tmp_path / "tb" / "run" / "steps").exists()
    for tag in ("val_acc", "hp/val_acc", "speed/epoch_time_s", "step_loss"):
        assert len(after[tag]) == len(before[tag]) + 1 and after[tag][:-1] == before[tag], (tag, before, after)
        assert after[tag] == sorted(set(after[tag])) and after[tag][-1] > 2 * BATCHES, (tag, after)
    assert after["hp/val_acc"] == after["val_acc"], after


def mlp_for(datamodule, model_class=MLPClassifier):
    return model_class(input_shape=datamodule.input_shape, num_classes=datamodule.num_classes)


def test_a_loader_slower_than_training_is_flagged_as_data_starved(tmp_path):
    # 240 ms a batch against a step of a few ms. With 80 ms, two CPU hogs beside the test
    # slowed the steps past 180 ms each, and the trial was rightly no longer starved.
    data = SlowLoadingData(item_seconds=0.03)
    for report in reports_of(tmp_path, mlp_for(data), data):
        assert report["hps_data_starved"] is True, report
        # every batch's loading counts as waiting
        assert BATCHES * 8 * 0.03 <= report["hps_data_wait_s"] < report["hps_epoch_time_s"]
        # ... and in the samples/s the trial trained at (it counted only the steps: 40x too high)
        busy = report["hps_train_time_s"] + report["hps_data_wait_s"]
        assert report["hps_samples_per_s"] == pytest.approx(BATCHES * 8 / busy), report
        # asleep in the loader, the trial process used little CPU
        assert report["hps_epoch_cpu_s"] < 0.5 * report["hps_epoch_time_s"], report


def test_a_tiny_epochs_short_wait_on_data_is_not_flagged(tmp_path):
    # 8 ms a batch against a step of a few ms: most of the training time, and 50 ms in all,
    # in an epoch of a tenth of a second (audit 31: flagged, and noise)
    data = SlowLoadingData(item_seconds=0.001)
    for report in reports_of(tmp_path, mlp_for(data), data):
        assert report["hps_data_wait_s"] < 0.1 and report["hps_data_starved"] is False, report


class StartsSlowly(SlowLoadingData):
    """Instant batches from a loader that takes 0.3 s to start each epoch's iteration, as
    starting loader workers does."""

    def train_dataloader(self):
        loader = super().train_dataloader()

        class Starting:
            def __len__(self):
                return len(loader)

            def __iter__(self):
                time.sleep(0.3)
                yield from loader

        return Starting()


def test_a_loaders_start_alone_is_waiting_on_data_but_not_starving(tmp_path):
    """The first batch of a trial's first epoch holds the start of its loader workers: 0.2 s
    of it flagged a one-epoch trial of instant data as data-starved (audit 35)."""
    data = StartsSlowly(item_seconds=0.0)
    for report in reports_of(tmp_path, mlp_for(data), data):
        assert report["hps_data_wait_s"] >= 0.3, report  # it was waited for, and is said so
        assert report["hps_data_starved"] is False, report


class StartsEagerly:
    """A loader whose iteration takes ``seconds`` to start before any batch is asked for,
    as a DataLoader's does when its workers do not persist (``persistent_workers: false``):
    a new set of worker processes at each ``iter()``."""

    def __init__(self, loader, seconds: float) -> None:
        self.loader, self.seconds = loader, seconds

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        time.sleep(self.seconds)
        return iter(self.loader)


class TrainingLoaderStartsEagerly(SlowLoadingData):
    def train_dataloader(self):
        return StartsEagerly(super().train_dataloader(), 0.3)


class ValidationLoaderStartsEagerly(SlowLoadingData):
    def val_dataloader(self):
        return StartsEagerly(super().val_dataloader(), 0.3)


def phases_s(report: dict) -> float:
    return sum(report[f"hps_{phase}_s"] for phase in ("train_time", "val_time", "data_wait", "checkpoint"))


def test_a_training_loaders_start_at_each_epoch_is_waiting_on_data(tmp_path):
    # Lightning starts it before the epoch's first fetch, outside the DataLoader's next():
    # it was in no phase (audit 68: 0.1-0.28 s an epoch with persistent_workers: false).
    data = TrainingLoaderStartsEagerly(item_seconds=0.0)
    reports = reports_of(tmp_path, mlp_for(data), data, epochs=3)
    for report in reports[1:]:  # the first epoch's started with the fit: the trial's start-up
        assert report["hps_data_wait_s"] >= 0.3 and report["hps_data_starved"] is False, report
        assert phases_s(report) <= report["hps_epoch_time_s"], report


def test_a_validation_loaders_start_is_validation_time(tmp_path):
    # Lightning starts it before any validation hook runs: it was in no phase (audit 68).
    data = ValidationLoaderStartsEagerly(item_seconds=0.0)
    for report in reports_of(tmp_path, mlp_for(data), data, epochs=2):
        assert report["hps_val_time_s"] >= 0.3, report
        assert phases_s(report) <= report["hps_epoch_time_s"], report


class SlowValidationEnd(MLPClassifier):
    """0.3 s of the model's own work after each validation (as a plot written there)."""

    def on_validation_end(self):
        time.sleep(0.3)


class SlowCheckpointAtEpochEnd(pl.callbacks.ModelCheckpoint):
    def on_train_epoch_end(self, trainer, pl_module):
        time.sleep(0.3)
        super().on_train_epoch_end(trainer, pl_module)


class WritesItsOwnCheckpointAtEpochEnd(MLPClassifier):
    def configure_callbacks(self):
        return [SlowCheckpointAtEpochEnd(save_on_train_epoch_end=True)]


def test_checkpoint_time_is_the_checkpoint_callbacks_and_not_the_models_own_hooks(tmp_path):
    # It ran from hpsearch's on_validation_end to its on_train_epoch_end: the model's own
    # on_validation_end was in it, and a checkpoint written at the epoch's end was not.
    data = SlowLoadingData(item_seconds=0.0)
    for report in reports_of(tmp_path, mlp_for(data, SlowValidationEnd), data, epochs=2):
        assert report["hps_checkpoint_s"] < 0.2 and report["hps_epoch_time_s"] >= 0.3, report
    for report in reports_of(tmp_path / "own", mlp_for(data, WritesItsOwnCheckpointAtEpochEnd), data, epochs=2):
        assert report["hps_checkpoint_s"] >= 0.3, report
        assert phases_s(report) <= report["hps_epoch_time_s"], report


def test_storing_an_epochs_checkpoints_is_its_checkpoint_time_and_its_events_its_reports(tmp_path):
    # With URI storage the upload ran after the epoch's time was taken and before the
    # report's: in no phase, and longer than the epoch itself with S3 (audit 68).
    data = SlowLoadingData(item_seconds=0.0)
    stored: list[str] = []

    def store(what: str, seconds: float):
        return lambda: (stored.append(what), time.sleep(seconds))

    reports = reports_of(tmp_path, mlp_for(data), data, epochs=2, store_epoch_files=store("files", 0.3),
                         store_epoch_events=store("events", 0.2))
    assert stored == ["files", "events"] * 2  # each epoch's, before its report
    for report in reports:
        assert report["hps_checkpoint_s"] >= 0.3 and phases_s(report) <= report["hps_epoch_time_s"], report
    assert reports[1]["hps_report_s"] >= 0.2, reports[1]  # the report of the epoch before it


class TwoTrainingLoaders(SlowLoadingData):
    def train_dataloader(self):
        return {"a": super().train_dataloader(), "b": super().train_dataloader()}


class TrainsOnEachLoader(MLPClassifier):
    def training_step(self, batch, batch_idx):
        return sum(super(TrainsOnEachLoader, self).training_step(part, batch_idx) for part in batch.values())


@pytest.mark.parametrize("loaders", [TwoTrainingLoaders, SlowLoadingData])
def test_samples_per_s_counts_every_training_loaders_batch(tmp_path, loaders):
    # With a mapping of loaders, each step holds one batch of each: it counted the first only.
    data = loaders(item_seconds=0.0)
    model = mlp_for(data, TrainsOnEachLoader if loaders is TwoTrainingLoaders else MLPClassifier)
    for report in reports_of(tmp_path, model, data):
        busy = report["hps_train_time_s"] + report["hps_data_wait_s"]
        samples = BATCHES * 8 * (2 if loaders is TwoTrainingLoaders else 1)
        assert report["hps_samples_per_s"] == pytest.approx(samples / busy), report


@dataclasses.dataclass
class NamedBatch:
    ids: list
    images: torch.Tensor
    labels: torch.Tensor


class DataclassBatches(SlowLoadingData):
    """Batches as a dataclass whose first field holds the samples' ids."""

    def train_dataloader(self):
        def collate(items):
            images, labels = torch.utils.data.default_collate(items)
            return NamedBatch([f"id{n}" for n in range(len(labels))], images, labels)
        return torch.utils.data.DataLoader(self._splits["train"], batch_size=8, collate_fn=collate)


class TrainsOnNamedBatches(MLPClassifier):
    def training_step(self, batch, batch_idx):
        return super().training_step((batch.images, batch.labels), batch_idx)


def test_samples_per_s_counts_a_dataclass_batchs_samples(tmp_path):
    """A dataclass batch (or a mapping whose first value holds names) counted 0 samples: the
    first tensor's length was taken, and it found none (audit 77)."""
    data = DataclassBatches(item_seconds=0.0)
    for report in reports_of(tmp_path, mlp_for(data, TrainsOnNamedBatches), data):
        busy = report["hps_train_time_s"] + report["hps_data_wait_s"]
        assert report["hps_samples_per_s"] == pytest.approx(BATCHES * 8 / busy), report


def test_a_batchs_size_is_what_every_part_with_a_length_agrees_on_else_unknown():
    """The first tensor's length was taken: a graph's edge count, 0 for a dataclass or a
    mapping whose first value held names (audit 77)."""
    from torch.utils.data import DataLoader

    from hpsearch.search.reporting import _batch_size, _fixed_batches

    assert _batch_size({"names": ["a", "b", "c"], "x": torch.zeros(3, 5), "y": torch.zeros(3)}) == 3
    assert _batch_size(NamedBatch(["a", "b"], torch.zeros(2, 4), torch.zeros(2))) == 2
    assert _batch_size({"edge_index": torch.zeros(2, 40), "x": torch.zeros(16, 8), "y": torch.zeros(4)}) is None
    assert _batch_size([torch.zeros(5), torch.zeros(7)]) is None and _batch_size({"meta": "text"}) is None
    # a loader that batches by a fixed size tells each batch's size, whatever it holds: the last one short
    assert _fixed_batches(DataLoader(range(10), batch_size=4)) == (4, 10)
    assert _fixed_batches(DataLoader(range(10), batch_sampler=[[0, 1], [2, 3, 4]])) is None


class LengthUnknown(torch.utils.data.Sampler):
    """A sampler that cannot tell its length, as torch's base class once said and user samplers still do."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __iter__(self):
        return iter(range(self.count))

    def __len__(self):
        raise NotImplementedError


def test_a_loader_whose_sampler_cannot_tell_its_length_is_measured_batch_by_batch_and_not_refused():
    """Lightning takes a NotImplementedError from ``len`` as no length; the preflight's count
    of batches raised it, refusing a loader the trials train with (audit 79)."""
    from torch.utils.data import DataLoader

    from hpsearch.search.preflight import _length
    from hpsearch.search.reporting import _fixed_batches

    loader = DataLoader(range(10), batch_size=4, sampler=LengthUnknown(10))
    assert _fixed_batches(loader) is None and _length(loader) is None


def test_work_between_steps_is_not_counted_as_waiting_on_data(tmp_path):
    data = SlowLoadingData(item_seconds=0.0)
    for report in reports_of(tmp_path, mlp_for(data, SlowBetweenSteps), data):
        assert report["hps_data_starved"] is False, report
        # 6 x 20 ms of the model's own hooks ran between steps: none of it is data wait
        assert report["hps_epoch_time_s"] >= BATCHES * 0.02
        assert report["hps_data_wait_s"] < 0.25 * BATCHES * 0.02, report["hps_data_wait_s"]


def test_the_models_own_epoch_end_work_counts_in_the_epochs_time(tmp_path):
    # Lightning calls callbacks' on_train_epoch_end before the model's: an epoch time taken
    # there left it out of s/epoch and the compute figures (0.06 s for a 2 s hook).
    data = SlowLoadingData(item_seconds=0.0)
    for report in reports_of(tmp_path, mlp_for(data, SlowEpochEnd), data, epochs=3):
        assert report["hps_epoch_time_s"] >= 0.4, report["hps_epoch_time_s"]


def test_a_metric_the_model_never_logs_is_named_by_hpsearch_and_fails_the_trial_at_once(tmp_path):
    # With the preflight off, a typo in 'metric' reached Lightning first: its EarlyStopping
    # or ModelCheckpoint error blamed callbacks the user never configured, and was retried.
    from hpsearch.search.reporting import MetricNotLoggedError
    from hpsearch.search.trial import _failure_reason

    data = SlowLoadingData(item_seconds=0.0)
    with pytest.raises(MetricNotLoggedError, match="'val_accuracy' was not logged.*logged: .*val_acc") as caught:
        reports_of(tmp_path, mlp_for(data), data, metric="val_accuracy")
    assert _failure_reason(caught.value) == str(caught.value)


class ValidatesAccuracyEveryOtherEpoch(MLPClassifier):
    """Logs val_acc at the first epoch's validation and not the second's."""

    def validation_step(self, batch, batch_idx):
        if self.current_epoch % 2 == 0:
            return super().validation_step(batch, batch_idx)


def test_a_search_metric_missing_from_one_epochs_validation_fails_the_trial(tmp_path):
    """Lightning keeps a metric's last value: the second epoch's report carried the first
    epoch's val_acc to ASHA, Optuna and TensorBoard, as if that epoch had logged it; and a
    metric logged only in training passed for one logged at validation."""
    from hpsearch.search.reporting import MetricNotLoggedError

    data = SlowLoadingData(item_seconds=0.0)
    missing = r"'val_acc' was not logged in epoch 2's validation \(current_epoch 1 in your code\)"
    with pytest.raises(MetricNotLoggedError, match=missing):
        reports_of(tmp_path / "every-other", mlp_for(data, ValidatesAccuracyEveryOtherEpoch), data)
    with pytest.raises(MetricNotLoggedError, match="'step_loss' was not logged in epoch 1's validation"):
        reports_of(tmp_path / "training-only", mlp_for(data, LogsEachStep), data, metric="step_loss")


def test_a_nan_loss_under_manual_optimization_fails_the_trial(tmp_path):
    # The accuracy stays finite (at chance) while the weights are NaN: only the logged
    # losses show it, and the trial must not end COMPLETE with a diverged model.
    from hpsearch.search.reporting import NonFiniteError

    data = SlowLoadingData(item_seconds=0.0)
    with pytest.raises(NonFiniteError, match=r"(train|val)_loss is nan at epoch 2"):
        reports_of(tmp_path, mlp_for(data, manually_optimized(MLPClassifier, nan_from_epoch=1)), data, epochs=3)


class LogsAnInfiniteAuxiliaryLoss(MLPClassifier):
    """Trains finely, and logs a loss of its own that is infinite from its second epoch."""

    def validation_step(self, batch, batch_idx):
        self.log("val_aux_loss", float("inf") if self.current_epoch >= 1 else 1.0)
        return super().validation_step(batch, batch_idx)


def test_an_infinite_loss_a_model_logs_beside_its_own_training_loss_does_not_fail_its_trial(tmp_path):
    """A model that optimizes automatically has its training loss checked at its steps: a
    logged loss of its own that was inf failed its trial, though its search metric and
    training were fine (audit 74)."""
    data = SlowLoadingData(item_seconds=0.0)
    reports = reports_of(tmp_path, mlp_for(data, LogsAnInfiniteAuxiliaryLoss), data, epochs=3)
    assert [report["epoch"] for report in reports] == [1, 2, 3], reports
    assert math.isinf(reports[-1]["val_aux_loss"]) and math.isfinite(reports[-1]["val_acc"])


def test_a_resumed_trial_trains_on_as_the_uninterrupted_one_would_have(tmp_path):
    """A trial seeds itself at every start (the search's seed plus its number), so a resumed
    one shuffled its batches unlike the uninterrupted one would have, and its later epochs
    differed: val_acc 0.893 against 0.944 at epoch 4 in one pair of runs."""
    data = SlowLoadingData(item_seconds=0.0)
    checkpoint = tmp_path / "stopped" / "trial" / "checkpoints" / "epoch-0000.ckpt"

    def seeded_model():
        pl.seed_everything(7, workers=True, verbose=False)  # as each start of the trial does
        return mlp_for(data)

    straight = reports_of(tmp_path / "straight", seeded_model(), data, epochs=3)
    reports_of(tmp_path / "stopped", seeded_model(), data, epochs=1)
    resumed = reports_of(tmp_path / "stopped", seeded_model(), data, epochs=3, resume_from=str(checkpoint),
                         reports_expected=3, known_epochs=1)  # the checkpoint's epoch, sent again, then two
    assert [(r["epoch"], r["val_acc"], r["val_loss"]) for r in resumed] == \
        [(r["epoch"], r["val_acc"], r["val_loss"]) for r in straight]


class PersistentLoaders(SlowLoadingData):
    """Shuffled by torch's generator, with a persistent loader worker, as a user's own DataLoaders often are."""

    def _own(self, split: str, shuffle: bool):
        return torch.utils.data.DataLoader(self._splits[split], batch_size=8, shuffle=shuffle, num_workers=1,
                                           persistent_workers=True, collate_fn=self.collate_for(8))

    def train_dataloader(self):
        return self._own("train", True)

    def val_dataloader(self):
        return self._own("val", False)


def test_a_resumed_trial_with_persistent_loader_workers_trains_on_as_the_uninterrupted_one(tmp_path):
    """A persistent validation loader draws its workers' seed from torch's generator once,
    at its first validation: the resumed trial drew it again after its checkpoint, and its
    values went their own way an epoch later (audit 80)."""
    def seeded():
        data = PersistentLoaders(item_seconds=0.0)
        pl.seed_everything(7, workers=True, verbose=False)
        return MLPClassifier(input_shape=data.input_shape, num_classes=data.num_classes, dropout=0.3), data

    straight = reports_of(tmp_path / "straight", *seeded(), epochs=4)
    reports_of(tmp_path / "stopped", *seeded(), epochs=2)
    checkpoint = tmp_path / "stopped" / "trial" / "checkpoints" / "epoch-0001.ckpt"
    resumed = reports_of(tmp_path / "stopped", *seeded(), epochs=4, resume_from=str(checkpoint), reports_expected=3,
                         known_epochs=2)
    assert [(r["epoch"], r["val_loss"]) for r in resumed] == [(r["epoch"], r["val_loss"]) for r in straight[1:]]


def test_a_resumed_trial_first_reports_again_the_epoch_its_checkpoint_holds(tmp_path):
    # An epoch's checkpoint is written before its report: a trial paused in between (Ctrl+C,
    # SIGTERM) continued from an epoch the study never heard of, which ASHA never judged.
    data = SlowLoadingData(item_seconds=0.0)
    first = reports_of(tmp_path, mlp_for(data, SlowEpochEnd), data, epochs=2,
                       static_fields={"hps_precision": "32-true", "hps_num_workers": 0})
    checkpoint = tmp_path / "trial" / "checkpoints" / "epoch-0001.ckpt"  # the second epoch's
    # resumed with another precision (the file's trainer.precision changed): the epoch sent
    # again keeps the one it trained with; the new epoch has the new one
    resumed = reports_of(tmp_path, mlp_for(data, SlowEpochEnd), data, epochs=3, resume_from=str(checkpoint),
                         reports_expected=2, known_epochs=1,
                         static_fields={"hps_precision": "bf16-mixed", "hps_num_workers": 1})
    again, new = resumed
    assert (again["hps_precision"], new["hps_precision"]) == ("32-true", "bf16-mixed")
    assert again["hps_num_workers"] == new["hps_num_workers"] == 1  # this attempt's loader
    assert (again["epoch"], again["hps_restored"], again["hps_finished"]) == (2, True, False), again
    assert again["val_acc"] == first[1]["val_acc"] and again["hps_best"] == first[1]["hps_best"]
    # The epoch's own time and telemetry, as measured up to its checkpoint, and its end (the
    # model's own 0.4 s there), which ran again: a study that never heard of the epoch counts
    # them (an interrupted study's compute lacked the epoch, then lacked its end)
    was = first[1]
    for key in ("hps_train_time_s", "hps_val_time_s", "hps_data_wait_s", "hps_epoch_cpu_s", "hps_samples_per_s"):
        assert again[key] == was[key], key
    assert again["hps_epoch_time_s"] >= was["hps_train_time_s"] + was["hps_val_time_s"] + 0.4, (again, was)
    assert new["epoch"] == 3 and "hps_restored" not in new and new["hps_finished"] is True
    # From the last epoch's checkpoint (paused before its report): that report is the trial's end
    [last] = reports_of(tmp_path, mlp_for(data), data, epochs=3, reports_expected=1, known_epochs=2,
                        resume_from=str(tmp_path / "trial" / "checkpoints" / "epoch-0002.ckpt"))
    assert (last["epoch"], last["hps_restored"], last["hps_finished"], last["hps_stop_reason"]) == \
        (3, True, True, "max_epochs"), last


class NeverImproves(MLPClassifier):
    def on_validation_epoch_end(self) -> None:
        self.log("score", 0.5)


def test_a_trial_resumed_where_early_stopping_ended_it_reports_that_end_and_trains_no_further(tmp_path):
    data = SlowLoadingData(item_seconds=0.0)
    first = reports_of(tmp_path, mlp_for(data, NeverImproves), data, epochs=5, metric="score", patience=1,
                       reports_expected=2)
    assert (first[1]["hps_finished"], first[1]["hps_stop_reason"]) == (True, "early_stopping")
    # Paused after the second epoch's checkpoint, before its report:
    [again] = reports_of(tmp_path, mlp_for(data, NeverImproves), data, epochs=5, metric="score", patience=1,
                         reports_expected=1, known_epochs=1,
                         resume_from=str(tmp_path / "trial" / "checkpoints" / "epoch-0001.ckpt"))
    assert (again["epoch"], again["hps_finished"], again["hps_stop_reason"]) == (2, True, "early_stopping"), again


def test_each_epoch_reports_the_cpu_time_its_training_and_validation_used(tmp_path):
    data = SlowLoadingData(item_seconds=0.0)
    for report in reports_of(tmp_path, mlp_for(data, BusySteps), data):
        assert BATCHES * 0.02 <= report["hps_epoch_cpu_s"] < BATCHES * 0.02 + 1.0, report


@pytest.mark.parametrize("item_seconds", [0.0, 0.002])
def test_each_epoch_reports_only_its_own_waits(tmp_path, item_seconds):
    data = SlowLoadingData(item_seconds=item_seconds)
    first, second = reports_of(tmp_path, mlp_for(data), data)
    # the counter is cumulative in the profiler; the reports must not be
    assert second["hps_data_wait_s"] < 2 * first["hps_data_wait_s"] + 0.05
    assert second["hps_data_wait_s"] >= BATCHES * 8 * item_seconds


class DivergesAtStep(MLPClassifier):
    """Its training loss turns NaN at one global step."""

    def __init__(self, nan_at_step: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.nan_at_step = nan_at_step

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if self.trainer.global_step == self.nan_at_step else loss


def test_a_nan_loss_ends_the_trial_naming_the_steps_it_happened_in(tmp_path):
    from hpsearch.search.reporting import NonFiniteError

    data = SlowLoadingData(item_seconds=0.0)
    model = DivergesAtStep(nan_at_step=BATCHES + 2, input_shape=data.input_shape, num_classes=data.num_classes)
    with pytest.raises(NonFiniteError, match=rf"NaN/inf loss at a step in {BATCHES + 1}\.\.{2 * BATCHES}, epoch 2"):
        reports_of(tmp_path, model, data, epochs=3)
    # caught before the diverged weights were validated and checkpointed
    assert sorted(p.name for p in (tmp_path / "trial" / "checkpoints").iterdir()) == ["best.ckpt", "epoch-0000.ckpt"]


def test_the_loss_is_read_on_the_host_once_every_few_steps_not_every_step(monkeypatch):
    """Reading a GPU loss's value (bool, item, float) makes the host wait for the GPU; the
    reporter must only do it every FINITE_CHECK_EVERY steps."""
    from types import SimpleNamespace

    from hpsearch.search.reporting import FINITE_CHECK_EVERY, NonFiniteError, TuneReporter

    reads = []
    for method in ("__bool__", "item", "__float__"):
        original = getattr(torch.Tensor, method)
        monkeypatch.setattr(torch.Tensor, method,
                            lambda self, *a, _original=original, **k: reads.append(1) or _original(self, *a, **k))
    reporter = TuneReporter("val_acc", "max", 1, report=lambda metrics: None, static_fields={})
    trainer = SimpleNamespace(global_step=0, current_epoch=0, sanity_checking=False)
    batch = torch.zeros(4, 2)

    def step(batch_idx: int, loss: float) -> None:
        reporter.on_train_batch_start(trainer, None, batch, batch_idx)
        trainer.global_step += 1
        reporter.on_train_batch_end(trainer, None, {"loss": torch.tensor(loss)}, batch, batch_idx)

    for batch_idx in range(FINITE_CHECK_EVERY - 1):
        step(batch_idx, 0.5 if batch_idx != 3 else float("inf"))
    assert reads == []
    with pytest.raises(NonFiniteError, match=rf"1\.\.{FINITE_CHECK_EVERY}, epoch 1"):
        step(FINITE_CHECK_EVERY - 1, 0.5)
    assert len(reads) == 1


def test_gpu_work_still_queued_at_a_phase_end_is_counted_in_that_phase(monkeypatch):
    """On a GPU a step's hooks return once its kernels are queued; the reporter waits for
    the device once at training's end and once at validation's end, so the queued work is
    counted as training and validation time (samples/s was 3x too high on an H200 without it)."""
    from types import SimpleNamespace

    from hpsearch.search.reporting import TuneReporter

    waited = []

    def synchronize(device):  # stands in for the GPU finishing its queue
        waited.append(device)
        time.sleep(0.2)

    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    reporter = TuneReporter("val_acc", "max", 1, report=lambda metrics: None, static_fields={})
    trainer = SimpleNamespace(global_step=0, current_epoch=0, sanity_checking=False, world_size=1,
                              callback_metrics={"val_acc": torch.tensor(0.5)},
                              lightning_module=SimpleNamespace(automatic_optimization=True))
    gpu_module = SimpleNamespace(device=torch.device("cuda", 0))
    batch = torch.zeros(4, 2)
    reporter.on_train_epoch_start(trainer, gpu_module)
    for batch_idx in range(3):
        reporter.on_train_batch_start(trainer, gpu_module, batch, batch_idx)
        trainer.global_step += 1
        reporter.on_train_batch_end(trainer, gpu_module, {"loss": torch.tensor(0.5)}, batch, batch_idx)
    assert waited == []  # no wait at every step
    reporter.on_validation_start(trainer, gpu_module)
    assert waited == [gpu_module.device] and reporter._train_seconds >= 0.2
    trainer.callback_metrics = {"val_acc": torch.tensor(0.5)}  # logged by the validation
    reporter.on_validation_end(trainer, gpu_module)
    assert waited == [gpu_module.device] * 2 and reporter._val_seconds >= 0.2

    cpu_module = SimpleNamespace(device=torch.device("cpu"))
    reporter.on_validation_start(trainer, cpu_module)
    trainer.callback_metrics = {"val_acc": torch.tensor(0.5)}
    reporter.on_validation_end(trainer, cpu_module)
    assert len(waited) == 2


@pytest.mark.parametrize("by_epoch,noted", [([(0.5, 0.5)] * 3, False), ([(0.5, 0.75)] * 3, True),
                                             ([(0.5, 0.5), (0.5, 0.75), (0.6, 0.8)], True)])
def test_ddp_ranks_that_disagree_on_the_search_metric_get_a_note(by_epoch, noted):
    """Without sync_dist=True, each DDP rank logs its own shard's metric and rank 0's alone
    is reported: the trial's notes say so, once, at whichever validation the ranks first
    differ (compared at the first only, ranks that agreed there and parted later went
    unnoted: audit 82). (The DDP search's trials, which sync, get none.)"""
    from types import SimpleNamespace

    from hpsearch.search.reporting import TuneReporter

    gathered, epochs = [], iter(by_epoch)

    def all_gather(value):
        gathered.append(float(value))
        return torch.tensor(rank_values, dtype=torch.float64)

    reporter = TuneReporter("val_acc", "max", 3, report=lambda metrics: None, static_fields={"hps_notes": ""})
    trainer = SimpleNamespace(global_step=4, current_epoch=0, sanity_checking=False, world_size=2, global_rank=0,
                              callback_metrics={}, strategy=SimpleNamespace(all_gather=all_gather),
                              lightning_module=SimpleNamespace(automatic_optimization=True))
    module = SimpleNamespace(device=torch.device("cpu"))
    for rank_values in epochs:
        reporter.on_validation_start(trainer, module)
        trainer.callback_metrics = {"val_acc": torch.tensor(rank_values[0])}  # logged by the validation
        reporter.on_validation_end(trainer, module)
    first_difference = next((i for i, values in enumerate(by_epoch) if values[0] != values[1]), len(by_epoch) - 1)
    assert gathered == [values[0] for values in by_epoch[:first_difference + 1]]  # not compared once they differ
    notes = reporter.static_fields["hps_notes"]
    low, high = next((values for values in by_epoch if values[0] != values[1]), (0.5, 0.75))
    assert (f"val_acc differs between the 2 ranks ({low:.4g} to {high:.4g}): log it with sync_dist=True"
            in notes) is noted, notes
    assert notes.count("differs between") == int(noted)


def test_evaluation_keeps_no_autograd_graph_and_the_final_test_runs_in_inference_mode(tmp_path, monkeypatch):
    # What the README's table says of the sixth technique: validation inside a trial's fit
    # runs under no_grad (Lightning's choice there), the best trial's test under inference_mode.
    import json

    from conftest import FIXTURES
    from hpsearch.search.config_loading import load_config
    from hpsearch.search.evaluation import evaluate_checkpoint

    monkeypatch.syspath_prepend(str(FIXTURES))
    from userpkg.grad_probe import GradModeProbe

    log = tmp_path / "modes.jsonl"
    data = SlowLoadingData(item_seconds=0.0)
    reports_of(tmp_path, GradModeProbe(log_to=str(log), channels=4, input_shape=data.input_shape,
                                       num_classes=data.num_classes), data)
    checkpoint = tmp_path / "trial" / "checkpoints" / "best.ckpt"
    assert checkpoint.is_file()
    config = load_config({
        "name": "modes", "metric": "val_acc", "mode": "max",
        "model": {"class_path": "userpkg.grad_probe:GradModeProbe", "init_args": {"log_to": str(log), "channels": 4}},
        "data": {"class_path": "synthetic-images", "init_args": {"num_samples": 80, "image_size": 4, "channels": 1,
                                                                 "batch_size": 8, "test_fraction": 0.2}},
        "space": {"model.lr": {"type": "float", "low": 0.01, "high": 0.1}}})
    assert "test_acc" in evaluate_checkpoint(config.model_dump(mode="json"), {"model.lr": 0.05}, str(checkpoint))
    seen = {(r["step"], r["grad"], r["inference"]) for r in map(json.loads, log.read_text().splitlines())}
    assert seen == {("validation", False, False), ("test", False, True)}, seen

    # A test_step that makes an input's gradient under enable_grad, as its validation_step
    # may inside fit: inference mode refuses it, and the search failed at its end (audit 82).
    # It is tested under no_grad instead.
    log.unlink()
    config.model.class_path = "userpkg.grad_probe:InputGradientAtEvaluation"
    tested = evaluate_checkpoint(config.model_dump(mode="json"), {"model.lr": 0.05}, str(checkpoint))
    assert tested["test_input_gradient"] > 0 and "test_acc" in tested, tested
    seen = {(r["step"], r["grad"], r["inference"]) for r in map(json.loads, log.read_text().splitlines())}
    assert seen == {("test", False, False)}, seen

    # A test_step that logs through self.logger, as the preflight lets it: the evaluation
    # had no logger, and failed after the whole search.
    config.model.class_path = "userpkg.grad_probe:LogsAtTest"
    assert "test_acc" in evaluate_checkpoint(config.model_dump(mode="json"), {"model.lr": 0.05}, str(checkpoint))
    assert list((checkpoint.parent.parent / "test").glob("events.out.tfevents.*"))
    # evaluated again (a resume does): one evaluation's events, not one more file each time
    time.sleep(1)  # event files are named by the second they were opened in
    assert "test_acc" in evaluate_checkpoint(config.model_dump(mode="json"), {"model.lr": 0.05}, str(checkpoint))
    assert len(list((checkpoint.parent.parent / "test").glob("events.out.tfevents.*"))) == 1


def test_a_models_own_checkpoints_go_to_the_trials_folder_and_its_evaluation_restores_them_quietly(tmp_path,
                                                                                                    monkeypatch):
    # Lightning put them beside the logger's files, inside the study's tensorboard/ folder,
    # and the evaluation, which logs elsewhere, warned that their folder had changed.
    import warnings

    from conftest import FIXTURES
    from hpsearch.search.config_loading import load_config
    from hpsearch.search.evaluation import evaluate_checkpoint

    monkeypatch.syspath_prepend(str(FIXTURES))
    from userpkg.grad_probe import KeepsItsOwnCheckpoints

    data = SlowLoadingData(item_seconds=0.0)
    reports_of(tmp_path, KeepsItsOwnCheckpoints(log_to=str(tmp_path / "modes.jsonl"), channels=4,
                                                input_shape=data.input_shape, num_classes=data.num_classes), data)
    assert [p.parent.name for p in (tmp_path / "trial" / "model_checkpoints").glob("*.ckpt")] == ["model_checkpoints"]
    assert not list((tmp_path / "tb").rglob("*.ckpt"))
    config = load_config({
        "name": "own", "metric": "val_acc", "mode": "max",
        "model": {"class_path": "userpkg.grad_probe:KeepsItsOwnCheckpoints",
                  "init_args": {"log_to": str(tmp_path / "modes.jsonl"), "channels": 4}},
        "data": {"class_path": "synthetic-images", "init_args": {"num_samples": 80, "image_size": 4, "channels": 1,
                                                                 "batch_size": 8, "test_fraction": 0.2}},
        "space": {"model.lr": {"type": "float", "low": 0.01, "high": 0.1}}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert "test_acc" in evaluate_checkpoint(config.model_dump(mode="json"), {"model.lr": 0.05},
                                                 str(tmp_path / "trial" / "checkpoints" / "best.ckpt"))
    assert not [w for w in caught if "dirpath has changed" in str(w.message)], [str(w.message) for w in caught]


def test_the_evaluation_does_not_repeat_torchs_words_for_loader_settings_the_driver_warned_of(tmp_path):
    # The driver warns once of pinned memory on CPU and of more loader workers than CPUs;
    # torch said both again in the final evaluation, the first twice.
    import warnings

    from conftest import make_image_folder
    from hpsearch.models.cnn import CNNClassifier
    from hpsearch.models.image_folder import ImageFolderDataModule
    from hpsearch.search.config_loading import load_config
    from hpsearch.search.evaluation import evaluate_checkpoint

    root = make_image_folder(tmp_path / "images")
    data = {"root": str(root), "image_size": 8, "batch_size": 4, "test_fraction": 0.3}
    datamodule = ImageFolderDataModule(**data)
    reports_of(tmp_path, CNNClassifier(channels=4, input_shape=datamodule.input_shape,
                                       num_classes=datamodule.num_classes), datamodule)
    config = load_config({"name": "loud", "metric": "val_acc", "mode": "max",
                          "model": {"class_path": "cnn", "init_args": {"channels": 4}},
                          "data": {"class_path": "image-folder", "init_args": data},
                          "space": {"model.lr": {"type": "float", "low": 0.01, "high": 0.1}},
                          "loader": {"pin_memory": True, "num_workers": (os.cpu_count() or 1) + 1}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert "test_acc" in evaluate_checkpoint(config.model_dump(mode="json"), {"model.lr": 0.05},
                                                 str(tmp_path / "trial" / "checkpoints" / "best.ckpt"))
    said = [str(w.message) for w in caught]
    assert not [m for m in said if "worker processes" in m or "'pin_memory' argument" in m], said


class ScriptedScoreWithItsOwnEarlyStopping(MLPClassifier):
    """Logs ``scores[epoch]`` as ``score``; its configure_callbacks adds an EarlyStopping
    of the user's own, as Lightning writes it by default (deciding at the epoch's end)."""

    def __init__(self, scores, patience: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.scores, self.patience = scores, patience

    def on_validation_epoch_end(self) -> None:
        self.log("score", float(self.scores[self.current_epoch]))

    def configure_callbacks(self):
        return [pl.callbacks.EarlyStopping(monitor="score", mode="max", patience=self.patience)]


@pytest.mark.parametrize("own_patience, file_patience", [(1, None), (10, 1)])
def test_a_models_own_early_stopping_and_the_files_patience_both_end_a_trial_as_finished(tmp_path, own_patience,
                                                                                          file_patience):
    # (1, None): the model's EarlyStopping stopped training after the epoch's report was
    # composed, and the trial ended PRUNED ("stopped after epoch 3"). (10, 1): Lightning
    # dropped hpsearch's EarlyStopping for the model's, so the file's patience of 1 did nothing.
    from hpsearch.search.outcome import FINISHED, STOP_REASON

    data = SlowLoadingData(item_seconds=0.0)
    model = ScriptedScoreWithItsOwnEarlyStopping([1.0, 3.0, 2.0, 1.0, 0.5, 0.2], own_patience,
                                                 input_shape=data.input_shape, num_classes=data.num_classes)
    reports = reports_of(tmp_path, model, data, epochs=6, metric="score", reports_expected=3, patience=file_patience)
    assert [(r[FINISHED], r[STOP_REASON]) for r in reports] == [(False, ""), (False, ""), (True, "early_stopping")]


class StopsItselfAtTheSecondEpoch(MLPClassifier):
    def on_validation_epoch_end(self):
        super().on_validation_epoch_end()
        if self.current_epoch == 1 and not self.trainer.sanity_checking:
            self.trainer.should_stop = True


class ReachesItsThresholdAtOnce(MLPClassifier):
    def configure_callbacks(self):
        from pytorch_lightning.callbacks import EarlyStopping

        return [EarlyStopping(monitor="val_acc", mode="max", stopping_threshold=0.0)]


def test_an_early_stop_another_rank_decided_is_early_stopping():
    """Lightning gives every rank the stop and its epoch, but the reason only to the rank
    whose own check fired: rank 0's said stopped_by_model (audit 67)."""
    from pytorch_lightning.callbacks import EarlyStopping

    from hpsearch.search.reporting import _stopped_training

    decided_elsewhere = EarlyStopping(monitor="val_acc", patience=5)
    decided_elsewhere.stopped_epoch = 3
    assert _stopped_training(decided_elsewhere) and not _stopped_training(EarlyStopping(monitor="val_acc"))


def test_a_model_that_stops_its_own_training_ends_its_trial_saying_so(tmp_path):
    """No EarlyStopping decided it, and the reason said early_stopping (audit 63); an
    EarlyStopping that stops at the first epoch on its threshold (its patience unspent, its
    stopped epoch 0) was then taken for the model's own stop (audit 65)."""
    from hpsearch.search.outcome import FINISHED, STOP_REASON

    data = SlowLoadingData(item_seconds=0.0)
    reports = reports_of(tmp_path, mlp_for(data, StopsItselfAtTheSecondEpoch), data, epochs=4, reports_expected=2)
    assert [(r[FINISHED], r[STOP_REASON]) for r in reports] == [(False, ""), (True, "stopped_by_model")]
    reports = reports_of(tmp_path / "threshold", mlp_for(data, ReachesItsThresholdAtOnce), data, epochs=4,
                         reports_expected=1)
    assert [(r[FINISHED], r[STOP_REASON]) for r in reports] == [(True, "early_stopping")]


@pytest.mark.parametrize("own_patience, scores, reported", [
    (10, [1.0, 3.0, 2.0, 2.5, 2.6], [(3, False, ""), (4, False, ""), (5, True, "max_epochs")]),
    # its patience runs out at the restored epoch itself, in the epoch end Lightning reruns
    (1, [1.0, 3.0, 2.0, 2.5, 2.6], [(3, True, "early_stopping")]),
])
def test_a_trial_with_its_models_own_early_stopping_resumes(tmp_path, own_patience, scores, reported):
    # Lightning reruns the restored epoch's end, where such a callback decides by default,
    # with no metrics: it raised "Early stopping conditioned on metric `score` which is not
    # available", and every retry and resume of the trial failed.
    from hpsearch.search.outcome import EPOCH, FINISHED, STOP_REASON

    data = SlowLoadingData(item_seconds=0.0)

    def model():
        return ScriptedScoreWithItsOwnEarlyStopping(scores, own_patience, input_shape=data.input_shape,
                                                    num_classes=data.num_classes)

    reports_of(tmp_path, model(), data, epochs=3, metric="score", patience=None)
    resumed = reports_of(tmp_path, model(), data, epochs=5, metric="score", patience=None, known_epochs=3,
                         resume_from=tmp_path / "trial" / "checkpoints" / "epoch-0002.ckpt",
                         reports_expected=len(reported))
    assert [(r[EPOCH], r[FINISHED], r[STOP_REASON]) for r in resumed] == reported


@pytest.mark.parametrize("known_epochs, resent", [(1, [2, 3]), (3, [3])])
def test_a_resumed_trial_sends_again_every_epoch_its_checkpoint_holds_that_the_study_lacks(tmp_path, known_epochs,
                                                                                           resent):
    """A DDP trial's rank 0 does not wait for Tune at its reports: a Ctrl+C lost epochs 2
    and 3 of one, and its resume sent only epoch 3 again, so the study never had epoch 2."""
    from hpsearch.search.outcome import EPOCH, FINISHED, RESTORED

    data = SlowLoadingData(item_seconds=0.0)
    model = ScriptedScoreWithItsOwnEarlyStopping([1.0, 3.0, 2.0, 2.5, 2.6], 10, input_shape=data.input_shape,
                                                 num_classes=data.num_classes)
    first = reports_of(tmp_path, model, data, epochs=3, metric="score", patience=None)
    resumed = reports_of(tmp_path, ScriptedScoreWithItsOwnEarlyStopping(
                             [1.0, 3.0, 2.0, 2.5, 2.6], 10, input_shape=data.input_shape, num_classes=data.num_classes),
                         data, epochs=5, metric="score", patience=None, known_epochs=known_epochs,
                         resume_from=tmp_path / "trial" / "checkpoints" / "epoch-0002.ckpt",
                         reports_expected=len(resent) + 2)
    assert [(r[EPOCH], bool(r.get(RESTORED)), r[FINISHED]) for r in resumed] == \
        [(epoch, True, False) for epoch in resent] + [(4, False, False), (5, False, True)]
    for again in resumed[:len(resent)]:
        original = first[again[EPOCH] - 1]
        assert again["score"] == original["score"] and again["hps_best"] == original["hps_best"], (again, original)
        assert again["hps_epoch_time_s"] == pytest.approx(original["hps_epoch_time_s"], rel=0.5)


def test_a_resumed_trial_with_nothing_left_to_train_adds_no_upload_to_its_compute(tmp_path):
    """Its report is of an epoch the study counted already: the upload of its files was
    added to that report's epoch time, and so to the trial's compute (audit 70)."""
    from hpsearch.search.reporting import TuneReporter

    reports: list[dict] = []
    reporter = TuneReporter("val_acc", "max", 1, report=reports.append, static_fields={},
                            store_epoch_files=lambda: time.sleep(0.2))
    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    reporter.report_restored(trainer, {"val_acc": torch.tensor(0.5)})
    [report] = reports
    assert report["hps_epoch_time_s"] == 0.0 and report["hps_checkpoint_s"] < 0.2, report
