"""The trials table: one row per trial, kept in ``trials.csv``; the source of ``status`` and ``best``.

Plain data and the csv module only, so the CLI's read-only commands never import
torch, Ray or Optuna.
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .experiment import atomic_write_text
from .outcome import FINISHED_STATES, PAUSED, RUNNING, best_of

FIXED_COLUMNS = ("trial", "state", "reason", "best", "last", "epochs")
TELEMETRY_COLUMNS = (
    "compute_s", "epoch_time_s", "train_s", "val_s", "epoch_cpu_s", "data_wait_s", "checkpoint_s", "report_s", "startup_s", "workers_start_s", "data_reused", "data_starved",
    "samples_per_s", "first_result_s", "seed", "device", "precision",
    "world_size", "strategy", "num_workers", "pin_memory", "loader_sharing", "batch_slots", "resumed", "attempts", "node_losses", "node_id", "node_ip",
    "rank_nodes", "error", "notes", "retry_of", "trial_dir", "ray_trial_id",
)
# Result keys reported by the trial, by the column they fill.
RESULT_TO_COLUMN = {
    "hps_epoch_time_s": "epoch_time_s",
    "hps_train_time_s": "train_s",
    "hps_val_time_s": "val_s",
    "hps_epoch_cpu_s": "epoch_cpu_s",
    "hps_data_wait_s": "data_wait_s",
    "hps_checkpoint_s": "checkpoint_s",
    "hps_report_s": "report_s",
    "hps_startup_s": "startup_s",
    "hps_workers_start_s": "workers_start_s",
    "hps_data_reused": "data_reused",
    "hps_data_starved": "data_starved",
    "hps_samples_per_s": "samples_per_s",
    "hps_first_result_s": "first_result_s",
    "hps_device": "device",
    "hps_precision": "precision",
    "hps_world_size": "world_size",
    "hps_strategy": "strategy",
    "hps_num_workers": "num_workers",
    "hps_pin_memory": "pin_memory",
    "hps_loader_sharing": "loader_sharing",
    "hps_batch_slots": "batch_slots",
    "hps_resumed": "resumed",
    "hps_trial_dir": "trial_dir",
    "hps_notes": "notes",
    "hps_node_id": "node_id",
    "hps_node_ip": "node_ip",
    "hps_rank_nodes": "rank_nodes",
}


class Row(dict):
    """A row of trials.csv that keeps its rendered CSV line until it changes, however it
    is changed. The driver rewrites the file at every trial's start and end: rendering
    every row each time cost 8 ms at 300 trials, and comparing each row with the items it
    was rendered from still cost 8 ms at 3,300 (audit 20), on the path between one trial
    and the next."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.line: str | None = None

    def __setitem__(self, key: str, value: Any) -> None:
        self.line = None
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self.line = None
        super().__delitem__(key)

    def __ior__(self, other: Any) -> "Row":
        self.line = None
        return super().__ior__(other)

    def update(self, *args: Any, **kwargs: Any) -> None:
        self.line = None
        super().update(*args, **kwargs)

    def setdefault(self, key: str, default: Any = None) -> Any:
        self.line = None
        return super().setdefault(key, default)

    def pop(self, *args: Any) -> Any:
        self.line = None
        return super().pop(*args)

    def popitem(self) -> tuple[str, Any]:
        self.line = None
        return super().popitem()

    def clear(self) -> None:
        self.line = None
        super().clear()


@dataclass
class TrialsTable:
    """Rows by trial number; ``metric``/``mode`` say which value is better."""

    metric: str
    mode: str
    param_names: list[str]
    rows: dict[int, Row] = field(default_factory=dict)

    @property
    def columns(self) -> list[str]:
        return [*FIXED_COLUMNS, *self.param_names, *TELEMETRY_COLUMNS]

    def row(self, number: int) -> Row:
        return self.rows.setdefault(number, Row(trial=number, state="PENDING", reason=""))

    def best_row(self) -> dict[str, Any] | None:
        """The best finished trial; pruned trials count only when none completed. Of trials
        tied on the value, the lowest numbered: the rows' order is the order trials started
        in (not their numbers) while a search runs, and the live summary named another of
        two tied trials than the result did.

        Optuna's rule (its ``best_trial`` takes complete trials only): a pruned trial's
        value is from an epoch before ASHA judged it short of its rung, and with a metric
        that falls as training goes on (a loss that overfits) the best value of any epoch
        can be a pruned trial's first. ``ahead_of_best`` names such a trial."""
        for states in (("COMPLETE",), ("COMPLETE", "PRUNED")):
            candidates = sorted((r for r in self.rows.values() if r.get("state") in states and has_value(r)),
                                key=lambda row: int(row["trial"]))
            if candidates:
                return best_of(candidates, self.mode, key=lambda row: _as_float(row["best"]))
        return None

    def ahead_of_best(self, best: dict[str, Any] | None) -> dict[str, Any] | None:
        """The best pruned or failed trial when it scored better than ``best``, ``best_row()``'s
        trial, which callers have already found: where the best is named, this is said beside
        it (audit 33: the result named trial 7 at 10.03, the table above it listed a pruned
        trial at 10.71, and nothing said why; audit 74: a trial that diverged after its best
        epoch failed, and ``status --top`` ranked it first with no word why it was not the best)."""
        if best is None:
            return None
        others = sorted((r for r in self.rows.values() if r.get("state") in ("PRUNED", "FAILED") and has_value(r)
                         and int(r["trial"]) != int(best["trial"])), key=lambda row: int(row["trial"]))
        ahead = best_of(others, self.mode, key=lambda row: _as_float(row["best"]))
        if ahead is None or _as_float(ahead["best"]) == _as_float(best["best"]):
            return None
        return ahead if best_of([ahead, best], self.mode, key=lambda row: _as_float(row["best"])) is ahead else None

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for row in self.rows.values():
            counts[row["state"]] = counts.get(row["state"], 0) + 1
        return counts

    def ended(self) -> int:
        """How many trials have ended (complete, pruned or failed)."""
        return sum(1 for row in self.rows.values() if row.get("state") in FINISHED_STATES)

    def pause_running(self, reason: str) -> int:
        """Mark the trials a session left running as PAUSED, saying why; how many were.

        Their Optuna trials stay RUNNING, which is what makes resume continue them."""
        running = [row for row in self.rows.values() if row.get("state") == RUNNING]
        for row in running:
            row["state"], row["reason"] = PAUSED, reason
        return len(running)

    def to_csv(self) -> str:
        columns = self.columns
        # The sampled values and the metric whole (a value read back is the value sampled:
        # result.trials' model.lr matched no best.json's at 6 digits); timings at 6 digits.
        whole = {*FIXED_COLUMNS, *self.param_names}
        lines = [_csv_line(columns)]
        for number in sorted(self.rows):
            row = self.rows[number]
            if not isinstance(row, Row):  # one set whole (``rows[n] = {...}``): kept as a Row from now on
                row = self.rows[number] = Row(row)
            if row.line is None:
                row.line = _csv_line([_cell(row.get(column, ""), column in whole) for column in columns])
            lines.append(row.line)
        return "".join(lines)

    def save(self, path: Path) -> None:
        atomic_write_text(path, self.to_csv())

    @classmethod
    def load(cls, path: Path, metric: str, mode: str, param_names: list[str]) -> "TrialsTable":
        table = cls(metric, mode, list(param_names))
        if path.is_file():
            with path.open(newline="", encoding="utf-8") as handle:
                for raw in csv.DictReader(handle):
                    row = Row((k, _parse(v)) for k, v in raw.items() if v != "")
                    _moved_to(row, path.parent)
                    table.rows[int(row["trial"])] = row
        return table


def _moved_to(row: dict[str, Any], root: Path) -> None:
    """A row written where the study was before it was moved or copied (a cluster's disk, a
    renamed folder) names its files there: its paths are made this directory's, as
    best.json's are (``ExperimentDir.stored_best``), and the session's next write keeps them."""
    trial_dir = row.get("trial_dir")
    if not isinstance(trial_dir, str) or Path(trial_dir).parent.name != "trials":
        return
    before = Path(trial_dir).parent.parent
    if before != root:
        for key in ("trial_dir", "reason", "error"):
            if isinstance(row.get(key), str):
                row[key] = row[key].replace(f"{before}{os.sep}", f"{root}{os.sep}")


# Counts that trials.csv leaves empty while nothing happened: read back as 0.
COUNT_COLUMNS = ("node_losses",)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """trials.csv as typed rows, in trial order, naming the study's files where it is now
    (``_moved_to``), as ``TrialsTable.load`` does."""
    with path.open(newline="", encoding="utf-8") as handle:
        rows = [{k: _parse(v) for k, v in raw.items()} for raw in csv.DictReader(handle)]
    for row in rows:
        row.update({name: 0 for name in COUNT_COLUMNS if row.get(name) == ""})
        _moved_to(row, path.parent)
    return sorted(rows, key=lambda r: r["trial"])


def _csv_line(values: list[Any]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer).writerow(values)
    return buffer.getvalue()


def _cell(value: Any, whole: bool = False) -> Any:
    if isinstance(value, float):
        return repr(value) if whole else f"{value:.6g}"
    return value


def _parse(text: str) -> Any:
    """A cell as the value it was written from. Text that only reads as a number ("007",
    "1_000", "1e3": a categorical choice, a revision) is not how a number is written here,
    and stays text: status had shown the choices "1e3" and "1_000" both as 1000."""
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            value = kind(text)
        except (TypeError, ValueError):
            continue
        # its own rendering: ``str`` (a float's whole form, its repr, is the same), else the six-digit form
        return value if text == str(value) or text == _cell(value) else text
    return text


def best_first(row: dict[str, Any], mode: str) -> tuple[float, int]:
    """A scored row's sort key, better values first, then lower trial numbers (``has_value``
    rows only)."""
    return (-1 if mode == "max" else 1) * float(row["best"]), int(row["trial"])


def has_value(row: dict[str, Any]) -> bool:
    """Whether a trial's row has a best value of the metric, and a finite one."""
    value = _as_float(row.get("best"))
    return value is not None and math.isfinite(value)


def _as_float(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
