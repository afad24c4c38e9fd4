"""ASHA's decisions on a distributed trial's rung epochs, passed from the driver to its ranks.

A single-process trial's report returns only once Tune has taken it, and a trial that
ASHA stops is removed while it waits there. A distributed trial's ranks report through
Ray Train, whose controller collects reports by polling them, so the ranks trained on
while ASHA decided: with short epochs, a trial stopped at a rung had trained, validated,
checkpointed and logged to TensorBoard one more epoch before Ray removed its ranks, an
epoch that trials.csv and Optuna never heard of.

So at the epochs where ASHA can stop a trial (its rungs, and an epoch a resumed trial
reports again), rank 0 waits for the decision, which the driver's scheduler writes to
Ray's key-value store (kept by the cluster's head, which every node reaches), and passes
it to the other ranks: a stopped trial's ranks leave training together, before the next
epoch starts. Between rungs nothing waits.

Ray's key-value store is reached through ``session_store``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .session_store import SessionStore

NAMESPACE = "hpsearch-rung-decisions"
# How long rank 0 waits for a decision before it trains on (and says so). A decision
# normally arrives within Ray Train's result poll (0.25 s) plus the driver's handling.
WAIT_LIMIT_S = 120.0
POLL_INTERVAL_S = 0.02
_STOP, _CONTINUE = b"stop", b"continue"


@dataclass(frozen=True)
class RungDecisions:
    """One search session's decisions, keyed by trial number and epoch (``store``: the
    session's, so that an earlier session's decisions on a long-lived cluster never answer
    this one's trials)."""

    rung_epochs: frozenset[int]
    store: SessionStore = field(default_factory=lambda: SessionStore(NAMESPACE))

    def awaited(self, epoch: int, restored: bool) -> bool:
        """Whether a trial waits for the decision on this report: ASHA decides only at a
        rung, or at the first epoch a trial reports past one (a resumed trial's first)."""
        return epoch in self.rung_epochs or restored

    def publish(self, trial_number: int, epoch: int, stop: bool) -> None:
        """Driver side: the scheduler's decision on the trial's report of ``epoch``."""
        self.store.put(f"{trial_number}/{epoch}", _STOP if stop else _CONTINUE)

    def wait_for(self, trial_number: int, epoch: int, limit_s: float = WAIT_LIMIT_S) -> bool | None:
        """Trial side: whether the scheduler stopped the trial at ``epoch``; None if no
        decision came within ``limit_s``."""
        name, deadline = f"{trial_number}/{epoch}", time.monotonic() + limit_s
        while True:
            decision = self.store.get(name)
            if decision is not None:
                return decision == _STOP
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL_INTERVAL_S)

    def clear(self) -> None:
        """Drop this session's decisions (the cluster may outlive the search)."""
        self.store.clear()
