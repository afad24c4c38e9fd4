"""Ray Tune callbacks in the driver: the trials table, TensorBoard's HParams rows, the
live progress display, and the stoppers: finished trials, the search's time budget, trials
failing in a row."""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import logging
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

from ray.tune import Callback
from ray.tune.stopper import Stopper, TimeoutStopper

from .config import ExperimentConfig
from .errors import DiskFullError, HpsearchError, counted
from .experiment import atomic_write_text, trial_name
from .outcome import (COMPLETE, DISK_FULL, EPOCH, FAILED, FINISHED, FINISHED_STATES, GIVE_UP, KNOWN_EPOCHS,
                      PLACEMENT_GROUP, PRUNED, RANK_NODES, RESTORED, RUNNING, TRIAL_NUMBER, PruneLog, classify)
from .searcher import RAY_TRIAL_ID, RETRY_OF
from .time_left import time_left
from .trial_watch import crash_account, crash_line
from .trials_table import RESULT_TO_COLUMN, TrialsTable, best_first, has_value


NODE_LOST = "its node was lost"  # a fault's error line, when it was taken for a node loss
NODE_LOSSES_FORGIVEN = 5  # per trial: node losses beyond these count as the trial's own faults
PROCESS_DIED = "its process died without a Python error"  # a fault's line, for a killed or crashed process


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


def paused_by_a_full_disk(trial) -> bool:
    """Whether the trial Tune just ended reported a full disk (``DISK_FULL``): paused, not
    ended, in the study (``classify``)."""
    return bool((getattr(trial, "last_result", None) or {}).get(DISK_FULL))


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

    Results rewrite the file at most every ``min_interval_s``; trial ends always do.
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
        self._write(force=True)

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
        row["error"] = _last_error_line(trial)
        self._write(force=True)

    def on_experiment_end(self, trials, **info) -> None:
        self._write(force=True)

    def _write(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_write >= self.min_interval_s:
            self.table.save(self.path)
            self._last_write = now


class RetryPolicy(Callback):
    """``failure.max_retries`` counts the trial's own faults only; a node that dies under a
    trial (a lost or pre-empted machine) is retried from the last checkpoint on another
    node without using up a retry, up to ``NODE_LOSSES_FORGIVEN`` times a trial (a bound,
    so that a fault taken for a node loss can never retry a trial forever).

    Ray Tune counts every failure against ``FailureConfig.max_failures``, so Tune is given
    one more than ``max_retries`` and this callback, which runs before the retry starts,
    (a) takes a node loss back off Tune's count (``Trial.run_metadata.num_failures``, a
    Ray internal this relies on; tested by the node-loss test), and (b) when the trial's
    own faults exceed ``max_retries``, or (c) when a retry failed with the same error as
    the attempt before it without reporting a later epoch, marks its config so the
    restarted trial ends at once as FAILED with the last error: a retry starts from the
    same checkpoint and runs the same batches, so a third try would fail the same way
    (not so a killed process, whose killer may choose otherwise next time). (A bug the
    trial itself recognises, say a ``TypeError``, is not retried at all: see
    ``trial._failure_reason``.) The row's ``error`` says what this fault was taken for,
    which the other callbacks read rather than judge it again.
    """

    def __init__(self, table: TrialsTable, max_retries: int, exp) -> None:
        self.table, self.max_retries, self.exp = table, max_retries, exp
        self._last_fault: dict[int, tuple[str, Any]] = {}  # trial number -> (error line, last epoch reported)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        """A retry's report, again, of an epoch its checkpoint holds: the attempt before it
        had got that far, though its own report of that epoch may never have left it (a
        crash or kill after the epoch's checkpoint was written and before its report), so
        that attempt's fault came after that epoch."""
        number = int(trial.config[TRIAL_NUMBER])
        if result.get(RESTORED) and number in self._last_fault:
            error, epoch = self._last_fault[number]
            if result.get(EPOCH) is not None and (epoch is None or result[EPOCH] > epoch):
                self._last_fault[number] = (error, result[EPOCH])

    def on_trial_recover(self, iteration, trials, trial, **info) -> None:
        number = int(trial.config[TRIAL_NUMBER])
        row = self.table.row(number)
        # The retry sends again only the epochs its checkpoint holds beyond those the study has.
        reported = int((trial.last_result or {}).get(EPOCH) or 0)
        trial.config[KNOWN_EPOCHS] = max(int(trial.config.get(KNOWN_EPOCHS) or 0), reported)
        node_losses = int(row.get("node_losses") or 0)
        if node_losses < NODE_LOSSES_FORGIVEN and node_was_lost(trial):
            trial.run_metadata.num_failures = max(0, trial.run_metadata.num_failures - 1)
            row["node_losses"], row["error"] = node_losses + 1, NODE_LOST
            return
        faults = int(row.get("attempts") or 1)  # attempts so far, each ended by a fault
        fault = (_last_error_line(trial, self.exp), (trial.last_result or {}).get(EPOCH))
        row["error"] = fault[0]
        # A killed process may live on a retry: the out-of-memory killer's choice turns on
        # what else runs on the node, not only on the trial's own batches.
        repeated = self._last_fault.get(number) == fault and PROCESS_DIED not in fault[0]
        self._last_fault[number] = fault
        if faults > self.max_retries or repeated:
            how = " the same way, at the same point" if repeated else ""
            where = _raised_at(trial)
            trial.config[GIVE_UP] = f"failed {faults} time{'s' if faults != 1 else ''}{how}: {fault[0]}" \
                                    f"{f' (at {where})' if where else ''}{_traceback_at(trial, self.exp)}"
        else:
            row["attempts"] = faults + 1


def node_was_lost(trial) -> bool:
    """True when the trial's worker, or one rank of a distributed trial, died with its
    node (not of an error of its own): the actor is gone or unreachable and, by Ray's
    message or by the cluster's view, the node it last ran on is dead; or, for a
    distributed trial, a rank failed while a node that held one of its ranks is gone."""
    from ray.exceptions import RayActorError, RayTaskError

    error = _pickled_error(trial)
    if isinstance(error, RayTaskError):
        return _a_rank_lost_its_node(error) or _a_rank_failed_beside_a_lost_node(error, trial)
    return isinstance(error, RayActorError) and _actor_lost_its_node(error, (trial.last_result or {}).get("hps_node_id"))


def _a_rank_failed_beside_a_lost_node(error, trial) -> bool:
    """A distributed trial over several nodes, one of which is lost: the ranks on the
    others often fail first, on their broken connection to its ranks (gloo's "Connection
    reset by peer", NCCL's errors), before Ray Train hears of the lost ranks themselves.
    Whether one of the nodes that held the trial's ranks (rank 0 reports them, see
    ``trial._ranks_placement``) is gone tells that from a fault of the trial's own, which
    leaves every node up. A node lost before the trial's first report is not seen so."""
    from ray.train import WorkerGroupError

    nodes = str((trial.last_result or {}).get(RANK_NODES) or "")
    return isinstance(getattr(error, "cause", None), WorkerGroupError) and any(
        _node_is_gone(node) for node in nodes.split(",") if node)


def _node_is_gone(node: str) -> bool:
    """Dead by the cluster's view, or its raylet not answering: the survivors' errors come
    as soon as the node's processes die, and Ray declares a node dead only after several
    missed health checks (half a minute by default)."""
    import socket

    import ray

    known = next((n for n in ray.nodes() if n["NodeID"] == node), None)
    if known is None or not known.get("Alive"):
        return True
    try:
        socket.create_connection((known["NodeManagerAddress"], known["NodeManagerPort"]), timeout=2).close()
    except OSError:
        return True
    return False


def _a_rank_lost_its_node(error) -> bool:
    """A distributed trial's rank whose node died: the trial's own task fails with Ray
    Train's ``WorkerGroupError``, which holds, per rank, the failed health check of that
    rank's actor (the worker's node is named only in its text); or with its
    ``PreemptionError``, for a node that Ray was told would be reclaimed, when Ray Train's
    preemption watcher runs (off by default, see ``tuner.RAY_DEFAULTS``)."""
    from ray.exceptions import RayActorError
    from ray.train import PreemptionError, WorkerGroupError

    cause = getattr(error, "cause", None)
    if isinstance(cause, PreemptionError):
        return True
    if not isinstance(cause, WorkerGroupError):
        return False
    for failure in cause.worker_failures.values():
        # the failed health check's cause, or the actor's own death as Ray Train may hold it
        unreachable = failure if isinstance(failure, RayActorError) else getattr(failure, "health_check_failure", None)
        node = re.search(r"node_id='([0-9a-f]+)'", str(failure))
        if isinstance(unreachable, RayActorError) and _actor_lost_its_node(unreachable, node and node.group(1)):
            return True
    return False


def _actor_lost_its_node(error, node: str | None) -> bool:
    """By Ray's own account of the actor's death (the GCS names a dead node's actors so),
    a pre-emption, an actor Ray cannot reach, or, failing those, the cluster's view of the
    node it last ran on. A process that died on a node still up, killed (the system's
    out-of-memory killer) or crashed (a segfault), is the trial's own fault: Ray's words
    for it also speak of nodes ("the OOMing node"), and taking it for a node loss retried
    such a trial forever."""
    from ray.exceptions import ActorUnavailableError

    if getattr(error, "preempted", False) or isinstance(error, ActorUnavailableError) \
            or "because its node has died" in str(error):
        return True
    return node is not None and node not in _alive_nodes()


def _alive_nodes() -> set[str]:
    import ray

    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


def _pickled_error(trial):
    from ray import cloudpickle  # the pickler Tune wrote the error file with (ray/tune/experiment/trial.py)

    path = getattr(trial, "pickled_error_file", None)
    try:
        with open(path, "rb") as handle:
            return cloudpickle.load(handle)
    except Exception:  # noqa: BLE001 - no error file, or an error that cannot unpickle here
        return None


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


def _traceback_at(trial, exp) -> str:
    """Where the traceback of the trial's last failed try is: its copy beside the trial's
    checkpoints (``KeepTracebacks``), else Ray's own file."""
    kept = kept_traceback(exp, trial)
    path = kept if kept.is_file() else getattr(trial, "error_file", None)
    return f" (traceback: {path})" if path else ""


def kept_traceback(exp, trial) -> Path:
    from .experiment import TRIAL_TRACEBACK

    return trial_dir_of(trial, exp) / TRIAL_TRACEBACK


def trial_dir_of(trial, exp) -> Path:
    """The study's folder of a Ray Tune trial."""
    return exp.trial_dir(trial_name(int(trial.config[TRIAL_NUMBER])))


class KeepTracebacks(Callback):
    """Copies the traceback of a trial's failed try from Ray's session directory (under
    /tmp, gone at the next reboot) to ``error.txt`` beside the trial's checkpoints, where a
    fault that ends a trial without a retry leaves its own (``trial._save_traceback``).
    Runs before ``RetryPolicy`` and ``ProgressDisplay``, which name the copy."""

    def __init__(self, exp) -> None:
        self.exp = exp

    def on_trial_recover(self, iteration, trials, trial, **info) -> None:
        self._keep(trial)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._keep(trial)

    def _keep(self, trial) -> None:
        source = getattr(trial, "error_file", None)
        if not source:
            return
        kept = kept_traceback(self.exp, trial)
        # after what the trial's process wrote of its own death, which Ray's text, guessing
        # at a kill, cannot say (audit 29: it came after Ray's guess)
        account = crash_account(kept.parent)
        own = f"The trial's process's own account (trials/.../crash*.txt):\n{account}\nRay's:\n" if account else ""
        try:
            atomic_write_text(kept, own + without_colours(Path(source).read_text(errors="replace")))
        except (OSError, HpsearchError):  # a full disk too
            pass  # Ray's own file stays, and is named instead


class _TrialTracebacks(logging.Filter):
    """Drops Ray Tune's log of a failed trial task, a full traceback for every try of every
    failing trial: ``ProgressDisplay`` says it in one line, and the traceback stays in the
    trial's error file. Also its log of a full disk met by a callback as a trial ended
    ("Error stopping trial", 40 lines): the search stops at its next write, saying so."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], DiskFullError):
            return False
        return not str(record.msg).startswith("Trial task failed for trial")


TRIAL_TRACEBACKS = _TrialTracebacks()


def quiet_trial_tracebacks(quiet: bool) -> None:
    """Whether the driver's console shows Ray Tune's traceback of each failed trial try
    (it does with ``-v``)."""
    logger = logging.getLogger("ray.tune.execution.tune_controller")
    (logger.addFilter if quiet else logger.removeFilter)(TRIAL_TRACEBACKS)


def _last_failure(trial) -> str:
    """The text of a trial's last failure: Tune's error file holds every failure of the
    trial, each under a "Failure # N" line."""
    path = getattr(trial, "error_file", None)
    try:
        text = Path(path).read_text() if path else ""
    except OSError:
        text = ""
    return without_colours(re.split(r"^Failure # \d+ \(occurred at [^)]*\)\s*$", text, flags=re.MULTILINE)[-1])


def without_colours(text: str) -> str:
    """Ray's error text without the terminal's colour codes it holds (``\\x1b[36m``)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _raised_at(trial) -> str | None:
    """Where the user's code raised the trial's last failure, as a trial that is not
    retried says it (``trial._failure_reason``): read from the traceback's text."""
    from .components import innermost_user_frame

    frames = re.findall(r'^\s*File "(.+)", line (\d+), in (.+)$', _last_failure(trial), flags=re.MULTILINE)
    return innermost_user_frame((name, int(line), function.strip()) for name, line, function in frames)


def _last_error_line(trial, exp=None) -> str:
    """The exception line of a trial's last failure, e.g. 'ValueError: bad lr'; where Ray
    wrote no traceback (an actor it lost), Ray's first and last sentences about it, not
    the indented details (actor id, namespace) under them. For a process that died, with
    ``exp``: what the process wrote of it itself, a native crash or a hang (trial_watch.py)."""
    last_failure = _last_failure(trial)
    # not Ray's header of the task (``ray::ImplicitFunc.train() (pid=..., actor_id=...)``),
    # which differs at every try: the same error must read the same (RetryPolicy compares)
    raw = [line.rstrip() for line in last_failure.splitlines() if line.strip() and not line.startswith("ray::")]
    lines = [line for line in raw if not line[0].isspace()]
    # 'ValueError: bad lr', 'mod.f.<locals>.DataError: x', or a class alone ('RuntimeError',
    # raised without a message)
    exception = [line for line in lines if re.match(r"[\w.<>]+(\([\w.]+\))?: ", line)
                 or re.fullmatch(r"(?:[\w<>]+\.)*[A-Z]\w*", line)]
    if exception:
        line = exception[-1]
        below = raw[len(raw) - raw[::-1].index(line):]
        indented = [text.strip() for text in itertools.takewhile(lambda text: text[0].isspace(), below)]
        if line.endswith(":") and indented:  # its message goes on indented below (a ConfigError's problems)
            line = f"{line} {' '.join(indented)}"
        elif line.endswith(":") and line != lines[-1]:  # its message goes on below (Ray Train's worker errors)
            line = f"{line} ... {lines[-1]}"
    elif lines:
        line = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    else:
        return "unknown error"
    line = _PROCESS_DEATH.sub(_process_death_in_short, line)[:300]
    if exp is not None and (PROCESS_DIED in line or _PEER_LOST.search(line)):
        line = crash_line(crash_account(trial_dir_of(trial, exp))) or line
    return line[:300]


# What a rank of a distributed trial raises when another rank's process is gone: a crash or
# a hang that rank's own account names, which is the trial's fault, not this (audit 61:
# every try of a segfault in one rank said only "Connection closed by peer [127.0.0.1]:41882")
_PEER_LOST = re.compile(r"Connection (closed|reset) by peer|remote process exited|communicator was aborted")


# Ray's account of a trial's (or a rank's) process that died without a Python error
_PROCESS_DEATH = re.compile(r"(The actor died unexpectedly before finishing this task\. \.\.\. )?"
                            r"The actor is dead because its worker process has died\..*?"
                            r"Worker exit detail: (.*?)(?: Some common causes.*|$)")


# Ray's detail for a worker that ended itself with a code (``os._exit(4)``), where a kill
# leaves "a connection error code 2. End of file."
_EXIT_CODE = re.compile(r"exits with an exit code (\d+)\b")


def _process_death_in_short(death: re.Match) -> str:
    """Ray's account runs to 800 characters, its likely causes in the middle, and was cut at 300."""
    detail = death.group(2).strip()
    exited = _EXIT_CODE.search(detail)
    if "SIGTERM" in detail:  # Ray's handler exits with 1 on it: no code of the trial's own (audit 32)
        return f"{PROCESS_DIED}: it was sent SIGTERM (by a person, a script or the machine) (Ray: {detail})"
    if exited and int(exited.group(1)) > 0:
        return (f"{PROCESS_DIED}: it exited with code {exited.group(1)} (os._exit, or an exit in native code "
                f"or in a thread of its own) (Ray: {detail})")
    return (f"{PROCESS_DIED}: killed (by the system's out-of-memory killer, most often) "
            f"or crashed in native code (Ray: {detail})")


class DropResumeCheckpoints(Callback):
    """A trial that ended (complete, pruned or failed) is never resumed, so the epoch
    checkpoints it kept for resume are deleted, where it wrote them and in the study's
    storage; its ``best.ckpt`` stays. With models of gigabytes these were most of a
    study's disk: two per ended trial.

    Runs before the trials table is written, so a trial is never shown as ended with
    them still there. A failure costs only the space, with a warning: the search goes on."""

    def __init__(self, exp, mirror=None) -> None:
        self.exp, self.mirror = exp, mirror

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        if not paused_by_a_full_disk(trial):  # paused, not ended: a resume continues it
            self._drop(trial)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._drop(trial)

    def _drop(self, trial) -> None:
        from .checkpoints import EPOCH_PATTERN, checkpoint_dir, drop_resume_checkpoints

        trial_dir = trial_dir_of(trial, self.exp)
        try:
            drop_resume_checkpoints(trial_dir)
            if self.mirror is not None:
                self.mirror.delete_matching(checkpoint_dir(trial_dir).relative_to(self.exp.root).as_posix(),
                                            EPOCH_PATTERN)
        except Exception as exc:  # noqa: BLE001 - costs disk space, never the search
            warnings.warn(f"epoch checkpoints of ended trial {trial_dir.name} not deleted: {exc}", stacklevel=2)


def _has_epoch_checkpoint(trial, exp) -> bool:
    from .checkpoints import epoch_checkpoints

    return bool(epoch_checkpoints(trial_dir_of(trial, exp)))


class KeepBestCheckpoints(Callback):
    """``search.keep_checkpoints``: of the ended trials, only the best N by the search
    metric keep their ``best.ckpt``, and the study's best by its own rule (a complete trial
    before a pruned one: ``TrialsTable.best_row``), which the test evaluation takes. ASHA
    prunes most trials, and each kept its best checkpoint: 3,197 files at 3,300 trials in
    audit 20, some 300 GB for a model of 100 MB.

    Runs after the trials table has the trial's end. At the session's start it applies the
    setting to the trials already ended (it may have been lowered on resume). A failure
    costs only the space, with a warning: the search goes on."""

    def __init__(self, keep: int, table: TrialsTable, exp, mirror=None) -> None:
        self.keep, self.table, self.exp, self.mirror = keep, table, exp, mirror
        self._held: set[int] | None = None  # ended trials whose best.ckpt may still be there
        # The best ``keep`` scored ended trials, as (rank, number): ranked over the whole
        # table once, then kept as trials end (an ended trial's value never changes). A
        # full ranking at every trial's end took 7 ms at 3,600 trials, between one trial
        # and the next.
        self._best: list[tuple[tuple[float, int], int]] | None = None

    def setup(self, **info) -> None:
        self._drop_all_but_the_best()

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self._trial_ended(int(trial.config[TRIAL_NUMBER]))

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._trial_ended(int(trial.config[TRIAL_NUMBER]))

    def _trial_ended(self, number: int) -> None:
        # A trial a full disk paused ends in Tune's eyes, not the study's: a resume continues
        # it from its checkpoints (audit 58: its best.ckpt went, and the study's best with it).
        if self.table.row(number).get("state") in FINISHED_STATES:
            self._drop_all_but_the_best(number)

    def _rank(self, row: dict[str, Any]) -> tuple[tuple[float, int], int] | None:
        """A scored ended trial's place: better values first, then lower numbers."""
        if row.get("state") not in (COMPLETE, PRUNED) or not has_value(row):
            return None
        return best_first(row, self.table.mode), int(row["trial"])

    def kept(self, ended: int | None = None) -> set[int]:
        """The ended trials whose checkpoints stay (``ended``: the trial that just ended)."""
        if self._best is None:
            self._best = heapq.nsmallest(self.keep, filter(None, map(self._rank, self.table.rows.values())))
        elif ended is not None and (rank := self._rank(self.table.row(ended))) is not None and rank not in self._best:
            bisect.insort(self._best, rank)
            del self._best[self.keep:]
        best = self.table.best_row()
        return {number for _, number in self._best} | ({int(best["trial"])} if best else set())

    def _drop_all_but_the_best(self, ended: int | None = None) -> None:
        from .checkpoints import BEST_CHECKPOINT, checkpoint_dir, remove_checkpoint

        if self._held is None:
            self._held = {int(row["trial"]) for row in self.table.rows.values() if row.get("state") in FINISHED_STATES}
        if ended is not None:
            self._held.add(ended)
        for number in sorted(self._held - self.kept(ended)):
            folder = checkpoint_dir(self.exp.trial_dir(trial_name(number)))
            try:
                remove_checkpoint(folder / BEST_CHECKPOINT)
                if self.mirror is not None:
                    self.mirror.delete_matching(folder.relative_to(self.exp.root).as_posix(), BEST_CHECKPOINT)
                self._held.discard(number)
            except Exception as exc:  # noqa: BLE001 - costs disk space, never the search
                warnings.warn(f"best checkpoint of trial {number} not deleted: {exc}", stacklevel=2)


class FreeRankReservations(Callback):
    """Frees the CPUs and GPUs of a distributed trial's ranks as soon as the trial ends.

    Ray Train reserves them in a placement group, which its controller removes when the
    training ends by itself. A trial that Tune stops (ASHA pruning it, say) ends its
    controller with it, and the reservation then lives as long as the driver's job. Ray
    Train's own cleaner (which hpsearch does not start: ``distributed.lean_torch_trainer``)
    asks Ray's dashboard whether the controller died, and a local Ray started by hpsearch
    runs none: on 2 CPUs, the trial after the first pruned one waited for CPUs forever
    before this callback. Each rank reports its placement group
    (``PLACEMENT_GROUP``); here it is removed when the trial completes, fails or is
    retried. One that Ray Train already removed is left alone."""

    def __init__(self) -> None:
        self.groups: dict[str, str] = {}  # trial id -> placement group id (hex)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        if result.get(PLACEMENT_GROUP):
            self.groups[trial.trial_id] = result[PLACEMENT_GROUP]

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self.free(trial.trial_id)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self.free(trial.trial_id)

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
        self._noted: set[str] = set()
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
        if notes and trial.trial_id not in self._noted:
            # Said once per trial (every report carries them): e.g. a damaged checkpoint set aside.
            self._noted.add(trial.trial_id)
            self._say(f"trial {trial.config[TRIAL_NUMBER]}: {notes}")
        self._refresh()

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        self._noted.discard(trial.trial_id)  # a retry says its own notes
        self._refresh()

    def on_step_end(self, iteration, trials, **info) -> None:
        now = time.monotonic()
        if self._live is None and now - max(self._summary_said_at, self.started) >= self.LOG_SUMMARY_EVERY_S:
            self._summary_said_at = now
            print(f"  {self.summary()}", file=sys.stderr, flush=True)

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self._announce(trial)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._announce(trial, _traceback_at(trial, self.exp))

    def on_trial_recover(self, iteration, trials, trial, **info) -> None:
        """One line per retry, in place of the traceback Ray Tune would print (see
        ``quiet_trial_tracebacks``); the traceback stays in the file it names."""
        if trial.config.get(GIVE_UP):
            return  # out of retries (``RetryPolicy``): its end as FAILED is announced instead
        number = int(trial.config[TRIAL_NUMBER])
        # An epoch's checkpoint is on disk before its report. A trial stopped between the
        # two has the checkpoint and no report: in its folder, which the driver sees unless
        # the trial ran on another machine.
        checkpointed = (trial.last_result or {}).get(EPOCH) or _has_epoch_checkpoint(trial, self.exp)
        start = "its last checkpoint" if checkpointed else "the start (no epoch finished)"
        verdict = self.table.row(number).get("error")  # RetryPolicy's, which ran first
        if verdict == NODE_LOST:  # said in words
            self._say(f"trial {number}: its node was lost; retrying from {start} on another node (not counted "
                      f"in failure.max_retries){_traceback_at(trial, self.exp)}")
            return
        # the line RetryPolicy read (Ray's error file, and a crashed process's own account) once
        self._say(f"trial {number}: retrying from {start} after {verdict or _last_error_line(trial, self.exp)}"
                  f"{_traceback_at(trial, self.exp)}")

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
