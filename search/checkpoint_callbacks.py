"""A trial's two checkpoint callbacks, which write each epoch's state once.

The best epoch so far is usually also one of the two newest (early in training, most
epochs improve). Two plain ModelCheckpoints then serialize the same model and optimizer
state twice: 1.9-3.4 s for 600 MB here, against 0.4-0.5 s to copy the written file. (Both
write the same bytes, so where the disk is the limit the copy saves little; see
``benchmarks/checkpoints.py``.) So the best callback only records its
decision. The newest-epochs callback runs after it and writes the file once, with both
callbacks' updated state. That file is then copied to ``best.ckpt``.

It is a copy, not a hard link. A link would tie the two names to one inode, so damage to
one (a truncated file, a bad block) would take the best weights with the resume point.
Sharded strategies (FSDP, DeepSpeed) write a checkpoint as a directory of shards, so
their two callbacks each write as before.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path
from weakref import proxy

import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.strategies import DeepSpeedStrategy, FSDPStrategy


class _OwnStateKey(ModelCheckpoint):
    """Saves and restores its state under a key of its own (``hpsearch.BestCheckpoint{...}``):
    a ModelCheckpoint of the user's model (``configure_callbacks``) on the same metric has
    plain ModelCheckpoint's key, and sharing it, one callback's state overwrote the other's
    in every checkpoint, so after a retry or resume the best score and ``best.ckpt`` came
    from the user's callback. A checkpoint written before has the state under that plain
    key, where it is read from when its own is missing: such studies resume with their best
    score known."""

    @property
    def state_key(self) -> str:
        return f"hpsearch.{super().state_key}"

    def _plain_state_key(self) -> str:
        return super().state_key.replace(type(self).__qualname__, ModelCheckpoint.__qualname__, 1)

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        state_from_plain_key(checkpoint, self.state_key, self._plain_state_key())

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # The folder is the trial's own: its earlier attempts' checkpoints are there on purpose,
        # and Lightning's warning of them began every resumed trial's output.log (audit 45).
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
            super().setup(trainer, pl_module, stage)

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_moved_to(state_dict, self.dirpath))


def state_moved_to(state: dict, dirpath: str | None) -> dict:
    """A ModelCheckpoint's saved state, its paths moved into ``dirpath`` where it was saved
    in another folder: the trial's own, at another path (a study copied elsewhere, or one in
    cloud storage resumed through another machine's cache). Lightning restores the best
    score only when the saved folder is the current one, and the resumed trial then took
    any later epoch for its best (audit 30)."""
    saved = state.get("dirpath")
    if not saved or not dirpath or saved == dirpath:
        return state

    def moved(path):
        if isinstance(path, str) and path and os.path.dirname(path) == saved:
            return os.path.join(dirpath, os.path.basename(path))
        return path

    state = dict(state, dirpath=dirpath)
    for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
        if key in state:
            state[key] = moved(state[key])
    if isinstance(state.get("best_k_models"), dict):
        state["best_k_models"] = {moved(path): score for path, score in state["best_k_models"].items()}
    return state


def state_from_plain_key(checkpoint: dict, own_key: str, plain_key: str) -> None:
    """For a callback whose state key became its own: a checkpoint written before holds its
    state under ``plain_key``, and it is read from there when ``own_key`` is missing (called
    from ``on_load_checkpoint``: Lightning restores each callback's state from
    ``checkpoint["callbacks"]`` just after that hook)."""
    states = checkpoint.get("callbacks") or {}
    if own_key not in states and plain_key in states:
        states[own_key] = states[plain_key]


class BestCheckpoint(_OwnStateKey):
    """The epoch with the best monitored value. When ``EpochCheckpoints`` writes the same
    step, this file is a copy of that write (see the module docstring)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._deferred_path: str | None = None  # this step's best, until the epoch file exists

    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        if isinstance(trainer.strategy, (FSDPStrategy, DeepSpeedStrategy)):
            super()._save_checkpoint(trainer, filepath)
            return
        # The same decision on every rank (ModelCheckpoint reduces it), so no rank waits
        # in a barrier of trainer.save_checkpoint that the others skip.
        self._deferred_path = filepath
        self._last_global_step_saved = trainer.global_step
        self._last_checkpoint_saved = filepath

    def copy_from(self, trainer: pl.Trainer, written: str) -> None:
        """Called by ``EpochCheckpoints`` once it has written ``written`` for this step."""
        if self._deferred_path is None:
            return
        target, self._deferred_path = self._deferred_path, None
        if trainer.is_global_zero:  # only rank 0 writes checkpoint files
            replace_with_copy(written, target)
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._deferred_path is not None:  # no epoch file was written at this step
            target, self._deferred_path = self._deferred_path, None
            super()._save_checkpoint(trainer, target)


class EpochCheckpoints(_OwnStateKey):
    """The newest epochs, for resume; hands each file it writes to ``best``."""

    def __init__(self, best: BestCheckpoint, **kwargs) -> None:
        super().__init__(**kwargs)
        self.best = best

    def _save_checkpoint(self, trainer: pl.Trainer, filepath: str) -> None:
        super()._save_checkpoint(trainer, filepath)
        self.best.copy_from(trainer, filepath)

    def _should_remove_checkpoint(self, trainer: pl.Trainer, previous: str, current: str) -> bool:
        """Lightning never removes the checkpoint a fit resumed from. Here it is one of the
        trial's own epoch files, no longer a resume point once two newer ones are written: a
        paused trial kept one stale epoch file more for every resume."""
        return previous != current and Path(str(self.dirpath)).absolute() in Path(previous).absolute().parents


def replace_with_copy(source: str, target: str) -> None:
    """Make ``target`` a copy of ``source`` in one rename, so a reader never sees half of it."""
    partial = f"{target}.partial"
    try:
        shutil.copyfile(source, partial)
    except OSError:
        Path(partial).unlink(missing_ok=True)  # half a file, and the space it holds (a full disk)
        raise
    os.replace(partial, target)


class ModelCheckpointsInTrialDir(pl.Callback):
    """Fits a ModelCheckpoint of the user's model (``configure_callbacks``) into the trial.

    One that names no ``dirpath`` gets the trial's ``model_checkpoints/`` folder.
    Lightning's default is beside the logger's files, so its checkpoints sat inside the
    study's ``tensorboard/`` folder; and the final evaluation's trainer, which logs
    elsewhere, resolved another folder, so restoring the callback's state from the best
    checkpoint made Lightning warn that its folder had changed. One that names a
    ``dirpath`` gets a folder of that name inside it (``moved`` maps each): every trial,
    and the preflight's, wrote the same file names into one folder, over each other's
    (audit 82).

    It saves at the end of validation, just before hpsearch's own checkpoint callbacks,
    so that the epoch's checkpoint holds its state as of that epoch. By Lightning's default
    it saved at the training epoch's end, after that checkpoint was written: resumed from
    it, the callback did not know its newest file, kept it for good, and wrote the epoch
    again beside it (``-v1``) when Lightning ran the epoch's end again. A trial validates
    once an epoch, at its end, so both are the same moment. (One that asks for
    ``save_on_train_epoch_end=True`` itself is left so.)

    Runs in ``setup``, once the model's callbacks are attached and before the checkpoint
    callbacks' own ``setup`` (Lightning puts checkpoint callbacks last)."""

    def __init__(self, dirpath: Path) -> None:
        self.dirpath = dirpath
        self.moved: dict[str, str] = {}  # a dirpath the model named: the trial's folder it got

    def _folder_for(self, named: str) -> str:
        """The trial's folder for a ``dirpath`` the model named: one of that folder's name,
        numbered where another named folder of the same name has it (``runs_a/ckpt`` and
        ``runs_b/ckpt`` shared one, their files told apart by Lightning's ``-v1`` only;
        audit 84). Callbacks are set up in the order the model gives them, alike in every
        fit of the trial, so each gets the same folder at every resume."""
        name = Path(named.rstrip("/")).name or "root"
        taken = set(self.moved.values())
        folder, number = self.dirpath / name, 2
        while str(folder) in taken:
            folder, number = self.dirpath / f"{name}-{number}", number + 1
        return str(folder)

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        users = [callback for callback in trainer.checkpoint_callbacks
                 if isinstance(callback, ModelCheckpoint) and not isinstance(callback, _OwnStateKey)]
        for callback in users:
            if callback.dirpath is None:
                callback.dirpath = str(self.dirpath)
            elif not str(callback.dirpath).startswith(str(self.dirpath)):  # not set here before (a second fit)
                named = str(callback.dirpath)
                if named not in self.moved:
                    self.moved[named] = self._folder_for(named)
                callback.dirpath = self.moved[named]
            if callback._save_on_train_epoch_end is None:  # Lightning's "decide at fit", its constructor's default
                callback._save_on_train_epoch_end = False
        if users:
            # hpsearch's after the user's. Only callbacks after this one move, so the
            # ``setup`` calls Lightning is making over this list reach each one once.
            ours = [callback for callback in trainer.callbacks if isinstance(callback, _OwnStateKey)]
            trainer.callbacks[:] = [callback for callback in trainer.callbacks if callback not in ours] + ours
