"""Tables for people: ``status`` (one row per trial) and ``best``. Reads files only."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .errors import counted, resume_command
from .experiment import ExperimentDir, read_sessions
from .study_lock import dead_holder
from .trials_table import read_rows

STATE_STYLES = {"COMPLETE": "green", "PRUNED": "yellow", "FAILED": "red", "RUNNING": "cyan", "PAUSED": "magenta"}


def _console() -> Console:
    # Piped output (logs, CI) gets a wide table rather than rich's 80-column default.
    return Console() if sys.stdout.isatty() else Console(width=160)


def print_status(exp: ExperimentDir, console: Console | None = None) -> None:
    console = console or _console()
    config = exp.stored_config()
    metric, params = config["metric"], list(config["space"])
    if not exp.trials_csv.is_file():
        console.print(f"{exp.root}: no trial has started yet", markup=False)
        return
    rows = read_rows(exp.trials_csv)
    # Where each trial ran, once the study spans more than one node.
    nodes = {row.get("node_id") for row in rows if row.get("node_id")}
    node_column = ("node",) if len(nodes) > 1 else ()
    table = Table(title=f"{config['name']} — {counted(len(rows), 'trial')}, {metric} ({config['mode']})")
    for column in ("trial", "state", *params, metric, "epochs", "tries", *node_column, "s/epoch", "start-up s",
                   "why it stopped"):
        table.add_column(column, justify="right" if column not in ("state", "why it stopped") else "left",
                         # a reason ends in its traceback's path: folded onto the next line, not cut off
                         overflow="fold" if column == "why it stopped" else "ellipsis")
    for row in rows:
        state = str(row.get("state", ""))
        reason = row.get("reason") or ""
        if row.get("error") and row["error"] != reason:
            finished_anyway = state in ("COMPLETE", "PRUNED")
            reason = f"{reason} (retried after: {row['error']})" if finished_anyway else f"{reason}: {row['error']}"
        if row.get("data_starved") is True:
            reason = f"{reason} [data-starved: {_fmt(row.get('data_wait_s'))}s waiting on data]".strip()
        if row.get("notes"):
            reason = f"{reason} ({row['notes']})"
        # Cells hold the user's values and messages, read as they are: "[data-starved: ...]"
        # or a "[rank0]" in an error is text, not rich markup (which dropped it).
        table.add_row(
            escape(str(row["trial"])),
            f"[{STATE_STYLES.get(state, 'white')}]{escape(state)}[/]",
            *(escape(_fmt(row.get(p))) for p in params),
            escape(_fmt(row.get("best"))),
            escape(_fmt(row.get("epochs"))),
            escape(_fmt(row.get("attempts"))
                   + (f" (+{row['node_losses']} node lost)" if row.get("node_losses") else "")),
            *((escape(f"{row.get('node_ip', '')} {str(row.get('node_id', ''))[:8]}"),) if node_column else ()),
            escape(_fmt(row.get("epoch_time_s"))),
            escape(_fmt(row.get("startup_s"))),
            escape(str(reason)),
        )
    console.print(table)
    running = [str(row["trial"]) for row in rows if row.get("state") == "RUNNING"]
    gone = dead_holder(exp) if running else None
    if gone is not None:
        which, them = (f"trial {running[0]} is", "it") if len(running) == 1 else (f"trials {', '.join(running)} are",
                                                                                  "them")
        last_session = max(read_sessions(exp), key=lambda session: float(session["started_at"]), default={})
        console.print(f"No search is running: its driver (pid {gone['pid']}, since {gone['since']}) is gone, so "
                      f"{which} not running; `{resume_command(exp.root, last_session.get('address'))}` continues "
                      f"{them}.", soft_wrap=True)
    test_error = (exp.stored_best() or {}).get("test_error")
    if test_error:
        console.print(f"The best trial's test evaluation failed: {test_error}; once it is fixed, "
                      f"`hpsearch resume {exp.root}` evaluates it again.", markup=False, soft_wrap=True)


def print_best(best: dict[str, Any], console: Console | None = None) -> None:
    console = console or _console()
    console.print(f"best trial {best['trial']}: {best['metric']} = {_fmt(best['value'])} "
                  f"({best['state'].lower()}, {counted(best.get('epochs'), 'epoch')})", markup=False)
    for key, value in best["params"].items():
        console.print(f"  {key} = {_fmt(value)}", markup=False)
    for key, value in (best.get("test_metrics") or {}).items():
        console.print(f"  test: {key} = {_fmt(value)}", markup=False)
    if best.get("test_error"):
        console.print(f"  test evaluation failed: {best['test_error']}", markup=False, soft_wrap=True)
        console.print(f"  once it is fixed, evaluate again with: hpsearch resume {best['experiment_dir']}",
                      markup=False, soft_wrap=True)
    if best.get("checkpoint"):
        console.print(f"  checkpoint: {best['checkpoint']}", markup=False)


def _fmt(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
