"""Reused shared-memory batch slots (models/_batch_slots.py): loader workers write
batches into them and the trial process copies each batch out as it arrives."""

from __future__ import annotations

import multiprocessing
import os
import pickle

import pytest
import torch
from hpsearch.models import _batch_slots
from hpsearch.models._batch_slots import BatchSlots
from torch.utils.data import DataLoader, default_collate

from conftest import make_image_folder

ITEM_SHAPE = (3, 4, 4)


def items(count: int) -> list[torch.Tensor]:
    """Items whose every pixel is their index, so a batch overwritten by another shows."""
    return [torch.full(ITEM_SHAPE, i, dtype=torch.uint8) for i in range(count)]


def expected_batches(dataset, batch_size: int) -> list[torch.Tensor]:
    return [default_collate(dataset[i:i + batch_size]) for i in range(0, len(dataset), batch_size)]


@pytest.fixture
def copies_out(monkeypatch):
    """Counts batches the trial process copied out of a slot."""
    counted = {"batches": 0}
    take = BatchSlots.take

    def counting_take(self, slot, count):
        counted["batches"] += 1
        return take(self, slot, count)

    monkeypatch.setattr(BatchSlots, "take", counting_take)
    return counted


def loader(dataset, slots: BatchSlots, batch_size: int, **options) -> DataLoader:
    return DataLoader(dataset, batch_size=batch_size, num_workers=2, collate_fn=slots.stack,
                      persistent_workers=True, prefetch_factor=2, **options)


def test_kept_batches_are_never_overwritten_when_slots_are_reused(copies_out):
    # one slot per worker and two batches in flight per worker: slots are reused on
    # almost every batch, and workers that find them all taken fall back to torch's way
    dataset = items(22)  # the last batch is short
    slots = BatchSlots(workers=2, slots_per_worker=1, batch_shape=(4, *ITEM_SHAPE), dtype=torch.uint8)
    kept = [batch for _ in range(2) for batch in loader(dataset, slots, batch_size=4)]
    expected = expected_batches(dataset, 4) * 2
    assert len(kept) == len(expected) == 12
    for batch, want in zip(kept, expected):
        assert batch.shape == want.shape and torch.equal(batch, want)
    assert copies_out["batches"] > 0  # the slot path was taken, not only the fallback


def test_an_epoch_cut_short_hands_its_slots_back():
    dataset = items(40)
    slots = BatchSlots(workers=2, slots_per_worker=3, batch_shape=(4, *ITEM_SHAPE), dtype=torch.uint8)
    batches = loader(dataset, slots, batch_size=4)
    for step, _ in enumerate(batches):
        if step == 1:
            break  # the workers still have batches in flight, each in a slot
    full_epoch = list(batches)
    assert all(torch.equal(batch, want) for batch, want in zip(full_epoch, expected_batches(dataset, 4)))
    # the cut epoch's batches were read and dropped when the next began, and every
    # batch of the full epoch was taken: all six slots are free again
    assert slots._claimed.tolist() == [0] * 6


def test_workers_that_are_not_persistent_cut_short_then_replaced_still_give_every_batch():
    dataset = items(24)
    slots = BatchSlots(workers=2, slots_per_worker=1, batch_shape=(4, *ITEM_SHAPE), dtype=torch.uint8)
    batches = DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=slots.stack, persistent_workers=False)
    for _ in range(2):
        next(iter(batches))  # an epoch cut short: its workers may still be finishing batches
        epoch = list(batches)
        assert len(epoch) == 6 and all(torch.equal(b, w) for b, w in zip(epoch, expected_batches(dataset, 4)))


def _claim_at(barrier, slots: BatchSlots, results) -> None:
    barrier.wait()
    results.put(slots._claim())


def test_two_workers_racing_for_the_last_free_slot_get_it_once_and_neither_waits():
    # workers of an epoch cut short may still run beside the next epoch's workers
    slots = BatchSlots(1, 2, (4, *ITEM_SHAPE), torch.uint8)
    assert slots._claim() == 0  # one slot left
    fork = multiprocessing.get_context("fork")
    barrier, results = fork.Barrier(2), fork.Queue()
    racers = [fork.Process(target=_claim_at, args=(barrier, slots, results)) for _ in range(2)]
    for racer in racers:
        racer.start()
    got = sorted((results.get(timeout=10) for _ in racers), key=str)
    for racer in racers:
        racer.join(timeout=10)
    assert got == [1, None] and not any(racer.is_alive() for racer in racers)
    assert slots._claimed.tolist() == [1, 1]  # what a forked worker claims, the trial process sees


def test_the_image_folder_uses_slots_only_with_forked_workers_and_says_so(tmp_path, monkeypatch):
    from hpsearch.models.image_folder import ImageFolderDataModule

    root = make_image_folder(tmp_path / "images")

    def data(**options) -> ImageFolderDataModule:
        return ImageFolderDataModule(str(root), image_size=8, batch_size=2, **options)

    assert data(num_workers=2).uses_batch_slots and data(num_workers=2).collate_for(2).slots is not None
    assert not data(num_workers=0).uses_batch_slots and data(num_workers=0).collate_for(2).slots is None
    off = data(num_workers=2, reuse_batch_buffers=False)
    assert not off.uses_batch_slots and off.collate_for(2).slots is None
    # spawned workers (macOS, Windows) cannot inherit the anonymous shared memory
    monkeypatch.setattr(_batch_slots.multiprocessing, "get_start_method", lambda *args, **kwargs: "spawn")
    spawned = data(num_workers=2)
    assert not spawned.uses_batch_slots and spawned.collate_for(2).slots is None


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm here")
def test_slots_leave_nothing_in_dev_shm_for_a_killed_process_to_leak():
    import torch.multiprocessing as torch_mp

    previous = torch_mp.get_sharing_strategy()
    torch_mp.set_sharing_strategy("file_system")  # hpsearch's own: tensors go by named segment
    try:
        before = set(os.listdir("/dev/shm"))
        slots = BatchSlots(2, 3, (4, *ITEM_SHAPE), torch.uint8)
        batches_of = iter(loader(items(16), slots, batch_size=4))
        # torch names a segment after the process that made it: this one's and its loader
        # workers' (other tests may run beside this one, with segments of their own)
        ours = (os.getpid(), *(worker.pid for worker in batches_of._workers))
        batches = list(batches_of)
        made = [name for name in set(os.listdir("/dev/shm")) - before
                if any(name.startswith(f"torch_{pid}_") for pid in ours)]
        assert len(batches) == 4 and not made, made
    finally:
        torch_mp.set_sharing_strategy(previous)


def test_outside_a_worker_or_for_a_batch_that_does_not_fit_torch_collates():
    slots = BatchSlots(1, 1, (2, *ITEM_SHAPE), torch.uint8)
    dataset = items(6)
    in_process = list(DataLoader(dataset, batch_size=2, collate_fn=slots.stack))  # no workers
    assert all(torch.equal(batch, want) for batch, want in zip(in_process, expected_batches(dataset, 2)))
    too_big = list(DataLoader(dataset, batch_size=3, num_workers=1, collate_fn=slots.stack))
    assert all(torch.equal(batch, want) for batch, want in zip(too_big, expected_batches(dataset, 3)))


def test_a_batch_for_slots_this_process_does_not_hold_is_a_clear_error():
    message = pickle.dumps(_batch_slots._BatchInSlot("not-a-slot-set", 0, 1))
    with pytest.raises(RuntimeError, match="does not hold"):
        pickle.loads(message)


def test_a_dtype_numpy_lacks_is_refused():
    with pytest.raises(TypeError):
        BatchSlots(1, 1, (2, 2), torch.bfloat16)


def test_hidden_folders_are_no_class_and_an_empty_class_folder_is_refused(tmp_path):
    """Jupyter's .ipynb_checkpoints beside the class folders became a class of its own (the
    model got an output too many, and the copy of an image a second label); a class folder
    with no images gave the model an output it never trains (audit 26)."""
    import shutil

    from hpsearch.models.image_folder import ImageFolderDataModule

    root = make_image_folder(tmp_path / "images")
    (root / ".ipynb_checkpoints").mkdir()
    shutil.copy(root / "cat" / "1.png", root / ".ipynb_checkpoints" / "1.png")
    (root / "dog" / ".hidden").mkdir()
    shutil.copy(root / "cat" / "1.png", root / "dog" / ".hidden" / "copy.png")
    data = ImageFolderDataModule(str(root), image_size=10)
    assert (data.classes, data.num_classes) == (["cat", "dog", "eel"], 3)
    data.setup()
    assert sum(len(split) for split in data._splits.values()) == 18  # the 6 of each class, no copies
    (root / "zebra").mkdir()
    with pytest.raises(ValueError, match="class folders with no image files .* zebra"):
        ImageFolderDataModule(str(root), image_size=10).setup()


@pytest.mark.parametrize("precision", ["64-true", "bf16-true"])
def test_image_batches_come_in_the_models_float_type(tmp_path, precision):
    """A 64-true or bf16-true model converts its inputs before on_after_batch_transfer,
    while they are still uint8: the float32 images then failed its first layer ("Input
    type (float) and bias type (double) should be the same", audit 26)."""
    import pytorch_lightning as pl

    from hpsearch.models.cnn import CNNClassifier
    from hpsearch.models.image_folder import ImageFolderDataModule

    data = ImageFolderDataModule(str(make_image_folder(tmp_path / "images")), image_size=10, batch_size=4)
    model = CNNClassifier(input_shape=data.input_shape, num_classes=data.num_classes, channels=4)
    trainer = pl.Trainer(precision=precision, max_epochs=1, limit_train_batches=2, limit_val_batches=1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=str(tmp_path))
    trainer.fit(model, datamodule=data)
    assert trainer.state.finished and trainer.global_step == 2
