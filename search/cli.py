"""The ``hpsearch`` command line: a thin layer over ``hpsearch.search.api``.

argparse (standard library) keeps ``--help``, ``status`` and ``best`` free of heavy
imports: torch, Lightning, Ray and Optuna load only for commands that search.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .streams import PassThroughStream

EXIT_CONFIG_ERROR = 2
EXIT_INTERRUPTED = 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hpsearch",
        description="Hyperparameter search for PyTorch Lightning models: Optuna samples, ASHA prunes, "
                    "Ray Tune runs the trials, TensorBoard compares them.",
    )
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="start a search from an experiment file")
    _add_new_study_options(run)
    _add_session_options(run)

    check = commands.add_parser("check", help="check an experiment file as run does, without starting Ray")
    _add_new_study_options(check)
    check.add_argument("--address", help="the Ray cluster run would join (default: check that a trial fits "
                                         "this machine, where run starts a local Ray)")
    _add_override_option(check)

    resume = commands.add_parser("resume", help="continue an interrupted study")
    resume.add_argument("experiment_dir", help="the experiment directory (EXP_DIR)")
    resume.add_argument("--retry-failed", action="store_true",
                        help="run each failed trial's configuration again, as a new trial beyond num_trials "
                             "(once the cause of the failures is fixed)")
    _add_session_options(resume)

    status = commands.add_parser("status", help="one row per trial: state, params, metric, epochs, why it stopped")
    status.add_argument("experiment_dir")
    status.add_argument("--all", action="store_true", dest="every_trial",
                        help="every trial (past 40 only the latest, those running or paused, and the best)")
    status.add_argument("--top", type=_whole_number(1, "a count of trials"), metavar="N",
                        help="the N trials of the best values of the metric, best first")
    status.add_argument("--state", action="append", type=str.upper, metavar="STATE", dest="states",
                        choices=["COMPLETE", "PRUNED", "FAILED", "RUNNING", "PAUSED"],
                        help="only trials in this state: complete, pruned, failed, running or paused (repeatable)")
    status.add_argument("--trial", type=_whole_number(0, "a trial number"), metavar="N",
                        help="trial N in full: its values, its metric at each epoch, its time, where it ran, its "
                             "files, the end of its traceback, how to load it")

    stop = commands.add_parser("stop", help="stop the search running on a study, as Ctrl+C would (it can be "
                                            "resumed)")
    stop.add_argument("experiment_dir")
    stop.add_argument("--no-wait", action="store_false", dest="wait",
                      help="return once the search is asked to stop, not once it has stopped")

    best = commands.add_parser("best", help="the best trial (best.json)")
    best.add_argument("experiment_dir")
    best.add_argument("--json", action="store_true", help="print best.json as is")

    board = commands.add_parser("tensorboard", help="start TensorBoard on one or more experiments")
    board.add_argument("experiment_dirs", nargs="+", metavar="EXP_DIR")
    board.add_argument("--port", type=_port, default=6006, help="port to serve on, 1-65535 (default: 6006)")
    board.add_argument("--host", default="127.0.0.1", help="interface to bind (default: localhost only)")

    report = commands.add_parser("report", help="write a self-contained HTML report (and PNGs) of a study")
    report.add_argument("experiment_dir")
    report.add_argument("--out", help="directory for report.html and the PNGs (default: EXP_DIR/report)")

    compare = commands.add_parser("compare", help="one table of best results, trials, wall time and compute")
    compare.add_argument("experiment_dirs", nargs="+", metavar="EXP_DIR")
    compare.add_argument("--json", action="store_true", help="print the table as JSON")
    return parser


def _add_new_study_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="experiment YAML file")
    parser.add_argument("--name", help="experiment name (default: 'name' in the file)")
    parser.add_argument("--storage", help="directory that holds experiments (default: 'storage' in the file)")


def _add_override_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field by dotted key, e.g. --set search.num_trials=4 (repeatable)")


def _add_session_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", help="join this Ray cluster (default: start a local Ray)")
    _add_override_option(parser)
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="show what the trials print (your code's output too), with Ray's and Lightning's")


def _whole_number(least: int, what: str):
    """An argparse type: a whole number of at least ``least``, called ``what`` in its errors."""
    def parse(text: str) -> int:
        try:
            number = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if number < least:
            raise argparse.ArgumentTypeError(f"{number} is not {what} ({least} or more)")
        return number

    return parse


def _port(text: str) -> int:
    """A port TensorBoard can be reached at: 99999 raised a traceback, and 0 (a free port of
    the system's choice) printed http://127.0.0.1:0/ (audit 39)."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (1-65535)")
    return port


def main(argv: list[str] | None = None) -> int:
    """The command line. ``argv`` None: the process is the command (its console script, or
    ``python -m``), whose stop signals are ignored once its exit status is decided."""
    args = build_parser().parse_args(argv)
    import warnings

    # hpsearch's own warnings read as one line, like its errors.
    warnings.formatwarning = lambda message, category, *rest, **kw: f"warning: {message}\n"
    # A search with no result: the command line says so itself, with its exit status.
    warnings.filterwarnings("ignore", message="no trial finished with a result")
    warnings.filterwarnings("ignore", message="search stopped before the study was complete")  # and this
    warnings.filterwarnings("ignore", message="search stopped: ")  # and why failures stopped it

    _unencodable_text_escaped()
    if args.command in ("run", "resume"):
        _ctrl_c_heard()
        _stop_signals_act_as_ctrl_c()
        if not args.verbose:
            # Ray's log of a failed try's unfetched error, with its traceback, which the search
            # drops (tuner.RAY_UNHANDLED_ERROR_NOTICE), came also as Ray disconnected after it
            # (audit 58): Ray's own switch, for this process, which is the command's
            os.environ.setdefault("RAY_IGNORE_UNHANDLED_ERRORS", "1")
    with _console_reader_may_leave(getattr(args, "verbose", False)):
        try:
            return _run_command(args)
        finally:
            _disconnect_ray()
            _forget_caught_interrupts()
            if argv is None:
                _stop_signals_ignored()


def _stop_signals_ignored() -> None:
    """The command has done its work and decided its exit status; what is left is the
    interpreter's exit (threads joined, modules torn down: 1.5 s here after a search), in
    which a Ctrl+C or SIGTERM ended it with 130 or 143 instead (audit 32). Python's exit
    puts its own handlers back to the default action, so they are ignored outright."""
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)


def _forget_caught_interrupts() -> None:
    """Let the command's exit status stand after a Ctrl+C it caught. CPython sets a
    process-wide "unhandled KeyboardInterrupt" flag when an interrupt passes out of code run
    from a string by ``exec`` (as dataclasses and namedtuple build their methods, during the
    imports a Ctrl+C at start-up lands in), even when Python code catches it later; with
    ``python -m hpsearch.search.cli`` the interpreter then ended the process by SIGINT at
    exit instead of 130. Each ``exec`` of a string clears the flag as it starts."""
    exec("pass")


def _disconnect_ray() -> None:
    """Leave Ray now, while the console streams are still this command's: Ray prints the
    messages it held back (to merge repeats) as it disconnects, which would otherwise be
    at the interpreter's exit, past ``_WithoutRayletEcho``. A Ctrl+C meanwhile (a second
    one, just after a stopped search printed its result) is ignored: the study is saved and
    the result printed, and one landing in Ray's shutdown ended the command with a
    traceback, or with status 1 and its last lines of output lost."""
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        from .tuner import shutdown_ray

        with _ctrl_c_ignored():
            shutdown_ray()


@contextmanager
def _ctrl_c_ignored() -> Iterator[None]:
    """Once a search has returned, its study is saved: a Ctrl+C then is not an interruption."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)


def _run_command(args) -> int:
    from .errors import ConfigError, HpsearchError, Interrupted

    try:
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CONFIG_ERROR
    except Interrupted as exc:  # its message names the Python call too, for the API's callers
        from .errors import resume_command

        print(f"search interrupted; finished trials are kept. Continue it with:\n  "
              f"{resume_command(exc.experiment_dir, exc.address)}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except HpsearchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # during the start-up: a search's own stop is an Interrupted
        from .errors import resume_command

        # trials that --retry-failed queued may be in the study already; any resume runs them (audit 29)
        queued = " (but for the failed trials' configurations queued to run again)" \
            if getattr(args, "retry_failed", False) else ""
        again = (f"; nothing ran, and the study is as it was{queued}: continue it with:\n  "
                 f"{resume_command(args.experiment_dir, args.address)}" if args.command == "resume" else "")
        if args.command == "run":  # one that lands once the study is made is an Interrupted (api.run)
            again = " before the search started; no study was made"
        print(f"\ninterrupted{again}", file=sys.stderr)
        return EXIT_INTERRUPTED


def _unencodable_text_escaped() -> None:
    """On a console whose encoding is not UTF-8 (``LC_ALL=C`` without Python's UTF-8 mode),
    text it cannot encode (a study's path, a trial's error) is written escaped (``\\xe9``):
    it ended the command in a UnicodeEncodeError (audit 81)."""
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        if encoding != "utf8" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


class _ReaderMayLeave(PassThroughStream):
    """A console stream whose reader may go away (``hpsearch run ... | head``, a ``less``
    that was quit): from then on what is written is dropped, and the stream's descriptor
    points at /dev/null, instead of a ``BrokenPipeError`` stopping the search (it was
    raised in a Tune callback, ended the session as crashed and was charged to a trial
    as a retry). The results are in the experiment directory either way."""

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                self.stream.write(text)
            except BrokenPipeError:
                self._left()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._left()

    def _left(self) -> None:
        self.gone = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())  # the stream's own buffer, flushed at exit, goes there too
            os.close(devnull)
        except (OSError, ValueError):
            pass


class _WithoutRayletEcho(PassThroughStream):
    """stdout without the raylets' error messages that Ray's driver prints there, prefixed
    ``(raylet)``: a dead node's is its raylet's last 20 log lines, twice. The search says
    what happened in one line of its own; ``-v`` shows Ray's output as it is."""

    PREFIX = "(raylet)"

    def __init__(self, stream) -> None:
        super().__init__(stream)
        self._dropped = False

    def write(self, text: str) -> int:
        # print() writes the message, then its "\n" on its own
        dropped, self._dropped = self._dropped, self.PREFIX in text[:24]
        if not (self._dropped or (dropped and text == "\n")):
            self.stream.write(text)
        return len(text)


@contextmanager
def _console_reader_may_leave(verbose: bool) -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` as ``_ReaderMayLeave`` streams while a command
    runs; stdout also ``_WithoutRayletEcho`` unless ``verbose``."""
    saved = sys.stdout, sys.stderr
    stdout = sys.stdout if verbose else _WithoutRayletEcho(sys.stdout)
    sys.stdout, sys.stderr = _ReaderMayLeave(stdout), _ReaderMayLeave(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def _ctrl_c_heard() -> None:
    """A search started as a script's background job (``hpsearch run ... &``) begins with
    SIGINT ignored, and a Ctrl+C or ``kill -INT`` before the search loop (validation, the
    preflight, Ray's start: 10-16 s) was lost while the whole search ran. A search is
    stopped by it from its first moment, background or not, as ``api`` does once it runs."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _stop_signals_act_as_ctrl_c() -> None:
    """SIGTERM and a hang-up (SIGHUP: the SSH connection or the terminal closed) stop a
    search as Ctrl+C does, from the command's first moment: during the search, gracefully
    (running trials paused, the session recorded), which ``api`` keeps for SIGTERM; before
    it, with status 130. A SIGTERM during the preflight ended the command with 143, and a
    hang-up at any time killed it outright, leaving its trials RUNNING (audit 24). After
    a hang-up the terminal is gone, and writing to it would fail: the console's output goes
    to /dev/null from then on (a file or pipe it was sent to keeps it)."""
    from .study_lock import GRACEFUL

    terminal = [fd for fd in (1, 2) if os.isatty(fd)]  # asked now: a hung-up terminal no longer says

    def as_ctrl_c(signum, frame) -> None:
        if signum == getattr(signal, "SIGHUP", None) and terminal:
            devnull = os.open(os.devnull, os.O_WRONLY)
            for fd in terminal:
                os.dup2(devnull, fd)
            os.close(devnull)
        handler = signal.getsignal(signal.SIGINT)
        if handler == signal.SIG_IGN:  # only once the search has returned (_ctrl_c_ignored): its study is saved
            return
        if not callable(handler):  # Python's default action: end as Ctrl+C ends
            raise KeyboardInterrupt
        handler(signal.SIGINT, frame)  # as a Ctrl+C is handled now: hpsearch's, Ray Tune's or Python's own

    setattr(as_ctrl_c, GRACEFUL, True)  # hpsearch stop may send it (study_lock)
    signal.signal(signal.SIGTERM, as_ctrl_c)
    # A command started with nohup has hang-ups ignored, to outlive its terminal: so it
    # does (audit 32; it stopped the search at the logout nohup is for).
    if hasattr(signal, "SIGHUP") and signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:
        signal.signal(signal.SIGHUP, as_ctrl_c)


def cmd_run(args) -> int:
    from . import api

    result = api.run(args.config, args.overrides, name=args.name, storage=args.storage,
                     address=args.address, verbose=args.verbose)
    with _ctrl_c_ignored():  # one landing here said "interrupted; nothing ran", exit 130, the result cut off
        return _report(result)


def _said_with_condition(config) -> list[str]:
    """Each searched parameter, a conditional one with its condition (``model.momentum if
    model.optimizer=sgd``)."""
    from .config import condition_text

    return [key + (f" if {condition_text(param.when)}" if param.when else "") for key, param in config.space.items()]


def _given_first(config) -> str:
    """How many trials run the values ``search.first_trials`` gives, before any is sampled."""
    given = len(config.search.first_trials)
    return f" ({given} with the values search.first_trials gives, first)" if given else ""


def cmd_check(args) -> int:
    from . import api
    from .errors import counted
    from .space import trial_limit

    config, home = api.check(args.config, args.overrides, name=args.name, storage=args.storage,
                             address=args.address)
    resources = config.resources
    trial = (f"{resources.workers_per_trial} x ({resources.worker_cpus:g} CPU, {resources.worker_gpus:g} GPU)"
             if resources.distributed else f"{resources.cpus_per_trial:g} CPU, {resources.gpus_per_trial:g} GPU")
    if api.starts_a_local_ray(args.address):
        capacity, node = api.room_on_this_machine(config)
        room = (f"this machine ({node['CPU']:g} CPUs, {node['GPU']:g} GPUs) holds {capacity} at a time"
                + (f", so {capacity} will run at once" if capacity < config.search.max_concurrent else ""))
    else:
        room = "the cluster's room for them is checked when the search starts"
    print(f"ok: {config.name}: {config.model.class_path} on {config.data.class_path}, "
          f"{counted(len(config.space), 'searched parameter')} ({', '.join(_said_with_condition(config)) or 'none'}), "
          f"{config.metric} ({config.mode}) logged at validation\n"
          f"  {counted(trial_limit(config), 'trial')}{_given_first(config)}, {config.search.max_concurrent} at a time, "
          f"each {trial}; {room}\n"
          f"{_what_the_preflight_trained(config)}"
          f"  the study would go to {home}")
    return 0


def _what_the_preflight_trained(config) -> str:
    """Which values the preflight trained with: the other values of the space were given to
    the constructors only, so one that fails later (in configure_optimizers, a step) fails
    its trials, and ``ok`` does not say otherwise (audit 45)."""
    if not config.search.preflight:
        return "  the preflight is off (search.preflight: false): nothing was trained\n"
    from .preflight import trained_with

    first = (", and with each first trial's values unless a warning above says its time ran out"
             if config.search.first_trials else "")
    return (f"  trained two steps{trained_with(config) or ' with no searched values'}{first}; the space's other "
            f"values were given to the constructors only\n")


def cmd_resume(args) -> int:
    from . import api

    result = api.resume(args.experiment_dir, args.overrides, address=args.address, verbose=args.verbose,
                        retry_failed=args.retry_failed)
    with _ctrl_c_ignored():
        return _report(result)


def _report(result) -> int:
    from .errors import counted
    from .outcome import FINISHED_STATES, PAUSED, SESSION_TIME_BUDGET
    from .experiment import ExperimentDir
    from .status_view import num_workers_setting, print_best, print_data_starved
    from .storage import study_address

    study = study_address(result.experiment_dir)
    copy = f", its working copy {result.experiment_dir}" if study != str(result.experiment_dir) else ""
    print(f"experiment: {study}  ({result.elapsed_s:.1f}s{copy})")
    if result.already_complete:
        print(f"the study was already complete ({counted(len(result.trials), 'trial')}); nothing was run. "
              + ("Every point of its grid has run, and the space cannot change on resume: "
                 "a larger grid is a new experiment" if result.grid_exhausted
                 else f"Add trials with: {result.resume_command} --set search.num_trials=N"))
    if result.evaluated_again:
        print(f"the search was already complete ({counted(len(result.trials), 'trial')}); only the best trial's "
              f"test evaluation ran again")
    if result.best:
        print_best(result.best)
    if any(trial.get("data_starved") is True for trial in result.trials):
        config = ExperimentDir(result.experiment_dir).stored_config()
        print_data_starved(result.trials, num_workers_setting=num_workers_setting(config))
    if result.outcome == SESSION_TIME_BUDGET:
        # The end the user asked for: not an error, so the exit status is 0.
        states = [trial.get("state") for trial in result.trials]
        finished = sum(1 for state in states if state in FINISHED_STATES)
        print(f"time budget reached with {counted(finished - result.finished_before, 'trial')} finished in this "
              f"session ({finished} in the study) and {states.count(PAUSED)} paused; "
              f"continue the study (with a fresh budget) with:\n  {result.resume_command}")
        return 0
    if result.stop_reason:
        print(f"{result.stop_reason}.\nOnce the cause is fixed, continue the study with:\n  {result.resume_command}",
              file=sys.stderr)
        return 1
    if not result.complete:
        if not result.best:  # the stop's message promised an evaluation if a trial had ended
            print("no trial had ended with a result, so none was evaluated", file=sys.stderr)
        print(f"search stopped before the study was complete; continue it with:\n  {result.resume_command}",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    if result.best and result.best.get("test_error"):
        return 1  # the search's result is kept, but a part the user asked for failed (print_best said why)
    if not result.best:
        # Every trial failed (or none reported its metric): a search with no result is a failure.
        states = [trial.get("state") for trial in result.trials]
        print(f"no trial finished with a result: {states.count('FAILED')} of {len(states)} failed (a failed trial's "
              f"epochs are not results); see why with:\n"
              f"  hpsearch status {study_address(result.experiment_dir)}", file=sys.stderr)
        return 1
    return 0


def cmd_status(args) -> int:
    from .status_view import print_status, table_console

    if args.trial is not None:
        chosen = [option for option, given in (("--all", args.every_trial), ("--top", args.top is not None),
                                                ("--state", bool(args.states))) if given]
        if chosen:  # a usage error, as argparse's: status 2
            print(f"hpsearch status: error: --trial shows one trial; {' and '.join(chosen)} choose"
                  f"{'s' if len(chosen) == 1 else ''} the rows of the table of all", file=sys.stderr)
            return 2
        from .storage import StudyHome
        from .trial_view import print_trial

        exp, mirror = StudyHome.existing(args.experiment_dir)
        print_trial(exp, args.trial, table_console(), mirror)
        return 0
    print_status(_experiment(args.experiment_dir), every_trial=args.every_trial, top=args.top,
                 states=tuple(args.states or ()))
    return 0


def cmd_stop(args) -> int:
    """SIGTERM to the study's driver (``study_lock.stop_holder``), on this machine: a search
    in the background, under nohup or in another terminal stopped as Ctrl+C stops it, without
    looking for its pid. Then wait until it has let go of the study."""
    import time

    from .errors import ExperimentError, resume_command
    from .experiment import ExperimentDir
    from .storage import is_uri, working_copy
    from .study_lock import is_held, stop_holder

    # A study in cloud storage is searched in its working copy on the driver's machine,
    # whose lock is this machine's to ask only if the driver runs here; nothing is fetched
    # (a fetch would write into the copy the search is using).
    local = working_copy(args.experiment_dir) if is_uri(args.experiment_dir) else Path(args.experiment_dir)
    try:
        exp = ExperimentDir.existing(local)
    except ExperimentError as exc:  # a new search makes its directory once its checks and Ray's start are done
        where = (f"no search of {args.experiment_dir} has run on this machine (its working copy {local} does not "
                 f"exist)" if is_uri(args.experiment_dir) else str(exc))
        raise ExperimentError(f"{where}; a search just started makes it once its checks and Ray's start are done: "
                              "if one is starting, stop it in a moment") from None
    holder = stop_holder(exp)
    print(f"asked pid {holder['pid']} ({holder.get('command', '')}) to stop, as Ctrl+C would (a first stop lets its "
          f"running trials stop, keeping their checkpoints, and evaluates the best trial so far; a second stops it "
          f"at once, as does a first once every trial has ended and the best is being evaluated: resume evaluates "
          f"it then)", flush=True)
    if not args.wait:
        return 0
    try:
        while is_held(exp):
            time.sleep(0.5)
    except KeyboardInterrupt:
        print(f"no longer waiting; pid {holder['pid']} is still stopping", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"stopped. Continue it with: {resume_command(exp.root)}")
    return 0


def cmd_best(args) -> int:
    from .errors import ExperimentError, resume_command
    from .status_view import print_best

    exp = _experiment(args.experiment_dir)
    best = exp.stored_best()
    if best is None:
        raise ExperimentError(f"{exp.root} has no best.json: {_why_no_best(exp)}")
    if args.json:
        print(json.dumps(best, indent=2))
    else:
        print_best(best)
    if best.get("test_error"):
        # The best trial is known, but the evaluation asked for failed: as ``run`` exits.
        print(f"the best trial's test evaluation failed; once it is fixed, run it again with:\n"
              f"  {resume_command(exp.root)}", file=sys.stderr)
        return 1
    return 0


def _why_no_best(exp) -> str:
    """Why a study has no best.json, from its trials: none has scored yet, or its last
    session ended before writing it (the best trial is evaluated once the search ends)."""
    from .errors import counted, resume_command
    from .storage import study_address
    from .trials_table import read_rows

    rows = read_rows(exp.trials_csv) if exp.trials_csv.is_file() else []
    reported = [row for row in rows if row.get("best") not in ("", None)]
    scored = [row for row in reported if row.get("state") in ("COMPLETE", "PRUNED")]
    failed = sum(row.get("state") == "FAILED" for row in rows)
    if not reported:
        return (f"no trial has a result yet ({len(rows)} started, {failed} failed; "
                f"see hpsearch status {study_address(exp.root)})")
    if not scored:
        failed_later = sum(row.get("state") == "FAILED" for row in reported)
        return (f"no trial has finished with a result yet ({counted(len(reported), 'trial')} reported an epoch's "
                f"result, {failed_later} of them failed later, and a failed trial does not count); "
                f"hpsearch status {study_address(exp.root)} shows them")
    have = "has a result" if len(scored) == 1 else "have results"
    return (f"{counted(len(scored), 'trial')} {have}, but the search has not finished or ended before its "
            f"evaluation of the best trial; if no search is running, {resume_command(exp.root)} writes it")


def cmd_tensorboard(args) -> int:
    from .tensorboard import serve

    return serve([_experiment(path, "tensorboard") for path in args.experiment_dirs], host=args.host,
                 port=args.port)


def cmd_report(args) -> int:
    from .errors import HpsearchError
    from .report import write_report

    exp = _experiment(args.experiment_dir)
    out = Path(args.out).expanduser() if args.out else exp.root / "report"
    try:
        out.mkdir(parents=True, exist_ok=True)
        page = write_report(exp, out)
    except OSError as exc:
        written = Path(exc.filename).resolve() if exc.filename else None
        if written is None or out.resolve() not in (written, *written.parents):
            raise  # reading the study
        elsewhere = "" if args.out else "; write it elsewhere with --out DIR"  # a study on a read-only mount (audit 81)
        raise HpsearchError(f"cannot write the report in {out}: {exc.strerror or exc}{elsewhere}") from exc
    print(f"report: {page}")
    return 0


def cmd_compare(args) -> int:
    from .status_view import print_comparison
    from .study_summary import comparison_records, summarize

    experiments = {exp.root.resolve(): exp for exp in (_experiment(path) for path in args.experiment_dirs)}
    summaries = [summarize(exp) for exp in experiments.values()]  # a study given twice is one row
    if args.json:
        print(json.dumps(comparison_records(summaries), indent=2))
    else:
        print_comparison(summaries)
    return 0


def _experiment(location: str, *parts: str):
    """An experiment from its directory, or from its URI (its files, and ``parts``, are
    fetched into the local working copy first)."""
    from .storage import StudyHome

    return StudyHome.existing(location, *parts)[0]


def _version() -> str:
    from hpsearch import __version__

    return f"hpsearch {__version__}"


COMMANDS = {
    "run": cmd_run,
    "check": cmd_check,
    "resume": cmd_resume,
    "status": cmd_status,
    "stop": cmd_stop,
    "best": cmd_best,
    "tensorboard": cmd_tensorboard,
    "report": cmd_report,
    "compare": cmd_compare,
}

if __name__ == "__main__":
    sys.exit(main())
