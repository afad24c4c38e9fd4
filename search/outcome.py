"""How a trial ended, decided once and used by the Optuna study, trials.csv and ``status``.

Ray Tune tells the searcher only that a trial completed; whether it ran to the end,
was stopped by early stopping, or was pruned by ASHA must be read from what the trial
reported (``hps_finished``, set by the trial itself) and from the scheduler's own log
of the trials it stopped (``PruneLog``). Reserved result keys carry the ``hps_`` prefix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

COMPLETE, PRUNED, FAILED, RUNNING, PENDING = "COMPLETE", "PRUNED", "FAILED", "RUNNING", "PENDING"
# Running when its session ended (time budget, Ctrl+C, SIGTERM): resume continues it from
# its last checkpoint. Ray Tune's word for a trial stopped to be continued later.
PAUSED = "PAUSED"
FINISHED_STATES = (COMPLETE, PRUNED, FAILED)

# How a search session ended (``sessions.json``'s ``outcome``).
SESSION_COMPLETE, SESSION_TIME_BUDGET, SESSION_INTERRUPTED = "complete", "time_budget", "interrupted"
SESSION_RAY_LOST = "ray_lost"  # its Ray stopped answering (see ray_watch.py)
# failure.max_consecutive_failures trials in a row failed (see tune_callbacks.FailuresInARow)
SESSION_FAILURES_IN_A_ROW = "failures_in_a_row"
# a trial's disk filled (see tune_callbacks.DiskFilled)
SESSION_DISK_FULL = "disk_full"
# still running, as its record says (``study_lock.search_runs`` tells one whose driver died)
SESSION_RUNNING = "running"
SESSION_CRASHED = "crashed"  # its driver met an error of hpsearch's own or of Ray's
SESSION_KILLED = "killed"  # its driver was killed outright: closed by the next session

# Result keys the trial reports besides the user's own metrics.
EPOCH = "epoch"
FINISHED = "hps_finished"
STOP_REASON = "hps_stop_reason"
TRIAL_NUMBER = "hps_trial_number"
RESTORED = "hps_restored"  # a resumed trial's report of the epoch its checkpoint holds, sent again
KNOWN_EPOCHS = "hps_known_epochs"  # in a trial's config: the epochs the study had of it when handed out
# In a trial's config, and the study's record of the trial: the seed it trains with, fixed
# when first handed out (a resume that changes search.seed leaves started trials theirs).
TRAINING_SEED = "hps_training_seed"
FIRST_TRIAL = "hps_first_trial"  # a trial's: the values of search.first_trials it was queued with
FAILURE = "hps_failure"  # set by a trial that ended on a fault a retry cannot fix (NaN, OOM)
# Set, in place of FAILURE, by a trial whose disk filled: no fault of its configuration,
# and gone once there is space, so the trial is PAUSED (its checkpoints kept, continued by
# a resume) and the session stops, rather than the trial FAILED for good (audit 55).
DISK_FULL = "hps_disk_full"
GIVE_UP = "hps_give_up"  # set in a trial's config by RetryPolicy when its retries are spent
PLACEMENT_GROUP = "hps_placement_group"  # a distributed trial's ranks' reservation (see FreeRankReservations)
RANK_NODES = "hps_rank_nodes"  # the Ray nodes a distributed trial's ranks run on, comma-separated


def best_of(values, mode: str, key=None):
    """The best of ``values`` for ``mode`` ('max' or 'min'), by ``key``; None if empty.

    The one place the direction of the search metric is applied, so the trial, the
    study and the trials table can never disagree on which value is better.
    """
    values = list(values)
    if not values:
        return None
    return (max if mode == "max" else min)(values, key=key)


def paused_by_a_full_disk(trial) -> bool:
    """Whether the trial Tune just ended reported a full disk (``DISK_FULL``): paused, not
    ended, in the study (``classify``)."""
    return bool((getattr(trial, "last_result", None) or {}).get(DISK_FULL))


@dataclass
class PruneLog:
    """Trials the scheduler stopped, by Ray trial id, with the epoch at which it did."""

    stopped_at_epoch: dict[str, int] = field(default_factory=dict)

    def record(self, trial_id: str, epoch: int) -> None:
        self.stopped_at_epoch[trial_id] = epoch


@dataclass(frozen=True)
class Outcome:
    state: str
    reason: str


def classify(trial_id: str, result: Mapping[str, Any] | None, error: bool, metric: str, prunes: PruneLog) -> Outcome:
    """The final state of a trial and a one-line reason a person can read."""
    if error:
        return Outcome(FAILED, "error")
    if result and result.get(DISK_FULL):
        return Outcome(PAUSED, str(result[DISK_FULL]))
    if result and result.get(FAILURE):
        return Outcome(FAILED, str(result[FAILURE]))
    if result and result.get(FINISHED):
        return Outcome(COMPLETE, str(result.get(STOP_REASON) or "finished"))
    value = (result or {}).get(metric)
    if value is not None and not math.isfinite(float(value)):
        return Outcome(FAILED, f"{metric} is not finite ({value})")
    if trial_id in prunes.stopped_at_epoch:
        return Outcome(PRUNED, f"pruned by ASHA after epoch {prunes.stopped_at_epoch[trial_id]}")
    epochs = (result or {}).get(EPOCH)
    return Outcome(PRUNED, f"stopped after epoch {epochs}" if epochs else "stopped before its first result")
