"""A DataModule over tensors held in memory, the base of ``digits`` and ``synthetic-images``."""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from torch.utils.data import TensorDataset, default_collate

from ..search.worker_data import once_per_worker
from ._loading import SplitLoaders, split_sizes


class TensorBatches(TensorDataset):
    """A ``TensorDataset`` that hands the DataLoader whole batches: one indexing per tensor,
    where the default is one per sample and a ``torch.stack`` (the DataLoader asks a
    dataset for ``__getitems__`` first). Same samples, same order, same shuffling."""

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
        index = torch.as_tensor(indices)
        return tuple(tensor[index] for tensor in self.tensors)


def whole_batch(batch):
    """The collate of ``TensorBatches`` loaders: a batch arrives whole; a list of samples
    (from a dataset without ``__getitems__``, e.g. one a subclass wrapped) is stacked."""
    return default_collate(batch) if isinstance(batch, list) else batch


class InMemoryImageDataModule(SplitLoaders, pl.LightningDataModule):
    """Train/val/test splits (fixed ``split_seed``) of an image tensor held in memory.

    Batches are sliced from memory, so worker processes would only add start-up and
    pickling costs: in-memory data is always loaded in the main process, whatever
    ``num_workers`` says (``effective_num_workers`` reports what ran).

    A subclass whose ``tensor_key`` names what its tensors are built from has them built
    once per trial worker (``once_per_worker``) and reused by that worker's later trials,
    unless ``reuse_in_worker`` is false.
    """

    # Read by hpsearch: loader workers asked of this DataModule are warned of as unused,
    # not as sharing the trial's CPUs (audit 35). A DataModule of yours may say the same.
    loads_in_main_process = True

    def __init__(
        self,
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        split_seed: int = 0,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = True,
        prefetch_factor: int | None = None,
        reuse_in_worker: bool = True,
    ) -> None:
        super().__init__()
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if eval_batch_size is not None and int(eval_batch_size) < 1:
            raise ValueError(f"eval_batch_size must be >= 1 (or left out: 4 x batch_size), got {eval_batch_size}")
        self.batch_size = int(batch_size)
        self.eval_batch_size = int(eval_batch_size or 4 * self.batch_size)
        self.val_fraction, self.test_fraction = float(val_fraction), float(test_fraction)
        self.split_seed = int(split_seed)
        self.requested_num_workers = int(num_workers)
        self.effective_num_workers = 0
        self.pin_memory = bool(pin_memory)
        self.persistent_workers = False
        self.prefetch_factor = None
        self.reuse_in_worker = bool(reuse_in_worker)
        self._splits: dict[str, TensorDataset] | None = None
        images, _ = self.load_tensors()
        self.input_shape = tuple(images.shape[1:])
        self.num_classes = int(self._labels.max().item()) + 1

    def load_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Images ``(N, C, H, W)`` as float32 and integer labels ``(N,)``; built once per
        instance, and once per trial worker where ``tensor_key`` allows it. Never changed
        in place: the worker's next trial may get the same tensors."""
        if not hasattr(self, "_images"):
            key = self.tensor_key() if self.reuse_in_worker else None
            if key is None:
                self._images, self._labels = self.build_tensors()
            else:
                klass = type(self)
                self._images, self._labels = once_per_worker((klass.__module__, klass.__qualname__, key),
                                                             self.build_tensors)
        return self._images, self._labels

    def build_tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def tensor_key(self):
        """Everything ``build_tensors`` depends on, as a hashable value; ``None`` (the
        default) when that is unknown, and the tensors are then built in every trial."""
        return None

    def setup(self, stage: str | None = None) -> None:
        if self._splits is not None:
            return
        images, labels = self.load_tensors()
        sizes = split_sizes(len(labels), self.val_fraction, self.test_fraction)
        order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(self.split_seed))
        bounds = [0, sizes[0], sizes[0] + sizes[1], sum(sizes)]
        self._splits = {
            name: TensorBatches(images[order[lo:hi]], labels[order[lo:hi]])
            for name, lo, hi in zip(("train", "val", "test"), bounds[:-1], bounds[1:])
        }

    def collate_for(self, batch_size: int):
        return whole_batch
