"""Ray Tune callbacks in the driver: the trials table, TensorBoard's HParams rows, the
live progress display, and the stoppers: finished trials, the search's time budget, trials
failing in a row, a full disk. (A trial's failed tries: ``trial_faults``; which
checkpoints an ended trial keeps: ``checkpoint_retention``.)"""

from __future__ import annotations

import math
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

from ray.tune import Callback
from ray.tune.stopper import Stopper, TimeoutStopper

from .checkpoint_retention import has_epoch_checkpoint
from .config import ExperimentConfig
from .errors import counted
from .outcome import (EPOCH, FAILED, FINISHED, GIVE_UP, PLACEMENT_GROUP, RESTORED, RUNNING, TRIAL_NUMBER,
                      PruneLog, classify, paused_by_a_full_disk)
from .searcher import RAY_TRIAL_ID, RETRY_OF
from .time_left import time_left
from .trial_faults import NODE_LOST, last_error_line, traceback_at
from .trials_table import RESULT_TO_COLUMN, TrialsTable


class FinishedTrials(Stopper):
    """Ends a trial at the report that says it finished (its last epoch, early stopping,
    a trial given up). Tune otherwise asked it for one more result, which its function gives
    only by returning: one more round trip through the driver for every trial that ASHA
    does not stop at max_epochs itself (every trial, with no scheduler)."""

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return bool(result.get(FINISHED))

    def stop_all(self) -> bool:
        return False


class TimeBudget(TimeoutStopper):
    """``search.time_budget_s``: Ray Tune's own timeout (counted from the start of Tune's
    loop, so Ray's start is not spent from it), which afterwards also says whether it
    ended the session: that end is the one the user asked for, not an interruption."""

    reached = False

    def stop_all(self) -> bool:
        self.reached = super().stop_all() or self.reached
        return self.reached


class FailuresInARow(Callback, Stopper):
    """``failure.max_consecutive_failures``: ends the session once that many trials in a
    row, in the order they ended, have failed. A fault that every trial meets (an
    unreadable file in the data, a bug at any setting) would otherwise fail each remaining
    trial of the study in turn, after a start-up of its own. A trial finishing between
    failures starts the count again; so does a resume, which follows a fix. Reads the state
    that ``TrialsTableRecorder``, which runs before it, gave the trial's row."""

    def __init__(self, table: TrialsTable, limit: int) -> None:
        self.table, self.limit = table, limit
        self.in_a_row = 0
        self.reached = False

    def _ended(self, trial) -> None:
        failed = self.table.row(int(trial.config[TRIAL_NUMBER])).get("state") == FAILED
        self.in_a_row = self.in_a_row + 1 if failed else 0
        self.reached = self.reached or self.in_a_row >= self.limit

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self._ended(trial)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._ended(trial)

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        return self.reached


class DiskFilled(Callback, Stopper):
    """Ends the session once a trial's disk has filled (``paused_by_a_full_disk``; its
    checkpoints kept): every trial after it would meet the same full disk, and be paused
    in turn after a start-up of its own. The session's message names the paused trials
    from trials.csv (``api._paused_by_a_full_disk``)."""

    reached = False

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self.reached = self.reached or paused_by_a_full_disk(trial)

    def __call__(self, trial_id: str, result: dict[str, Any]) -> bool:
        return False

    def stop_all(self) -> bool:
        return self.reached


# The figures of one epoch, as against those of the trial's attempt (its start-up, device).
EPOCH_FIGURES = ("hps_epoch_time_s", "hps_train_time_s", "hps_val_time_s", "hps_epoch_cpu_s", "hps_data_wait_s",
                 "hps_checkpoint_s", "hps_report_s", "hps_samples_per_s", "hps_data_starved")


class TrialsTableRecorder(Callback):
    """Keeps ``trials.csv`` current: every trial's state, params, metric and telemetry.

    Results and trial starts rewrite the file at most every ``min_interval_s`` (one held
    back is written once the interval has passed); trial ends always do.
    ``planned``: a trial's columns known from its config before it reports (its device,
    precision, strategy, seed), filled in at its start where the row has none: a trial that
    failed before its first report, on its precision or strategy say, showed none of them.
    Its reports replace them with what it used.
    """

    def __init__(self, table: TrialsTable, path: Path, prunes: PruneLog, min_interval_s: float = 2.0,
                 planned: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> None:
        self.table, self.path, self.prunes = table, path, prunes
        self.min_interval_s = min_interval_s
        self.planned = planned
        self._last_write = 0.0
        self._unsaved = False  # a change the interval held back

    def _row(self, trial) -> dict[str, Any]:
        number = int(trial.config[TRIAL_NUMBER])
        row = self.table.row(number)
        row[RAY_TRIAL_ID] = trial.trial_id
        for name, value in trial.config.get("params", {}).items():
            row[name] = value
        return row

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        row = self._row(trial)
        row["state"], row["reason"] = RUNNING, ""
        planned = self.planned(trial.config) if self.planned else {}
        for column, value in planned.items():
            if row.get(column) in (None, ""):
                row[column] = value
        row["attempts"] = row.get("attempts") or 1
        if RETRY_OF in trial.config:  # a failed trial's configuration run again (resume --retry-failed)
            row["retry_of"] = trial.config[RETRY_OF]
        # Held back by the interval as results are (a trial's end is always written): each
        # write is the whole file, and a write at every start and end made the driver write
        # 36 MB for a 180 KB trials.csv at 200 trials, growing with the square (audit 83).
        self._write()

    def on_trial_recover(self, iteration, trials, trial, **info) -> None:
        """A failed trial about to be retried from its last checkpoint (``RetryPolicy``
        has counted the attempt or the node loss in the row, and named the fault)."""
        self._row(trial)
        self._write(force=True)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        row = self._row(trial)
        row["state"] = RUNNING
        # A resumed trial's first reports are epochs its checkpoint holds, again, with their
        # time: new to the row only if the study never heard of them (their reports were lost
        # to the interruption); else counted then, and older than what the row shows.
        known = result.get(RESTORED) and int(row.get("epochs") or 0) >= int(result.get(EPOCH) or 0)
        if not known:
            metric = result.get(self.table.metric)
            if metric is not None:
                row["last"] = metric
            if result.get("hps_best") is not None:
                row["best"] = result["hps_best"]
            # Compute spent, every attempt included: what the report's "compute" figures add up.
            row["compute_s"] = float(row.get("compute_s") or 0.0) + float(result.get("hps_epoch_time_s") or 0.0) \
                * int(result.get("hps_world_size") or 1)
            if EPOCH in result:
                row["epochs"] = result[EPOCH]
        for key, column in RESULT_TO_COLUMN.items():
            # A known epoch's figures, sent again from its checkpoint, were measured before the
            # checkpoint was written (no write time, no report): the row keeps those it had,
            # as TensorBoard does (audit 39: 0.59 s against 0.73 s, checkpoint_s 0.0001 s).
            if key in result and not (known and key in EPOCH_FIGURES):
                row[column] = result[key]
        self._write()

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        row = self._row(trial)
        outcome = classify(trial.trial_id, trial.last_result, False, self.table.metric, self.prunes)
        row["state"], row["reason"] = outcome.state, outcome.reason
        if outcome.state == FAILED:
            row["error"] = outcome.reason
        self._write(force=True)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        row = self._row(trial)
        row["state"], row["reason"] = FAILED, "error"
        row["error"] = last_error_line(trial)
        self._write(force=True)

    def on_experiment_end(self, trials, **info) -> None:
        self._write(force=True)

    def on_step_end(self, iteration, trials, **info) -> None:
        """A result held back by the interval is written once it has passed: it waited for
        the next report or a trial's end, an epoch behind in ``status`` (audit 75)."""
        if self._unsaved:
            self._write()

    def _write(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_write >= self.min_interval_s:
            self.table.save(self.path)
            self._last_write, self._unsaved = now, False
        else:
            self._unsaved = True


class TensorBoardSessions(Callback):
    """Adds each ended trial to TensorBoard's HParams table, with its state and epochs, and
    the study's best so far to its own run (``StudyRun``).

    Runs after ``TrialsTableRecorder`` (whose row holds the final state). The study's
    HParams columns are written with the first trial that ends, and again when a trial
    ends that logged a metric they have no column for (the first may have failed before
    its first report).
    """

    def __init__(self, config: ExperimentConfig, table: TrialsTable, tensorboard_dir: Path) -> None:
        from .tensorboard_layout import StudyRun

        self.config, self.table, self.tensorboard_dir = config, table, tensorboard_dir
        self._columns: set[str] | None = None  # the metric names the study's columns cover, once known
        self.study_run = StudyRun(tensorboard_dir, config.metric, table.best_row())

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self._write(trial)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._write(trial)

    def on_experiment_end(self, trials, **info) -> None:
        self.study_run.close()

    def _write(self, trial) -> None:
        """A failure here (a full disk, say) costs the HParams row, never the search: it is
        written again at the next session (``backfill_trial_sessions``)."""
        from .tensorboard_layout import write_hparams_columns, write_trial_session

        number = int(trial.config[TRIAL_NUMBER])
        row = self.table.row(number)
        last = trial.last_result or {}
        logged, at_steps = ({name for name in str(last.get(field) or "").split(",") if name}
                            for field in ("hps_logged_metrics", "hps_step_metrics"))
        try:
            if self._columns is None or not logged <= self._columns:  # the file is read only then
                self._columns = write_hparams_columns(self.tensorboard_dir, self.config, sorted(logged),
                                                      at_steps) | logged
            write_trial_session(self.tensorboard_dir, self.config, number, trial.config.get("params", {}),
                                row["state"], int(float(row.get("epochs") or 0)))
        except Exception as exc:  # noqa: BLE001 - reported, and repaired at the next session
            warnings.warn(f"TensorBoard HParams row of trial {number} not written: {exc}", stacklevel=2)
        best = self.table.best_row()
        if best is None:
            return
        ended = self.table.ended()
        try:  # by the values its run is named with: its row's, a trial of an earlier session's too
            self.study_run.add(ended, best, {key: best[key] for key in self.config.space
                                             if best.get(key) not in (None, "")})
        except Exception as exc:  # noqa: BLE001 - the next trial's end writes the best again
            warnings.warn(f"TensorBoard's study run not written after trial {number}: {exc}", stacklevel=2)


class PushStudyFiles(Callback):
    """With URI storage: the study's own files go to storage whenever a trial ends, at
    most every ``min_interval_s`` while results arrive, and at the end of the session."""

    def __init__(self, mirror, min_interval_s: float = 30.0) -> None:
        self.mirror, self.min_interval_s = mirror, min_interval_s
        self._last = time.monotonic()

    def _push(self, force: bool) -> None:
        """A failed upload (a network blip) costs nothing but a warning: the local copy has
        everything and the next push sends it."""
        if force or time.monotonic() - self._last >= self.min_interval_s:
            try:
                self.mirror.push_study_files()
                if force:
                    self.mirror.push("tensorboard")  # the HParams rows this driver wrote
            except Exception as exc:  # noqa: BLE001
                warnings.warn(f"storage upload failed, will retry: {exc}", stacklevel=2)
            self._last = time.monotonic()

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        self._push(force=False)

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self._push(force=True)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._push(force=True)

    def on_experiment_end(self, trials, **info) -> None:
        self._push(force=True)


def _short(value: Any) -> str:
    """A metric as the summary line shows it (0.87, not 0.8700000047683716)."""
    try:
        return f"{float(value):.4g}"
    except (TypeError, ValueError):
        return "n/a"


class FreeRankReservations(Callback):
    """Frees the CPUs and GPUs of a distributed trial's ranks as soon as the trial ends, and
    the last report its rank 0 kept (``last_reports``; Tune may have ended the trial's
    process before it removed it).

    Ray Train reserves them in a placement group, which its controller removes when the
    training ends by itself. A trial that Tune stops (ASHA pruning it, say) ends its
    controller with it, and the reservation then lives as long as the driver's job. Ray
    Train's own cleaner (which hpsearch does not start: ``distributed.lean_torch_trainer``)
    asks Ray's dashboard whether the controller died, and a local Ray started by hpsearch
    runs none: on 2 CPUs, the trial after the first pruned one waited for CPUs forever
    before this callback. Each rank reports its placement group
    (``PLACEMENT_GROUP``); here it is removed when the trial completes, fails or is
    retried. One that Ray Train already removed is left alone."""

    def __init__(self, last_reports=None) -> None:
        self.groups: dict[str, str] = {}  # trial id -> placement group id (hex)
        self.last_reports = last_reports  # distributed.RankZeroLastReports

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        if result.get(PLACEMENT_GROUP):
            self.groups[trial.trial_id] = result[PLACEMENT_GROUP]

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self.free(trial.trial_id)
        self._drop_kept_report(trial)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self.free(trial.trial_id)
        self._drop_kept_report(trial)

    def _drop_kept_report(self, trial) -> None:
        if self.last_reports is None:
            return
        try:
            self.last_reports.take(int(trial.config[TRIAL_NUMBER]))
        except Exception as exc:  # the session's end drops it at the latest
            warnings.warn(f"could not drop trial {trial.config[TRIAL_NUMBER]}'s kept report: {exc}", stacklevel=2)

    def on_trial_recover(self, iteration, trials, trial, **info) -> None:
        self.free(trial.trial_id)

    def free(self, trial_id: str) -> None:
        group_id = self.groups.pop(trial_id, None)
        if group_id is None:
            return
        try:
            remove_reservation(group_id)
        except Exception as exc:  # the search goes on; the reservation ends with it at the latest
            warnings.warn(f"could not free the placement group {group_id} of trial {trial_id}: {exc}", stacklevel=2)


def remove_reservation(group_id: str) -> None:
    """Removes the placement group of this hex id, ending the processes in it (one already
    removed is left be)."""
    import ray
    from ray.util.placement_group import PlacementGroup, placement_group_table, remove_placement_group

    group = PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group_id)))
    if placement_group_table(group).get("state", "REMOVED") != "REMOVED":
        remove_placement_group(group)


class ProgressDisplay(Callback):
    """A live summary: trials running/finished/pruned/failed, the best so far, the time
    elapsed and about how long is left.

    On a terminal it redraws one panel (rich); elsewhere (CI, logs) it prints one line
    per finished trial, and the summary under it at most every ``LOG_SUMMARY_EVERY_S``
    and at the last trial: under every trial's line, it doubled a log (3,600 lines at
    1,800 trials; audit 40). While no trial ends, the summary alone comes every
    ``LOG_SUMMARY_EVERY_S``: a log of long trials said nothing for minutes (audit 56).
    """

    LOG_SUMMARY_EVERY_S = 30.0

    def __init__(self, table: TrialsTable, num_trials: int, exp, time_budget_s: float | None = None) -> None:
        self.table, self.num_trials, self.exp, self.time_budget_s = table, num_trials, exp, time_budget_s
        self.started = time.monotonic()
        self.console = None
        self._live = None
        self._noted: dict[str, str] = {}  # each trial's notes said so far
        self._summary_said_at = -math.inf
        self._ended_before = 0  # by earlier sessions of the study, counted as this one starts

    def setup(self, **info) -> None:
        from rich.console import Console

        self._ended_before = self.table.ended()

        self.console = Console(stderr=True)
        # Said at once: in a log, the next line may come only when the first trial ends.
        self.console.print(f"searching: {counted(self.num_trials, 'trial')} in all; "
                           f"results in {self.exp.root}", markup=False,
                           highlight=False, soft_wrap=True)  # a path stays whole in a log
        if self.console.is_terminal:
            from rich.live import Live

            self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
            self._live.start()

    def summary(self) -> str:
        counts = self.table.counts()
        done = self.table.ended()
        best = self.table.best_row()
        best_text = f"best {self.table.metric}={best['best']:.4g} (trial {best['trial']})" if best else "no result yet"
        return (f"[{time.monotonic() - self.started:6.1f}s] {done}/{self.num_trials} done{self._time_left(done)} · "
                f"{counts.get('RUNNING', 0)} running · {counts.get('COMPLETE', 0)} complete · "
                f"{counts.get('PRUNED', 0)} pruned · {counts.get('FAILED', 0)} failed · {best_text}")

    def _time_left(self, done: int) -> str:
        return time_left(time.monotonic() - self.started, done, self._ended_before, self.num_trials,
                         self.time_budget_s)

    def _render(self):
        from rich.panel import Panel

        return Panel(self.summary(), title="hpsearch", expand=False)

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render())

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        notes = result.get("hps_notes")
        said = self._noted.get(trial.trial_id, "")
        if notes and notes != said:
            # Each note said once (every report carries them all): e.g. a damaged checkpoint set
            # aside at the start, ranks found to disagree on the metric at a later epoch.
            self._noted[trial.trial_id] = notes
            new = notes[len(said):].lstrip("; ") if notes.startswith(said) else notes
            self._say(f"trial {trial.config[TRIAL_NUMBER]}: {new}")
        self._refresh()

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        self._noted.pop(trial.trial_id, None)  # a retry says its own notes
        self._refresh()

    def on_step_end(self, iteration, trials, **info) -> None:
        now = time.monotonic()
        if self._live is None and now - max(self._summary_said_at, self.started) >= self.LOG_SUMMARY_EVERY_S:
            self._summary_said_at = now
            print(f"  {self.summary()}", file=sys.stderr, flush=True)

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self._announce(trial)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._announce(trial, traceback_at(trial, self.exp))

    def on_trial_recover(self, iteration, trials, trial, **info) -> None:
        """One line per retry, in place of the traceback Ray Tune would print (see
        ``quiet_trial_tracebacks``); the traceback stays in the file it names."""
        if trial.config.get(GIVE_UP):
            return  # out of retries (``RetryPolicy``): its end as FAILED is announced instead
        number = int(trial.config[TRIAL_NUMBER])
        # An epoch's checkpoint is on disk before its report. A trial stopped between the
        # two has the checkpoint and no report: in its folder, which the driver sees unless
        # the trial ran on another machine.
        checkpointed = (trial.last_result or {}).get(EPOCH) or has_epoch_checkpoint(trial, self.exp)
        start = "its last checkpoint" if checkpointed else "the start (no epoch finished)"
        verdict = self.table.row(number).get("error")  # RetryPolicy's, which ran first
        if verdict == NODE_LOST:  # said in words
            self._say(f"trial {number}: its node was lost; retrying from {start} on another node (not counted "
                      f"in failure.max_retries){traceback_at(trial, self.exp)}")
            return
        # the line RetryPolicy read (Ray's error file, and a crashed process's own account) once
        self._say(f"trial {number}: retrying from {start} after {verdict or last_error_line(trial, self.exp)}"
                  f"{traceback_at(trial, self.exp)}")

    def _announce(self, trial, note: str = "") -> None:
        row = self.table.rows.get(int(trial.config[TRIAL_NUMBER]), {})
        self._say(f"trial {row.get('trial')}: {row.get('state')} ({row.get('reason')}) "
                  f"{self.table.metric}={_short(row.get('best'))} after {counted(row.get('epochs', 0), 'epoch')}{note}")

    def _say(self, line: str) -> None:
        if self._live is not None:
            self._live.console.print(line, markup=False)  # an error's "[rank1]" is text, not markup
            self._refresh()
        else:
            now = time.monotonic()
            last = self.table.ended() >= self.num_trials
            if now - self._summary_said_at >= self.LOG_SUMMARY_EVERY_S or last:
                self._summary_said_at = now
                line += f"\n  {self.summary()}"
            print(line, file=sys.stderr, flush=True)

    def on_experiment_end(self, trials, **info) -> None:
        if self._live is not None:
            self._live.update(self._render())
            self._live.stop()
            self._live = None

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_live"] = state["console"] = None
        return state


class RaisedAtTheNextStep(Callback):
    """A user's callback, whose exceptions in ``on_trial_complete`` and ``on_trial_error``
    are raised again from the next ``on_step_end``. Tune calls those two hooks while it
    stops a trial, and takes anything raised there for the trial's own failure: a tracker
    that raised at a trial's end had the complete trial retried, then marked FAILED, and
    the search ended "complete" with no result and no word of the callback. From
    ``on_step_end`` the exception ends the search, as from any other hook, and the search
    names the callback and its hook (``api._callback_error_in``). An exception in
    ``on_experiment_end``, once every trial has ended, is kept too, for the search to raise
    once its result is saved (``raise_kept``): it cost a finished search its evaluation and
    best.json (audit 25). Every other hook is the callback's own, and it passes for the
    callback's class (Tune looks for its logger callbacks by class)."""

    _KEPT_HOOKS = ("on_trial_complete", "on_trial_error", "on_experiment_end")

    def __init__(self, callback: Callback) -> None:
        self.callback = callback
        self.kept: list[Exception] = []

    def __getattribute__(self, name: str):
        if (name.startswith("on_") or name in ("setup", "get_state", "set_state", "__class__")) \
                and name not in (*RaisedAtTheNextStep._KEPT_HOOKS, "on_step_end"):
            return getattr(object.__getattribute__(self, "callback"), name)
        return object.__getattribute__(self, name)

    def __reduce__(self):  # Tune pickles its callbacks; this class, not the one it passes for
        return RaisedAtTheNextStep, (self.callback,)

    def on_trial_complete(self, *args, **kwargs) -> None:
        self._kept_if_raised(self.callback.on_trial_complete, args, kwargs)

    def on_trial_error(self, *args, **kwargs) -> None:
        self._kept_if_raised(self.callback.on_trial_error, args, kwargs)

    def on_experiment_end(self, *args, **kwargs) -> None:
        self._kept_if_raised(self.callback.on_experiment_end, args, kwargs)

    def on_step_end(self, *args, **kwargs) -> None:
        self.raise_kept()
        self.callback.on_step_end(*args, **kwargs)

    def raise_kept(self) -> None:
        if self.kept:
            raise self.kept.pop(0)

    def _kept_if_raised(self, hook, args, kwargs) -> None:
        try:
            hook(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - raised again at the next step
            self.kept.append(exc)
