"""A trial's checkpoints on disk: the best epoch, and the two newest epochs for resume.

Two newest, not one: a checkpoint cut short by a crash or a full disk must not cost
the trial its progress. Resume takes the newest checkpoint that reads back whole and
moves a damaged one aside (``*.corrupt``), with a warning, rather than failing. A trial
that has ended is never resumed: its epoch checkpoints are then deleted, and only the
best stays.

A DeepSpeed trial's checkpoint is a directory of shards under the same name (Lightning's
``DeepSpeedStrategy`` writes it so); what is done here to a checkpoint file is done to
such a directory too (read back, removed, its epoch read from rank 0's model states).
"""

from __future__ import annotations

import re
import shutil
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

BEST_CHECKPOINT = "best.ckpt"
EPOCH_PATTERN = "epoch-*.ckpt"


def checkpoint_dir(trial_dir: Path) -> Path:
    return trial_dir / "checkpoints"


def model_checkpoint_dir(trial_dir: Path) -> Path:
    """Where a ModelCheckpoint of the user's own model writes when it names no folder: its
    files are the user's, and the disk rules (``drop_resume_checkpoints``) leave them be."""
    return trial_dir / "model_checkpoints"


def epoch_checkpoints(trial_dir: Path) -> list[Path]:
    """Epoch checkpoints, newest first (names sort by their zero-padded epoch)."""
    return sorted(checkpoint_dir(trial_dir).glob(EPOCH_PATTERN), reverse=True)


def drop_resume_checkpoints(trial_dir: Path) -> None:
    """Delete an ended trial's epoch checkpoints (``best.ckpt`` stays), and any file a
    process killed while writing it left half written (``*.partial``, see ``checkpoint_writes``)."""
    for path in [*epoch_checkpoints(trial_dir), *checkpoint_dir(trial_dir).glob("*.partial")]:
        remove_checkpoint(path)


def remove_checkpoint(path: Path) -> None:
    """A checkpoint file, or a sharded checkpoint's directory (``unlink`` raised on one)."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def is_readable(path: Path) -> bool:
    """torch.save writes a zip archive: a cut-off or emptied file fails its CRC check. A
    sharded checkpoint reads back if each of its shards does (every one was taken for
    damaged, and the trial restarted from its first epoch), and each rank's is there."""
    shards = sorted(path.rglob("*.pt")) if path.is_dir() else [path]
    return bool(shards) and all(map(_reads_back, shards)) and (not path.is_dir() or _every_ranks_shard(path))


def _every_ranks_shard(path: Path) -> bool:
    """Whether a DeepSpeed checkpoint holds the optimizer shard of each of the ranks that
    rank 0's model states name (``dp_world_size``): DeepSpeed writes its directory in place,
    and a rank killed as it saved left one without its shard, which read back whole (audit 65)."""
    import torch

    # (named bf16_zero_pp_rank_... in bf16: audit 67)
    optimizer_shards = [shard.name for shard in path.rglob("*zero_pp_rank_*_optim_states.pt")]
    if not optimizer_shards:
        return True  # not partitioned (no ZeRO optimizer shards)
    try:
        ranks = int(torch.load(_trainer_state(path), map_location="cpu", weights_only=False, mmap=True)
                    .get("dp_world_size", 0))
    except Exception:  # noqa: BLE001 - its model states do not load: not a checkpoint to resume from
        return False
    present = {int(found.group(1)) for name in optimizer_shards if (found := re.search(r"zero_pp_rank_(\d+)_", name))}
    return present >= set(range(ranks))


def _reads_back(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None
    except (OSError, zipfile.BadZipFile, EOFError):
        return False


def _trainer_state(path: Path) -> Path:
    """The file that holds a checkpoint's epoch and loops: the checkpoint itself, or in a
    DeepSpeed checkpoint's directory, rank 0's model states (Lightning's state goes there
    as DeepSpeed's client state: ``mp_rank_00_model_states.pt``, under ZeRO-3
    ``zero_pp_rank_0_mp_rank_00_model_states.pt``)."""
    if not path.is_dir():
        return path
    states = sorted(path.rglob("*model_states.pt"))
    if not states:
        raise FileNotFoundError(f"{path} holds no model states (*model_states.pt)")
    return states[0]


def latest_good_checkpoint(trial_dir: Path) -> tuple[Path | None, list[str]]:
    """The newest readable epoch checkpoint, and a note for each damaged one set aside."""
    notes: list[str] = []
    for path in epoch_checkpoints(trial_dir):
        if is_readable(path):
            return path, notes + ([f"resuming from {path.name}"] if notes else [])
        aside = path.with_suffix(".corrupt")
        path.replace(aside)
        note = f"checkpoint {path.name} is damaged (moved to {aside.name})"
        warnings.warn(note, stacklevel=2)
        notes.append(note)
    if notes:
        notes.append("no readable checkpoint left: the trial restarts from its first epoch")
    return None, notes


@dataclass(frozen=True)
class ResumedAt:
    """Where a resumed attempt's TensorBoard events start: the first epoch it trains
    (counted from 1) and its first batch, as Lightning counts the batches that stepped an
    optimizer (see ``trial_logger``)."""

    epoch: int
    batch: int
    by_epoch: bool = True  # False: a trial whose TensorBoard run steps everything by the batch


# Marks the checkpoints of trials whose TensorBoard run is stepped by the epoch. A trial
# checkpointed before that (2026-12-05) goes on stepping its run by the batch when it resumes.
TENSORBOARD_BY_EPOCH = "hpsearch_tensorboard_by_epoch"


def epochs_trained(path: Path) -> int:
    """The epochs a checkpoint taken at an epoch's end holds (it keeps the epoch's index, from 0)."""
    import torch

    return int(torch.load(_trainer_state(path), map_location="cpu", weights_only=False, mmap=True).get("epoch", -1)) + 1


def resumed_at(path: Path) -> ResumedAt:
    """The first epoch and batch trained after a Lightning checkpoint taken at an epoch's
    end, and how its TensorBoard run is stepped. The checkpoint holds the ended epoch's
    index (from 0), and the batch count before its last batch's increment, which Lightning
    makes again on restoring (memory-mapped, cheap)."""
    import torch

    state = torch.load(_trainer_state(path), map_location="cpu", weights_only=False, mmap=True)
    epoch_loop = state.get("loops", {}).get("fit_loop", {}).get("epoch_loop.state_dict", {})
    if "_batches_that_stepped" in epoch_loop:
        batch = int(epoch_loop["_batches_that_stepped"]) + 1
    else:
        batch = int(state.get("global_step", 0))  # a checkpoint without the loops' state: its optimizer steps
    return ResumedAt(epoch=int(state.get("epoch", -1)) + 2, batch=batch,
                     by_epoch=bool(state.get(TENSORBOARD_BY_EPOCH, False)))
