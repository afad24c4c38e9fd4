"""Errors that hpsearch shows to users as they are, without a traceback.

Each says what was wrong, where (field, file, line) and, where it can, what to do.
The CLI prints them and exits non-zero; the Python API raises them.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import warnings
from dataclasses import dataclass
from typing import Iterator


class HpsearchError(Exception):
    """Base of every error meant for the user rather than for a debugger."""


class DiskFullError(HpsearchError):
    """A study file could not be written for want of space; its previous version is intact."""


class UnreadableDataFile(OSError):
    """A data file that fails the same way whenever it is read (an image that does not
    decode: truncated, not an image at all, a folder named like one). Its trial ends at
    once, naming the file, and is not retried; a DataModule of yours may raise it too."""


def warn_user(message: str | Warning, category: type[Warning] = UserWarning) -> None:
    """Warn as from the user's own line that called into hpsearch (the outermost call),
    not from hpsearch's code: Python prints that line with the message, and a filter by
    module applies to it. (Python 3.12's ``skip_file_prefixes`` does this; 3.10 is supported.)"""
    import hpsearch

    # hpsearch's own source: this folder (hpsearch.search) and the package's __init__'s
    own = tuple(os.path.dirname(os.path.abspath(path)) + os.sep for path in (__file__, hpsearch.__file__))
    frame, level, outermost_own = sys._getframe(1), 1, 0
    while frame is not None:
        if frame.f_code.co_filename.startswith(own):
            outermost_own = level
        frame, level = frame.f_back, level + 1
    # stacklevel 2 is this function's caller (level 1); the user's frame is just outside the outermost own one
    warnings.warn(message, category, stacklevel=outermost_own + 2)


def exception_chain(error: BaseException | None) -> Iterator[BaseException]:
    """The error, then what it was raised from or during (``__cause__``, else
    ``__context__``), and so on: each once, however the chain loops."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def first_line(exc: BaseException) -> str:
    """An exception's message as one line (its first), for a one-line report of it."""
    return str(exc).splitlines()[0] if str(exc) else ""


def own_line(exc: BaseException) -> str:
    """``first_line``, or for an exception a DataLoader's worker raised, the original's: torch
    raises it again in the training process as "Caught X in DataLoader worker process 0.",
    its own message last, below the worker's traceback (a bad file went unnamed; audit 71)."""
    lines = [line.rstrip() for line in str(exc).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith("Caught ") and "DataLoader worker process" in lines[0]:
        # the worker's traceback ends with "ValueError: its message", which may go on over
        # lines (and notes) of its own: all of it, on one line (audit 72)
        caught = re.match(r"Caught (\w+) in", lines[0])  # torch may raise it again as another type
        named = re.compile(rf"(?:[\w.]+\.)?{re.escape(caught.group(1) if caught else type(exc).__name__)}(?:: |$)")
        starts = [index for index, line in enumerate(lines) if named.match(line)]
        if not starts:
            return lines[-1].strip()
        return " ".join(part.strip() for part in (named.sub("", lines[starts[-1]], count=1), *lines[starts[-1] + 1:])
                        if part.strip())
    return first_line(exc)


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an experiment file: the dotted field, what is wrong, and where."""

    field: str
    message: str
    line: int | None = None
    source: str | None = None

    def __str__(self) -> str:
        where = ""
        if self.source and self.line:
            where = f" ({self.source}, line {self.line})"
        elif self.line:
            where = f" (line {self.line})"
        elif self.source:
            where = f" ({self.source})"
        return f"{self.field or '<file>'}{where}: {self.message}"


class ConfigError(HpsearchError):
    """The experiment file is invalid; ``problems`` lists every field at fault."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        noun = "problem" if len(self.problems) == 1 else "problems"
        super().__init__(f"invalid experiment config, {len(self.problems)} {noun}:\n{lines}")

    def __reduce__(self):
        # Rebuilt from its problems, not its message: Ray pickles a trial's exception to the
        # driver, and the message passed back as ``problems`` became one problem per character.
        return type(self), (self.problems,)

    @classmethod
    def single(cls, field: str, message: str, line: int | None = None, source: str | None = None):
        return cls([Problem(field, message, line, source)])


# Why a training DataLoader gives no batch: said by the preflight, and by a trial whose
# loader gave none (it ended with no result, as if pruned: audit 77)
NO_TRAINING_BATCH = ("a batch size larger than the training split with drop_last, an empty dataset or "
                     "IterableDataset, or a sampler that draws nothing")


class ResourceError(HpsearchError):
    """A trial asks for more than the cluster can give; the message names the numbers."""


class ExperimentError(HpsearchError):
    """An experiment directory is missing, locked, or not an hpsearch experiment."""


class Interrupted(HpsearchError):
    """The search was stopped (Ctrl+C, SIGTERM) before the study was complete; it can be resumed."""

    def __init__(self, experiment_dir, address: str | None = None) -> None:
        self.experiment_dir, self.address = experiment_dir, address
        # from Python, the call too: it named the command only (audit 51); the command line
        # prints the command alone (cli._run_command)
        super().__init__(f"search interrupted; finished trials are kept. Continue it with "
                         f"{resume_call(experiment_dir, address)}, or:\n  {resume_command(experiment_dir, address)}")


def counted(count: int | None, noun: str) -> str:
    """``1 epoch``, ``3 epochs``: a count with its noun, for messages."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def resume_command(experiment_dir, address: str | None = None) -> str:
    """The command that continues a study, on the cluster its session joined by
    ``--address``, or by ``RAY_ADDRESS`` as a Ray job does (without either, a resume starts
    a Ray of its own on this machine)."""
    from .cluster_join import cluster_address
    from .storage import study_address

    address = cluster_address(address)
    study = shlex.quote(study_address(experiment_dir))
    return f"hpsearch resume {study}" + (f" --address {address}" if address else "")


def resume_call(experiment_dir, address: str | None = None) -> str:
    """The Python call that continues a study (``resume_command``'s, from Python)."""
    from .storage import study_address

    return f"hpsearch.resume({study_address(experiment_dir)!r}" + (f", address={address!r})" if address else ")")


class CallbackError(HpsearchError):
    """One of the user's own Ray Tune callbacks (``callbacks=``) raised; the search stopped
    there, and the study can be resumed once it is fixed."""

    def __init__(self, callback: object, hook: str, error: BaseException, experiment_dir) -> None:
        self.callback, self.hook, self.error, self.experiment_dir = callback, hook, error, experiment_dir
        super().__init__(f"your callback {type(callback).__name__}.{hook} raised {type(error).__name__}: {error}; "
                         f"the search stopped and finished trials are kept. Fix it and continue with "
                         f"hpsearch.resume({str(experiment_dir)!r}, callbacks=[...])")
