"""The Lightning callback that reports each validated epoch to Ray Tune.

The report is composed at ``on_train_epoch_end``: by then validation has logged its
metrics, ModelCheckpoint has written best/last, and EarlyStopping has decided whether
to stop, so it can say truthfully whether this epoch was the trial's last
(``hps_finished``). It is sent a moment later, once Lightning has logged the epoch's
training metrics (see ``_deliver_pending``); the training's last report, once ``fit`` has
returned (``send_final``). Tune may stop the trial at a report (ASHA, the time budget, or a
finished trial), which Ray signals by raising ``SystemExit`` from the report: inside ``fit``
it becomes ``StoppedByScheduler``. Only rank 0 reports to Tune directly; under Ray Train every rank
reports (Train waits for all of them and forwards rank 0's metrics), and metrics logged
with ``sync_dist`` are the same on every rank. Ray Train's ranks do not wait for Tune at
their report, so at a rung they ask whether the scheduler stopped the trial, and leave
training together if it did (``stopped_by_scheduler``, see ``rung_decisions``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterator, Mapping
from typing import Any, Callable

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import EarlyStopping
from pytorch_lightning.profilers import Profiler
from pytorch_lightning.utilities.exceptions import _TunerExitException

from .errors import HpsearchError
from .outcome import EPOCH, FINISHED, RESTORED, STOP_REASON, best_of


# A trial that waits on its DataLoader for more than this share of its training time
# is flagged as data-starved (more loader workers, or faster decoding, would help).
STARVED_SHARE = 0.3
# ... and has waited at least this long in the epoch: in a tiny epoch the wait is mostly
# the loader's own start, and the flag was noise on trials of 0.1 s epochs (audit 31).
STARVED_MIN_WAIT_S = 0.1
# Steps between host-side checks that the training loss stayed finite. Reading a GPU
# tensor's value on the host waits for every kernel queued before it: a check on every
# step would keep the CPU from queueing the next step while the GPU runs this one.
FINITE_CHECK_EVERY = 32
# Static fields that say how an epoch was trained: a resumed attempt may differ (another
# node, a changed ``trainer.precision``), and an epoch it only reports again keeps its own.
TRAINED_WITH = ("hps_device", "hps_precision", "hps_strategy", "hps_world_size")
SPEED_KEYS = ("hps_epoch_time_s", "hps_samples_per_s", "hps_data_wait_s", "hps_val_time_s", "hps_checkpoint_s",
              "hps_epoch_cpu_s")


class EpochPhaseTimer(Profiler):
    """The parts of an epoch that happen outside hpsearch's own hooks, timed from the
    actions Lightning reports to the trainer's profiler.

    * Waiting for training data: the seconds inside the DataLoader's ``next()``
      (``train_dataloader_next``), and, at an epoch's start, the loader's own start
      (``iter()``: with ``persistent_workers: false``, a new set of worker processes each
      epoch) from the epoch's run until its first fetch. Timing the gap between one
      training batch's end and the next one's start instead would also count Lightning's
      own work between steps (about 0.6 ms a step here): a small model with instant data
      then looked 28% starved.
    * Checkpoints: the seconds inside the hooks of the trainer's checkpoint callbacks
      (hpsearch's and the model's own), and nothing else: the time from their start to
      the epoch's end also held the model's own ``on_validation_end`` (audit 68).
    * The start of validation: when the last training batch's hooks ended, so that the
      validation loader's start (its workers' too), which Lightning runs before any
      validation hook, is validation's time (``TuneReporter.on_validation_start``)."""

    FETCH = "train_dataloader_next"
    EPOCH_RUN = "run_training_epoch"
    BATCH_END = ".on_train_batch_end"
    CHECKPOINT_HOOKS = ("on_train_batch_end", "on_validation_end", "on_train_epoch_end")

    def __init__(self) -> None:
        super().__init__()
        self.seconds = 0.0
        self.first_of_epoch_s = 0.0  # the epoch's first fetch: it holds the loader workers' start
        self.checkpoint_s = 0.0
        self.batch_hooks_ended = 0.0
        self._fetch_started: float | None = None
        self._epoch_run_started: float | None = None
        self._checkpoint_actions: frozenset[str] = frozenset()
        self._checkpoint_started: float | None = None
        self._first = False

    def time_checkpoints(self, callbacks) -> None:
        """Time the hooks of these checkpoint callbacks (Lightning's action names for them)."""
        self._checkpoint_actions = frozenset(f"[Callback]{callback.state_key}.{hook}"
                                             for callback in callbacks for hook in self.CHECKPOINT_HOOKS)

    def epoch_started(self) -> None:
        self._first, self.first_of_epoch_s = True, 0.0

    def start(self, action_name: str) -> None:
        if action_name.endswith(self.FETCH):
            self._fetch_started = time.perf_counter()
            if self._first and self._epoch_run_started is not None:
                self._fetch_started = self._epoch_run_started  # the loader's start, then its first batch
            self._epoch_run_started = None
        elif action_name == self.EPOCH_RUN:
            self._epoch_run_started = time.perf_counter()
        elif action_name in self._checkpoint_actions:
            self._checkpoint_started = time.perf_counter()

    def stop(self, action_name: str) -> None:
        if self._fetch_started is not None and action_name.endswith(self.FETCH):
            waited = time.perf_counter() - self._fetch_started
            self.seconds += waited
            if self._first:
                self.first_of_epoch_s, self._first = waited, False
            self._fetch_started = None
        elif self._checkpoint_started is not None and action_name in self._checkpoint_actions:
            self.checkpoint_s += time.perf_counter() - self._checkpoint_started
            self._checkpoint_started = None
        elif action_name.startswith("[LightningModule]") and action_name.endswith(self.BATCH_END):
            self.batch_hooks_ended = time.perf_counter()  # the model's, called after every callback's

    def summary(self) -> str:
        return ""  # nothing to print at the end of fit; the reporter reports the waits


class MetricNotLoggedError(HpsearchError):
    """The search metric was not among the metrics logged at validation."""


class NoTrainingBatchError(HpsearchError):
    """The training DataLoader gave no batch: the trial would end with no result, which
    Tune took for a pruned trial's (audit 77); retrying would repeat it."""


class NonFiniteError(HpsearchError):
    """The training loss, a logged loss or the search metric became NaN or infinite;
    retrying would repeat it."""


class StoppedByScheduler(_TunerExitException):
    """Tune stopped this trial at its last report. Lightning leaves ``fit`` on it as it
    does for its own tuning callbacks (batch size and learning rate finders): teardown
    hooks run and loggers close as on success, and no ``on_exception`` hook of the user's
    takes it for a crash. (Ray's own signal, ``SystemExit`` raised from the report, ran
    every pruned trial's ``on_exception`` hooks and closed its loggers as failed.)"""


def _stopped_training(callback) -> bool:
    """Whether ``callback`` is an EarlyStopping that stopped the training: by its own word
    (Lightning 2.6's ``stopping_reason``; a threshold reached at the first epoch leaves
    ``stopped_epoch`` 0 and the patience unspent: audit 65), else by its spent patience or
    the epoch it recorded."""
    if not isinstance(callback, EarlyStopping):
        return False
    reason = getattr(callback, "stopping_reason", None)
    # (only the rank whose own check fired has a reason: every rank has the epoch; audit 67)
    return (reason is not None and reason.name != "NOT_STOPPED") or callback.wait_count >= callback.patience \
        or callback.stopped_epoch > 0


class TuneReporter(pl.Callback):
    """Reports the epoch's metrics, telemetry and stop decision through ``report``."""

    def __init__(self, metric: str, mode: str, max_epochs: int, report: Callable[[dict], None],
                 static_fields: dict[str, Any], store_epoch_files: Callable[[], Any] | None = None,
                 store_epoch_events: Callable[[], Any] | None = None,
                 report_on_every_rank: bool = False, started: float | None = None,
                 fields_at_train_start: Callable[[pl.Trainer], dict[str, Any]] | None = None,
                 stopped_by_scheduler: Callable[[pl.Trainer, dict[str, Any]], bool] | None = None,
                 known_epochs: int = 0) -> None:
        """``known_epochs``: the epochs the study had of this trial when it was handed out;
        a resumed trial sends again those its checkpoint holds beyond them.
        ``store_epoch_files`` and ``store_epoch_events``: called on rank 0 once the epoch's
        files are written, and before the report, to put the trial's folder (its
        checkpoints) and its TensorBoard run where the study keeps them (URI storage: the
        study must never know of an epoch whose checkpoint is not in storage); the first is
        the epoch's checkpoint time, the second its report's. ``fields_at_train_start``: reported fields
        known only once the DataModule's ``setup`` has run and the trainer holds its
        loaders. ``stopped_by_scheduler``: asked on every rank after each report when the
        report does not itself wait for Tune's decision (Ray Train's ranks): whether the
        scheduler stopped the trial there, in which case training ends before another
        epoch starts."""
        self.metric, self.mode, self.max_epochs = metric, mode, max_epochs
        self.known_epochs = known_epochs
        self.store_epoch_files, self.store_epoch_events = store_epoch_files, store_epoch_events
        self.stopped_by_scheduler = stopped_by_scheduler
        self.report_on_every_rank = report_on_every_rank
        self.report = report
        self.static_fields = dict(static_fields)
        self.fields_at_train_start = fields_at_train_start
        self.best: float | None = None
        self.reported = False
        self.batches_run = 0  # training batches this session of the trial ran
        self._pending: dict[str, Any] | None = None  # composed at an epoch's end, sent just after
        self._final: dict[str, Any] | None = None  # the training's last report, sent after fit
        self.stopped_by_tune = False  # Tune stopped the trial at a report (its SystemExit, not the user's)
        self._restored_at = 0.0  # when a resumed trial began again from its checkpoint
        self._validated = False
        self._before_validation: dict[str, Any] = {}  # callback_metrics as validation began
        self.started = started if started is not None else time.perf_counter()  # the trial's start
        self._startup_s: float | None = None
        self._report_s = 0.0
        self.phase_timer = EpochPhaseTimer()  # the trainer's profiler (see build_trainer)
        self._epoch_started = self._batch_started = self._fetched_before_epoch = 0.0
        self._val_started = self._val_seconds = self._checkpointed_before_epoch = self._published_s = 0.0
        self._cpu_at_epoch_start = self._epoch_cpu_s = 0.0
        self._train_samples: int | None = 0  # None: a batch's size could not be told
        self._train_seconds = 0.0
        self._several_loaders = False
        self._fixed_batches: tuple[int, int] | None = None  # see ``_fixed_batches``
        self._losses_finite: torch.Tensor | None = None  # on the loss's device; see FINITE_CHECK_EVERY
        self._unchecked_from_step = 0
        # This epoch's validated metrics, saved in its checkpoint (``state_dict``); and those
        # of the epoch a resumed trial's checkpoint holds, to report again at its start.
        self._validated_epoch: dict[str, Any] | None = None
        self._checkpointed_epoch: dict[str, Any] | None = None
        self._earlier_epochs: list[dict[str, Any]] = []  # every validated epoch before the newest, alike
        self._ranks_differed = False  # see _compare_ranks_metric

    def state_dict(self) -> dict[str, Any]:
        """What an epoch's checkpoint keeps of this callback: that epoch's validated metrics,
        and the earlier epochs'."""
        if self._validated_epoch is None:
            return {}
        return {"validated_epoch": self._validated_epoch, "earlier_epochs": self._earlier_epochs}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._checkpointed_epoch = state_dict.get("validated_epoch")
        self._earlier_epochs = list(state_dict.get("earlier_epochs") or [])

    def on_train_start(self, trainer, pl_module) -> None:
        self.phase_timer.time_checkpoints(trainer.checkpoint_callbacks)  # the model's own among them
        if self._startup_s is None:
            self._startup_s = time.perf_counter() - self.started
        if self.fields_at_train_start is not None:
            self.static_fields.update(self.fields_at_train_start(trainer))
        loaders = trainer.train_dataloader
        # Several training loaders (a list or mapping of them): each batch holds one batch of each.
        self._several_loaders = isinstance(loaders, (list, tuple, Mapping)) and len(loaders) > 1
        self._fixed_batches = _fixed_batches(loaders)
        self._unchecked_from_step = trainer.global_step  # a resumed trial's steps go on from its checkpoint
        if self._checkpointed_epoch is not None:
            validated, self._checkpointed_epoch = self._checkpointed_epoch, None
            # Lightning runs the restored epoch's end again (its on_train_epoch_end hooks),
            # with no metrics: a callback that decides there, as a model's own EarlyStopping
            # does by default, raised that its monitor was not logged, and every retry and
            # resume of the trial failed. It sees the epoch's validated metrics now.
            trainer.callback_metrics.update({name: torch.tensor(value)
                                             for name, value in validated["metrics"].items()})
            self._validated_epoch = validated  # an earlier epoch once the next one validates
            # A DDP trial's rank 0 does not wait for Tune at each report, so a stop could
            # lose the reports of several epochs its checkpoint holds, not only the last: the
            # study never had them, and only the last was sent again.
            for earlier in self._earlier_epochs:
                if earlier["epoch"] > self.known_epochs:
                    self._send(trainer, self._earlier_epoch_report(earlier), inside_fit=True)
            # Sent at the next epoch's start or the training's end, after that epoch end:
            # a stop decided there ends the trial finished (see _deliver_pending).
            self._pending = self._checkpointed_epoch_report(trainer, validated)
            self._restored_at = time.perf_counter()

    def _checkpointed_epoch_report(self, trainer: pl.Trainer, validated: dict[str, Any]) -> dict[str, Any]:
        """The report, again, of the epoch the resumed checkpoint holds. Its checkpoint is
        written before its report, so a trial stopped in between (a Ctrl+C or SIGTERM that
        pauses the search, a killed worker) continued from an epoch the study never heard of:
        ASHA never judged it at its rung, and Optuna and trials.csv lacked it. When the study
        has it already, the same values arrive again: the searcher keeps one value per epoch
        and ASHA records a trial once per rung. The epoch's time and telemetry, as measured
        up to its checkpoint, come with it (checkpoints written before they were kept have
        none): the driver adds the time to the trial's compute only if the study never
        heard of the epoch (see ``TrialsTableRecorder``). TensorBoard already has the epoch."""
        metrics, epoch = dict(validated["metrics"]), validated["epoch"]
        self.best = self._best_so_far(trainer, metrics[self.metric])
        # Its end, decided as it was then: the last epoch, or early stopping's patience spent
        # (its count is restored with the checkpoint; Lightning's stop flag is not).
        patience_spent = any(isinstance(callback, EarlyStopping) and callback.wait_count >= callback.patience
                             for callback in trainer.callbacks)
        finished = epoch >= self.max_epochs or patience_spent
        reason = "max_epochs" if epoch >= self.max_epochs else ("early_stopping" if finished else "")
        if patience_spent:
            trainer.should_stop = True  # it stopped there: no further epoch
        return self._restored_report(validated, finished, reason, self.best)

    def _earlier_epoch_report(self, validated: dict[str, Any]) -> dict[str, Any]:
        """The report, again, of an epoch before the resumed checkpoint's own, with the
        trial's best as it stood then."""
        epoch = validated["epoch"]
        best = best_of([e["metrics"][self.metric] for e in self._earlier_epochs if e["epoch"] <= epoch], self.mode)
        return self._restored_report(validated, False, "", best)

    def _restored_report(self, validated: dict[str, Any], finished: bool, reason: str,
                         best: float | None) -> dict[str, Any]:
        metrics = dict(validated["metrics"])
        metrics.update(self.static_fields)
        metrics.update(validated.get("telemetry") or {})
        metrics.update(validated.get("trained_with") or {})  # checkpoints written before it have none
        metrics.update({EPOCH: validated["epoch"], FINISHED: finished, STOP_REASON: reason, "hps_best": best,
                        "hps_logged_metrics": ",".join(sorted(validated["metrics"])), RESTORED: True,
                        "hps_startup_s": self._startup_s or 0.0})  # this attempt's start-up
        return metrics

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._deliver_pending(trainer)
        self._epoch_started, self._cpu_at_epoch_start = time.perf_counter(), time.process_time()
        self._fetched_before_epoch = self.phase_timer.seconds
        self._checkpointed_before_epoch = self.phase_timer.checkpoint_s
        self.phase_timer.epoch_started()
        self._train_samples, self._train_seconds = 0, 0.0
        self._val_seconds = self._epoch_cpu_s = 0.0
        self._validated = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._batch_started = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            finite = torch.isfinite(loss.detach())
            self._losses_finite = finite if self._losses_finite is None else self._losses_finite & finite
            if (batch_idx + 1) % FINITE_CHECK_EVERY == 0:
                self._check_losses_finite(trainer)  # waits for the queued steps: training time
        self._train_seconds += time.perf_counter() - self._batch_started
        if self._fixed_batches is not None:  # what the loader batched, whatever the batch holds
            size, drawn = self._fixed_batches
            samples: int | None = max(0, min(size, drawn - size * batch_idx))
        else:
            samples = _samples_in(batch, self._several_loaders)
        self._train_samples = None if samples is None or self._train_samples is None else self._train_samples + samples
        self.batches_run += 1

    def _check_losses_finite(self, trainer: pl.Trainer) -> None:
        """Raise if a training loss since the last check was NaN or infinite: the one
        host-device sync every ``FINITE_CHECK_EVERY`` steps, and before validation, so
        diverged weights are never validated or checkpointed, and the trial is named by its
        loss rather than by a NaN metric."""
        if self._losses_finite is not None and not bool(self._losses_finite):
            raise NonFiniteError(f"NaN/inf loss at a step in {self._unchecked_from_step + 1}..{trainer.global_step}, "
                                 f"epoch {trainer.current_epoch + 1}")
        self._losses_finite, self._unchecked_from_step = None, trainer.global_step

    def on_validation_start(self, trainer, pl_module) -> None:
        self._before_validation = dict(trainer.callback_metrics)
        if not trainer.sanity_checking:
            waiting_from = time.perf_counter()
            _wait_for_device(pl_module)
            self._check_losses_finite(trainer)
            # On a GPU a step's hooks end once its kernels are queued, not run: what is still
            # queued when the epoch's training ends is training time, waited for here.
            self._train_seconds += time.perf_counter() - waiting_from
            # Validation began when the last training batch's hooks ended: Lightning then
            # starts the validation loader (new worker processes, unless persistent) before
            # any validation hook runs; that time was in no phase (audit 68).
            ended = self.phase_timer.batch_hooks_ended
            self._val_started = time.perf_counter() - (waiting_from - ended if ended > self._epoch_started else 0.0)
        else:
            self._val_started = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        # Checkpoint callbacks run their on_validation_end after this one (Lightning
        # orders them last); the phase timer times them.
        _wait_for_device(pl_module)  # validation's queued kernels belong to its time
        now = time.perf_counter()
        self._val_seconds = now - self._val_started
        self._epoch_cpu_s = time.process_time() - self._cpu_at_epoch_start
        self._validated = not trainer.sanity_checking
        if self._validated:
            # Checked here, before the checkpoint callbacks, so that a metric the model never
            # logs is named by hpsearch (with what was logged) and not by ModelCheckpoint;
            # and kept for this epoch's checkpoint, which they write next.
            self._check_logged_now(trainer)
            checked = self._checked(trainer, trainer.callback_metrics)
            self._compare_ranks_metric(trainer, pl_module, math.nan if checked is None else checked[self.metric])
            # Its time and telemetry so far go in the checkpoint too: a resumed trial
            # sends them with the epoch again, for a study that never heard of it.
            if self._validated_epoch is not None and checked is not None \
                    and self._validated_epoch["epoch"] != trainer.current_epoch + 1:
                self._earlier_epochs.append(self._validated_epoch)
            self._validated_epoch = None if checked is None else {
                "epoch": trainer.current_epoch + 1, "metrics": checked,
                "telemetry": self._telemetry(trainer, now - self._epoch_started),
                "trained_with": {key: self.static_fields[key] for key in TRAINED_WITH if key in self.static_fields}}

    def _compare_ranks_metric(self, trainer: pl.Trainer, pl_module, value: float) -> None:
        """Under DDP, at each validation until they first differ: whether the ranks agree on
        the search metric. Logged without ``sync_dist=True``, each rank's value is its own
        shard's, and rank 0's alone is reported, so trials would be compared on part of the
        validation data; the trial's notes (console, trials.csv) then say so. Ranks may agree
        at first (a few classes, equal shards) and part later: compared at the first
        validation only, they went unnoted (audit 82). One all-gather of one number, on
        every rank, each rank deciding alike from the same gathered values."""
        if trainer.world_size < 2 or self._ranks_differed:
            return
        values = trainer.strategy.all_gather(torch.tensor(value, dtype=torch.float64, device=pl_module.device))
        low, high = float(values.min()), float(values.max())
        if high - low > 1e-6 * max(1.0, abs(high), abs(low)):
            self._ranks_differed = True
            note = (f"{self.metric} differs between the {trainer.world_size} ranks ({low:.4g} to {high:.4g}): "
                    f"log it with sync_dist=True, or rank 0's share of the validation data alone decides")
            self.static_fields["hps_notes"] = "; ".join(filter(None, (self.static_fields.get("hps_notes"), note)))

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module) -> None:
        self._check_losses_finite(trainer)
        if trainer.sanity_checking or not self._validated:
            # No validation ran in this epoch (e.g. the tail of an epoch whose checkpoint a
            # resumed trial started from): nothing new to report.
            return
        metrics = self._checked(trainer, trainer.callback_metrics)
        if metrics is None:
            return
        epoch = trainer.current_epoch + 1
        finished = bool(trainer.should_stop) or epoch >= self.max_epochs
        self._pending = self._compose(trainer, metrics, epoch, finished, time.perf_counter() - self._epoch_started)

    def on_train_end(self, trainer, pl_module) -> None:
        self._deliver_pending(trainer, last=True)

    def send_final(self, trainer: pl.Trainer) -> None:
        """Send the training's last report, once ``fit`` has returned: every callback's
        ``on_train_end`` and Lightning's teardown have run by then, so Tune may end the trial
        at it (a finished trial is stopped at its last report) without cutting them short.
        Tune's stop raises ``SystemExit`` here, as Ray expects the trial's thread to end."""
        if self._final is not None:
            final, self._final = self._final, None
            self._send(trainer, final, inside_fit=False)

    def _deliver_pending(self, trainer: pl.Trainer, last: bool = False) -> None:
        """Send the last epoch's report, composed at its end. It goes out only now (the next
        epoch's start, or the end of training) because Lightning logs the epoch's training
        metrics, and runs the model's own ``on_train_epoch_end``, after every callback's
        ``on_train_epoch_end``; Tune may stop the trial at the report, and a trial pruned
        there would otherwise never have that epoch's ``train_loss`` in TensorBoard. The
        epoch's time is taken here too, so it includes the model's epoch-end work.
        ``last``: the training's end, whose report waits for ``send_final``."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            if trainer.should_stop and not pending[FINISHED]:
                # Stopped after this report was composed: by a callback of the model's own
                # (an EarlyStopping deciding at the epoch's end, Lightning's default) or by
                # the model itself. The trial ends here, finished, not cut short.
                pending[FINISHED], pending[STOP_REASON] = True, self._stop_reason(trainer, pending[EPOCH], True)
            if pending.get(RESTORED):
                if "hps_epoch_time_s" in pending:
                    # The epoch's end ran again just now (the model's own on_train_epoch_end
                    # too): the part of its time its checkpoint could not hold.
                    pending["hps_epoch_time_s"] += time.perf_counter() - self._restored_at
            else:
                # The epoch ends here, after the model's own on_train_epoch_end (EMA updates,
                # epoch-level metrics): its time belongs to the epoch and to the compute spent,
                # and so do checkpoints written at the epoch's end (they run after this
                # callback's on_train_epoch_end, where the report was composed).
                pending["hps_epoch_time_s"] = time.perf_counter() - self._epoch_started
                pending["hps_checkpoint_s"] = self.phase_timer.checkpoint_s - self._checkpointed_before_epoch
                self._store_files(trainer, pending)
                self._log_and_publish(trainer, pending)  # (TensorBoard has a restored epoch)
            if last:
                self._final = pending
            else:
                self._send(trainer, pending, inside_fit=True)

    def report_restored(self, trainer: pl.Trainer, validation_metrics) -> None:
        """Report a resumed trial that had nothing left to train (its last checkpoint was
        its final epoch), from a fresh validation of the restored weights."""
        metrics = self._checked(trainer, validation_metrics)
        if metrics is not None:
            restored = self._compose(trainer, metrics, trainer.current_epoch, True, 0.0)
            self._store_files(trainer, restored, timed=False)  # an epoch the study counted (audit 70)
            self._log_and_publish(trainer, restored, in_tensorboard=False)  # it has the epoch
            self._send(trainer, restored, inside_fit=False)

    def _check_logged_now(self, trainer: pl.Trainer) -> None:
        """The search metric must come from this validation: Lightning keeps a metric's
        last value, so one logged only in training, or only at some epochs' validation, was
        reported (to ASHA, Optuna and TensorBoard) with a value this epoch never logged."""
        value = trainer.callback_metrics.get(self.metric)
        if value is not None and self.metric not in logged_since(trainer, self._before_validation) \
                and trainer.global_rank == 0:
            raise MetricNotLoggedError(
                f"metric {self.metric!r} was not logged in epoch {trainer.current_epoch + 1}'s validation "
                f"(current_epoch {trainer.current_epoch} in your code): its value "
                f"there was an earlier one, from training or an earlier validation. Log it with "
                f"self.log({self.metric!r}, ...) at every validation (validation_step or on_validation_epoch_end).")

    def _checked(self, trainer: pl.Trainer, logged) -> dict[str, float] | None:
        """The logged scalars, after checking the search metric is there and finite."""
        metrics = {k: float(v) for k, v in logged.items() if _is_scalar(v)}
        if self.metric not in metrics:
            if trainer.global_rank == 0:
                raise MetricNotLoggedError(
                    f"metric {self.metric!r} was not logged at validation; the model logged: "
                    f"{', '.join(sorted(metrics)) or 'nothing'}. Log it with self.log({self.metric!r}, ...) "
                    "in validation_step, or change 'metric' in the experiment file."
                )
            return None
        # The search metric, and for a model that optimizes manually every loss it logs: it
        # returns no loss from training_step for the step check to see (an accuracy can
        # stay finite, at chance, while the loss is NaN). Another model's step check sees
        # its loss: an auxiliary loss of its own that is inf failed its trial (audit 74).
        manual = not getattr(trainer.lightning_module, "automatic_optimization", True)
        for name in (self.metric, *sorted(k for k in metrics if manual and "loss" in k.lower())):
            if not math.isfinite(metrics[name]):
                raise NonFiniteError(f"{name} is {metrics[name]} at epoch {trainer.current_epoch + 1}")
        return metrics

    def _best_so_far(self, trainer: pl.Trainer, value: float) -> float:
        """The trial's best value, earlier sessions included: the best-checkpoint callback's
        score (restored with the checkpoint) when it watches the search metric."""
        candidates = [value] + ([self.best] if self.best is not None else [])
        callback = trainer.checkpoint_callback
        if callback is not None and getattr(callback, "monitor", None) == self.metric \
                and callback.best_model_score is not None:
            candidates.append(float(callback.best_model_score))
        return best_of(candidates, self.mode)

    def _stop_reason(self, trainer: pl.Trainer, epoch: int, finished: bool) -> str:
        """Why the trial ends at this epoch ('' if it goes on): its last epoch; an
        EarlyStopping's decision (the file's patience, or a callback of the model's own); or
        the model's own ``trainer.should_stop``, which was called early stopping too (audit 63)."""
        if epoch >= self.max_epochs:
            return "max_epochs"
        if not finished:
            return ""
        return "early_stopping" if any(map(_stopped_training, trainer.callbacks)) else "stopped_by_model"

    def _compose(self, trainer: pl.Trainer, metrics: dict[str, float], epoch: int, finished: bool,
                 epoch_seconds: float) -> dict[str, Any]:
        """The epoch's report: the logged metrics, the stop decision and the telemetry,
        measured now (the counters restart with the next epoch)."""
        self.best = self._best_so_far(trainer, metrics[self.metric])
        reason = self._stop_reason(trainer, epoch, finished)
        logged = ",".join(sorted(metrics))
        # those TensorBoard has at training steps, in the trial's steps run (``trial_logger``)
        at_steps = ",".join(sorted(getattr(trainer.logger, "step_metrics", set()) & set(metrics)))
        metrics.update(self.static_fields)
        metrics.update({
            EPOCH: epoch,
            FINISHED: finished,
            STOP_REASON: reason,
            "hps_best": self.best,
            "hps_logged_metrics": logged,  # the user's metric names, for TensorBoard's HParams columns
            "hps_step_metrics": at_steps,
            **self._telemetry(trainer, epoch_seconds),
        })
        return metrics

    def _telemetry(self, trainer: pl.Trainer, epoch_seconds: float) -> dict[str, Any]:
        """The epoch's time, where it went, and how fast it trained, measured now."""
        data_wait = self.phase_timer.seconds - self._fetched_before_epoch
        busy = self._train_seconds + data_wait
        # Starved or not, by the batches after the epoch's first, whose wait holds the
        # loader workers' start: that alone flagged a one-epoch trial of instant data (audit 35).
        steady_wait = data_wait - self.phase_timer.first_of_epoch_s
        steady = busy - self.phase_timer.first_of_epoch_s
        return {
            "hps_epoch_time_s": epoch_seconds,
            "hps_train_time_s": self._train_seconds,
            "hps_val_time_s": self._val_seconds,
            # CPU seconds of this process (all its threads) from the epoch's start to its
            # validation's end: against the wall time, how much the trial had a CPU to
            # itself (about 1 on a busy CPU trial, low when it waits on a GPU or on data)
            "hps_epoch_cpu_s": self._epoch_cpu_s,
            "hps_data_wait_s": data_wait,
            # so far: those written at the epoch's end are added as it ends (_deliver_pending)
            "hps_checkpoint_s": self.phase_timer.checkpoint_s - self._checkpointed_before_epoch,
            "hps_report_s": self._report_s,  # the previous report's cost
            "hps_startup_s": self._startup_s or 0.0,
            "hps_data_starved": steady_wait >= STARVED_MIN_WAIT_S and steady_wait / steady > STARVED_SHARE,
            # over the training's time, waiting for data included: what the trial trained at
            # (none where a batch's size could not be told: a wrong figure was given; audit 77)
            "hps_samples_per_s": None if self._train_samples is None
            else self._train_samples * trainer.world_size / busy if busy > 0 else 0.0,
        }

    def _store_files(self, trainer: pl.Trainer, metrics: dict[str, Any], timed: bool = True) -> None:
        """Put the epoch's checkpoints where the study keeps them (URI storage): part of
        the epoch's checkpointing, and of its time (``timed``). An upload was timed in no
        phase, and with S3 took longer than the epoch itself (audit 68)."""
        if trainer.global_rank == 0 and self.store_epoch_files is not None:
            storing = time.perf_counter()
            self.store_epoch_files()
            stored = time.perf_counter() - storing
            if timed:
                metrics["hps_checkpoint_s"] = metrics.get("hps_checkpoint_s", 0.0) + stored
                metrics["hps_epoch_time_s"] = metrics.get("hps_epoch_time_s", 0.0) + stored

    def _log_and_publish(self, trainer: pl.Trainer, metrics: dict[str, Any], in_tensorboard: bool = True) -> None:
        """Before an epoch's report: its speed and the best search metric so far
        (``hp/<metric>``, the column HParams compares trials by) in TensorBoard, unless it
        has them already, and its events where the study keeps them. Part of the report's
        time (``hps_report_s``, see ``_send``)."""
        publishing = time.perf_counter()
        if trainer.global_rank == 0:
            if trainer.logger is not None and in_tensorboard:
                scalars = {f"speed/{key[4:]}": float(metrics[key]) for key in SPEED_KEYS if metrics[key] is not None}
                if metrics["hps_best"] is not None:
                    scalars[f"hp/{self.metric}"] = metrics["hps_best"]
                trainer.logger.log_epoch_metrics(scalars, metrics[EPOCH])
                # Events reach disk before the report: a driver killed right after it
                # must not leave TensorBoard missing epochs the study has.
                trainer.logger.flush()
            if self.store_epoch_events is not None:
                self.store_epoch_events()
        self._published_s = time.perf_counter() - publishing

    def _send(self, trainer: pl.Trainer, metrics: dict[str, Any], inside_fit: bool) -> None:
        """Report from the ranks that report, then learn whether the trial goes on. The
        time taken, waiting for the decision included, is the next report's ``hps_report_s``."""
        reporting = time.perf_counter()
        if trainer.global_rank == 0 or self.report_on_every_rank:
            try:
                self.report(metrics)
            except SystemExit as exc:  # Tune stopped the trial at this report
                self.stopped_by_tune = exc.code in (0, None)
                if not inside_fit or exc.code not in (0, None):
                    raise
                self.reported = True
                raise StoppedByScheduler(f"stopped by Tune at epoch {metrics[EPOCH]}") from None
            self.reported = True
        stopped = self.stopped_by_scheduler is not None and self.stopped_by_scheduler(trainer, metrics)
        self._report_s, self._published_s = self._published_s + time.perf_counter() - reporting, 0.0
        if stopped:
            raise StoppedByScheduler(f"stopped by the scheduler at epoch {metrics[EPOCH]}")


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (int, float)) or (isinstance(value, torch.Tensor) and value.numel() == 1)


def _wait_for_device(pl_module) -> None:
    """Wait for the kernels queued on the module's GPU (once an epoch, at the boundaries the
    telemetry measures), so time spent there is not counted in the next phase."""
    device = getattr(pl_module, "device", None)
    if isinstance(device, torch.device) and device.type == "cuda":
        torch.cuda.synchronize(device)


def _fixed_batches(loaders: Any) -> tuple[int, int] | None:
    """(batch size, samples an epoch draws) of a DataLoader that batches a sampler with a
    length by a fixed size (torch's own ``BatchSampler``): each of its batches holds that
    many, but a last short one. None for any other (a batch sampler of the user's, an
    IterableDataset, several loaders), whose batches are measured one by one."""
    from torch.utils.data import BatchSampler, DataLoader

    if not isinstance(loaders, DataLoader) or loaders.batch_size is None \
            or type(loaders.batch_sampler) is not BatchSampler:
        return None
    try:
        return int(loaders.batch_size), len(loaders.batch_sampler.sampler)
    except (TypeError, NotImplementedError):  # a sampler without a length
        return None


def _samples_in(batch: Any, several_loaders: bool) -> int | None:
    """The samples of one training step: with several training loaders, Lightning hands a
    list or mapping holding one batch of each (None for one that ran out), summed here.
    None where a batch's size cannot be told."""
    if several_loaders and isinstance(batch, (Mapping, list, tuple)):
        parts = [_batch_size(part) for part in (batch.values() if isinstance(batch, Mapping) else batch)
                 if part is not None]
        return None if None in parts else sum(parts)  # type: ignore[arg-type]
    return _batch_size(batch)


def _batch_size(batch: Any) -> int | None:
    """The samples in a batch of any structure (tensors, lists of strings or ids, mappings,
    dataclasses), where every part that has a length agrees on it; None where they differ
    (a graph's edges beside its nodes, sequences of several lengths) or none has one. The
    first tensor's length was taken: 0 for a dataclass, or a dict whose first value held
    strings, and the edges' count for a graph (audit 77)."""
    sizes = set(_sizes(batch))
    return sizes.pop() if len(sizes) == 1 else None


def _sizes(batch: Any) -> Iterator[int]:
    if isinstance(batch, torch.Tensor):
        if batch.dim():
            yield int(batch.shape[0])
    elif isinstance(batch, Mapping):
        for value in batch.values():
            yield from _sizes(value)
    elif dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        for field in dataclasses.fields(batch):
            yield from _sizes(getattr(batch, field.name))
    elif isinstance(batch, (list, tuple)) and batch:
        if all(isinstance(item, (str, bytes, int, float, bool)) or item is None for item in batch):
            yield len(batch)  # a sample's name or id each
        else:
            for item in batch:
                yield from _sizes(item)


def logged_since(trainer: pl.Trainer, before: dict[str, Any]) -> set[str]:
    """The metrics logged since ``before`` (a copy of ``callback_metrics``): Lightning
    replaces a metric's value when it is logged again, and keeps it otherwise."""
    return {name for name, value in trainer.callback_metrics.items() if before.get(name) is not value}
