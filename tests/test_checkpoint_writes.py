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
                            profiler=reporter.fetch_timer)
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
