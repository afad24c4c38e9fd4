"""A trial's own output, kept beside its checkpoints.

What the user's code prints and warns in a trial went only to the Ray worker's log (one
file per worker process, under Ray's session directory, mixed with other trials), and to
the console with ``-v``, among Ray's and Lightning's output. Each trial's process now also
writes it to ``trials/trial_NNNN/output.log``: Python's ``sys.stdout`` and ``sys.stderr``
(``print``, ``warnings``, tqdm), from the trial's start to its end, every try and rank
appended. Output written below Python (a C library writing to its file descriptors) and
logging handlers made before the trial (which hold the streams they were given, as
Lightning's and Ray's do) are not in it.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .streams import PassThroughStream

OUTPUT_FILE = "output.log"


class _Copied(PassThroughStream):
    """A stream whose writes also go to a file, opened at the first write (a trial that
    prints nothing leaves none; with cloud storage, the trial's earlier output is pulled
    before the file exists here)."""

    def __init__(self, stream, path: Path) -> None:
        super().__init__(stream)
        self.path, self.copy = path, None  # path: None once it cannot be written

    def write(self, text: str) -> int:
        written = self.stream.write(text)
        if self.copy is None and self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.copy = open(self.path, "a", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115
            except OSError:
                self.path = None  # the copy is a convenience: never the reason a print fails
        if self.copy is not None:
            self.copy.write(text)
        return written if written is not None else len(text)

    def flush(self) -> None:
        self.stream.flush()
        if self.copy is not None:
            self.copy.flush()

    def close_copy(self) -> None:
        if self.copy is not None:
            self.copy.close()


@contextmanager
def output_kept(trial_dir: Path) -> Iterator[None]:
    """While the block runs, what this process prints also goes to the trial's output.log."""
    streams = sys.stdout, sys.stderr
    copied = [_Copied(stream, trial_dir / OUTPUT_FILE) for stream in streams]
    sys.stdout, sys.stderr = copied
    try:
        yield
    finally:
        sys.stdout, sys.stderr = streams
        for stream in copied:
            stream.close_copy()
