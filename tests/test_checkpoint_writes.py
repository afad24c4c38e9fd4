"""A one-process trial writes its large checkpoints in a thread while the next epoch trains,
and the study still never learns of an epoch before its files are written. (The tests'
checkpoints are small: ``in_background`` takes every size to the thread.)"""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import threading
import time

import pytest

from hpsearch.models.mlp import MLPClassifier
from hpsearch.models.synthetic import SyntheticImagesDataModule

BATCHES = 6  # training batches an epoch


def tiny_data() -> SyntheticImagesDataModule:
    return SyntheticImagesDataModule(num_samples=80, image_size=4, channels=1, batch_size=8, val_fraction=0.2,
                                     test_fraction=0.2)


class CountsSteps(MLPClassifier):
    """Counts its training steps; at ``release_at`` it lets a held write go on, and at
    ``fail_at`` it raises (after releasing)."""

    release: threading.Event
    release_at: int
    fail_at: int | None = None
    steps = 0

    def training_step(self, batch, batch_idx):
        self.steps += 1
        if self.steps >= self.release_at:
            self.release.set()
        if self.steps == self.fail_at:
            raise RuntimeError("the trial's own fault in epoch 2")
        return super().training_step(batch, batch_idx)


@pytest.fixture
def in_background(monkeypatch):
    from hpsearch.search import checkpoint_writes

    monkeypatch.setattr(checkpoint_writes, "IN_BACKGROUND_FROM_MB", 0)


@pytest.fixture
def held_writes(monkeypatch, in_background):
    """Each checkpoint write waits until ``release`` is set (for at most 20 s): a write
    still going on while the training thread moves on. ``fault``: the write raises it."""
    from hpsearch.search import checkpoint_writes

    release, written, state = threading.Event(), [], {"fault": None}
    write = checkpoint_writes._write_beside_then_rename

    def held_write(checkpoint, path):
        release.wait(timeout=20)
        if state["fault"] is not None and "epoch-0001" in str(path):
            raise state["fault"]
        write(checkpoint, path)
        written.append(str(path))

    monkeypatch.setattr(checkpoint_writes, "_write_beside_then_rename", held_write)
    return release, written, state


def fit(tmp_path, model, epochs: int = 2, report=None):
    from hpsearch.search.config import LoaderConfig, ResourcesConfig, TrainerConfig
    from hpsearch.search.devices import trial_device
    from hpsearch.search.lightning_trainer import build_trainer
    from hpsearch.search.reporting import TuneReporter

    reporter = TuneReporter("val_acc", "max", epochs, report=report, static_fields={})
    settings = TrainerConfig(early_stopping_patience=None)
    trainer = build_trainer(settings, device=trial_device(settings, LoaderConfig(), ResourcesConfig()),
                            metric="val_acc", mode="max", max_epochs=epochs, trial_dir=tmp_path / "trial",
                            tensorboard_run=tmp_path / "tb" / "run", callbacks=[reporter],
                            profiler=reporter.fetch_timer)
    return trainer, reporter


def model_for(data, release, release_at, fail_at=None):
    model = CountsSteps(input_shape=data.input_shape, num_classes=data.num_classes)
    model.release, model.release_at, model.fail_at = release, release_at, fail_at  # not hyperparameters
    return model


def test_the_next_epoch_trains_while_a_checkpoint_is_written_and_its_report_waits_for_the_files(tmp_path,
                                                                                             held_writes):
    release, written, _ = held_writes
    data = tiny_data()
    model = model_for(data, release, release_at=BATCHES + 2)  # the write goes on in epoch 2's 2nd step
    checkpoints = tmp_path / "trial" / "checkpoints"
    seen = []

    def report(metrics):
        seen.append({"epoch": metrics["epoch"], "steps": model.steps, "val_acc": metrics["val_acc"],
                     "files": sorted(path.name for path in checkpoints.iterdir())})

    trainer, reporter = fit(tmp_path, model, report=report)
    trainer.fit(model, datamodule=data)
    reporter.send_final(trainer)
    first, last = seen
    # Epoch 1's report came while epoch 2 trained, and only once its files were written
    # (written in the training thread, the write would have waited out its 20 s first).
    assert first["epoch"] == 1 and first["steps"] >= BATCHES + 2, seen
    assert {"epoch-0000.ckpt", "best.ckpt"} <= set(first["files"]), seen
    assert last["epoch"] == 2 and {"epoch-0001.ckpt", "best.ckpt"} <= set(last["files"]), seen
    # best.ckpt: the copy of the best epoch's file, made in the thread once that file was written
    best_epoch = 1 if last["val_acc"] > first["val_acc"] else 0
    assert (checkpoints / "best.ckpt").read_bytes() == (checkpoints / f"epoch-{best_epoch:04d}.ckpt").read_bytes()
    assert not list(checkpoints.glob("*.partial"))


def test_a_failed_write_fails_the_trial_and_its_epoch_is_never_reported(tmp_path, held_writes):
    release, _, state = held_writes
    release.set()
    state["fault"] = OSError(errno.ENOSPC, "No space left on device")
    data = tiny_data()
    model = model_for(data, release, release_at=0)
    reports = []
    trainer, reporter = fit(tmp_path, model, epochs=3, report=reports.append)
    with pytest.raises(OSError, match="No space left"):
        trainer.fit(model, datamodule=data)
    reporter.send_held(trainer)  # as the trial does after a fault: nothing, its files were not written
    assert [report["epoch"] for report in reports] == [1]
    assert not (tmp_path / "trial" / "checkpoints" / "epoch-0001.ckpt").exists()


def test_a_stop_at_a_report_sent_inside_the_next_epoch_ends_the_training(tmp_path, held_writes):
    release, _, _ = held_writes
    data = tiny_data()
    model = model_for(data, release, release_at=BATCHES + 1)
    reports = []

    def report(metrics):  # Tune stops a trial at its report by raising SystemExit there
        reports.append(metrics["epoch"])
        raise SystemExit(0)

    trainer, reporter = fit(tmp_path, model, epochs=3, report=report)
    trainer.fit(model, datamodule=data)
    assert reporter.stopped_by_tune and reports == [1]
    assert BATCHES < model.steps < 2 * BATCHES  # it left epoch 2 part-way, at the report
    assert (tmp_path / "trial" / "checkpoints" / "epoch-0000.ckpt").exists()


def test_a_fault_while_a_report_waits_for_its_files_still_reports_that_epoch(tmp_path, held_writes):
    release, _, _ = held_writes
    data = tiny_data()
    model = model_for(data, release, release_at=BATCHES + 1, fail_at=BATCHES + 1)  # epoch 2's first step
    reports = []
    trainer, reporter = fit(tmp_path, model, epochs=3, report=reports.append)
    with pytest.raises(RuntimeError, match="own fault"):
        trainer.fit(model, datamodule=data)
    assert reports == []  # the fault came before epoch 1's files were written
    reporter.send_held(trainer)
    assert [report["epoch"] for report in reports] == [1]


def test_a_trial_that_faults_while_its_last_report_waits_for_its_files_reports_that_epoch_and_then_the_fault(
        tmp_path, example_config):
    """Through the trial's own function, as a Ray worker runs it (a fault the same code
    would raise again, so the trial fails at once, reporting why)."""
    from conftest import write_yaml

    from hpsearch.search.config_loading import load_config

    (tmp_path / "faulty_model.py").write_text(
        "import threading\n"
        "from hpsearch.models.cnn import CNNClassifier\n"
        "from hpsearch.search import checkpoint_writes\n"
        "checkpoint_writes.IN_BACKGROUND_FROM_MB = 0\n"
        "RELEASE = threading.Event()\n"
        "write = checkpoint_writes._write_beside_then_rename\n"
        "def held_write(*args):\n"
        "    RELEASE.wait(timeout=20)\n"
        "    write(*args)\n"
        "checkpoint_writes._write_beside_then_rename = held_write\n"
        "class Faulty(CNNClassifier):\n"
        "    def training_step(self, batch, batch_idx):\n"
        "        if self.current_epoch == 1:\n"
        "            RELEASE.set()\n"
        "            raise TypeError('a bug met in epoch 2')\n"
        "        return super().training_step(batch, batch_idx)\n")
    example_config["model"]["class_path"] = "faulty_model:Faulty"
    example_config["scheduler"]["max_epochs"] = 3
    config = load_config(write_yaml(tmp_path / "exp.yaml", example_config))
    (tmp_path / "experiment.json").write_text(json.dumps(config.model_dump(mode="json")))
    (tmp_path / "one_trial.py").write_text("""
import json
from ray import tune
from hpsearch.search import trial as trial_module
from hpsearch.search.outcome import EPOCH, FAILURE, TRIAL_NUMBER

reports = []
tune.report = reports.append
trial_module.train_trial({"params": {"model.lr": 0.01, "model.channels": 8, "data.batch_size": 64},
                          TRIAL_NUMBER: 0}, experiment=json.load(open("experiment.json")), experiment_dir="study")
print(json.dumps([[report.get(EPOCH), report.get(FAILURE) or ""] for report in reports]))
""")
    done = subprocess.run([sys.executable, "one_trial.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    reports = json.loads(done.stdout.strip().splitlines()[-1])
    assert [epoch for epoch, _ in reports] == [1, 1], reports
    assert reports[0][1] == "" and "TypeError: a bug met in epoch 2" in reports[1][1], reports


def test_an_epoch_that_waits_for_the_last_epochs_files_counts_the_wait_as_its_checkpoint_time(tmp_path, monkeypatch,
                                                                                              in_background):
    from hpsearch.search import checkpoint_writes

    write, validating = checkpoint_writes._write_beside_then_rename, threading.Event()

    def write_lasting_into_the_next_validation(checkpoint, path):
        if "epoch-0000" in str(path):
            validating.wait(timeout=20)
            time.sleep(0.3)
        write(checkpoint, path)

    monkeypatch.setattr(checkpoint_writes, "_write_beside_then_rename", write_lasting_into_the_next_validation)
    data = tiny_data()

    class SaysWhenValidating(CountsSteps):
        def on_validation_model_eval(self):  # before the callbacks' on_validation_start
            super().on_validation_model_eval()
            if self.current_epoch == 1:
                validating.set()

    model = SaysWhenValidating(input_shape=data.input_shape, num_classes=data.num_classes)
    model.release, model.release_at = threading.Event(), 0
    reports = []
    trainer, reporter = fit(tmp_path, model, report=reports.append)
    trainer.fit(model, datamodule=data)
    reporter.send_final(trainer)
    first, second = reports
    # the first epoch only took its state on the training path; the second waited 0.3 s or
    # more for the first's files, at its validation's start
    assert first["hps_checkpoint_s"] < 0.3 <= second["hps_checkpoint_s"] <= second["hps_epoch_time_s"], reports


def test_a_small_checkpoint_is_written_on_the_training_thread_and_its_report_leaves_before_the_next_batch(
        tmp_path, monkeypatch):
    from hpsearch.search import checkpoint_writes

    write, threads = checkpoint_writes._write_beside_then_rename, []

    def recorded_write(checkpoint, path):
        threads.append(threading.current_thread().name)
        write(checkpoint, path)

    monkeypatch.setattr(checkpoint_writes, "_write_beside_then_rename", recorded_write)
    data = tiny_data()
    model = model_for(data, threading.Event(), release_at=0)
    steps_at_reports = []
    trainer, reporter = fit(tmp_path, model, report=lambda metrics: steps_at_reports.append(model.steps))
    trainer.fit(model, datamodule=data)
    reporter.send_final(trainer)
    assert threads == [threading.main_thread().name] * 2
    assert steps_at_reports == [BATCHES, 2 * BATCHES]


def test_an_ended_trial_keeps_its_best_checkpoint_and_nothing_a_killed_write_left(tmp_path):
    from hpsearch.search.checkpoints import checkpoint_dir, drop_resume_checkpoints

    folder = checkpoint_dir(tmp_path)
    folder.mkdir(parents=True)
    for name in ("best.ckpt", "epoch-0003.ckpt", "epoch-0004.ckpt", "epoch-0005.ckpt.partial", "best.ckpt.partial"):
        (folder / name).write_bytes(b"x")
    drop_resume_checkpoints(tmp_path)
    assert [path.name for path in folder.iterdir()] == ["best.ckpt"]
