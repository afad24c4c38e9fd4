"""Driver-side timing shared by the benchmarks: when each trial started, reported and ended."""

from __future__ import annotations

import time

from ray.tune import Callback


class TrialTimer(Callback):
    """Wall-clock of each trial's start, results and end, and the epoch times they report.

    An epoch's time is ``epoch_time_key`` less ``excluded_key`` (hpsearch's epoch ends
    after its checkpoint writes, which are not training or validation); ``cpu_key``: the
    trial process's CPU seconds over the same training and validation."""

    def __init__(self, epoch_time_key: str, excluded_key: str | None = None, cpu_key: str | None = None) -> None:
        self.epoch_time_key, self.excluded_key, self.cpu_key = epoch_time_key, excluded_key, cpu_key
        self.epoch_cpu_seconds: list[float] = []
        self.started_at: dict[str, float] = {}
        self.first_result_at: dict[str, float] = {}
        self.first_epoch_s: dict[str, float] = {}
        self.ended_at: dict[str, float] = {}
        self.epoch_seconds: list[float] = []

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        self.started_at.setdefault(trial.trial_id, time.monotonic())

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        now = time.monotonic()
        seconds = float(result.get(self.epoch_time_key, 0.0))
        if self.excluded_key is not None:
            seconds -= float(result.get(self.excluded_key, 0.0))
        if trial.trial_id not in self.first_result_at:
            self.first_result_at[trial.trial_id] = now
            self.first_epoch_s[trial.trial_id] = seconds
        self.epoch_seconds.append(seconds)
        if self.cpu_key is not None:
            self.epoch_cpu_seconds.append(float(result.get(self.cpu_key, 0.0)))

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self.ended_at[trial.trial_id] = time.monotonic()

    def summary(self, started: float, wall: float, concurrency: int) -> dict[str, float]:
        startups = [self.first_result_at[t] - self.started_at[t] - self.first_epoch_s[t]
                    for t in self.first_result_at if t in self.started_at]
        return {
            "wall_s": wall,
            "first_result_s": min(self.first_result_at.values()) - started if self.first_result_at else float("nan"),
            "slot_efficiency": sum(self.epoch_seconds) / (wall * concurrency),
            # The wall time a perfect scheduler would need for the same epochs: no start-up,
            # no idle slot. What no amount of overhead removal can beat.
            "compute_floor_s": sum(self.epoch_seconds) / concurrency,
            # The same epochs' CPU time over the slots: no schedule on ``concurrency`` CPUs
            # can run them in less (the benchmarks' lower bounds start from it).
            "cpu_floor_s": sum(self.epoch_cpu_seconds) / concurrency,
            "startup_s": sum(startups) / len(startups) if startups else float("nan"),
            "epochs": len(self.epoch_seconds),
        }
