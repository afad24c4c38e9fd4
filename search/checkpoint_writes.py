"""A one-process trial's large checkpoints, written in a thread while training goes on.

An epoch's checkpoint is serialized and written to disk in the trial's process. On the
training thread that stalls every epoch for the whole write (0.8-1.3 s an epoch for a
model of 300 MB with Adam here, see ``benchmarks/checkpoints.py``), and a GPU waits with
it. From ``IN_BACKGROUND_FROM_MB`` up, the training thread only copies the checkpoint's
tensors to the CPU (a point-in-time copy: the next step changes the weights in place), and
a thread serializes and writes that copy while the next epoch trains, then does the file
work queued behind it (the copy to ``best.ckpt``, removing an old epoch file), in order.
A smaller checkpoint, and the file work after it, is written on the training thread: it
takes milliseconds, and its epoch's report then leaves at the next epoch's start, before
that epoch's first batch could crash or hang.

The study must never learn of an epoch whose files are not written: ``TuneReporter`` sends
an epoch's report once its files are written, at the first batch after that, and waits for
them at the latest when the next validation starts. A fault in the thread is raised on the
training thread at that wait, as the write's own fault would have been.

Only one copy is held at a time: a checkpoint asked for while the last is still being
written waits for it. The copy is serialized straight into a file beside the target, then
renamed over it (Lightning's own writer serializes into a buffer in memory first), so the
host holds one copy of the trial's state besides the state itself, as before.
Distributed trials (DDP, FSDP, DeepSpeed) write as Lightning does.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import pytorch_lightning as pl
import torch
from lightning_utilities.core.apply_func import apply_to_collection
from pytorch_lightning.plugins.io import TorchCheckpointIO


# The size (of its tensors) from which a checkpoint is written in the thread: about 0.1 s
# of writing here, and 64 MB is a model of 5M parameters with Adam's two moments.
IN_BACKGROUND_FROM_MB = 64


class BackgroundCheckpointWrites(TorchCheckpointIO):
    """Lightning's checkpoint writer for a one-process trial, writing in a thread of its own."""

    def __init__(self) -> None:
        super().__init__()
        self._thread: ThreadPoolExecutor | None = None
        self._last: Future | None = None
        self._fault: BaseException | None = None
        self._lock = threading.Lock()
        self.faulted = False  # a write or file task failed at some point: what it left is not trusted

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        self.wait()  # one copy of the state at a time
        if storage_options is None and "://" not in str(path):
            write, options = _write_beside_then_rename, ()
        else:  # (hpsearch's trial folders are local; other paths as Lightning writes them)
            write, options = super().save_checkpoint, (storage_options,)
        if _tensor_bytes(checkpoint) < IN_BACKGROUND_FROM_MB * 2**20:
            write(checkpoint, path, *options)
        else:
            self._submit(write, apply_to_collection(checkpoint, torch.Tensor, _copy_on_cpu), path, *options)

    def remove_checkpoint(self, path) -> None:
        self.then(super().remove_checkpoint, path)  # after the writes queued before it

    def then(self, task: Callable[..., Any], *args: Any) -> None:
        """Run ``task(*args)`` after everything queued so far: in the thread behind a large
        checkpoint's write, or here and now when nothing is queued."""
        if self.busy:
            self._submit(task, *args)
        else:
            self.wait()  # (a fault the thread met is raised here)
            task(*args)

    def _submit(self, task: Callable[..., Any], *args: Any) -> None:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hpsearch-checkpoints")
        self._last = self._thread.submit(self._run, task, *args)

    def _run(self, task: Callable[..., Any], *args: Any) -> None:
        try:
            task(*args)
        except BaseException as exc:  # raised on the training thread, at its next wait
            with self._lock:
                self._fault = self._fault or exc
                self.faulted = True

    @property
    def busy(self) -> bool:
        """Whether files queued so far are still being written."""
        return self._last is not None and not self._last.done()

    def wait(self) -> None:
        """Wait until everything queued so far is done; raise the first fault it met."""
        if self._last is not None:
            self._last.result()
            self._last = None
        with self._lock:
            fault, self._fault = self._fault, None
        if fault is not None:
            raise fault

    def teardown(self) -> None:
        """At the end of each ``fit``: every file written, and the thread gone."""
        try:
            self.wait()
        finally:
            if self._thread is not None:
                self._thread.shutdown(wait=True)
                self._thread = None


def background_writes(trainer: pl.Trainer) -> BackgroundCheckpointWrites | None:
    """The trainer's background writer, if its checkpoints are written in one."""
    writer = getattr(trainer.strategy, "checkpoint_io", None)
    return writer if isinstance(writer, BackgroundCheckpointWrites) else None


def _write_beside_then_rename(checkpoint: dict[str, Any], path) -> None:
    """Serialize straight into ``<path>.partial``, then rename it to ``path``: a reader never
    sees half a file, and no second copy of the checkpoint is made in memory."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.partial")
    torch.save(checkpoint, partial)
    os.replace(partial, target)


def _tensor_bytes(checkpoint: dict[str, Any]) -> int:
    sizes: list[int] = []
    apply_to_collection(checkpoint, torch.Tensor, lambda tensor: sizes.append(tensor.nbytes))
    return sum(sizes)


def _copy_on_cpu(tensor: torch.Tensor) -> torch.Tensor:
    """A copy the training thread will not change; on the CPU, since a second copy of a
    large model's state on its GPU could run the GPU out of memory (serializing moves the
    tensors to the CPU anyway, and loading puts them back where the model is)."""
    return tensor.detach().to("cpu", copy=True)
