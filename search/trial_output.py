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
being what keeps their order; so does what other threads of the worker write meanwhile.
Where the descriptors are not the streams (a test harness's captured ``sys.stdout``),
Python's ``sys.stdout`` and ``sys.stderr`` are copied instead.
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
# backlog to the file then is left to finish on its own.
_COPIER_WAITED_S = 0.5
# The copier: what comes down the pipe goes on to where the trial's standard output went
# before and, a line at a time (the ranks of a distributed trial append to one file), to
# the file, made at the first byte. A byte on the control pipe says the trial is over
# (its end, EOF, says the trial's process died): what is in the pipe then is all the trial
# wrote, and once that is in the file the copier says so on the answer pipe. It goes on
# forwarding to the standard output until no process holds the pipe: one the trial started
# that outlives it (torch's shared-memory manager, a tracker's service, each started once
# in a worker) then writes on, where its output went before, not into a broken pipe. It
# ignores the signals that stop a search (a Ctrl+C at the terminal, Ray's or a batch
# system's SIGTERM): a copier gone first would turn the trial's next print into a broken
# pipe during its own graceful stop. poll, not select: a worker's descriptors may be
# numbered past select's 1024.
_COPIER = """
import os, select, signal, sys
for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(number, signal.SIG_IGN)
path, control, answer = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
copy, pending = None, b""

def forward(chunk):
    try:
        os.write(1, chunk)
    except OSError:
        pass

def to_file(chunk, whole=False):
    global copy, pending
    if copy == -2:
        return
    pending += chunk
    cut = len(pending) if whole else pending.rfind(b"\\n") + 1
    lines, pending = pending[:cut], pending[cut:]
    if not lines:
        return
    if copy is None:
        try:
            copy = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError:
            copy = -2
            return
    try:
        while lines:
            lines = lines[os.write(copy, lines):]
    except OSError:
        pass

watched = select.poll()
watched.register(0, select.POLLIN)
watched.register(control, select.POLLIN)
while True:
    ready = dict(watched.poll())
    if ready.get(0):
        chunk = os.read(0, 1 << 16)
        if not chunk:
            break
        forward(chunk)
        to_file(chunk)
    elif ready.get(control):
        os.set_blocking(0, False)
        for _ in range(1024):
            try:
                chunk = os.read(0, 1 << 16)
            except BlockingIOError:
                break
            if not chunk:
                break
            forward(chunk)
            to_file(chunk)
        to_file(b"", whole=True)
        copy = -2
        try:
            os.write(answer, b".")
        except OSError:
            pass
        os.set_blocking(0, True)
        watched.unregister(control)
if copy != -2:
    to_file(b"", whole=True)
"""


@contextmanager
def output_kept(trial_dir: Path) -> Iterator[None]:
    """While the block runs, what this process prints also goes to the trial's output.log
    (made at the first byte, in the block: a trial with cloud storage pulls its earlier
    output first). A file that cannot be written is no reason for a print to fail."""
    path = trial_dir / OUTPUT_FILE
    if _descriptors_are_the_streams() and sys.executable and os.access(sys.executable, os.X_OK):
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
    answer_read, answer_write = os.pipe()
    try:
        copier = subprocess.Popen([sys.executable, "-S", "-I", "-c", _COPIER, str(path), str(control_read),
                                   str(answer_write)], stdin=read_end, stdout=saved[0], stderr=subprocess.DEVNULL,
                                  pass_fds=(control_read, answer_write), start_new_session=True)
    except Exception:  # noqa: BLE001 - no process to spare: the copy is a convenience, never a trial's fault
        copier = None
    finally:
        for descriptor in (read_end, control_read, answer_write):
            os.close(descriptor)
    if copier is None:
        for descriptor in (write_end, control_write, answer_read, *saved):
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
        except OSError:  # the copier has ended: it read the pipe to its end
            pass
        os.close(control_write)
        _copied(copier, answer_read)


def _copied(copier: subprocess.Popen, answer_read: int) -> None:
    """Wait, briefly, for the copier to say the trial's output is in the file; a copier
    that forwards on for a process the trial started is reaped when it ends."""
    import select

    try:
        answer = select.poll()  # not select(): a descriptor may be numbered past 1024
        answer.register(answer_read, select.POLLIN)
        if answer.poll(_COPIER_WAITED_S * 1000):
            os.read(answer_read, 1)
    except OSError:
        pass
    finally:
        os.close(answer_read)
    if copier.poll() is None:
        threading.Thread(target=copier.wait, daemon=True, name="hpsearch-output-copier").start()


def _flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass


class _Copied(PassThroughStream):
    """A stream whose writes also go to a file, opened at the first write. A handler that
    kept it past the trial (a logging.StreamHandler made in it) writes on to the stream."""

    def __init__(self, stream, path: Path) -> None:
        super().__init__(stream)
        self.path, self.copy = path, None  # path: None once it cannot be written, or the trial ended

    def write(self, text: str) -> int:
        written = self.stream.write(text)
        if self.copy is None and self.path is not None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self.copy = open(self.path, "a", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115
            except OSError:
                self.path = None  # the copy is a convenience: never the reason a print fails
        if self.copy is not None:
            try:
                self.copy.write(text)
            except (OSError, ValueError):  # a full disk, say
                self.close_copy()
        return written if written is not None else len(text)

    def flush(self) -> None:
        self.stream.flush()
        if self.copy is not None:
            try:
                self.copy.flush()
            except (OSError, ValueError):
                self.close_copy()

    def close_copy(self) -> None:
        copy, self.copy, self.path = self.copy, None, None
        if copy is not None:
            try:
                copy.close()
            except (OSError, ValueError):
                pass


@contextmanager
def _streams_copied(path: Path) -> Iterator[None]:
    """Python's streams copied; one that is None (a process started without it) stays so."""
    streams = sys.stdout, sys.stderr
    copied = [None if stream is None else _Copied(stream, path) for stream in streams]
    sys.stdout, sys.stderr = copied
    try:
        yield
    finally:
        sys.stdout, sys.stderr = streams
        for stream in copied:
            if stream is not None:
                stream.close_copy()
