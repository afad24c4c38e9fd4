"""A trial's checkpoints: each epoch's state is serialized once, best.ckpt stays right and
independent of the resume files, and resume knows the best score."""

from __future__ import annotations

import pytest
import pytorch_lightning as pl
import torch

from hpsearch.models.mlp import MLPClassifier
from hpsearch.models.synthetic import SyntheticImagesDataModule

SETTINGS = "{'monitor': 'score', 'mode': 'max', 'every_n_train_steps': 0, 'every_n_epochs': 1, " \
           "'train_time_interval': None}"
STATE_KEY = f"hpsearch.BestCheckpoint{SETTINGS}"
PLAIN_STATE_KEY = f"ModelCheckpoint{SETTINGS}"  # before: shared with a user's ModelCheckpoint on the metric


class ScriptedScore(MLPClassifier):
    """Logs ``scores[epoch]`` as the search metric ``score``."""

    def __init__(self, scores: list[float], **kwargs) -> None:
        super().__init__(**kwargs)
        self.scores = scores

    def on_validation_epoch_end(self) -> None:
        self.log("score", float(self.scores[self.current_epoch]))


class ScriptedScoreWithItsOwnCheckpoint(ScriptedScore):
    """A user's model whose configure_callbacks adds a ModelCheckpoint on the search metric."""

    def __init__(self, scores: list[float], own_dir: str = "", **kwargs) -> None:
        super().__init__(scores, **kwargs)
        self.own_dir = own_dir

    def configure_callbacks(self):
        return [pl.callbacks.ModelCheckpoint(dirpath=self.own_dir, monitor="score", mode="max")]


class ScriptedScoreOnPlateau(ScriptedScore):
    """Its learning rate is cut tenfold at every epoch whose score does not fall."""

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=1.0)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.1, patience=0)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": plateau, "monitor": "score", "interval": "epoch"}}


def data() -> SyntheticImagesDataModule:
    return SyntheticImagesDataModule(num_samples=40, image_size=4, channels=1, batch_size=8, val_fraction=0.2,
                                     test_fraction=0.2)


def fit(tmp_path, scores: list[float], monkeypatch, resume_from=None, own_checkpoint: bool = False,
        model_class: type | None = None, resumed: bool = False) -> int:
    """Fit for ``len(scores)`` epochs; returns how many checkpoints were serialized."""
    from pathlib import Path

    from hpsearch.search.checkpoints import resumed_at
    from hpsearch.search.config import LoaderConfig, ResourcesConfig, TrainerConfig
    from hpsearch.search.devices import trial_device
    from hpsearch.search.lightning_trainer import build_trainer

    saves: list[str] = []
    save = pl.Trainer.save_checkpoint

    def counted_save(trainer, filepath, *args, **kwargs):
        saves.append(str(filepath))
        return save(trainer, filepath, *args, **kwargs)

    monkeypatch.setattr(pl.Trainer, "save_checkpoint", counted_save)
    settings = TrainerConfig(early_stopping_patience=None)
    dm = data()
    model = (model_class or ScriptedScore)(scores, input_shape=dm.input_shape, num_classes=dm.num_classes) \
        if not own_checkpoint else ScriptedScoreWithItsOwnCheckpoint(scores, own_dir=str(tmp_path / "own"),
                                                                    input_shape=dm.input_shape,
                                                                    num_classes=dm.num_classes)
    trainer = build_trainer(settings, device=trial_device(settings, LoaderConfig(), ResourcesConfig()),
                            metric="score", mode="max", max_epochs=len(scores), trial_dir=tmp_path,
                            tensorboard_run=tmp_path / "tb" / "run", callbacks=[],
                            resumed_at=resumed_at(Path(resume_from)) if resumed else None)
    trainer.fit(model, datamodule=dm, ckpt_path=resume_from)
    return len(saves)


def load(path):
    return torch.load(path, map_location="cpu", weights_only=False)


def test_each_epoch_is_serialized_once_and_best_is_a_separate_copy(tmp_path, monkeypatch):
    saves = fit(tmp_path, [1.0, 3.0, 2.0, 4.0], monkeypatch)
    # two plain ModelCheckpoints serialized 4 epochs + 3 new bests = 7 times
    assert saves == 4
    folder = tmp_path / "checkpoints"
    assert sorted(p.name for p in folder.iterdir()) == ["best.ckpt", "epoch-0002.ckpt", "epoch-0003.ckpt"]
    best, newest = load(folder / "best.ckpt"), load(folder / "epoch-0003.ckpt")
    assert best["epoch"] == 3 and best["global_step"] == newest["global_step"]
    assert all(torch.equal(best["state_dict"][k], v) for k, v in newest["state_dict"].items())
    # a copy, not a link: damage to the resume file leaves the best weights whole
    assert (folder / "best.ckpt").stat().st_ino != (folder / "epoch-0003.ckpt").stat().st_ino
    # every epoch file holds the best score as of its own epoch, under the callback's own key
    assert load(folder / "epoch-0002.ckpt")["callbacks"][STATE_KEY]["best_model_score"] == 3.0
    assert newest["callbacks"][STATE_KEY]["best_model_score"] == 4.0


def test_a_resumed_trial_keeps_its_best_when_later_epochs_are_worse(tmp_path, monkeypatch):
    fit(tmp_path, [1.0, 3.0, 2.0], monkeypatch)
    folder = tmp_path / "checkpoints"
    assert load(folder / "best.ckpt")["epoch"] == 1
    fit(tmp_path, [1.0, 3.0, 2.0, 2.5], monkeypatch, resume_from=folder / "epoch-0002.ckpt")
    # 2.5 is below the restored best (3.0): best.ckpt is still epoch 1's, though
    # epoch-0001.ckpt, the file it was copied from, has been rotated away
    assert load(folder / "best.ckpt")["epoch"] == 1
    assert sorted(p.name for p in folder.glob("epoch-*")) == ["epoch-0002.ckpt", "epoch-0003.ckpt"]


def test_a_resumed_trial_removes_the_epoch_it_resumed_from_once_two_newer_are_written(tmp_path, monkeypatch):
    # Lightning never removes the checkpoint a fit resumed from: a paused trial kept one
    # stale epoch file more for every resume.
    fit(tmp_path, [1.0], monkeypatch)
    folder = tmp_path / "checkpoints"
    fit(tmp_path, [1.0, 3.0, 2.0, 2.5], monkeypatch, resume_from=folder / "epoch-0000.ckpt")
    assert sorted(p.name for p in folder.glob("epoch-*")) == ["epoch-0002.ckpt", "epoch-0003.ckpt"]
    assert load(folder / "best.ckpt")["epoch"] == 1


def test_a_models_own_checkpoint_on_the_search_metric_leaves_the_trials_best_alone(tmp_path, monkeypatch):
    # Both callbacks saved their state under one key: after a resume, hpsearch's callback
    # restored the user's (another dirpath, so no best score) and took epoch 3's 2.0 as best.
    fit(tmp_path, [1.0, 3.0, 0.5], monkeypatch, own_checkpoint=True)
    folder = tmp_path / "checkpoints"
    assert load(folder / "epoch-0002.ckpt")["callbacks"][STATE_KEY]["best_model_score"] == 3.0
    fit(tmp_path, [1.0, 3.0, 0.5, 2.0], monkeypatch, resume_from=folder / "epoch-0002.ckpt", own_checkpoint=True)
    assert load(folder / "best.ckpt")["epoch"] == 1
    assert load(folder / "epoch-0003.ckpt")["callbacks"][STATE_KEY]["best_model_score"] == 3.0



def test_a_models_own_checkpoint_keeps_its_top_k_across_a_resume(tmp_path, monkeypatch):
    """Such a callback saves, by Lightning's default, at the training epoch's end, after
    hpsearch has written the epoch's checkpoint: that file held its state as of the epoch
    before. Resumed from it, the callback did not know its newest file, kept it for good
    and wrote the epoch again beside it (``-v1``) when Lightning ran the epoch's end
    again: three files for ``save_top_k=1`` (audit 23)."""
    fit(tmp_path, [1.0, 3.0, 0.5], monkeypatch, own_checkpoint=True)
    folder, own = tmp_path / "checkpoints", tmp_path / "model_checkpoints" / "own"
    [user_key] = [key for key in load(folder / "epoch-0001.ckpt")["callbacks"] if key.startswith("ModelCheckpoint")]
    assert load(folder / "epoch-0001.ckpt")["callbacks"][user_key]["best_model_score"] == 3.0  # its own epoch's
    # a fault in epoch 3 (index 2): the retry starts from epoch 2's (index 1) checkpoint
    fit(tmp_path, [1.0, 3.0, 0.5, 4.0], monkeypatch, resume_from=folder / "epoch-0001.ckpt", own_checkpoint=True)
    [kept] = own.iterdir()
    assert kept.name.startswith("epoch=3-"), kept.name

def test_trials_whose_model_names_one_checkpoint_folder_each_write_into_a_folder_of_their_own(tmp_path, monkeypatch):
    """Every trial's model named the same ``dirpath``: trials wrote files of the same names
    into it, over each other's (audit 82). Each trial's go in its own model_checkpoints/."""
    from pathlib import Path
    from types import SimpleNamespace

    from hpsearch.search.checkpoint_callbacks import ModelCheckpointsInTrialDir

    for trial in ("trial_0000", "trial_0001"):  # fit() names its ModelCheckpoint's folder tmp_path/trial/own
        fit(tmp_path / trial, [1.0, 3.0], monkeypatch, own_checkpoint=True)
        [kept] = (tmp_path / trial / "model_checkpoints" / "own").iterdir()
        assert kept.name.startswith("epoch=1-"), kept.name
        assert not (tmp_path / trial / "own").exists()
    shared = pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / "shared"))
    placed = ModelCheckpointsInTrialDir(tmp_path / "trial_0002" / "model_checkpoints")
    for _ in range(2):  # a second fit of the trainer leaves it where it is
        placed.setup(SimpleNamespace(checkpoint_callbacks=[shared], callbacks=[shared]), None, "fit")
    assert shared.dirpath == str(tmp_path / "trial_0002" / "model_checkpoints" / "shared")
    assert placed.moved == {str(tmp_path / "shared"): shared.dirpath}
    # two that name folders of one name: each its own (they shared one, told apart by -v1; audit 84)
    first, second = (pl.callbacks.ModelCheckpoint(dirpath=str(tmp_path / run / "ckpt")) for run in ("a", "b"))
    for _ in range(2):  # set up again in a resumed fit: the same folders
        for callback in (first, second):
            callback.dirpath = str(tmp_path / ("a" if callback is first else "b") / "ckpt")
        placed = ModelCheckpointsInTrialDir(tmp_path / "trial_0003" / "model_checkpoints")
        placed.setup(SimpleNamespace(checkpoint_callbacks=[first, second], callbacks=[first, second]), None, "fit")
        assert (Path(first.dirpath).name, Path(second.dirpath).name) == ("ckpt", "ckpt-2")


def test_a_checkpoint_written_under_the_plain_key_resumes_with_its_best_known(tmp_path, monkeypatch):
    # Studies checkpointed before the callbacks had keys of their own.
    fit(tmp_path, [1.0, 3.0, 2.0], monkeypatch)
    folder = tmp_path / "checkpoints"
    old = load(folder / "epoch-0002.ckpt")
    old["callbacks"] = {key.replace("hpsearch.BestCheckpoint", "ModelCheckpoint").replace(
        "hpsearch.EpochCheckpoints", "ModelCheckpoint"): state for key, state in old["callbacks"].items()}
    assert PLAIN_STATE_KEY in old["callbacks"]
    torch.save(old, folder / "epoch-0002.ckpt")
    fit(tmp_path, [1.0, 3.0, 2.0, 2.5], monkeypatch, resume_from=folder / "epoch-0002.ckpt")
    assert load(folder / "best.ckpt")["epoch"] == 1  # 2.5 is below the restored 3.0


def test_a_trial_whose_study_moved_resumes_with_its_best_known(tmp_path, monkeypatch):
    """A study copied elsewhere, or one in S3 resumed through another cache path (audit
    30): Lightning restores a ModelCheckpoint's best score only when its folder's path is
    the one saved, so the resumed trial took any later epoch for its best, and best.ckpt
    and the trial's value with it."""
    import shutil

    fit(tmp_path / "here", [1.0, 3.0, 2.0], monkeypatch)
    shutil.move(tmp_path / "here", tmp_path / "moved")
    folder = tmp_path / "moved" / "checkpoints"
    fit(tmp_path / "moved", [1.0, 3.0, 2.0, 2.5], monkeypatch, resume_from=folder / "epoch-0002.ckpt")
    assert load(folder / "best.ckpt")["epoch"] == 1  # 2.5 is below the restored 3.0
    assert not (tmp_path / "here").exists()  # nothing was written to where the study was
    state = load(folder / "epoch-0003.ckpt")["callbacks"][STATE_KEY]
    assert state["best_model_score"] == 3.0 and state["best_model_path"] == str(folder / "best.ckpt"), state


def test_a_resumed_trial_keeps_every_cut_of_its_plateau_scheduler(tmp_path, monkeypatch):
    # Lightning steps ReduceLROnPlateau after an epoch's checkpoint is written and skips
    # that step when resuming from it: a retried or resumed trial lost one cut each time.
    def learning_rate(checkpoint) -> float:
        return load(checkpoint)["optimizer_states"][0]["param_groups"][0]["lr"]

    scores = [1.0, 2.0, 3.0, 4.0]  # never falling: a cut after every epoch but the first
    fit(tmp_path / "whole", scores, monkeypatch, model_class=ScriptedScoreOnPlateau)
    fit(tmp_path / "resumed", scores[:3], monkeypatch, model_class=ScriptedScoreOnPlateau)
    folder = tmp_path / "resumed" / "checkpoints"
    fit(tmp_path / "resumed", scores, monkeypatch, model_class=ScriptedScoreOnPlateau,
        resume_from=folder / "epoch-0002.ckpt")
    whole = learning_rate(tmp_path / "whole" / "checkpoints" / "epoch-0003.ckpt")
    assert learning_rate(folder / "epoch-0003.ckpt") == pytest.approx(whole) == pytest.approx(0.01)


def test_a_best_epoch_no_epoch_file_was_written_for_is_written_at_the_epochs_end(tmp_path):
    from hpsearch.search.checkpoint_callbacks import BestCheckpoint

    dm = data()
    best = BestCheckpoint(dirpath=tmp_path, filename="best", monitor="score", mode="max", save_top_k=1,
                          enable_version_counter=False, save_on_train_epoch_end=False)
    trainer = pl.Trainer(max_epochs=2, callbacks=[best], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(ScriptedScore([2.0, 1.0], input_shape=dm.input_shape, num_classes=dm.num_classes), datamodule=dm)
    assert load(tmp_path / "best.ckpt")["epoch"] == 0
    assert not list(tmp_path.glob("*.partial"))


def test_a_trials_own_checkpoint_folder_holding_its_earlier_checkpoints_is_not_warned_of(tmp_path):
    """Lightning's "Checkpoint directory ... exists and is not empty" began every resumed
    trial's output.log: the folder is the trial's own, and holds its checkpoints on purpose."""
    import warnings

    from hpsearch.search.checkpoint_callbacks import BestCheckpoint

    (tmp_path / "epoch-0000.ckpt").write_bytes(b"an earlier attempt's")
    best = BestCheckpoint(dirpath=tmp_path, filename="best", monitor="score", mode="max")
    trainer = pl.Trainer(callbacks=[best], logger=False, enable_progress_bar=False, enable_model_summary=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        best.setup(trainer, None, "fit")
    assert not [str(w.message) for w in caught if "exists and is not empty" in str(w.message)]
    assert best.dirpath == str(tmp_path)


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed"])
def test_sharded_strategies_write_best_themselves(strategy):
    """Their checkpoints are directories of shards, which ``replace_with_copy`` cannot copy."""
    from pytorch_lightning.strategies import DeepSpeedStrategy, FSDPStrategy

    from hpsearch.search.checkpoint_callbacks import BestCheckpoint

    written: list[str] = []

    class Sharded(FSDPStrategy if strategy == "fsdp" else DeepSpeedStrategy):
        def __init__(self) -> None:  # no process group or DeepSpeed needed to ask the type
            pass

    class FakeTrainer:
        global_step = 5

        def __init__(self) -> None:
            self.strategy = Sharded()

        def save_checkpoint(self, path, weights_only=False):
            written.append(path)

        is_global_zero, loggers = True, []

    best = BestCheckpoint(dirpath="/nonexistent", filename="best", monitor="score", mode="max")
    best._save_checkpoint(FakeTrainer(), "/nonexistent/best.ckpt")
    assert written == ["/nonexistent/best.ckpt"] and best._deferred_path is None


class ScriptedScoreOnPlateauTunedByLightning(ScriptedScoreOnPlateau):
    """Also runs Lightning's BatchSizeFinder at each fit's start, which saves and restores a
    checkpoint of its own there."""

    trained_epochs: list[int] = []

    def configure_callbacks(self):
        return [pl.callbacks.BatchSizeFinder(mode="power", init_val=8, max_trials=1, steps_per_trial=1)]

    def on_train_epoch_start(self) -> None:
        self.trained_epochs.append(self.current_epoch)


@pytest.mark.parametrize("resume_at_epoch", [1, 2])
def test_a_trial_resumed_with_lightnings_batch_size_finder_trains_on_from_its_checkpoint(tmp_path, monkeypatch,
                                                                                        resume_at_epoch):
    # The finder runs between the resume's restore of the model and its restore of the
    # optimizer and loops, and its own restore emptied the checkpoint held for those: the
    # resumed trial trained again from epoch 0 (and with it, a plateau cut owed was lost).
    def learning_rate(checkpoint) -> float:
        return load(checkpoint)["optimizer_states"][0]["param_groups"][0]["lr"]

    model = ScriptedScoreOnPlateauTunedByLightning
    scores = [1.0, 2.0, 3.0, 4.0]  # never falling: a cut after every epoch but the first
    fit(tmp_path / "whole", scores, monkeypatch, model_class=model)
    fit(tmp_path / "resumed", scores[:resume_at_epoch + 1], monkeypatch, model_class=model)
    folder = tmp_path / "resumed" / "checkpoints"
    model.trained_epochs.clear()
    fit(tmp_path / "resumed", scores, monkeypatch, model_class=model,
        resume_from=folder / f"epoch-{resume_at_epoch:04d}.ckpt")
    assert model.trained_epochs[1:] == list(range(resume_at_epoch + 1, 4))  # [0]: the finder's own step
    whole = learning_rate(tmp_path / "whole" / "checkpoints" / "epoch-0003.ckpt")
    assert learning_rate(folder / "epoch-0003.ckpt") == pytest.approx(whole) == pytest.approx(0.01)


class ScriptedScoreTunedByLearningRateFinder(ScriptedScore):
    trained_epochs: list[int] = []

    def __init__(self, scores: list[float], **kwargs) -> None:
        super().__init__(scores, lr=0.01, **kwargs)

    def configure_callbacks(self):
        return [pl.callbacks.LearningRateFinder(num_training_steps=3)]

    def on_train_epoch_start(self) -> None:
        self.trained_epochs.append(self.current_epoch)


def test_a_trial_resumed_with_lightnings_learning_rate_finder_trains_on_with_the_rate_it_found(tmp_path, monkeypatch):
    # The finder's own restore left the resumed trial to train again from epoch 0 on its
    # trained weights, and report its epochs again over the study's (audit 70).
    def learning_rate(checkpoint) -> float:
        return load(checkpoint)["optimizer_states"][0]["param_groups"][0]["lr"]

    model = ScriptedScoreTunedByLearningRateFinder
    scores = [1.0, 2.0, 3.0, 4.0]
    fit(tmp_path, scores[:3], monkeypatch, model_class=model)
    folder = tmp_path / "checkpoints"
    found = learning_rate(folder / "epoch-0002.ckpt")
    # as the finder leaves a rate it suggests (these few steps suggest none) in the model's
    # hyperparameters, which the checkpoint keeps
    checkpoint = load(folder / "epoch-0002.ckpt")
    checkpoint["hyper_parameters"]["lr"] = 0.0042
    torch.save(checkpoint, folder / "epoch-0002.ckpt")
    model.trained_epochs.clear()
    fit(tmp_path, scores, monkeypatch, model_class=model, resume_from=folder / "epoch-0002.ckpt", resumed=True)
    assert model.trained_epochs == [3]  # the finder's own steps would have come first, at epoch 0
    assert learning_rate(folder / "epoch-0003.ckpt") == found
    # and the model's own record of it, which went back to the sampled 0.01 (audit 72)
    assert load(folder / "epoch-0003.ckpt")["hyper_parameters"]["lr"] == 0.0042
