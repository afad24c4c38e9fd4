"""Data a trial worker builds once and hands to the later trials it runs.

hpsearch reuses its Ray workers across trials, and the trials of one search usually read
the same dataset: an in-memory DataModule that loads or generates its tensors in every
trial pays that again and again (2-4 s for 50,000 CIFAR-sized images on this project's
machine, against 0.1 s epochs of a pruned trial). ``once_per_worker`` returns what a
trial of this worker already built under the same key, and builds it otherwise.

A worker keeps what its last trial asked for, and no more: a trial that asks for a key
not built yet first drops every value the worker holds that this trial has not asked
for, since those belonged to earlier trials with other data arguments. So a worker whose
trials sample a data argument never holds two versions of a dataset, while a trial may
keep several (a train set and a test set). Outside a trial (the driver's preflight, your
own scripts, tests) it builds every time, so nothing outlives a search in your session.

What it returns is shared with the next trials of the worker: treat it as read-only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, TypeVar

T = TypeVar("T")

# Set by the trial (``trial.fit_trial``) in the process that runs it: the trial's number.
IN_TRIAL_ENV = "HPSEARCH_TRIAL_NUMBER"


@dataclass
class WorkerData:
    """The values built in this process, each with the last trial that asked for it."""

    held: dict[Hashable, tuple[Any, str]] = field(default_factory=dict)
    builds: int = 0
    reuses: int = 0

    def get(self, key: Hashable, build: Callable[[], T], trial: str,
            still_valid: Callable[[T], bool] | None = None) -> T:
        if key in self.held and (still_valid is None or still_valid(self.held[key][0])):
            value = self.held[key][0]
            self.held[key] = (value, trial)
            self.reuses += 1
            return value
        # Free what earlier trials left before building (and a stale value under this key):
        # it would otherwise be held twice.
        self.held = {k: entry for k, entry in self.held.items() if entry[1] == trial and k != key}
        value = build()
        self.held[key] = (value, trial)
        self.builds += 1
        return value

    def clear(self) -> None:
        self.held.clear()


# The one per process: what a reused Ray worker carries from one trial to the next.
WORKER_DATA = WorkerData()


def once_per_worker(key: Hashable, build: Callable[[], T], still_valid: Callable[[T], bool] | None = None) -> T:
    """``build()``, or the value an earlier trial of this worker built under an equal ``key``.

    ``key`` must name everything the value depends on (e.g. the class, the file, the
    seed and the size), since any trial of the search may come next in this worker.
    ``still_valid``: whether a value built before still holds (what it was built from may
    have changed since in ways the key cannot name before building: the folders a listing
    found); a value it refuses is built again."""
    trial = os.environ.get(IN_TRIAL_ENV)
    if trial is None:
        return build()
    return WORKER_DATA.get(key, build, trial, still_valid)
