"""Tables for people: ``status`` (one row per trial), ``best`` and ``compare``. Reads files only."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from .errors import counted, resume_command
from .journal_reader import WAITING, trial_states
from .outcome import SESSION_DISK_FULL, SESSION_FAILURES_IN_A_ROW, SESSION_RAY_LOST, SESSION_RUNNING, best_of
from .experiment import STUDY_FILE, ExperimentDir, latest_session
from .storage import study_address
from .study_lock import dead_holder, holder
from .time_left import time_left
from .trials_table import TrialsTable, best_first, has_value, read_rows

if TYPE_CHECKING:
    from .study_summary import StudySummary

REASON_WIDTH = 20  # the least width of status's "why it stopped" column
PARAMS_WIDTH = 16  # the least width of status's shared "params" column
PARAMS_LINES = 8  # the most lines a trial's values take in that column (status --trial shows them all)
NARROWEST_FOLDED = 6  # how narrow those two get on a terminal too narrow for their least widths
TELEMETRY_COLUMNS = {"s/epoch": "epoch_time_s", "start-up s": "startup_s"}  # title: trials.csv's field
# Left out, in this order, where the table would not fit the terminal even with the
# parameters in one column: trials.csv keeps them.
OPTIONAL_COLUMNS = ("start-up s", "s/epoch")
SHOWN_TRIALS = 40  # status's rows, past which only the latest, the running or paused, and the best are shown
STATE_STYLES = {"COMPLETE": "green", "PRUNED": "yellow", "FAILED": "red", "RUNNING": "cyan", "PAUSED": "magenta"}
# Why the best trial named is not a pruned one that scored better (``TrialsTable.best_row``).
PRUNED_NOT_CANDIDATES = ("a pruned trial is the best only when none completed (Optuna's rule: its value is from "
                         "an epoch before ASHA judged it)")
FAILED_NOT_CANDIDATES = "a failed trial is never the best (a later epoch of it failed: its reason says why)"


def ahead_note(ahead: dict[str, Any], metric: str, value: Any) -> str:
    """The words for a pruned or failed trial that scored better than the best, and why it
    is not the best; ``ahead``: best.json's ``ahead`` or a trials.csv row (with its value
    as ``value``). A best.json of before 2026-12-07 names only a pruned one, as
    ``pruned_ahead``."""
    state = str(ahead.get("state") or "PRUNED")
    epochs = f" (in {counted(ahead['epochs'], 'epoch')})" if ahead.get("epochs") not in (None, "") else ""
    why = FAILED_NOT_CANDIDATES if state == "FAILED" else PRUNED_NOT_CANDIDATES
    return f"{state.lower()} trial {ahead['trial']} scored better, {metric} = {_fmt(value)}{epochs}, but {why}"


def table_console(piped_width: int = 160) -> Console:
    """A terminal's own width; piped output (logs, CI) a wide table rather than rich's
    80-column default, or the width ``COLUMNS`` asks for (which piped output ignored;
    audit 83)."""
    if sys.stdout.isatty():
        return Console()
    asked = os.environ.get("COLUMNS", "")
    return Console(width=int(asked) if asked.isdigit() and int(asked) > 0 else piped_width)


def print_status(exp: ExperimentDir, console: Console | None = None, every_trial: bool = False,
                 top: int | None = None, states: tuple[str, ...] = ()) -> None:
    """The trials' table, then the study in one line: its trials by state and its best.
    Past ``SHOWN_TRIALS`` trials, unless ``every_trial``, the table holds the latest ones,
    those running or paused, and the best: at 3,000 trials it printed 3,300 lines in 6 s
    (20 s at 10,000), and said nothing of the study as a whole (audit 20, D3). ``states``
    keeps the trials in those states; ``top``, the ``top`` of best value, best first
    (the 10 best of 1,800 trials were only in trials.csv; audit 40)."""
    console = console or table_console()
    config = exp.stored_config()
    metric, params = config["metric"], list(config["space"])
    rows = read_rows(exp.trials_csv) if exp.trials_csv.is_file() else []
    table = _table_of(rows, metric, config["mode"], params)
    best = table.best_row()
    queued_and_not = trial_states(exp.root / STUDY_FILE)
    if rows:
        # the metric's column holds each trial's best epoch's value, not its last (audit 28)
        # the directory's name: a study run again from the same file is the file's name and a date (audit 39)
        title = f"{exp.root.name} — {counted(len(rows), 'trial')}, {metric} ({config['mode']}; best of each trial)"
        chosen = [row for row in rows if row.get("state") in states] if states else rows
        if top is not None:
            scored = (row for row in chosen if has_value(row))
            chosen = sorted(scored, key=lambda row: best_first(row, config["mode"]))[:top]
        shown = _marked_not_sampled(chosen if every_trial or top is not None else _worth_showing(chosen, best),
                                    config["space"])
        if states or top is not None:
            picked = " and ".join(filter(None, [f"{', '.join(s.lower() for s in states)} only" if states else "",
                                                f"the {top} best" if top is not None else ""]))
            title += f" — {picked}: {len(shown)} shown"
        console.print(_trials_table(title, shown, params, metric, *_layout(console, title, shown, params, metric)))
        if len(shown) < len(chosen):
            # of the trials chosen: with --state, those in its states (it said the study's rest, and
            # its --all dropped the states; audit 83)
            in_states = "".join(f" --state {state}" for state in states)
            console.print(f"{len(chosen) - len(shown)} more trials{' in that state' if states else ''} not shown "
                          f"(the latest {SHOWN_TRIALS} are, and those running or paused, and the best); "
                          f"`hpsearch status {study_address(exp.root)}{in_states} --all` shows every one, and "
                          f"trials.csv has them.", markup=False, soft_wrap=True)
        console.print(_summary_line(rows, best, table.ahead_of_best(best), metric, config["mode"]), markup=False,
                      soft_wrap=True)
    elif any(state != WAITING for state in queued_and_not):
        # trials.csv deleted or lost: the study still has its trials (audit 27)
        state = "has no trial rows" if exp.trials_csv.is_file() else "is missing"
        console.print(f"{exp.root}: trials.csv {state}, but the study's journal ({STUDY_FILE}) holds its "
                      f"trials; `{resume_command(exp.root)}` writes trials.csv again from it", markup=False,
                      soft_wrap=True)
    else:
        console.print(f"{exp.root}: no trial has started yet", markup=False)
    queued = queued_and_not.count(WAITING)
    if queued:  # a session ended before handing them out: first trials, failed trials' values run again
        console.print(f"{counted(queued, 'more trial')} {'is' if queued == 1 else 'are'} queued in the study to run "
                      f"first (search.first_trials, or failed trials' values run again): "
                      f"`{resume_command(exp.root)}` runs {'it' if queued == 1 else 'them'}.", markup=False,
                      soft_wrap=True)
    running = [str(row["trial"]) for row in rows if row.get("state") == "RUNNING"]
    last_session = latest_session(exp)
    # A session still "running" whose driver is gone was killed (before any trial had a
    # row, say, or during the test evaluation): say so even with no trial left RUNNING.
    which, them = (f"trial {running[0]} is", "it") if len(running) == 1 else (
        f"trials {', '.join(running)} are", "them")
    if last_session.get("outcome") == SESSION_RAY_LOST:
        # Its cluster is gone: a resume runs here, or on another cluster (see ray_watch.py)
        here = resume_command(exp.root)
        stopped = "so " + which + " not running" if running else "before the session ended"
        console.print(f"No search is running: its Ray stopped answering at "
                      f"{datetime.fromtimestamp(float(last_session['ended_at'])):%Y-%m-%d %H:%M:%S}, {stopped}; "
                      f"`{here}` continues {them if running else 'the study'} on this machine, or with "
                      f"--address ADDRESS on another cluster.", soft_wrap=True)
        gone = None
    else:
        gone = dead_holder(exp) if running or last_session.get("outcome") == SESSION_RUNNING else None
        if gone is None and last_session.get("outcome") == SESSION_RUNNING and (driver := holder(exp)) is not None:
            stop = f"`hpsearch stop {study_address(exp.root)}` stops it" if driver["host"] == socket.gethostname() \
                else f"it runs on {driver['host']}: `hpsearch stop` stops it there"
            console.print(f"A search is running on the study: pid {driver['pid']} on {driver['host']}, since "
                          f"{driver['since']}{_session_time_left(last_session, table.ended(), config)}; {stop}.",
                          markup=False, soft_wrap=True)
    if gone is not None:
        resume = resume_command(exp.root, last_session.get("address"))
        cluster = _cluster_gone(last_session.get("address"))
        if running:
            console.print(f"No search is running: its driver (pid {gone['pid']}, since {gone['since']}) is gone, "
                          f"so {which} not running; `{resume}` continues {them}{cluster}.", soft_wrap=True)
        else:
            console.print(f"No search is running: its driver (pid {gone['pid']}, since {gone['since']}) ended "
                          f"before its session did; `{resume}` continues the study{cluster}.", soft_wrap=True)
    if last_session.get("outcome") == SESSION_FAILURES_IN_A_ROW:
        console.print(f"No search is running: its last session stopped because trials kept failing "
                      f"(failure.max_consecutive_failures in a row); once the cause is fixed, "
                      f"`{resume_command(exp.root, last_session.get('address'))}` continues the study.",
                      markup=False, soft_wrap=True)
    if last_session.get("outcome") == SESSION_DISK_FULL:
        console.print(f"No search is running: its last session stopped on a full disk; once there is space, "
                      f"`{resume_command(exp.root, last_session.get('address'))}` continues the study, and the "
                      f"paused trials from their last checkpoints.", markup=False, soft_wrap=True)
    test_error = (exp.stored_best() or {}).get("test_error")
    if test_error:
        console.print(f"The best trial's test evaluation failed: {test_error}; once it is fixed, "
                      f"`{resume_command(exp.root)}` evaluates it again.", markup=False, soft_wrap=True)


def _session_time_left(session: dict[str, Any], ended: int, config: dict[str, Any]) -> str:
    """What the live summary of the running session says of its time left (``time_left``),
    from sessions.json and the trials ended in trials.csv (which lags the search by a few
    seconds at most). A grid's size is not counted here (its points may be fewer than
    num_trials): no estimate."""
    search = config.get("search") or {}
    if "finished_before" not in session or "num_trials" not in search or search.get("sampler") == "grid":
        return ""
    return time_left(time.time() - float(session["started_at"]), ended, int(session["finished_before"]),
                     int(search["num_trials"]), search.get("time_budget_s"))


def _table_of(rows: list[dict[str, Any]], metric: str, mode: str, params: list[str]) -> TrialsTable:
    table = TrialsTable(metric, mode, params)
    table.rows.update((int(row["trial"]), row) for row in rows)
    return table


def _worth_showing(rows: list[dict[str, Any]], best: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The latest ``SHOWN_TRIALS`` trials, those running or paused, and the best, in order."""
    if len(rows) <= SHOWN_TRIALS:
        return rows
    latest = {row["trial"] for row in rows[-SHOWN_TRIALS:]}
    return [row for row in rows if row["trial"] in latest or row is best or row.get("state") in ("RUNNING", "PAUSED")]


def _summary_line(rows: list[dict[str, Any]], best: dict[str, Any] | None, ahead: dict[str, Any] | None,
                  metric: str, mode: str) -> str:
    """``3300 trials: 1276 complete, 1921 pruned, 103 failed; best val_loss = 0.1667 (trial 3257)``;
    ``ahead``: a pruned or failed trial that scored better (``TrialsTable.ahead_of_best``)."""
    states: dict[str, int] = {}
    for row in rows:
        states[str(row.get("state", ""))] = states.get(str(row.get("state", "")), 0) + 1
    order = [state for state in STATE_STYLES if state in states] + sorted(set(states) - set(STATE_STYLES))
    line = f"{counted(len(rows), 'trial')}: " + ", ".join(f"{states[state]} {state.lower()}" for state in order)
    if best is not None:
        line += f"; best {metric} = {_fmt(best.get('best'))} (trial {best['trial']})"
        if ahead is not None:
            line += f"; {ahead_note(ahead, metric, float(ahead['best']))}"
    # A trial not ended is not the study's best yet (the test evaluation takes ended ones),
    # but its better value so far is worth a word: the line seemed to skip it (audit 21, D4).
    going = [row for row in rows if row.get("state") in ("RUNNING", "PAUSED") and has_value(row)]
    if going:
        leading = best_of(going, mode, key=lambda row: float(row["best"]))
        if best is None or best_of([float(leading["best"]), float(best["best"])], mode) != float(best["best"]):
            line += (f"; {'none ended yet, but ' if best is None else ''}{leading['state'].lower()} trial "
                     f"{leading['trial']} has {metric} = {_fmt(leading['best'])} so far")
    return line


def print_best(best: dict[str, Any], console: Console | None = None) -> None:
    console = console or table_console()
    at = f" at epoch {best['best_epoch']}" if best.get("best_epoch") is not None else ""
    seed = f", seed {best['seed']}" if best.get("seed") is not None else ""
    console.print(f"best trial {best['trial']}: {best['metric']} = {_fmt(best['value'])}{at} "
                  f"({best['state'].lower()}, {counted(best.get('epochs'), 'epoch')}{seed})", markup=False)
    for key, value in best["params"].items():  # whole: to train it again with, not only to read
        console.print(f"  {key} = {value!r}" if isinstance(value, float) else f"  {key} = {_fmt(value)}",
                      markup=False)
    asked = ((best.get("config") or {}).get("trainer") or {}).get("precision")
    if best.get("precision") and asked and best["precision"] != asked:  # audit 33: best.json said only the one asked
        why = "auto: its choice there" if asked == "auto" else f"{asked} is not available there"
        console.print(f"  ran with precision {best['precision']} on {best.get('device') or 'its device'} "
                      f"(trainer.precision {why})", markup=False)
    for key, value in (best.get("test_metrics") or {}).items():
        console.print(f"  test: {key} = {_fmt(value)}", markup=False)
    if best.get("test_error"):
        console.print(f"  test evaluation failed: {best['test_error']}", markup=False, soft_wrap=True)
        console.print(f"  once it is fixed, evaluate again with: {resume_command(best['experiment_dir'])}",
                      markup=False, soft_wrap=True)
    if best.get("checkpoint"):
        console.print(f"  checkpoint: {best['checkpoint']}", markup=False)
    ahead = best.get("ahead") or best.get("pruned_ahead")
    if ahead:
        console.print(f"  {ahead_note(ahead, best['metric'], ahead['value'])}", markup=False, soft_wrap=True)


def _layout(console: Console, title: str, rows: list[dict[str, Any]], params: list[str],
            metric: str) -> tuple[int | None, tuple[str, ...], int]:
    """The width of the column the sampled values share (None: a column each), the
    telemetry columns left out, and the reasons' least width, for the table to fit the
    console. Figures are never cut: too many parameters for a column each cut every figure
    to "0.00…" and header to "mode…" (at 120 columns, with 7 parameters), and at 80 columns
    the last column was cut at the screen's edge. The shared column's width is set here,
    not by rich, whose even split of the room between two folding columns ignored their
    least widths. Where even their least widths do not fit (under about 73 columns), the
    two folding columns give them up, evenly, down to ``NARROWEST_FOLDED``: the reasons
    were cut at the screen's edge there ("early_stoppin")."""
    def width(params_width: int | None, left_out: tuple[str, ...]) -> int:
        table = _trials_table(title, rows, params, metric, params_width, left_out, measuring=True)
        return Measurement.get(console, console.options.update(width=10**4), table).maximum

    if width(None, ()) <= console.width:
        return None, (), REASON_WIDTH
    left_out: tuple[str, ...] = ()
    rest = width(PARAMS_WIDTH, left_out)
    for column in OPTIONAL_COLUMNS:
        if rest <= console.width:
            break
        left_out += (column,)
        rest = width(PARAMS_WIDTH, left_out)
    room = console.width - rest  # beyond the least widths; below 0 where they do not fit
    if room < 0:
        params_width = max(NARROWEST_FOLDED, PARAMS_WIDTH + room // 2)
        return params_width, left_out, max(NARROWEST_FOLDED, REASON_WIDTH + room + (PARAMS_WIDTH - params_width))
    # The room to the values, less what the reasons need of it (at most half): half went to
    # each, and short reasons left the other half blank (49 of 200 columns; audit 83).
    longest = max((len(_shared_values(row, params)) for row in rows), default=0)
    reasons = max((len(_why_it_stopped(row)) for row in rows), default=0)
    to_reasons = min(max(0, reasons - REASON_WIDTH), room // 2)
    return PARAMS_WIDTH + min(max(0, longest - PARAMS_WIDTH), room - to_reasons), left_out, REASON_WIDTH


class _NotSampled(str):
    """A conditional parameter's cell in a trial that did not sample it (``-``); a sampled
    null, which trials.csv also leaves empty, stays None."""


NOT_SAMPLED = _NotSampled("")


def _marked_not_sampled(rows: list[dict[str, Any]], space: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows to show, a conditional parameter's empty cell marked ``NOT_SAMPLED``."""
    conditional = [key for key, param in space.items() if isinstance(param, dict) and param.get("when")]
    return [{**row, **{key: NOT_SAMPLED for key in conditional if row.get(key) in (None, "")}}
            if conditional else row for row in rows]


def _shared_values(row: dict[str, Any], params: list[str], width: int | None = None) -> str:
    """The values of the shared column; a conditional parameter the trial did not sample is
    left out, rather than shown as ``momentum=-`` in most rows (a sampled null shows as ``-``).
    With a ``width``: whole ``name=value`` pairs to a line, one too long for a line on lines
    of its own (folded there, whole), and at most ``PARAMS_LINES`` lines, the last saying how
    many more: folded as one text at the column's edge, 32 values broke mid-word with the
    next pair on the same line, and 41 trials made 3,963 lines at 80 columns (audit 83)."""
    pairs = [f"{name}={_sampled(row, param)}" for name, param in zip(_short_names(params), params)
             if row.get(param) is not NOT_SAMPLED]
    if width is None:
        return " ".join(pairs)
    lines: list[str] = []  # each a line of the column, but a long pair's, which folds
    used = 0  # the column's lines they take
    for index, pair in enumerate(pairs):
        if lines and len(lines[-1]) + 1 + len(pair) <= width:
            lines[-1] += f" {pair}"
            continue
        needs = -(-len(pair) // width)
        if used + needs > PARAMS_LINES - (index < len(pairs) - 1):  # room kept for the count of the rest
            lines.append(f"+{len(pairs) - index} more")
            break
        lines.append(pair)
        used += needs
    return "\n".join(lines)


def _sampled(row: dict[str, Any], param: str) -> str:
    """A sampled value as shown; a searched precision that this trial's device lacks, with
    the one it ran (16-mixed on CPU runs as bf16-mixed: the column said 16-mixed; audit 35)."""
    value = _fmt(row.get(param))
    ran = row.get("precision")
    if param == "trainer.precision" and ran not in (None, "") and str(ran) != value and value != "-":
        return f"{value} (ran {ran})"
    return value


def _cluster_gone(address: str | None) -> str:
    """A driver on a joined cluster's node dies with that node's Ray (``ray stop``, the
    head lost): then the command that resumes the study must not only name that cluster."""
    from .cluster_join import ClusterError, ensure_cluster_answers

    if not address:
        return ""
    try:
        ensure_cluster_answers(address)
    except ClusterError:
        return (f" (no cluster answers at {address} now: without --address it continues on this machine, "
                f"with another --address on a new cluster)")
    return ""


def _trials_table(title: str, rows: list[dict[str, Any]], params: list[str], metric: str,
                  params_width: int | None, left_out: tuple[str, ...] = (), reason_width: int = REASON_WIDTH,
                  measuring: bool = False) -> Table:
    """``status``'s table: a row per trial, the sampled values in a column each or, where
    those would not fit, together in one ``params_width`` wide. ``measuring``: the columns
    that fold (the shared values, the reasons) are left empty, to measure the rest."""
    # Where each trial ran, once the study spans more than one machine (each session's
    # local Ray is a node of its own, with a new id, on the same machine).
    node_column = ("node",) if len({row.get("node_ip") for row in rows if row.get("node_ip")}) > 1 else ()
    param_columns = ["params"] if params_width is not None else _short_names(params)
    caption = f"{' and '.join(reversed(left_out))} left out at this width (trials.csv has them)" if left_out else None
    folded = ("params", "why it stopped")  # figures are never cut: these fold instead
    telemetry = [column for column in TELEMETRY_COLUMNS if column not in left_out]
    titles = ("trial", "state", *param_columns, metric, "epochs", "tries", *node_column, *telemetry, "why it stopped")
    digits = _distinguishing_digits([row.get("best") for row in rows])
    cells = [_row_cells(row, params, params_width, bool(node_column), telemetry, measuring, digits) for row in rows]
    table = Table(title=title, caption=caption, box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), show_edge=False)
    for index, column in enumerate(titles):
        # A column of figures is as wide as its widest cell, set here so that rich does not
        # measure every cell again, twice when the table is wider than the terminal: at
        # 3,600 trials that measuring took most of ``status --all``'s time.
        width = params_width if column == "params" else None if column in folded else \
            max([cell_len(column), *(row_cells[index].cell_len for row_cells in cells)])
        table.add_column(column, justify="left" if column in ("state", *folded) else "right",
                         # a reason ends in its traceback's path: folded onto the next line, not cut off
                         overflow="fold" if column in folded else "ellipsis", no_wrap=column not in folded,
                         width=width, min_width=reason_width if column == "why it stopped" else None)
    for row_cells in cells:
        table.add_row(*row_cells)
    return table


def _distinguishing_digits(values: list[Any], least: int = 4, most: int = 12) -> int:
    """The significant digits at which different values of the metric read differently:
    at four, 1.005995 and 1.006423 both read 1.006 (audit 33)."""
    numbers = {value for value in values if isinstance(value, float)}
    for digits in range(least, most):
        if len({f"{value:.{digits}g}" for value in numbers}) == len(numbers):
            return digits
    return most


def _row_cells(row: dict[str, Any], params: list[str], params_width: int | None, node_column: bool,
               telemetry: list[str], measuring: bool, digits: int = 4) -> list[Text]:
    """One trial's cells in ``status``'s table. They hold the user's values and messages as
    they are: a "[rank0]" in an error is text, not rich markup (which dropped it)."""
    state = str(row.get("state", ""))
    reason = _why_it_stopped(row)
    values = [_sampled(row, p) for p in params] if params_width is None else \
        ["" if measuring else _shared_values(row, params, params_width)]
    tries = _fmt(row.get("attempts")) + (f" (+{row['node_losses']} node lost)" if row.get("node_losses") else "")
    return [
        Text(str(row["trial"])),
        Text.assemble((state, STATE_STYLES.get(state, "white"))),  # the word styled, not its padding
        *(Text(value) for value in values),
        Text(_fmt(row.get("best"), digits)),
        Text(_fmt(row.get("epochs"))),
        Text(tries),
        *((Text(f"{row.get('node_ip', '')} {str(row.get('node_id', ''))[:8]}"),) if node_column else ()),
        *(Text(_fmt(row.get(TELEMETRY_COLUMNS[column]))) for column in telemetry),
        Text("" if measuring else str(reason)),
    ]


def _why_it_stopped(row: dict[str, Any]) -> str:
    """A trial's "why it stopped" cell: its reason, with its error, data starvation, notes,
    and whose configuration it ran again."""
    reason = row.get("reason") or ""
    if row.get("error") and row["error"] != reason:
        if str(row.get("state", "")) in ("COMPLETE", "PRUNED"):  # finished anyway
            reason = f"{reason} (retried after: {row['error']})"
        else:  # a trial in its next try, or paused or interrupted before it
            reason = f"{reason}: {row['error']}" if reason else str(row["error"])
    if row.get("data_starved") is True:
        reason = f"{reason} [data-starved: {_waiting_on_data(row)}]".strip()
    if row.get("notes"):
        reason = f"{reason} ({row['notes']})"
    if row.get("retry_of") not in (None, ""):
        reason = f"{reason} (trial {row['retry_of']}'s configuration again)".strip()
    return str(reason)


def _short_names(params: list[str]) -> list[str]:
    """Each searched parameter's column title: its argument's name (``lr`` for
    ``model.lr``), or the whole key where two share one."""
    last = [param.rsplit(".", 1)[-1] for param in params]
    return [name if last.count(name) == 1 else param for name, param in zip(last, params)]


def num_workers_setting(config: dict[str, Any]) -> Any:
    """The study file's ``loader.num_workers`` ("auto" unless the file set a count)."""
    loader = config.get("loader")
    return loader.get("num_workers", "auto") if isinstance(loader, dict) else "auto"


def starved_advice(num_workers_setting: Any = "auto") -> str:
    """What helps a data-starved trial (``status --trial``, and the end of ``run``/``resume``):
    the trial's CPUs size its loader workers only while ``loader.num_workers`` is "auto",
    so a file that sets the count is told to raise it (it was told of both)."""
    if num_workers_setting in (None, "auto"):
        return ("more loader workers would help: loader.num_workers, or resources.cpus_per_trial, which sizes "
                "them (one CPU per trial loads in the training process); or cheaper loading")
    return (f"more loader workers would help: loader.num_workers (the file sets {num_workers_setting}), "
            f"with resources.cpus_per_trial to run them on; or cheaper loading")


def print_data_starved(trials: list[dict[str, Any]], console: Console | None = None,
                       num_workers_setting: Any = "auto") -> None:
    """Say at a session's end how many trials waited on their DataLoader, and what helps:
    the flag was only in ``status`` (audit 68)."""
    starved = [str(row.get("trial")) for row in trials if row.get("data_starved") is True]
    if starved:
        named = ", ".join(starved[:10]) + (f" and {len(starved) - 10} more" if len(starved) > 10 else "")
        (console or table_console()).print(
            f"data-starved: {'trial' if len(starved) == 1 else 'trials'} {named} waited on the DataLoader for much "
            f"of the training (hpsearch status says how much); {starved_advice(num_workers_setting)}", markup=False)


def _waiting_on_data(row: dict[str, Any]) -> str:
    """A data-starved trial's last epoch: the share of its training time spent waiting on
    data, which the flag is for, and the seconds (the seconds alone told little)."""
    wait, train = row.get("data_wait_s"), row.get("train_s")
    if not isinstance(wait, (int, float)) or not isinstance(train, (int, float)) or wait + train <= 0:
        return f"{_fmt(wait)}s waiting on data"
    return f"{wait / (wait + train):.0%} of its training time waiting on data, {_fmt(wait)} s in its last epoch"


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


COMPARE_COLUMNS = ("experiment", "metric", "best", "best trial", "test metrics", "trials", "complete", "pruned",
                   "failed", "unfinished", "wall s", "compute s", "saved s", "differs in")
COMPARE_TEXT = ("experiment", "metric", "test metrics", "differs in")  # the columns that fold
COMPARE_TEXT_ROOM = 40  # what compare's four text columns need at least, beside the figures


def print_comparison(summaries: list[StudySummary], console: Console | None = None) -> None:
    """Per study, named by its directory (a study run again from the same file has the
    same name): best result, trials by state, wall time and compute, and the settings in
    which the studies differ. One row each where the table fits the console; else a block
    each, which an 80-column terminal reads (the table's 13 columns were cut to 3
    characters each there, every figure folded over three lines)."""
    from .study_summary import settings_that_differ, study_labels

    console = console or table_console(piped_width=200)
    differing = settings_that_differ(summaries)
    shared = _choices_every_study_has(differing)
    studies = [_compared(s, label, differs, shared) for s, label, differs in
               zip(summaries, study_labels(summaries), differing)]
    figures_only = _comparison_table([{k: ("" if k in COMPARE_TEXT else v) for k, v in study.items()}
                                      for study in studies])
    if Measurement.get(console, console.options.update(width=10**4), figures_only).maximum + COMPARE_TEXT_ROOM \
            <= console.width:
        console.print(_comparison_table(studies))
        return
    console.print("hpsearch compare", style="italic", justify="center")
    for s, study in zip(summaries, studies):
        block = Table.grid(padding=(0, 2))
        block.add_column(no_wrap=True)
        block.add_column(overflow="fold")
        block.add_row(f"[bold]{study['experiment']}[/]", "")
        block.add_row("  metric", study["metric"])
        block.add_row("  best", f"{study['best']} (trial {study['best trial']})")
        block.add_row("  test metrics", study["test metrics"])
        block.add_row("  trials", f"{study['trials']}: {study['complete']} complete, {study['pruned']} pruned, "
                                  f"{study['failed']} failed" + (f", {study['unfinished']} not finished"
                                                                 if study["unfinished"] != "0" else ""))
        block.add_row("  time", f"{study['wall s']} s wall, {study['compute s']} s compute, {study['saved s']} s "
                                f"saved by pruning and early stopping")
        block.add_row("  differs in", study["differs in"])
        console.print(block)


def _compared(s: StudySummary, label: str, differs: dict[str, Any],
              shared: dict[str, list] | None = None) -> dict[str, str]:
    """One study's cells, by column, escaped for rich; ``shared``: per categorical parameter,
    the choices every compared study has (``_choices_every_study_has``)."""
    best = s.best or {}
    tests = ", ".join(f"{k}={v:.4g}" for k, v in (best.get("test_metrics") or {}).items())
    if best.get("evaluated") is False:
        tests = "not evaluated yet (search running)" if s.search_running else "not evaluated yet (resume)"
    cells = {
        "experiment": label, "metric": f"{s.metric} ({s.mode})",
        "best": f"{best['value']:.4g}" if best.get("value") is not None else "-",
        # a pruned trial is the best only where none completed: said, as best and status say it (audit 49)
        "best trial": str(best.get("trial", "-")) + (" (pruned)" if best.get("state") == "PRUNED" else ""),
        "test metrics": tests or "-", "trials": str(s.trials),
        "complete": str(s.counts["COMPLETE"]), "pruned": str(s.counts["PRUNED"]), "failed": str(s.counts["FAILED"]),
        # paused or running: the table left them out, and a study stopped half-way read as done (audit 39)
        "unfinished": str(s.trials - sum(s.counts[state] for state in ("COMPLETE", "PRUNED", "FAILED"))),
        "wall s": f"{s.wall_s:.1f}", "compute s": f"{s.compute_s:.1f}",
        "saved s": f"{s.saved_by_pruning_s + s.saved_by_early_stopping_s:.1f}",
        "differs in": ", ".join(f"{key}={_differing(key, value, (shared or {}).get(key))}"
                                for key, value in differs.items()) or "-",
    }
    return {column: escape(text) for column, text in cells.items()}


# Past this length, a categorical's choices that every compared study has are counted, not listed.
LISTED_CHOICES_WIDTH = 40


def _differing(key: str, value: Any, shared: list | None = None) -> str:
    """A setting in which the compared studies differ; a parameter this study does not search
    is said so. Of a categorical's choices too long to list, those every compared study has
    (``shared``) are counted and the others listed: whole lists of 50-character choices,
    folded, hid the one choice a study added (audit 83)."""
    if value is None and key.startswith("space."):
        return "not searched"
    whole = _setting(value)
    if shared and len(whole) > LISTED_CHOICES_WIDTH:
        own = [choice for choice in value["choices"] if choice not in shared]
        condition = whole[whole.rindex("]") + 1:]
        return "[" + ", ".join([f"{len(shared)} in every study", *(f"+{_setting(c)}" for c in own)]) + "]" + condition
    return whole


def _choices_every_study_has(differing: list[dict[str, Any]]) -> dict[str, list]:
    """Per categorical parameter in which the studies differ, the choices every one of them
    has (none where a study does not search it, or searches it otherwise)."""
    shared: dict[str, list] = {}
    for key in {key for differs in differing for key in differs}:
        values = [differs.get(key) for differs in differing]
        if all(isinstance(v, dict) and v.get("type") == "categorical" for v in values):
            shared[key] = [choice for choice in values[0]["choices"]
                           if all(choice in v["choices"] for v in values[1:])]
    return shared


def _setting(value: Any) -> str:
    """A setting as the experiment file would have it: a searched parameter as its range
    (``float 0.001..0.1 log``) or its choices, not a Python dict; true, false and null as in YAML."""
    if isinstance(value, dict) and value.get("type") in ("float", "int", "categorical"):
        from .config import condition_text

        condition = f" if {condition_text(value['when'])}" if value.get("when") else ""
        if value["type"] == "categorical":
            return "[" + ", ".join(_setting(choice) for choice in value.get("choices", [])) + "]" + condition
        step = f" step {value['step']:g}" if value.get("step") not in (None, 1) else ""
        return f"{value['type']} {value['low']:g}..{value['high']:g}{' log' if value.get('log') else ''}{step}" \
            + condition
    if value is None or isinstance(value, (bool, dict, list)):
        return json.dumps(value)
    return str(value)


def _comparison_table(studies: list[dict[str, str]]) -> Table:
    table = Table(title="hpsearch compare", box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), show_edge=False)
    for column in COMPARE_COLUMNS:
        text = column in COMPARE_TEXT
        table.add_column(column, justify="left" if text else "right", overflow="fold", no_wrap=not text)
    for study in studies:
        table.add_row(*(study[column] for column in COMPARE_COLUMNS))
    return table
