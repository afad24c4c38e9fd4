"""Which checkpoints an ended trial keeps, in the driver: its epoch checkpoints go once it
has ended (``DropResumeCheckpoints``), and with ``search.keep_checkpoints`` only the best
trials keep their ``best.ckpt`` (``KeepBestCheckpoints``)."""

from __future__ import annotations

import bisect
import heapq
import warnings
from typing import Any

from ray.tune import Callback

from .experiment import trial_dir_of, trial_name
from .outcome import COMPLETE, FAILED, FINISHED_STATES, PRUNED, TRIAL_NUMBER, paused_by_a_full_disk
from .trials_table import TrialsTable, best_first, has_value


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


def has_epoch_checkpoint(trial, exp) -> bool:
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
        if row.get("state") not in (COMPLETE, PRUNED, FAILED) or not has_value(row):
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
