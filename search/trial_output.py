"""A trial's own output, kept beside its checkpoints.

What the user's code prints and warns in a trial went only to the Ray worker's log (one
file per worker process, under Ray's session directory, mixed with other trials), and to
the console with ``-v``, among Ray's and Lightning's output. Each trial's process now also
writes it to ``trials/trial_NNNN/output.log``, from the trial's start to its end, every
try and rank appended.

The copy is taken at the file descriptors: a small process between the trial's standard
output and error and where its standard output went before. So it holds what is written
below Python too (a C++ library's warnings, a CUDA kernel's device-side assert, NCCL's and
gloo's messages, the trial's own child processes), in the order written, and, since the
copier is another process, what a trial wrote just before it was killed. While a trial
runs, both streams go to the Ray worker's standard output (its ``.out`` log), one pipe
being what keeps their order. Where the descriptors are not the streams
(a test harness's captured ``sys.stdout``), Python's ``sys.stdout`` and ``sys.stderr`` are
copied instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from .streams import PassThroughStream

OUTPUT_FILE = "output.log"
STANDARD_DESCRIPTORS = (1, 2)
# A reused worker's next trial waits for the last one's thread, at most 2 s in Ray Tune
# (TUNE_FUNCTION_THREAD_TIMEOUT_S) before it gives the actor up: a copier still writing a
# backlog then is left to finish on its own.
_COPIER_WAITED_S = 0.5
# The copier: what comes down the pipe goes on to where the trial's standard output went
# before, and to the file, made at the first byte. It ignores the signals that stop a
# search (a Ctrl+C at the terminal, Ray's or a batch system's SIGTERM): a copier gone first
# would turn the trial's next print into a broken pipe during its own graceful stop. A
# byte on the control pipe (or its end: the trial's process died) says the trial is over:
# what is in the pipe then is all the trial wrote, and the copier ends once it has copied
# that, though a process the trial started (torch's shared-memory manager, a tracker's
# service) may hold the pipe open for much longer.
_COPIER = """
import os, select, signal, sys
for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(number, signal.SIG_IGN)
path, control, copy = sys.argv[1], int(sys.argv[2]), None

def write(chunk):
    global copy
    try:
        os.write(1, chunk)
    except OSError:
        pass
    if copy is None:
        try:
            copy = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError:
            copy = -1
    if copy >= 0:
        try:
            while chunk:
                chunk = chunk[os.write(copy, chunk):]
        except OSError:
            pass

while True:
    ready = select.select([0, control], [], [])[0]
    if 0 in ready:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            break
        write(chunk)
    elif control in ready:
        os.set_blocking(0, False)
        for _ in range(1024):
            try:
                chunk = os.read(0, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            write(chunk)
        break
"""


@contextmanager
def output_kept(trial_dir: Path) -> Iterator[None]:
    """While the block runs, what this process prints also goes to the trial's output.log
    (made at the first byte, in the block: a trial with cloud storage pulls its earlier
    output first). A file that cannot be written is no reason for a print to fail."""
    path = trial_dir / OUTPUT_FILE
    if _descriptors_are_the_streams():
        with _descriptors_copied(path):
            yield
    else:
        with _streams_copied(path):
            yield


def _descriptors_are_the_streams() -> bool:
    try:
        return (sys.stdout.fileno(), sys.stderr.fileno()) == STANDARD_DESCRIPTORS
    except (AttributeError, ValueError, OSError):  # io.UnsupportedOperation is both of the last two
        return False


@contextmanager
def _descriptors_copied(path: Path) -> Iterator[None]:
    _flush_streams()
    saved = [os.dup(descriptor) for descriptor in STANDARD_DESCRIPTORS]
    read_end, write_end = os.pipe()
    control_read, control_write = os.pipe()
    try:
        copier = subprocess.Popen([sys.executable, "-S", "-I", "-c", _COPIER, str(path), str(control_read)],
                                  stdin=read_end, stdout=saved[0], stderr=subprocess.DEVNULL,
                                  pass_fds=(control_read,), start_new_session=True)
    except OSError:  # no process to spare: the copy is a convenience, never the reason a trial fails
        copier = None
    finally:
        os.close(read_end)
        os.close(control_read)
    if copier is None:
        for descriptor in (write_end, control_write, *saved):
            os.close(descriptor)
        with _streams_copied(path):
            yield
        return
    for descriptor in STANDARD_DESCRIPTORS:
        os.dup2(write_end, descriptor)
    os.close(write_end)
    try:
        yield
    finally:
        _flush_streams()
        for descriptor, before in zip(STANDARD_DESCRIPTORS, saved):
            os.dup2(before, descriptor)
            os.close(before)
        try:
            os.write(control_write, b".")
        finally:
            os.close(control_write)
        try:
            copier.wait(timeout=_COPIER_WAITED_S)
        except subprocess.TimeoutExpired:
            threading.Thread(target=copier.wait, daemon=True, name="hpsearch-output-copier").start()


def _flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass


class _Copied(PassThroughStream):
    """A stream whose writes also go to a file, opened at the first write."""

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
def _streams_copied(path: Path) -> Iterator[None]:
    streams = sys.stdout, sys.stderr
    copied = [_Copied(stream, path) for stream in streams]
    sys.stdout, sys.stderr = copied
    try:
        yield
    finally:
        sys.stdout, sys.stderr = streams
        for stream in copied:
            stream.close_copy()
