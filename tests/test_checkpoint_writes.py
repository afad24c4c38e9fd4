"""A trial's checkpoint files are serialized straight into place, never half written."""

from __future__ import annotations

import io

import pytest
import torch

from hpsearch.models.mlp import MLPClassifier
from hpsearch.models.synthetic import SyntheticImagesDataModule


def tiny_data() -> SyntheticImagesDataModule:
    return SyntheticImagesDataModule(num_samples=80, image_size=4, channels=1, batch_size=8, val_fraction=0.2,
                                     test_fraction=0.2)


def fit(tmp_path, epochs: int = 2, reports: list | None = None):
    from hpsearch.search.config import LoaderConfig, ResourcesConfig, TrainerConfig
    from hpsearch.search.devices import trial_device
    from hpsearch.search.lightning_trainer import build_trainer
    from hpsearch.search.reporting import TuneReporter

    data = tiny_data()
    model = MLPClassifier(input_shape=data.input_shape, num_classes=data.num_classes)
    reports = [] if reports is None else reports
    reporter = TuneReporter("val_acc", "max", epochs, report=reports.append, static_fields={})
    settings = TrainerConfig(early_stopping_patience=None)
    trainer = build_trainer(settings, device=trial_device(settings, LoaderConfig(), ResourcesConfig()),
                            metric="val_acc", mode="max", max_epochs=epochs, trial_dir=tmp_path / "trial",
                            tensorboard_run=tmp_path / "tb" / "run", callbacks=[reporter],
                            profiler=reporter.phase_timer)
    trainer.fit(model, datamodule=data)
    reporter.send_final(trainer)
    return reports


def test_a_trials_checkpoints_are_serialized_straight_into_their_files(tmp_path, monkeypatch):
    # Lightning's writer serialized each into a buffer in memory, then copied and wrote it:
    # more passes over the state, and more copies of it held at once.
    save, targets = torch.save, []

    def recorded_save(obj, f, *args, **kwargs):
        targets.append(f)
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", recorded_save)
    reports = fit(tmp_path)
    checkpoints = tmp_path / "trial" / "checkpoints"
    assert targets and not any(isinstance(target, io.IOBase) for target in targets), targets
    assert {str(target) for target in targets} == {f"{checkpoints}/epoch-0000.ckpt.partial",
                                                   f"{checkpoints}/epoch-0001.ckpt.partial"}
    assert sorted(path.name for path in checkpoints.iterdir()) == ["best.ckpt", "epoch-0000.ckpt", "epoch-0001.ckpt"]
    best_epoch = 1 if reports[1]["val_acc"] > reports[0]["val_acc"] else 0
    assert (checkpoints / "best.ckpt").read_bytes() == (checkpoints / f"epoch-{best_epoch:04d}.ckpt").read_bytes()
    assert torch.load(checkpoints / "best.ckpt", map_location="cpu", weights_only=False)["epoch"] == best_epoch


def test_a_write_that_fails_leaves_the_file_it_would_have_replaced_whole(tmp_path):
    from hpsearch.search.checkpoint_writes import CheckpointFileWriter

    path = tmp_path / "epoch-0001.ckpt"
    writer = CheckpointFileWriter()
    writer.save_checkpoint({"weights": torch.ones(3)}, path)
    with pytest.raises(Exception, match="pickle"):
        writer.save_checkpoint({"weights": torch.zeros(3), "unpicklable": lambda: None}, path)
    assert torch.equal(torch.load(path, weights_only=True)["weights"], torch.ones(3))


def test_one_file_strategies_get_the_writer_and_sharded_ones_keep_their_own():
    from pytorch_lightning.strategies import DDPStrategy, FSDPStrategy

    from hpsearch.search.lightning_trainer import _writes_whole_files

    assert _writes_whole_files("auto") and _writes_whole_files(DDPStrategy())
    assert not _writes_whole_files(FSDPStrategy())


def test_an_ended_trial_keeps_its_best_checkpoint_and_nothing_a_killed_write_left(tmp_path):
    from hpsearch.search.checkpoints import checkpoint_dir, drop_resume_checkpoints

    folder = checkpoint_dir(tmp_path)
    folder.mkdir(parents=True)
    for name in ("best.ckpt", "epoch-0003.ckpt", "epoch-0004.ckpt", "epoch-0005.ckpt.partial", "best.ckpt.partial"):
        (folder / name).write_bytes(b"x")
    drop_resume_checkpoints(tmp_path)
    assert [path.name for path in folder.iterdir()] == ["best.ckpt"]


@pytest.mark.parametrize("disk_full", [True, False])
def test_a_checkpoint_write_that_fails_on_a_full_disk_says_so(tmp_path, monkeypatch, disk_full):
    """torch.save on a full disk raises a RuntimeError with no errno ("unexpected pos 576 vs
    534"), which a trial retried as its own fault, where a full disk pauses it (audit 55).
    Where the disk is full it is an ENOSPC OSError; the half-written file, and the space
    it holds, is gone either way; another fault stays as it was."""
    import errno

    from hpsearch.search import checkpoint_writes

    def save_until_full(checkpoint, path):
        path.write_bytes(b"x" * 100)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    monkeypatch.setattr(checkpoint_writes.torch, "save", save_until_full)
    monkeypatch.setattr(checkpoint_writes, "disk_is_full", lambda folder: disk_full)
    target = tmp_path / "epoch-0001.ckpt"
    with pytest.raises(OSError if disk_full else RuntimeError) as raised:
        checkpoint_writes.CheckpointFileWriter().save_checkpoint({"state": 1}, str(target))
    assert (raised.value.errno == errno.ENOSPC) if disk_full else not isinstance(raised.value, OSError)
    assert list(tmp_path.iterdir()) == []


def test_a_disk_is_full_below_a_mebibyte_left_to_this_user(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from hpsearch.search import checkpoint_writes

    def left(blocks: int):
        return lambda folder: SimpleNamespace(f_bavail=blocks, f_bfree=blocks + 10**6, f_frsize=4096)

    monkeypatch.setattr(checkpoint_writes.os, "statvfs", left(255))  # 1020 KiB: full
    assert checkpoint_writes.disk_is_full(tmp_path)
    monkeypatch.setattr(checkpoint_writes.os, "statvfs", left(257))  # 1028 KiB
    assert not checkpoint_writes.disk_is_full(tmp_path)
    monkeypatch.undo()
    assert not checkpoint_writes.disk_is_full(tmp_path / "gone")  # no file system to ask: not said full


def test_a_checkpoint_that_cannot_be_pickled_is_no_full_disk(tmp_path, monkeypatch):
    import pickle

    from hpsearch.search import checkpoint_writes

    monkeypatch.setattr(checkpoint_writes, "disk_is_full", lambda folder: True)  # a small volume, nearly full
    with pytest.raises((pickle.PicklingError, AttributeError)) as raised:  # torch's: "Can't pickle local object"
        checkpoint_writes.CheckpointFileWriter().save_checkpoint({"f": lambda: 0}, str(tmp_path / "e.ckpt"))
    assert not isinstance(raised.value, OSError) and list(tmp_path.iterdir()) == []
