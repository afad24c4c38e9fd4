"""The Lightning ``Trainer`` of one trial, with early stopping, checkpoints and TensorBoard."""

from __future__ import annotations

import logging
import math
import random
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import EarlyStopping, LearningRateMonitor

from .checkpoint_callbacks import BestCheckpoint, EpochCheckpoints, ModelCheckpointsInTrialDir, state_from_plain_key
from .checkpoint_writes import CheckpointFileWriter
from .checkpoints import BEST_CHECKPOINT, ResumedAt, checkpoint_dir, model_checkpoint_dir
from .config import TrainerConfig
from .devices import TrialDevice
from .trial_logger import StepsByEpochInCheckpoint, TrialLogger


LIGHTNING_LOGGERS = ("pytorch_lightning", "lightning_fabric")
LIGHTNING_NOISE = (".*does not have many workers.*", ".*LeafSpec.*", ".*litlogger.*", ".*litmodels.*",
                   ".*callbacks used to create the checkpoint.*",
                   ".*smaller than the logging interval.*")  # StepLogsEveryEpoch adapts it


def quiet_lightning() -> None:
    """Lightning's start-up chatter (devices, TPU/HPU availability, tips) on every trial is
    noise. For the life of the process: a trial worker's, which hpsearch owns."""
    for name in LIGHTNING_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for message in LIGHTNING_NOISE:
        warnings.filterwarnings("ignore", message=message)


@contextmanager
def lightning_quieted() -> Iterator[None]:
    """``quiet_lightning`` for a block of the driver (the preflight, the test evaluation),
    which may be the user's own Python session: Lightning's loggers and the warning filters
    are as they were after it. They stayed changed, and the user's own Trainers afterwards
    said nothing of their devices or their end, and none of those warnings (audit 25)."""
    loggers = [logging.getLogger(name) for name in LIGHTNING_LOGGERS]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        quiet_lightning()
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels):
                logger.setLevel(level)


@contextmanager
def ctrl_c_interrupts() -> Iterator[None]:
    """Keep Ctrl+C a ``KeyboardInterrupt`` through a Lightning ``fit``/``validate``/``test``.

    Lightning answers Ctrl+C inside those calls by ignoring further presses and calling
    ``sys.exit(1)``. In hpsearch's driver (the preflight batch, the final test evaluation)
    that ended the CLI with status 1 and not a word, where an interrupted search must say
    how to resume it and exit with 130. (Lightning's teardown puts the SIGINT handler back.)
    """
    try:
        yield
    except SystemExit as exc:
        if isinstance(exc.__context__, KeyboardInterrupt):
            raise KeyboardInterrupt() from None
        raise


def remember_callback_factories() -> None:
    """Let this process's Trainers look up Lightning's callback-factory entry points once.

    Every ``Trainer()`` asks ``importlib.metadata`` for the entry points that add
    callbacks from installed packages, which reads the metadata of every installed
    distribution: 8 ms of a 10 ms ``Trainer()`` here (136 distributions), paid by every
    trial. The answer depends only on ``sys.path`` and what is installed there, so it is
    kept per ``sys.path``; the factories themselves still run for every Trainer. For
    trial workers, which hpsearch owns; a Lightning without that lookup is left as it is.
    """
    from lightning_fabric.utilities import registry

    lookup = getattr(registry, "entry_points", None)
    if lookup is not None and not hasattr(lookup, "remembered"):
        registry.entry_points = _remembered_per_sys_path(lookup)


def _remembered_per_sys_path(lookup: Callable[..., Any]) -> Callable[..., Any]:
    answers: dict[tuple, Any] = {}

    def entry_points(**selection: Any) -> Any:
        key = (tuple(sys.path), tuple(sorted(selection.items())))
        if key not in answers:
            answers[key] = lookup(**selection)  # an immutable EntryPoints tuple
        return answers[key]

    entry_points.remembered = answers  # type: ignore[attr-defined]
    return entry_points


class SearchLearningRateMonitor(LearningRateMonitor):
    """The learning rate in the trial's run at each epoch (``lr-<optimizer>``, a column of
    TensorBoard's HParams). A class of its own, as ``SearchEarlyStopping`` is: a model's own
    LearningRateMonitor (``configure_callbacks``) replaced it, and the trial's run had no
    epoch's learning rate (audit 63). Both run now; at each epoch this one logs only the
    rates the model's does not log then itself (each epoch had two points; audits 65, 67)."""

    def on_train_epoch_start(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        theirs = {callback.logging_interval for callback in trainer.callbacks
                  if isinstance(callback, LearningRateMonitor) and not isinstance(callback, SearchLearningRateMonitor)}
        if theirs <= {"step"}:
            super().on_train_epoch_start(trainer, *args, **kwargs)
            return
        if "epoch" in theirs:
            return  # the model's logs every rate at each epoch
        # Lightning's default (None): the model's logs at each epoch all but the rates of
        # schedulers stepped by the batch, which it logs at steps
        logged = self._extract_stats(trainer, "epoch")
        missing = {name: value for name, value in self._extract_stats(trainer, "any").items() if name not in logged}
        for logger in trainer.loggers if missing else ():
            logger.log_metrics(missing, step=trainer.fit_loop.epoch_loop._batches_that_stepped)


class SearchEarlyStopping(EarlyStopping):
    """``trainer.early_stopping_patience``. A class of its own because Lightning drops a
    Trainer callback when the model's ``configure_callbacks`` returns one of the same
    class: a model's own EarlyStopping silently replaced the file's patience. Both now
    run, and either may stop the trial. Its state has its own key too; a checkpoint
    written before has it under plain EarlyStopping's, where it is read from then."""

    def _plain_state_key(self) -> str:
        return self.state_key.replace(type(self).__qualname__, EarlyStopping.__qualname__, 1)

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        state_from_plain_key(checkpoint, self.state_key, self._plain_state_key())


# Lightning writes step-logged metrics (``self.log`` in ``training_step``'s default) to
# TensorBoard every this many optimizer steps ...
LOG_EVERY_N_STEPS = 10


class StepLogsEveryEpoch(pl.Callback):
    """... or every epoch's steps when an epoch has fewer, so each epoch has its points: a
    trial of 8 batches an epoch, pruned after its first, had no ``train_loss`` at all."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        batches = trainer.num_training_batches
        if math.isfinite(batches):
            steps = max(1, int(batches) // max(1, trainer.accumulate_grad_batches))
            trainer.log_every_n_steps = min(LOG_EVERY_N_STEPS, steps)


# The checkpoints Lightning's tuners write at a fit's start and restore after their trial
# runs (``pytorch_lightning/tuner``: ``.scale_batch_size_<uuid>.ckpt``, ``.lr_find_<uuid>.ckpt``).
BATCH_SIZE_FINDER_CHECKPOINT = ".scale_batch_size_"
TUNER_CHECKPOINT_PREFIXES = (BATCH_SIZE_FINDER_CHECKPOINT, ".lr_find_")


def restored_by_a_tuner(trainer: pl.Trainer) -> bool:
    """Whether the checkpoint being restored is a tuner's own rather than the trial's resume."""
    return Path(str(trainer.ckpt_path or "")).name.startswith(TUNER_CHECKPOINT_PREFIXES)


class LightningTunersOnResume(pl.Callback):
    """A resumed trial trains on from its checkpoint's epoch with Lightning's tuners too.
    They run at the fit's start, after the resume has restored the model and callbacks but
    before it restores the optimizer and the loops' progress, and their own restore empties
    the checkpoint Lightning holds for that: the resumed trial started again at epoch 0
    from its trained weights (plain Lightning does the same), and reported its epochs again
    over the study's (audit 70).

    * The batch-size finder runs again, and the resume's checkpoint is handed back after it
      (a tuner callback runs first at the fit's start: Lightning puts them first).
    * The learning-rate finder runs the fit loop itself and sets the loaders up again, and
      with the resume's loop state handed back after it every later epoch ran no batch. A
      resumed trial does without it: the rate it found at the trial's start is in the
      optimizer's state the checkpoint restores, and in the model's hyperparameters there,
      which are set again (a model that decays its rate from ``self.hparams.lr`` went back
      to the sampled one: audit 72)."""

    def __init__(self, resuming: bool) -> None:
        self._resuming = resuming
        self._resume: tuple[Any, dict] | None = None
        self._emptied_by_a_tuner = False
        self._rate_attributes: list[str] = []  # the attr_name of each learning-rate finder left out

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        from pytorch_lightning.callbacks import LearningRateFinder

        finders = [c for c in trainer.callbacks if isinstance(c, LearningRateFinder)]  # the model's own among them
        if self._resuming and stage == "fit" and finders:
            trainer.callbacks = [c for c in trainer.callbacks if not isinstance(c, LearningRateFinder)]
            self._rate_attributes = [getattr(finder, "_attr_name", "") for finder in finders]
            print("hpsearch: the resumed trial does not run Lightning's LearningRateFinder again: the rate it found "
                  "is in the optimizer's state and the hyperparameters its checkpoint restores", file=sys.stderr)

    def _rates_found(self, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        """Set again the rate each left-out finder set on the model, as its checkpoint holds it."""
        from pytorch_lightning.tuner.lr_finder import _determine_lr_attr_name
        from pytorch_lightning.utilities.parsing import lightning_setattr

        for attribute in self._rate_attributes:
            try:
                name = _determine_lr_attr_name(pl_module, attribute)
            except AttributeError:  # the finder itself would have refused the model
                continue
            found = (checkpoint.get("hyper_parameters") or {}).get(name)
            if found is not None:
                lightning_setattr(pl_module, name, found)

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        if restored_by_a_tuner(trainer):
            # the batch-size finder's (a learning-rate finder's is a fit that did not resume)
            self._emptied_by_a_tuner = self._resume is not None and \
                Path(str(trainer.ckpt_path)).name.startswith(BATCH_SIZE_FINDER_CHECKPOINT)
        else:
            self._resume = (trainer.ckpt_path, checkpoint)
            self._rates_found(pl_module, checkpoint)  # before configure_optimizers reads them

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        resume, self._resume = self._resume, None
        emptied, self._emptied_by_a_tuner = self._emptied_by_a_tuner, False
        connector = trainer._checkpoint_connector
        if resume is not None and emptied and not getattr(connector, "_loaded_checkpoint", True):
            connector._ckpt_path, connector._loaded_checkpoint = resume

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._resume, self._emptied_by_a_tuner = None, False  # a validate's, or one restored after the start
        self._rate_attributes = []


class RandomStateInCheckpoint(pl.Callback):
    """A trial resumed from a checkpoint trains on as it would have without the stop: the
    random state of Python, numpy and torch (CPU and CUDA) is saved with the checkpoint and
    set again just before training goes on, after the trial's start has seeded it and
    built the model. Without it the resumed trial shuffled its batches (and drew its
    dropout) otherwise, and its later epochs' results differed from the uninterrupted
    trial's. Kept as plain lists and tensors, which a weights-only load reads.

    Only a resumed trial's (``resuming``), from the checkpoint it resumes from: Lightning's
    tuners (``BatchSizeFinder``, ``LearningRateFinder``) restore a checkpoint of their own
    after their trial runs, and the random state went back to before them, where plain
    Lightning trains on from after them (audit 63: other batches than plain Lightning's)."""

    def __init__(self, resuming: bool) -> None:
        self._resuming = resuming
        self._restored: dict[str, Any] | None = None
        self._reading_a_tuners = False

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        self._reading_a_tuners = restored_by_a_tuner(trainer)  # Lightning calls load_state_dict next

    def state_dict(self) -> dict[str, Any]:
        version, state, gauss = random.getstate()
        kind, keys, position, has_gauss, cached_gauss = np.random.get_state()
        return {"python": [version, list(state), gauss],
                "numpy": [kind, keys.tolist(), position, has_gauss, cached_gauss],
                "torch": torch.get_rng_state(),
                "torch.cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self._resuming and not self._reading_a_tuners:
            self._restored = state_dict

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._restored is None:
            return
        state, self._restored = self._restored, None
        version, python_state, gauss = state["python"]
        random.setstate((version, tuple(python_state), gauss))
        kind, keys, position, has_gauss, cached_gauss = state["numpy"]
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), position, has_gauss, cached_gauss))
        torch.set_rng_state(state["torch"])
        if state["torch.cuda"] and torch.cuda.is_available() and len(state["torch.cuda"]) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(state["torch.cuda"])


class ValidationLoaderSeedOnResume(pl.Callback):
    """A DataLoader with persistent workers draws its workers' base seed from torch's
    generator when it makes its iterator, once in its life: a validation loader at a
    trial's first validation. A resumed trial makes it again at its first validation after
    the checkpoint, a draw the uninterrupted trial (and plain Lightning) did not make, and
    its shuffling and dropout went on from another point (audit 80: val_loss 1.685 against
    1.693 an epoch later). The generator is set back to where it stood before that
    validation made the iterator (the workers' own seed differs, as README says of
    randomness in loader workers). A training loader's iterator is made in Lightning's
    set-up of the fit, before the random state is set again, so its draw is undone there."""

    def __init__(self, resuming: bool) -> None:
        self._resuming = resuming
        self._before: torch.Tensor | None = None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._resuming:  # until the first validation: it may come after any batch (val_check_interval)
            self._before = torch.get_rng_state()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._resuming or trainer.sanity_checking:
            return
        self._resuming, before, self._before = False, self._before, None
        loaders = trainer.val_dataloaders
        made_now = [loader for loader in (loaders if isinstance(loaders, (list, tuple)) else [loaders])
                    if getattr(loader, "persistent_workers", False) and getattr(loader, "num_workers", 0) > 0
                    and getattr(loader, "generator", None) is None]
        if made_now and before is not None:
            torch.set_rng_state(before)


class PlateauStepOnResume(pl.Callback):
    """The ReduceLROnPlateau step a resumed trial would lose. Lightning steps such a
    scheduler at the epoch's end, after validation, when the epoch's checkpoint is already
    written; resuming from it, Lightning skips that step, since it does not keep the
    monitored value (its own comment says so). So each retry or resume lost one cut of the
    learning rate. This callback keeps the monitored values in the checkpoint, and takes
    the missing step when training starts from one (only if the scheduler has not taken
    it: the count of its steps says)."""

    def __init__(self) -> None:
        self._monitored: dict[str, float] = {}
        self._epoch = 0
        self._restored: dict[str, Any] | None = None
        self._reading_a_tuners = False

    def state_dict(self) -> dict[str, Any]:
        return {"monitored": dict(self._monitored), "epoch": self._epoch}

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        self._reading_a_tuners = restored_by_a_tuner(trainer)  # Lightning calls load_state_dict next

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not self._reading_a_tuners:  # a tuner's was written before this fit's first validation
            self._restored = state_dict

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        metrics = trainer.callback_metrics
        self._monitored = {config.monitor: float(metrics[config.monitor]) for config in trainer.lr_scheduler_configs
                           if config.reduce_on_plateau and config.monitor in metrics}
        self._epoch = trainer.current_epoch + 1

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        restored, self._restored = self._restored, None
        if not restored or not pl_module.automatic_optimization:  # manual: the model steps its schedulers
            return
        epoch = restored["epoch"]
        for config in trainer.lr_scheduler_configs:
            value = restored["monitored"].get(config.monitor)
            if (config.reduce_on_plateau and config.interval == "epoch" and value is not None
                    and epoch % config.frequency == 0 and config.scheduler.last_epoch < epoch // config.frequency):
                pl_module.lr_scheduler_step(config.scheduler, value)


def build_trainer(
    settings: TrainerConfig,
    *,
    device: TrialDevice,
    metric: str,
    mode: str,
    max_epochs: int,
    trial_dir: Path,
    tensorboard_run: Path,
    callbacks: list[pl.Callback],
    strategy="auto",
    resumed_at: ResumedAt | None = None,
    profiler=None,
) -> pl.Trainer:
    """Checkpoints keep the best epoch (for the final evaluation) and the two newest (for
    resume, see ``checkpoints.py``); an epoch that is both is written once (see
    ``checkpoint_callbacks.py``).

    Checkpointing and early stopping act at the end of validation, which Lightning runs
    before ``on_train_epoch_end``: so when ``TuneReporter`` reports there, this epoch's
    checkpoint is on disk and the stop decision is made. That matters because Tune may
    stop the trial at that report, and nothing after it is guaranteed to run.

    ``profiler``: what Lightning reports its timed actions to (``TuneReporter.phase_timer``
    takes the epoch's waits for data and its checkpoint hooks' time from there).
    """
    all_callbacks = list(callbacks)
    best = BestCheckpoint(
        dirpath=checkpoint_dir(trial_dir), filename=Path(BEST_CHECKPOINT).stem, monitor=metric, mode=mode,
        save_top_k=1, enable_version_counter=False, save_on_train_epoch_end=False,
    )
    all_callbacks.append(best)  # before the epoch callback: Lightning keeps their order
    all_callbacks.append(EpochCheckpoints(
        best, dirpath=checkpoint_dir(trial_dir), filename="epoch-{epoch:04d}", auto_insert_metric_name=False,
        monitor="step", mode="max", save_top_k=2, enable_version_counter=False, save_on_train_epoch_end=False,
    ))
    if settings.early_stopping_patience is not None:
        all_callbacks.append(SearchEarlyStopping(
            monitor=metric, mode=mode, patience=settings.early_stopping_patience,
            min_delta=settings.early_stopping_min_delta, check_finite=True,
            check_on_train_epoch_end=False,
        ))
    all_callbacks.append(SearchLearningRateMonitor(logging_interval="epoch"))
    all_callbacks.append(PlateauStepOnResume())
    all_callbacks.append(LightningTunersOnResume(resuming=resumed_at is not None))
    all_callbacks.append(StepLogsEveryEpoch())
    all_callbacks.append(RandomStateInCheckpoint(resuming=resumed_at is not None))
    all_callbacks.append(ValidationLoaderSeedOnResume(resuming=resumed_at is not None))
    all_callbacks.append(ModelCheckpointsInTrialDir(model_checkpoint_dir(trial_dir)))
    all_callbacks.append(StepsByEpochInCheckpoint())
    logger = TrialLogger(tensorboard_run, resumed_at)  # a resumed attempt hides what it redoes
    trainer = pl.Trainer(
        accelerator=device.accelerator,
        devices=1,  # one device per process; distributed ranks are separate processes
        strategy=strategy,
        precision=device.precision,
        max_epochs=max_epochs,
        logger=logger,
        callbacks=all_callbacks,
        gradient_clip_val=settings.gradient_clip_val,
        accumulate_grad_batches=settings.accumulate_grad_batches,
        limit_train_batches=settings.limit_train_batches,
        limit_val_batches=settings.limit_val_batches,
        deterministic=settings.deterministic,
        num_sanity_val_steps=0,  # the driver's preflight already ran validation once
        # for trainer.validate (a resumed trial's restored weights); fit's own validation
        # runs under no_grad, Lightning's choice (see README, the six speed techniques)
        inference_mode=True,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=LOG_EVERY_N_STEPS,
        profiler=profiler,
        # each file serialized straight into place (sharded strategies write directories of their own)
        plugins=[CheckpointFileWriter()] if _writes_whole_files(strategy) else None,
    )
    logger.follow(trainer)
    return trainer


def _writes_whole_files(strategy) -> bool:
    """Whether the strategy writes a checkpoint as one file (rank 0's), with its CheckpointIO."""
    from pytorch_lightning.strategies import DDPStrategy, DeepSpeedStrategy

    return strategy == "auto" or (isinstance(strategy, DDPStrategy) and not isinstance(strategy, DeepSpeedStrategy))
