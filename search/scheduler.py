"""The scheduler that decides which trials continue: Ray's ASHA, keyed by trial number.

Three things differ from a plain ``ASHAScheduler``:

* rungs are keyed by the study's trial number and counted in the trial's own
  ``epoch`` result, not Ray's trial id and report counter, so a trial resumed in a
  later session is the same trial to ASHA;
* the rungs can be seeded from the study's history (``seed_rungs``), so a resumed
  search keeps the cutoffs it had; and stopped trials are logged in a ``PruneLog``
  so they reach Optuna as PRUNED;
* for distributed trials, each decision is published for the trial's ranks, which wait
  for it at the rungs (see ``rung_decisions``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ray.tune.schedulers import AsyncHyperBandScheduler, FIFOScheduler, TrialScheduler

from .config import ExperimentConfig
from .outcome import EPOCH, FINISHED, TRIAL_NUMBER, PruneLog
from .rung_decisions import RungDecisions


@dataclass(frozen=True)
class _RungKey:
    """Stands in for a Ray ``Trial`` inside ASHA's brackets: only ``trial_id`` is read."""

    trial_id: str


def rung_key(number: int) -> _RungKey:
    return _RungKey(f"study-trial-{number}")


class StudyASHA(AsyncHyperBandScheduler):
    def __init__(self, prunes: PruneLog, decisions: RungDecisions | None = None, **kwargs) -> None:
        """``decisions``: where to publish each decision, for trials whose ranks report
        through Ray Train and wait for it at a rung."""
        super().__init__(**kwargs)
        self.prunes = prunes
        self.decisions = decisions

    @staticmethod
    def _key(trial) -> _RungKey:
        return rung_key(int(trial.config[TRIAL_NUMBER]))

    def on_trial_add(self, tune_controller, trial) -> None:
        super().on_trial_add(tune_controller, self._key(trial))

    def on_trial_result(self, tune_controller, trial, result):
        decision = super().on_trial_result(tune_controller, self._key(trial), result)
        if decision == TrialScheduler.STOP and not result.get(FINISHED):
            self.prunes.record(trial.trial_id, int(result.get(EPOCH, 0)))
        if self.decisions is not None and EPOCH in result and not result.get(FINISHED):
            self.decisions.publish(int(trial.config[TRIAL_NUMBER]), int(result[EPOCH]),
                                   decision == TrialScheduler.STOP)
        return decision

    def on_trial_complete(self, tune_controller, trial, result) -> None:
        if self._key(trial).trial_id in self._trial_info:
            super().on_trial_complete(tune_controller, self._key(trial), result)

    def on_trial_remove(self, tune_controller, trial) -> None:
        self._trial_info.pop(self._key(trial).trial_id, None)

    def seed_rungs(self, history: Mapping[int, Mapping[int, float]]) -> int:
        """Record earlier sessions' results: ``{trial number: {epoch: metric value}}``.

        Each trial enters a rung with its value at the first epoch at or past the
        rung's milestone, exactly as it would have live. Returns the entries made.
        """
        entries = 0
        for bracket in self._brackets:
            for milestone, recorded in bracket._rungs:
                for number, curve in history.items():
                    reached = sorted(epoch for epoch in curve if epoch >= milestone)
                    if reached:
                        recorded[rung_key(number).trial_id] = self._metric_op * curve[reached[0]]
                        entries += 1
        return entries


def make_scheduler(config: ExperimentConfig, prunes: PruneLog) -> TrialScheduler:
    settings = config.scheduler
    if settings.type == "none":
        return FIFOScheduler()
    return StudyASHA(
        prunes,
        decisions=RungDecisions(frozenset(settings.rung_epochs)) if config.resources.distributed else None,
        time_attr=EPOCH,
        metric=config.metric,
        mode=config.mode,
        max_t=settings.max_epochs,
        grace_period=settings.grace_period,
        reduction_factor=settings.reduction_factor,
        brackets=1,
    )
