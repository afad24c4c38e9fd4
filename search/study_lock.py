"""One driver per study: an OS file lock in the experiment directory.

``filelock`` takes an ``flock`` on ``.driver.lock``; the kernel drops it when its
process dies however it dies, so a lock left by a killed driver is reclaimed by the
next one without any staleness guesswork. ``driver.json`` beside it says who holds it,
so the refusal can name the holder.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout

from .errors import ExperimentError
from .experiment import ExperimentDir, latest_session, write_json
from .outcome import SESSION_RUNNING

LOCK_FILE = ".driver.lock"
HOLDER_FILE = "driver.json"


@contextmanager
def study_lock(exp: ExperimentDir) -> Iterator[None]:
    """Hold the study for this process, or raise ``ExperimentError`` naming the holder."""
    lock = FileLock(str(exp.root / LOCK_FILE), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise ExperimentError(f"{exp.root} is already being searched by {_new_holder(exp)}; "
                              "wait for it to finish or stop it first") from None
    except OSError as exc:  # a read-only study: filelock's traceback was all it said (audit 81)
        raise ExperimentError(f"cannot take the study's lock {exp.root / LOCK_FILE}: {exc.strerror or exc}; "
                              f"a search writes into its study (hpsearch status, best and compare only read "
                              f"it, and report --out DIR writes elsewhere)") from None
    try:
        write_json(exp.root / HOLDER_FILE, {
            "pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(sys.argv), "process_started": _process_started(os.getpid()),
            # the command line takes SIGTERM as a Ctrl+C from its first moment; a Python
            # process (hpsearch.run) only while its trials run (``sigterm_stops_gracefully``)
            "sigterm_graceful": stops_gracefully(signal.getsignal(signal.SIGTERM)),
        })
        yield
    finally:
        lock.release()


def dead_holder(exp: ExperimentDir) -> dict | None:
    """The last driver of the study (``driver.json``) if it ran on this machine and its
    process is gone; None if it lives, ran elsewhere, or is unknown. A driver killed
    outright (SIGKILL, out of memory) leaves its trials RUNNING in trials.csv: this tells
    ``status`` that nothing is running them."""
    info = holder(exp)
    if info is None or info["host"] != socket.gethostname():
        return None
    try:
        os.kill(int(info["pid"]), 0)
    except ProcessLookupError:
        return info
    except (OSError, ValueError, TypeError):  # alive and another user's, or no usable pid
        return None
    return None


def _new_holder(exp: ExperimentDir, wait_s: float = 2.0) -> str:
    """The lock's holder as ``driver.json`` names it. A holder writes the file just after it
    takes the lock: until then the file names the driver before it, which has ended, and
    a refused resume named that dead pid (audit 37: 3 of 12 refusals of resumes started
    together). So a holder this machine knows to be dead is read again, a while."""
    deadline = time.monotonic() + wait_s
    while dead_holder(exp) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    if dead_holder(exp) is not None:
        return "another process (driver.json still names the one before it, which has ended)"
    return _holder_said(exp)


def _holder_said(exp: ExperimentDir) -> str:
    info = holder(exp)
    try:
        return f"pid {info['pid']} on {info['host']} (since {info['since']}: {info['command']})"
    except (TypeError, KeyError):
        return "another process"


def holder(exp: ExperimentDir) -> dict | None:
    """The study's last driver as ``driver.json`` names it (pid, host, since, command, as
    ``study_lock`` wrote it), or None if absent or unreadable; whether it still runs is for
    the caller to ask (``dead_holder``, ``is_held``)."""
    try:
        info = json.loads((exp.root / HOLDER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) and "pid" in info and "host" in info else None


def _process_started(pid: int) -> int | None:
    """When process ``pid`` started, in the kernel's clock ticks since boot (Linux's
    /proc; None elsewhere): with the pid, it names one process, where a pid alone may
    have been reused by another since."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22, counted after the command's name


def search_runs(exp: ExperimentDir) -> bool:
    """Whether a search is running on the study, as ``status`` tells it: its last session
    is still running and its driver is not known to be gone. (The report and ``compare``
    of a study being searched had said that its search ended before evaluating the best
    trial, and that ``resume`` would: the lock refuses it.)"""
    return latest_session(exp).get("outcome") == SESSION_RUNNING and dead_holder(exp) is None


def is_held(exp: ExperimentDir) -> bool:
    """Whether a process holds the study now (its lock is taken), asked by taking the lock
    for an instant."""
    lock = FileLock(str(exp.root / LOCK_FILE), timeout=0)
    try:
        lock.acquire()
    except Timeout:
        return True
    lock.release()
    return False


def stop_holder(exp: ExperimentDir) -> dict:
    """Send the process that holds the study a SIGTERM, which a search takes as a Ctrl+C:
    it stops gracefully, a second one at once. Returns the holder (``driver.json``);
    ``ExperimentError`` when nothing holds the study, the holder runs on another machine,
    or ``driver.json`` cannot name the live process that holds it."""
    if not is_held(exp):
        raise ExperimentError(f"no search holds {exp.root}: nothing to stop")
    info = holder(exp)
    if info is None:
        raise ExperimentError(f"{exp.root} is held, but its driver.json does not say by which process")
    if info["host"] != socket.gethostname():
        raise ExperimentError(f"{exp.root} is being searched on {info['host']} (pid {info['pid']}): stop it "
                              f"there, with hpsearch stop, or kill -TERM {info['pid']}")
    pid = int(info["pid"])
    started, now = info.get("process_started"), _process_started(pid)
    # A pid whose start differs names another process now, and one with no start to match
    # on a system that has them, a driver.json from before they were written: signalling it
    # could stop the wrong process. Without /proc (macOS), the lock held and its pid are all.
    if started != now and not (started is None and now is None and not Path("/proc/self/stat").exists()):
        raise ExperimentError(f"cannot tell which process holds {exp.root}: driver.json names pid {pid} "
                              f"({info.get('command', '')}), which {'may not be' if started is None else 'is not'} "
                              "the one holding it now; stop the search where it runs (Ctrl+C)")
    if info.get("sigterm_graceful") is False:
        raise ExperimentError(f"pid {pid} ({info.get('command', '')}) does not take a SIGTERM as a Ctrl+C now: a "
                              "Python process (hpsearch.run or resume) does so only while its trials run, not while "
                              "its search starts or its best trial is evaluated, and a SIGTERM would end it outright "
                              "(a notebook's kernel): run hpsearch stop again in a moment, or stop it where it runs "
                              "(Ctrl+C)")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        raise ExperimentError(f"the search of {exp.root} (pid {pid}) ended just now") from None
    except PermissionError:
        raise ExperimentError(f"pid {pid}, which searches {exp.root}, is another user's: it cannot be "
                              "signalled from here") from None
    return info


# Marks a SIGTERM handler of hpsearch's that stops a search as a Ctrl+C does (the command
# line's, and the search's own while its trials run): ``hpsearch stop`` signals only then.
GRACEFUL = "hpsearch_stops_gracefully"


def stops_gracefully(handler: object) -> bool:
    """Whether ``handler`` (a SIGTERM handler) is one of hpsearch's that stops a search as a
    Ctrl+C does."""
    return bool(getattr(handler, GRACEFUL, False))


@contextmanager
def sigterm_stops_gracefully(exp: ExperimentDir) -> Iterator[None]:
    """While the search's own SIGTERM handler is in place (``api._stop_signals_interrupt``,
    in a Python process whose SIGTERM otherwise ends it): ``driver.json`` says so, for
    ``hpsearch stop``. It stopped a notebook's search by ending its kernel, before the
    trials ran, or while a resume only evaluated the best trial (audits 43, 44)."""
    info = holder(exp)
    change = info is not None and info.get("sigterm_graceful") is False \
        and stops_gracefully(signal.getsignal(signal.SIGTERM))
    if change:
        write_json(exp.root / HOLDER_FILE, {**info, "sigterm_graceful": True})
    try:
        yield
    finally:
        if change:
            write_json(exp.root / HOLDER_FILE, {**info, "sigterm_graceful": False})
