"""Shared-memory batch buffers that loader workers reuse instead of allocating per batch.

torch's DataLoader gives every batch a new shared-memory segment: the worker creates it
(a round trip to torch's shared-memory manager and fresh pages to fault in), the trial
process maps it, and the last user unlinks it. When every CPU of a trial is decoding,
those round trips wait for a CPU. Here each worker writes its batches into a few slots
made once per DataLoader; the trial process copies a batch out of its slot while it
unpickles the batch message and hands the slot straight back. So what the trial
receives is an ordinary tensor of its own: a batch that user code keeps (for logging,
say) is never overwritten. A batch the DataLoader drops still frees its slot where the
workers are persistent (hpsearch's default: the next epoch reads what the last one left
in flight); workers that are not persistent are replaced with those batches unread, and
their slots stay claimed. When a worker finds no slot free, or the batch does not fit
one, it falls back to torch's own collation.

The slots are anonymous shared memory that forked workers inherit: no file in
/dev/shm, so nothing outlives the processes that map it. Named segments made with
torch's ``share_memory_()`` did: after an end-to-end search through Ray, every trial
process's slots were still in /dev/shm, because Ray kills a worker's child processes
when it exits (``RAY_kill_child_processes_on_worker_exit``, on by default) and torch's
shared-memory manager, which would unlink them, is one. Nor does a container's small
/dev/shm bound them. Workers must inherit the slots, so they are only made where workers
are forked (Linux's default); with spawned workers (macOS, Windows) batches travel
torch's way.
"""

from __future__ import annotations

import mmap
import multiprocessing
import uuid
import weakref
from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import default_collate, get_worker_info

# The trial process's slot sets by key, so that unpickling a batch message finds its
# slots; weak, so a set lives exactly as long as the DataLoader that made it.
_SLOT_SETS: weakref.WeakValueDictionary[str, BatchSlots] = weakref.WeakValueDictionary()
CLAIM_WAIT_S = 0.05  # then a worker collates torch's way
RELEASE_WAIT_S = 5.0


def workers_are_forked() -> bool:
    """Whether DataLoader workers started here inherit this process's memory (fork:
    Linux's default), which is what slots need; spawned ones (macOS, Windows) do not."""
    return multiprocessing.get_start_method() == "fork"


class BatchSlots:
    """``slots_per_worker`` buffers of ``batch_shape`` per loader worker, which all
    ``workers`` draw from, made in the trial process before the workers are forked;
    ``dtype`` is one that numpy also has (the trial process copies batches out with numpy).

    With ``pin_memory`` (and CUDA present), batches are copied out into pinned memory,
    which the DataLoader's own pinning then keeps as it is: one copy, as torch makes.
    """

    def __init__(self, workers: int, slots_per_worker: int, batch_shape: Sequence[int],
                 dtype: torch.dtype, pin_memory: bool = False) -> None:
        if workers < 1 or slots_per_worker < 1:
            raise ValueError(f"need at least one worker and one slot, got {workers} and {slots_per_worker}")
        empty = torch.empty(0, dtype=dtype)
        empty.numpy()  # raises TypeError for a dtype numpy lacks (bfloat16)
        self.key = uuid.uuid4().hex
        self.pin_memory = bool(pin_memory) and torch.cuda.is_available()
        shape = (workers * slots_per_worker, *batch_shape)
        self._memory = mmap.mmap(-1, torch.Size(shape).numel() * empty.element_size())  # anonymous, MAP_SHARED
        self.buffers = torch.frombuffer(self._memory, dtype=dtype).view(shape)
        self._claimed = np.frombuffer(mmap.mmap(-1, len(self.buffers)), dtype=np.uint8)  # 1: in use
        self._claims = multiprocessing.get_context("fork").Lock()  # guards _claimed, held for microseconds
        _SLOT_SETS[self.key] = self

    def stack(self, tensors: Sequence[torch.Tensor]):
        """In a loader worker: the tensors stacked into a free slot, as a
        message that becomes a tensor when the trial process unpickles it. Elsewhere,
        or with no slot free, or a batch that does not fit: torch's ``default_collate``."""
        slot = self._claim() if get_worker_info() is not None and self._fits(tensors) else None
        if slot is None:
            return default_collate(list(tensors))
        torch.stack(tuple(tensors), out=self.buffers[slot, : len(tensors)])
        return _BatchInSlot(self.key, slot, len(tensors))

    def _claim(self) -> int | None:
        """A free slot, now marked in use; None when none is free or the flags stay busy.
        Never waits long: besides this epoch's workers, a worker of an epoch cut short
        may still be finishing a batch (workers that are not persistent are replaced)."""
        if not self._claims.acquire(timeout=CLAIM_WAIT_S):
            return None
        try:
            free = np.flatnonzero(self._claimed == 0)
            if free.size == 0:
                return None
            self._claimed[free[0]] = 1
            return int(free[0])
        finally:
            self._claims.release()

    def _release(self, slot: int) -> None:
        # a worker killed while holding the flags would hold them for good: then the
        # slot stays marked in use, and workers fall back, rather than this process hanging
        if self._claims.acquire(timeout=RELEASE_WAIT_S):
            self._claimed[slot] = 0
            self._claims.release()

    def _fits(self, tensors: Sequence[torch.Tensor]) -> bool:
        item_shape, dtype = self.buffers.shape[2:], self.buffers.dtype
        return 0 < len(tensors) <= self.buffers.shape[1] and all(
            isinstance(t, torch.Tensor) and t.dtype == dtype and t.shape == item_shape for t in tensors
        )

    def take(self, slot: int, count: int) -> torch.Tensor:
        """In the trial process: the batch in ``slot`` copied out, and the slot freed."""
        # numpy's copy is one plain memcpy; torch's clone splits it over intra-op threads,
        # which on CPUs busy with loader workers waited 5 ms a batch for each other.
        source = self.buffers[slot, :count]
        batch = torch.empty(source.shape, dtype=source.dtype, pin_memory=self.pin_memory)
        np.copyto(batch.numpy(), source.numpy())
        self._release(slot)  # after the copy: the lock orders it before the next write
        return batch


class _BatchInSlot:
    """A batch that a worker left in a slot; pickles to 'copy it out of that slot'."""

    __slots__ = ("count", "key", "slot")

    def __init__(self, key: str, slot: int, count: int) -> None:
        self.key, self.slot, self.count = key, slot, count

    def __reduce__(self):
        return _take_from_slot, (self.key, self.slot, self.count)


def _take_from_slot(key: str, slot: int, count: int) -> torch.Tensor:
    slots = _SLOT_SETS.get(key)
    if slots is None:
        raise RuntimeError(
            f"a loader batch arrived for batch slots {key} that this process does not hold; "
            "batches built in slots can only be read by the process whose DataLoader made them"
        )
    return slots.take(slot, count)
