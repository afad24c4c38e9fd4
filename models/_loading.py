"""DataLoader construction shared by the built-in DataModules.

Every built-in DataModule accepts the same loader arguments, which hpsearch fills in
from the trial's resources (workers from its CPUs, pinned memory on GPU); evaluation
loaders use ``eval_batch_size`` because evaluation runs without gradients and fits
larger batches.
"""

from __future__ import annotations

from torch.utils.data import DataLoader, Dataset, default_collate


def make_loader(
    dataset: Dataset,
    batch_size: int,
    *,
    shuffle: bool,
    num_workers: int,
    pin_memory: bool,
    persistent_workers: bool,
    prefetch_factor: int | None,
    seed_generator=None,
    collate_fn=None,
) -> DataLoader:
    """A DataLoader whose worker options are only passed where they are valid."""
    options = {}
    if num_workers > 0:
        options["persistent_workers"] = persistent_workers
        if prefetch_factor is not None:
            options["prefetch_factor"] = prefetch_factor
    return DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=shuffle,
        num_workers=num_workers,
        pin_memory=pin_memory,
        generator=seed_generator,
        collate_fn=collate_fn,
        **options,
    )


def split_sizes(total: int, val_fraction: float, test_fraction: float) -> tuple[int, int, int]:
    """Sizes of the train/val/test splits; every split gets at least one sample."""
    if not 0 < val_fraction < 1 or not 0 <= test_fraction < 1 or val_fraction + test_fraction >= 1:
        raise ValueError(
            f"val_fraction ({val_fraction}) and test_fraction ({test_fraction}) must be "
            "in [0, 1) and leave samples for training"
        )
    n_val = max(1, int(round(total * val_fraction)))
    n_test = int(round(total * test_fraction))
    if test_fraction > 0:
        n_test = max(1, n_test)
    n_train = total - n_val - n_test
    if n_train < 1:
        raise ValueError(f"{total} samples are too few for the requested splits")
    return n_train, n_val, n_test


class SplitLoaders:
    """``train/val/test_dataloader`` over ``self._splits`` for the built-in DataModules.

    Expects ``batch_size``, ``eval_batch_size``, ``test_fraction``, ``effective_num_workers``,
    ``pin_memory``, ``persistent_workers`` and ``prefetch_factor`` on the instance.
    """

    _splits: dict | None

    def collate_for(self, batch_size: int):
        """How loaders of ``batch_size`` assemble a batch; a DataModule may override it."""
        return default_collate

    def _loader(self, split: str, batch_size: int, shuffle: bool) -> DataLoader:
        assert self._splits is not None, "setup() must run before the loaders are asked for"
        return make_loader(
            self._splits[split], batch_size, shuffle=shuffle, num_workers=self.effective_num_workers,
            pin_memory=self.pin_memory, persistent_workers=self.persistent_workers,
            prefetch_factor=self.prefetch_factor, collate_fn=self.collate_for(batch_size),
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", self.eval_batch_size, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        if self.test_fraction <= 0:
            raise ValueError("this DataModule was built with test_fraction=0: it has no test split")
        return self._loader("test", self.eval_batch_size, shuffle=False)
