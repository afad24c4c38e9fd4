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
        collate_fn=collate_fn,
        **options,
    )


def check_fractions(val_fraction: float, test_fraction: float) -> None:
    """A ``ValueError`` naming the fraction that leaves a split impossible."""
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction must be above 0 and below 1, got {val_fraction}")
    if not 0 <= test_fraction < 1:
        raise ValueError(f"test_fraction must be at least 0 and below 1, got {test_fraction}")
    if val_fraction + test_fraction >= 1:
        raise ValueError(f"val_fraction ({val_fraction}) and test_fraction ({test_fraction}) leave no samples for "
                         "training: their sum must be below 1")


def split_sizes(total: int, val_fraction: float, test_fraction: float) -> tuple[int, int, int]:
    """Sizes of the train/val/test splits; every split gets at least one sample."""
    check_fractions(val_fraction, test_fraction)
    n_val = max(1, int(round(total * val_fraction)))
    n_test = int(round(total * test_fraction))
    if test_fraction > 0:
        n_test = max(1, n_test)
    n_train = total - n_val - n_test
    if n_train < 1:
        raise ValueError(f"{total} samples are too few for these splits: validation takes {n_val} and the test "
                         f"{n_test} (each split at least one), which leaves none for training")
    return n_train, n_val, n_test


def stratified_split(keys: list[str], labels: list[int], val_fraction: float, test_fraction: float,
                     seed: int) -> tuple[list[int], list[int], list[int]]:
    """The indices of the train, val and test samples: each class split in proportion
    (stratified), as far as whole samples allow, the splits' sizes those of
    ``split_sizes``; a class keeps a sample for training where the sizes leave room. A
    class's samples go to the splits in the order of a seeded hash of their ``keys`` (a
    file's path), not of their place in the list, so adding samples moves few of the
    others: a random permutation of the whole list moved a quarter of the validation
    files into training when one file was added (audit 48)."""
    import hashlib

    def drawn(key: str) -> bytes:
        # a name that is not UTF-8 (Latin-1 bytes) holds surrogates: hashed as its bytes (audit 71)
        return hashlib.blake2b(f"{seed}\0{key}".encode("utf-8", "surrogateescape"), digest_size=8).digest()

    _, n_val, n_test = split_sizes(len(keys), val_fraction, test_fraction)
    by_class: dict[int, list[int]] = {}
    for index in sorted(range(len(keys)), key=lambda index: drawn(keys[index])):
        by_class.setdefault(labels[index], []).append(index)
    taken = dict.fromkeys(by_class, 0)  # each class's samples given to val, then to test, from its order's front
    splits = []
    for total, fraction in ((n_val, val_fraction), (n_test, test_fraction)):
        counts = {label: min(int(len(members) * fraction), max(0, len(members) - 1 - taken[label]))
                  for label, members in by_class.items()}
        # the rest one at a time: first to the classes rounding down cost most (of those, the
        # ones that gave validation fewer), keeping one sample of each class for training,
        # then, where that leaves too few, without
        order = sorted(by_class, key=lambda label: (counts[label] - len(by_class[label]) * fraction, taken[label],
                                                    drawn(f"class {label}")))
        for keep in (1, 0):
            while sum(counts.values()) < total:
                open_ = [label for label in order if len(by_class[label]) - taken[label] - counts[label] > keep]
                for label in open_[:total - sum(counts.values())]:
                    counts[label] += 1
                if not open_:
                    break
        splits.append(sorted(index for label, members in by_class.items()
                             for index in members[taken[label]:taken[label] + counts[label]]))
        for label in by_class:
            taken[label] += counts[label]
    train = sorted(index for label, members in by_class.items() for index in members[taken[label]:])
    return train, splits[0], splits[1]


class SplitLoaders:
    """``train/val/test_dataloader`` over ``self._splits`` for the built-in DataModules.

    Expects ``batch_size``, ``eval_batch_size``, ``test_fraction``, ``effective_num_workers``,
    ``pin_memory``, ``persistent_workers`` and ``prefetch_factor`` on the instance.
    """

    _splits: dict | None
    # The arguments that decide which samples each split holds: searched, each trial would
    # be scored on other validation samples, and their values could not be compared.
    SPLIT_ARGUMENTS = ("val_fraction", "test_fraction", "split_seed")

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
