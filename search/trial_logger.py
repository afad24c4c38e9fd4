"""A trial's TensorBoard logger: epoch metrics stepped by the epoch, so trials line up.

Lightning steps every scalar by the batches trained. With a searched batch size (the
quickstart's 32 to 256) the same epoch of two trials fell at steps eight times apart,
and TensorBoard, whose x-axis is the step, drew their validation curves side by side
instead of over each other. Ray Tune's own TensorBoard logger steps by the report, an
epoch here; this one does the same for what is logged once an epoch:

    tensorboard/trial_0003-lr=0.01/         the trial's run: what is logged once an epoch
                                            (validation, epoch means, the learning rate,
                                            hpsearch's speed/ and hp/), at the epoch: 1, 2, ...
    tensorboard/trial_0003-lr=0.01/steps/   what is logged at training steps (``self.log``
                                            in ``training_step``, Lightning's default
                                            there), at Lightning's step (the batches that
                                            stepped an optimizer, from 0); only for models
                                            that log any

A resumed attempt redoes what came after its checkpoint: each run hides the events an
earlier attempt wrote from the first epoch, or batch, the resumed one redoes
(TensorBoard's purge step), so each curve keeps one point per step. A trial checkpointed
before runs were stepped by the epoch resumes stepping its run by the batch, as its
earlier attempts did.
"""

from __future__ import annotations

import time
import weakref
from pathlib import Path
from typing import Any, Mapping

import pytorch_lightning as pl
from pytorch_lightning.loggers import TensorBoardLogger
from pytorch_lightning.utilities import rank_zero_only

from .checkpoints import TENSORBOARD_BY_EPOCH, ResumedAt
from .tensorboard_layout import STEPS_RUN, TEST_RECORD


class TrialLogger(TensorBoardLogger):
    """A ``TensorBoardLogger`` whose once-an-epoch scalars go to the trial's run at the
    epoch's number, and whose per-step scalars go to its ``steps`` run at Lightning's step.
    ``logger.experiment`` is the trial's run, as with Lightning's logger: give what you
    write there the epoch as its step (``self.current_epoch + 1``) to line it up."""

    def __init__(self, run: Path, resumed_at: ResumedAt | None = None) -> None:
        self.by_epoch = resumed_at is None or resumed_at.by_epoch
        purge = (resumed_at.epoch if self.by_epoch else resumed_at.batch) if resumed_at else None
        steps_purge = resumed_at.batch if resumed_at else None
        if resumed_at is None:
            # An attempt that starts over, its trial having no checkpoint yet (an attempt
            # that failed, or a session that stopped, in the first epoch), hides all that
            # the attempts before it wrote: each of their points was there twice (audit 22).
            if _trials_own_events(run):
                purge = 0
                after_earlier_event_files(run)
            if _trials_own_events(run / STEPS_RUN):
                steps_purge = 0
        super().__init__(save_dir=str(run.parent), name="", version=run.name, default_hp_metric=False,
                         **({"purge_step": purge} if purge is not None else {}))
        self._steps = TensorBoardLogger(save_dir=str(run), name="", version=STEPS_RUN, default_hp_metric=False,
                                        **({"purge_step": steps_purge} if steps_purge is not None else {}))
        self._trainer: weakref.ref[pl.Trainer] | None = None
        self.step_metrics: set[str] = set()  # the names written to the steps run

    @rank_zero_only
    def log_hyperparams(self, params: Any, metrics: Any = None, step: int | None = None) -> None:
        """The model's hyperparameters, kept as Lightning keeps them (``hparams.yaml``), and
        ``metrics`` logged as scalars; but no HParams record goes to the trial's run. hpsearch
        writes the trial's own at its end (its sampled values, state and epochs), and
        TensorBoard shows only a run's first: Lightning's documented ``log_hyperparams(
        self.hparams, {"hp/x": 0})`` in a model's ``on_train_start`` took the trial's place in
        the HParams tab (audit 63)."""
        super().log_hyperparams(params)  # with no metrics (and no default hp_metric): no record
        if metrics is not None:
            self.log_metrics(metrics if isinstance(metrics, Mapping) else {"hp_metric": metrics}, step)

    def follow(self, trainer: pl.Trainer) -> None:
        """The trainer whose loop tells an epoch's scalars from a step's."""
        self._trainer = weakref.ref(trainer)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        trainer = self._trainer() if self._trainer is not None else None
        if trainer is None or not self.by_epoch:
            super().log_metrics(metrics, step)
        elif trainer._logger_connector._first_loop_iter is not None:
            # inside a loop's batches: Lightning's per-step logging (its own flag for it)
            if self._steps._experiment is None:
                after_earlier_event_files(Path(self._steps.log_dir))
            self.step_metrics.update(metrics)
            self._steps.log_metrics(metrics, step)
        else:
            # an epoch's end, or an epoch's start (the learning rate for the epoch to come);
            # Lightning's own ``epoch`` scalar only repeats the x-axis there
            self.log_epoch_metrics({name: value for name, value in metrics.items() if name != "epoch"},
                                   trainer.current_epoch + 1)

    @rank_zero_only
    def log_epoch_metrics(self, metrics: Mapping[str, Any], epoch: int) -> None:
        """Scalars of the epoch ``epoch`` (counted from 1), logged whenever: hpsearch logs
        an epoch's speed when the next one starts. A run stepped by the batch has them at
        the step of the epoch's own metrics, its last batch's (as Lightning counts the
        batches that stepped an optimizer: its own ``LearningRateMonitor`` reads it too)."""
        trainer = self._trainer() if self._trainer is not None else None
        if not self.by_epoch and trainer is not None:
            epoch = max(0, trainer.fit_loop.epoch_loop._batches_that_stepped - 1)
        super().log_metrics(metrics, step=epoch)

    @rank_zero_only
    def flush(self) -> None:
        """Both runs' events to disk now."""
        self.experiment.flush()
        if self._steps._experiment is not None:
            self._steps._experiment.flush()

    @rank_zero_only
    def save(self) -> None:
        super().save()
        if self._steps._experiment is not None:
            self._steps._experiment.flush()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        super().finalize(status)
        if self._steps._experiment is not None:
            self._steps._experiment.flush()
            self._steps._experiment.close()


class StepsByEpochInCheckpoint(pl.Callback):
    """Marks the trial's checkpoints: its TensorBoard run is stepped by the epoch."""

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        logger = trainer.logger
        checkpoint[TENSORBOARD_BY_EPOCH] = isinstance(logger, TrialLogger) and logger.by_epoch


def _trials_own_events(run: Path) -> bool:
    """Whether an attempt of the trial wrote events in ``run`` (the driver's HParams record
    and test metrics, files of their own, are left aside: written once the trial ended)."""
    return any(not p.name.endswith((".hparams", TEST_RECORD)) for p in run.glob("events.out.tfevents.*"))


def after_earlier_event_files(run: Path) -> None:
    """Wait, if need be, until the clock is past the newest event file's second.

    TensorBoard reads a run's event files in name order, and names start with the
    second they were opened in; a retry opened within the same second could sort before
    the attempt it continues, and the resumed curve would be read out of order.
    """
    seconds = [int(p.name.split(".")[3]) for p in run.glob("events.out.tfevents.*")
               if p.name.split(".")[3].isdigit()]
    while seconds and time.time() < max(seconds) + 1:
        time.sleep(0.05)
