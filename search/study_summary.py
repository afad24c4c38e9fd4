"""The numbers a person compares studies by, computed from the experiment's files.

Read from ``trials.csv``, ``sessions.json``, ``best.json`` and ``experiment.yaml``
only (no torch, Ray or Optuna), so ``hpsearch compare`` is instant; ``hpsearch report``
adds the plots on top of the same numbers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .config import SchedulerConfig
from .config_loading import flat_settings
from .experiment import ExperimentDir, distinct_labels, read_sessions
from .outcome import FINISHED_STATES, PAUSED, RUNNING
from .study_lock import search_runs
from .trials_table import TrialsTable, read_rows


@dataclass
class RungCount:
    epoch: int
    reached: int  # trials that ran at least this many epochs
    kept: int  # of those, trials ASHA did not prune there (one early-stopped there was kept: audit 78)


@dataclass
class StudySummary:
    name: str
    experiment_dir: str
    metric: str
    mode: str
    max_epochs: int
    best: dict[str, Any] | None  # best.json; before it is written, the best finished trial, marked "evaluated": False
    rows: list[dict[str, Any]]
    counts: dict[str, int]
    wall_s: float  # sum of the sessions' durations (a killed session counts to its last trial end)
    compute_s: float  # trial-seconds spent training and validating, every attempt included
    saved_by_pruning_s: float  # epochs ASHA cut, at each pruned trial's own epoch time
    saved_by_early_stopping_s: float
    rungs: list[RungCount] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)  # experiment.yaml, by dotted key
    search_running: bool = False  # its last session has not ended, and its driver is not known to be gone

    @property
    def trials(self) -> int:
        return len(self.rows)


def summarize(exp: ExperimentDir) -> StudySummary:
    config = exp.stored_config()
    scheduler = SchedulerConfig.model_validate(config.get("scheduler", {}))
    max_epochs = scheduler.max_epochs
    rows = read_rows(exp.trials_csv) if exp.trials_csv.is_file() else []
    best = exp.stored_best() or _best_not_yet_evaluated(exp, config)
    counts = {state: sum(1 for r in rows if r.get("state") == state) for state in (*FINISHED_STATES, PAUSED, RUNNING)}
    pruning = stopping = 0.0
    for row in rows:
        epochs = _number(row.get("epochs"))
        spent = _number(row.get("compute_s"))
        if not epochs or row.get("state") not in ("PRUNED", "COMPLETE") or epochs >= max_epochs:
            continue
        saved = (max_epochs - epochs) * spent / epochs
        if row["state"] == "PRUNED":
            pruning += saved
        elif str(row.get("reason", "")) in ("early_stopping", "stopped_by_model"):
            stopping += saved
    ran = [(_number(r.get("epochs")), r.get("state") == "PRUNED") for r in rows]  # a paused one reached its rungs too
    rungs = [RungCount(epoch, sum(1 for e, _ in ran if e >= epoch),
                       sum(1 for e, pruned in ran if e > epoch or (e == epoch and not pruned)))
             for epoch in scheduler.rung_epochs]
    return StudySummary(
        name=config.get("name", exp.root.name), experiment_dir=str(exp.root), metric=config["metric"],
        mode=config.get("mode", "max"), max_epochs=max_epochs, best=best, rows=rows, counts=counts,
        wall_s=_wall_seconds(exp), compute_s=sum(_number(r.get("compute_s")) for r in rows),
        saved_by_pruning_s=pruning, saved_by_early_stopping_s=stopping, rungs=rungs,
        settings=compared_settings(config),
        search_running=search_runs(exp),
    )


def compared_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The settings ``compare`` tells studies apart by, by dotted key; a searched parameter
    whole (a study that searches another parameter differs by that parameter, not by each
    of its fields). ASHA's own settings are left out of a study without a scheduler: they
    act on nothing there, and were listed as a difference (audit 49)."""
    settings = {**flat_settings({k: v for k, v in config.items() if k != "space"}),
                **{f"space.{param}": spec for param, spec in config.get("space", {}).items()}}
    if settings.get("scheduler.type") == "none":
        for key in ("scheduler.grace_period", "scheduler.reduction_factor"):
            settings.pop(key, None)
    return settings


def _best_not_yet_evaluated(exp: ExperimentDir, config: dict[str, Any]) -> dict[str, Any] | None:
    """The trial the search's end will evaluate, as best.json would name it, for a study
    whose last session ended before writing best.json (a second Ctrl+C, a kill, a search
    still running): "no result yet" would contradict trials.csv and ``status``."""
    space = list(config.get("space") or {})
    row = TrialsTable.load(exp.trials_csv, config["metric"], config.get("mode", "max"), space).best_row()
    if row is None:
        return None
    return {"value": row["best"], "trial": int(row["trial"]), "state": row["state"], "epochs": row.get("epochs"),
            "params": {name: row[name] for name in space if name in row}, "test_metrics": {}, "evaluated": False}


def _wall_seconds(exp: ExperimentDir) -> float:
    """Sessions' durations; one that never ended cleanly (SIGKILL) counts until trials.csv
    was last written, the last moment it is known to have worked."""
    total = 0.0
    for session in read_sessions(exp):
        if session.get("seconds") is not None:
            total += float(session["seconds"])
        elif exp.trials_csv.is_file():
            total += max(0.0, exp.trials_csv.stat().st_mtime - float(session["started_at"]))
    return total


def _number(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if math.isfinite(number) else 0.0


def settings_that_differ(summaries: list[StudySummary]) -> list[dict[str, Any]]:
    """Per study, its values of the settings in which the compared studies differ: what
    tells a study run again with one change (or none: the same file twice) from the first.
    A parameter another study searches and it does not is None (not searched), so that its
    row does not read as the same; another setting it lacks (one a later version added) is
    left out."""
    missing = object()
    keys = sorted({key for s in summaries for key in s.settings} - {"name", "storage"})
    differ = [key for key in keys if len({repr(s.settings.get(key, missing)) for s in summaries}) > 1]
    return [{key: s.settings.get(key) for key in differ if key in s.settings or key.startswith("space.")}
            for s in summaries]


def study_labels(summaries: list[StudySummary]) -> list[str]:
    """Each study's name in the table (``experiment.distinct_labels``)."""
    from pathlib import Path

    return distinct_labels([Path(s.experiment_dir) for s in summaries])


def comparison_records(summaries: list[StudySummary]) -> list[dict[str, Any]]:
    """The comparison as plain data (``hpsearch compare --json``)."""
    return [{
        "experiment": s.name, "experiment_dir": s.experiment_dir, "metric": s.metric, "mode": s.mode,
        "differs_in": differs,
        "best_value": (s.best or {}).get("value"), "best_trial": (s.best or {}).get("trial"),
        "best_state": (s.best or {}).get("state"),
        "test_metrics": (s.best or {}).get("test_metrics", {}),
        "best_evaluated": s.best is not None and s.best.get("evaluated", True),  # False: best.json not written yet
        "trials": s.trials, **s.counts,
        "wall_s": round(s.wall_s, 3), "compute_s": round(s.compute_s, 3),
        "saved_by_pruning_s": round(s.saved_by_pruning_s, 3),
        "saved_by_early_stopping_s": round(s.saved_by_early_stopping_s, 3),
    } for s, differs in zip(summaries, settings_that_differ(summaries))]
