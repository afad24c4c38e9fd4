"""A trial process's own account of a death that Ray can only call a death.

Python's faulthandler writes the stack of a native crash (a segfault in an extension, an
abort) to the trial's ``crash.txt``, where Ray says only that the worker's connection
ended, and that file is gone with Ray's session logs at the next reboot. With
``failure.hang_timeout_s``, a watchdog thread ends a trial that has finished no batch for
that long, with every thread's stack in the same file: a hung trial (a deadlocked loader,
a collective waiting for a lost peer) otherwise held its slot until the search was
stopped. The driver reads the file when a trial's process died (``trial_faults``), where
the study's directory is shared with the trial's node (not for URI storage).
"""

from __future__ import annotations

import faulthandler
import os
import re
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

CRASH_FILE = "crash.txt"
HUNG = "hung: no batch finished for"
HUNG_EXIT_CODE = 70  # the process's own exit, after the stacks are written


def crash_file(trial_dir: Path, rank: int | None = None) -> Path:
    """Where the trial's process (a distributed trial's rank) writes its account."""
    return trial_dir / (CRASH_FILE if not rank else f"crash-rank{rank}.txt")


class TrialWatch:
    """For one trial in this process: its crash account, and with ``hang_timeout_s`` the
    watchdog, from the training's start (after the DataModule's setup, which may download)
    to its end. ``callbacks()`` tell it when a batch finished."""

    def __init__(self, hang_timeout_s: float | None = None) -> None:
        self.hang_timeout_s = hang_timeout_s
        self._last = time.monotonic()
        self._armed = False

    def callbacks(self) -> list:
        """The Lightning callback that marks the training's start and end and each batch;
        none without a watchdog, whose hooks at every step would cost each trial's steps."""
        if not self.hang_timeout_s:
            return []
        import pytorch_lightning as pl

        watch = self

        class BatchesFinish(pl.Callback):
            def on_fit_start(self, trainer, pl_module) -> None:
                watch._armed = True
                watch.progress()

            def on_train_epoch_start(self, trainer, pl_module) -> None:
                watch.progress()

            def on_train_batch_end(self, *args, **kwargs) -> None:
                watch.progress()

            def on_validation_batch_end(self, *args, **kwargs) -> None:
                watch.progress()

            def on_fit_end(self, trainer, pl_module) -> None:
                watch._armed = False

            def on_exception(self, trainer, pl_module, exception) -> None:
                watch._armed = False

        return [BatchesFinish()]

    def progress(self) -> None:
        self._last = time.monotonic()

    @contextmanager
    def recording(self, path: Path) -> Iterator[None]:
        """Native crashes' stacks go to ``path`` (and the watchdog's, on a hang) while the
        block runs; an account left empty is removed, and faulthandler is put back as it was."""
        was_enabled = faulthandler.is_enabled()
        account = open(path, "w", encoding="utf-8")  # noqa: SIM115 - faulthandler writes to it until the block ends
        faulthandler.enable(file=account, all_threads=True)
        stop = threading.Event()
        watchdog = None
        if self.hang_timeout_s:
            watchdog = threading.Thread(target=self._watch, args=(account, stop), name="hpsearch-hang-watch",
                                        daemon=True)
            watchdog.start()
        try:
            yield
        finally:
            stop.set()
            if watchdog is not None:
                watchdog.join()
            if was_enabled:
                faulthandler.enable(file=sys.stderr, all_threads=True)
            else:
                faulthandler.disable()
            account.close()
            if path.stat().st_size == 0:
                path.unlink(missing_ok=True)

    def _watch(self, account, stop: threading.Event) -> None:
        timeout = float(self.hang_timeout_s or 0)
        while not stop.wait(min(5.0, timeout / 4)):
            if self._armed and time.monotonic() - self._last > timeout:
                account.write(f"{HUNG} {timeout:g} s (failure.hang_timeout_s); the stack of every thread, "
                              f"most recent call first:\n")
                account.flush()
                faulthandler.dump_traceback(file=account, all_threads=True)
                account.flush()
                os.fsync(account.fileno())
                os._exit(HUNG_EXIT_CODE)  # the driver retries it, or gives it up, as a process that died


def written_accounts(trial_dir: Path) -> list[Path]:
    """The trial's crash accounts that say something: a distributed trial's rank that Ray
    Train ended with its worker group (another rank's fault) leaves its own empty."""
    return sorted(path for path in trial_dir.glob("crash*.txt") if _size(path))


def drop_empty_accounts(trial_dir: Path) -> None:
    """Removes the accounts such ranks left empty, which ``recording`` had no time to."""
    for path in trial_dir.glob("crash*.txt"):
        if _size(path) == 0:
            try:
                path.unlink()
            except OSError:  # gone already
                pass


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:  # gone since it was listed
        return None


def crash_account(trial_dir: Path) -> str:
    """What the trial's processes wrote of their death, all ranks'; empty if nothing."""
    texts = []
    for path in sorted(trial_dir.glob("crash*.txt")):
        try:
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
    return "\n".join(text for text in texts if text.strip())


_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ .*:$", re.MULTILINE)
_FRAME = re.compile(r'^\s+File "(.+)", line (\d+) in (.+)$', re.MULTILINE)


def crash_line(account: str) -> str | None:
    """The error line for a trial whose process died, read from its account: a hang, or a
    native crash ('its process crashed: Segmentation fault'), with the user's line it was
    at; None for an account that says neither."""
    from .components import innermost_user_frame

    hung = next((line for line in account.splitlines() if line.startswith(HUNG)), None)
    fatal = re.search(r"^Fatal Python error: (.+)$", account, re.MULTILINE)
    if hung is None and fatal is None:
        return None
    # Thread blocks, most recent call first. A crash is the current thread's; a hang is
    # another thread's (the current one is the watchdog).
    starts = [(match.start(), match.group(1)) for match in _THREAD.finditer(account)]
    blocks = [(kind, account[start:end]) for (start, kind), end in
              zip(starts, [s for s, _ in starts[1:]] + [len(account)])]
    wanted = [text for kind, text in blocks if (kind == "Current thread") == (hung is None)]
    # of a hang's threads, the one training (a TensorBoard writer's thread waits too, always)
    wanted.sort(key=lambda text: " in fit_trial" not in text)
    where = next((found for found in (innermost_user_frame(reversed([(name, int(line), function.strip())
                                                                       for name, line, function in
                                                                       _FRAME.findall(text)]))
                                      for text in wanted) if found), None)
    at = f" (at {where})" if where else ""
    if hung is not None:
        return f"{hung.split(';')[0]}{at}"
    return f"its process crashed: {fatal.group(1).strip()}{at}"
