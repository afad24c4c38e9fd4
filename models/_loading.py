"""DataLoader construction shared by the built-in DataModules.

Every built-in DataModule accepts the same loader arguments, which hpsearch fills in
from the trial's resources (workers from its CPUs, pinned memory on GPU); evaluation
loaders use ``eval_batch_size`` because evaluation runs without gradients and fits
larger batches.
"""

from __future__ import annotations

from torch.utils.data import DataLoader, Dataset


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
