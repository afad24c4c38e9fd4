"""``hpsearch status EXP --trial N``: one trial in full, for finding out why it failed or
what it did, without opening its files one by one: its values, its metric epoch by epoch,
how its time went, where it ran, its files, the end of its traceback, and how to load it.

Reads the study's files only (trials.csv, the Optuna journal through ``journal_reader``,
the trial's folder), so it imports neither torch, Ray nor Optuna, like the rest of ``status``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from .errors import ExperimentError, counted, resume_command
from .experiment import STUDY_FILE, TRIAL_TRACEBACK, ExperimentDir, trial_name
from .journal_reader import one_trial
from .status_view import num_workers_setting, starved_advice
from .outcome import FIRST_TRIAL, best_of
from .storage import study_address
from .study_lock import search_runs
from .trial_watch import CRASH_FILE, written_accounts
from .trials_table import read_rows

if TYPE_CHECKING:
    from .storage import Mirror

SHOWN_FILES = (TRIAL_TRACEBACK, "output.log", "experiment.json")  # in a trial's folder, named when there
TRACEBACK_LINES = 15  # the end of a failed trial's traceback shown; error.txt has it all
LABEL_WIDTH = 12
# (label, trials.csv column) of the parts of the last epoch's time, as the speed telemetry
# reports them; its report_s is the report before it, timed once sent: no part of the epoch
_EPOCH_TIMES = (("training", "train_s"), ("validation", "val_s"), ("waiting for data", "data_wait_s"),
                ("checkpoints", "checkpoint_s"))


def print_trial(exp: ExperimentDir, number: int, console: Console, mirror: Mirror | None = None) -> None:
    """Everything the study holds of trial ``number``, one topic a line. ``mirror``: the
    study's storage, for a study in cloud storage, whose trial files are pulled first
    (``trial_files``; its checkpoints stay there)."""
    config = exp.stored_config()
    rows = {int(row["trial"]): row for row in read_rows(exp.trials_csv)} if exp.trials_csv.is_file() else {}
    record = one_trial(exp.root / STUDY_FILE, number, FIRST_TRIAL)
    row = rows.get(number)
    if row is None:
        raise ExperimentError(_no_row(exp, number, record.get("state"), rows))

    def line(label: str, text: str) -> None:
        console.print(f"{label:<{LABEL_WIDTH}}{text}", markup=False, soft_wrap=True)

    metric, best = config["metric"], exp.stored_best() or {}
    the_best = " (the study's best trial)" if best.get("trial") == number else ""
    console.print(f"trial {number} of {exp.root.name}{the_best}: {_state(row)}", markup=False, soft_wrap=True)
    values = [_value(key, row.get(key), spec) for key, spec in config["space"].items()]
    if LABEL_WIDTH + len(", ".join(values)) <= console.width:
        line("values", ", ".join(values))
    else:  # one to a line: 32 values made one line of 2,300 characters (audit 83)
        for label, value in zip(["values", *[""] * len(values)], values):
            line(label, value)
    given = record.get(FIRST_TRIAL)
    if given is not None or row.get("retry_of") not in (None, ""):
        line("", "given by search.first_trials" if given is not None else
             f"trial {row['retry_of']}'s values, run again (resume --retry-failed)")
    line(metric, _metric(row, record["values"], config["mode"]))
    if the_best and (best.get("test_metrics") or best.get("test_error")):
        line("test", ", ".join(f"{key} = {_number(value)}" for key, value in (best.get("test_metrics") or {}).items())
             or f"its evaluation failed: {best['test_error']}")
    line("time", _times(row, num_workers_setting(config)))
    line("ran on", _where(row))
    if row.get("seed") not in (None, ""):
        line("seed", f"{row['seed']} (what it trained with; hpsearch.load_trial builds it from this seed too)")
    folder = exp.trial_dir(trial_name(number))
    if mirror is not None:
        mirror.pull(*trial_files(number, row))
    checkpoint = f"trials/{trial_name(number)}/checkpoints/best.ckpt"
    kept = (exp.root / checkpoint).exists() or (mirror is not None and mirror.exists(checkpoint))
    shown = mirror.address_of(folder) if mirror is not None else folder
    line("folder", f"{shown}{_files(folder, kept)}")
    runs = sorted(p.name for p in exp.tensorboard_dir.glob(f"{trial_name(number)}*") if p.is_dir())
    if runs:
        line("TensorBoard", f"run {runs[0]} (hpsearch tensorboard {study_address(exp.root)})")
    if kept:
        line("load it", f"hpsearch.load_trial({str(study_address(exp.root))!r}, {number})")
    traceback = _traceback(folder)
    if traceback is not None:
        path, lines = traceback
        shown = lines[-TRACEBACK_LINES:]
        cut = f", its last {len(shown)} lines" if len(shown) < len(lines) else ""
        console.print(f"\n{path}{cut}:", markup=False, soft_wrap=True)
        for text in shown:
            console.print(f"  {text}", markup=False, soft_wrap=True, highlight=False)


def trial_files(number: int, row: dict[str, Any]) -> list[str]:
    """The files of a trial's folder that ``print_trial`` reads or names, relative to the
    study: each rank's traceback of a distributed trial among them."""
    ranks = row.get("world_size") if isinstance(row.get("world_size"), int) else 1
    names = [*SHOWN_FILES, CRASH_FILE]
    if ranks > 1:  # rank 0's crash account is crash.txt (trial_watch.crash_file)
        names += [f"error-rank{rank}.txt" for rank in range(ranks)]
        names += [f"crash-rank{rank}.txt" for rank in range(1, ranks)]
    return [f"trials/{trial_name(number)}/{name}" for name in names]


def _state(row: dict[str, Any]) -> str:
    """The state, why, and the error of its last try when that is not the reason itself."""
    text = f"{row.get('state', '?')}, {row.get('reason') or 'no reason recorded'}"
    error = row.get("error")
    if error and error != row.get("reason"):
        text += f" (its last fault: {error})"
    tries = row.get("attempts")
    if isinstance(tries, int) and tries > 1:
        text += f"; {tries} tries"
    if row.get("node_losses"):
        text += f", {counted(row['node_losses'], 'node')} lost under it"
    if row.get("notes"):
        text += f"; {row['notes']}"
    return text


def _value(key: str, value: Any, spec: dict[str, Any]) -> str:
    if value in (None, "") and spec.get("when"):
        condition = " and ".join(f"{name}={choices}" for name, choices in spec["when"].items())
        return f"{key} not sampled (only when {condition})"
    return f"{key} = {value!r}" if isinstance(value, float) else f"{key} = {value}"


def _metric(row: dict[str, Any], values: dict[int, Any], mode: str) -> str:
    """Its best value and the epoch of it, its last, and each epoch's (the journal's record
    of its reports; trials.csv's best and last lag it while the trial runs, audit 46)."""
    scored = {epoch: value for epoch, value in values.items()
              if isinstance(value, (int, float)) and math.isfinite(value)}
    if not scored and row.get("best") in (None, ""):
        return "no value reported"
    best, last, at = row.get("best"), row.get("last"), ""
    if scored:
        best_epoch = best_of(sorted(scored), mode, key=scored.__getitem__)
        best, last, at = scored[best_epoch], values[max(values)], f" at epoch {best_epoch}"
    epochs = max(row.get("epochs") or 0, max(values, default=0))
    text = f"best {_number(best)}{at} ({mode}), last {_number(last)}, after {counted(epochs, 'epoch')}"
    if values:
        text += "; by epoch: " + "  ".join(f"{epoch}: {_number(values[epoch])}" for epoch in sorted(values))
    return text


def _no_row(exp: ExperimentDir, number: int, state: str | None, rows: dict[int, Any]) -> str:
    """Why trial ``number`` has no row in trials.csv, by its state in the journal: queued, or
    handed out and starting, is run by the search running on the study, else by a resume
    (audit 46); one that ended has lost its row, which a resume writes again (audit 47)."""
    running, resume = search_runs(exp), f"`{resume_command(exp.root)}`"
    if state == "WAITING":
        return f"trial {number} is queued in the study and has not started; " + (
            "the search running on it runs it" if running else f"{resume} runs it")
    if state == "RUNNING":
        return f"trial {number} is starting: the study has it, trials.csv not yet; " + (
            "ask again in a moment" if running else f"no search runs on the study: {resume} runs it")
    if state is not None:
        return (f"trial {number} ended ({state} in the study's journal), but trials.csv has no row for it; "
                f"{resume} writes trials.csv again from the journal")
    held = f"its trials: {min(rows)}-{max(rows)}" if rows else "it has no trial yet"
    return f"{exp.root} has no trial {number} ({held})"


def _times(row: dict[str, Any], workers_setting: Any = "auto") -> str:
    """Its last epoch's time and where it went (the speed telemetry), its start-up and its
    compute in all; ``workers_setting``: the file's ``loader.num_workers``, for the advice
    to a data-starved trial."""
    epoch = row.get("epoch_time_s")
    if not isinstance(epoch, (int, float)):
        return "no epoch ended"
    parts = [f"{label} {_seconds(row[column])}" for label, column in _EPOCH_TIMES
             if isinstance(row.get(column), (int, float))]
    text = f"its last epoch {_seconds(epoch)} ({', '.join(parts)})"
    if isinstance(row.get("report_s"), (int, float)) and isinstance(row.get("epochs"), int) and row["epochs"] > 1:
        # shown as a part of the epoch, the parts added up to more than it (audit 49)
        text += f"; the report of the epoch before it {_seconds(row['report_s'])}"
    if isinstance(row.get("startup_s"), (int, float)):
        text += f"; start-up {_seconds(row['startup_s'])}"
    if isinstance(row.get("compute_s"), (int, float)):
        text += f"; {_seconds(row['compute_s'])} of compute in all"
    if row.get("data_starved") is True:
        workers = row.get("num_workers")
        had = f" with {counted(workers, 'loader worker')}" if isinstance(workers, int) else ""
        text += f"; data-starved (its DataLoader could not keep up{had}: {starved_advice(workers_setting)})"
    return text


def _where(row: dict[str, Any]) -> str:
    """Its device, precision and processes, its DataLoader's settings and its node: what
    the trial recorded of them (a trial that failed while it was built recorded less)."""
    if row.get("device") in (None, ""):
        return "not recorded (it ended before its first epoch)"
    ranks = row.get("world_size")
    parts = [str(row["device"]), f"precision {row.get('precision')}",
             f"{ranks} processes ({row.get('strategy')})" if isinstance(ranks, int) and ranks > 1 else "1 process"]
    if row.get("num_workers") not in (None, ""):
        parts.append(f"{counted(row['num_workers'], 'loader worker')}, pin_memory {row.get('pin_memory')}")
    if row.get("node_id"):
        parts.append(f"node {row.get('node_ip', '')} {str(row['node_id'])[:8]}")
    if row.get("resumed") is True:
        parts.append("resumed from a checkpoint")
    return ", ".join(parts)


def _files(folder: Path, checkpoint_kept: bool) -> str:
    """The files a user looks for in a trial's folder, those it has."""
    present = [name for name in SHOWN_FILES if (folder / name).exists()]
    present += ["checkpoints/best.ckpt"] if checkpoint_kept else []
    # a paused or running trial's, which a resume continues from (Lightning counts epochs from 0)
    present += sorted(f"checkpoints/{path.name}" for path in folder.glob("checkpoints/epoch-*.ckpt"))
    present += sorted(path.name for path in folder.glob("error-rank*.txt"))
    present += [path.name for path in written_accounts(folder)]
    return f" ({', '.join(present)})" if present else " (empty)" if folder.is_dir() else " (not there)"


def _traceback(folder: Path) -> tuple[Path, list[str]] | None:
    """The trial's traceback (a rank's, for a distributed trial whose ranks wrote their own),
    else its process's own account of a native crash (faulthandler's, ``trial_watch``)."""
    for path in [folder / TRIAL_TRACEBACK, *sorted(folder.glob("error-rank*.txt"), key=_rank), folder / CRASH_FILE,
                 *sorted(folder.glob("crash-rank*.txt"), key=_rank)]:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        lines = text.rstrip().splitlines()
        if lines:
            return path, lines
    return None


def _seconds(value: float) -> str:
    return f"{value:.3g} s"


def _rank(path: Path) -> int:
    """A rank's file's rank (``crash-rank10.txt``: 10), to order them by number."""
    return int("".join(filter(str.isdigit, path.stem)) or 0)


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else "-" if value in (None, "") else str(value)
