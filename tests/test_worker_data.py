"""Data built once per trial worker (``once_per_worker``) and the built-in in-memory data on it."""

from __future__ import annotations

import gc
import os
import shutil
import time
import weakref

import pytest
import torch

import hpsearch
from conftest import make_image_folder
from hpsearch.models.digits import DigitsDataModule
from hpsearch.models.image_folder import ImageFolderDataModule
from hpsearch.models.synthetic import SyntheticImagesDataModule
from hpsearch.search.worker_data import IN_TRIAL_ENV, WORKER_DATA


class Dataset:
    """A stand-in for a loaded dataset; counts how many were built."""

    built = 0

    def __init__(self, name: str) -> None:
        self.name = name
        Dataset.built += 1


@pytest.fixture(autouse=True)
def empty_worker_data(monkeypatch):
    Dataset.built = 0
    WORKER_DATA.clear()
    WORKER_DATA.builds = WORKER_DATA.reuses = 0
    monkeypatch.delenv(IN_TRIAL_ENV, raising=False)
    yield
    WORKER_DATA.clear()


@pytest.fixture
def in_a_trial(monkeypatch):
    monkeypatch.setenv(IN_TRIAL_ENV, "7")


def test_outside_a_trial_every_call_builds_and_nothing_is_kept():
    first = hpsearch.once_per_worker("cifar", lambda: Dataset("cifar"))
    second = hpsearch.once_per_worker("cifar", lambda: Dataset("cifar"))
    assert first is not second and Dataset.built == 2
    assert WORKER_DATA.held == {}


def test_in_a_trial_an_equal_key_gets_what_the_worker_built(in_a_trial):
    first = hpsearch.once_per_worker(("cifar", 32), lambda: Dataset("cifar"))
    second = hpsearch.once_per_worker(("cifar", 32), lambda: Dataset("cifar"))
    assert second is first and Dataset.built == 1
    assert (WORKER_DATA.builds, WORKER_DATA.reuses) == (1, 1)


def test_a_trial_keeps_every_value_it_asked_for(in_a_trial):
    train = hpsearch.once_per_worker(("train", 32), lambda: Dataset("train"))
    test = hpsearch.once_per_worker(("test", 32), lambda: Dataset("test"))
    assert hpsearch.once_per_worker(("train", 32), lambda: Dataset("train")) is train
    assert hpsearch.once_per_worker(("test", 32), lambda: Dataset("test")) is test
    assert Dataset.built == 2 and WORKER_DATA.reuses == 2


def test_the_next_trial_reuses_what_it_asks_for_again(in_a_trial, monkeypatch):
    train = hpsearch.once_per_worker(("train", 32), lambda: Dataset("train"))
    hpsearch.once_per_worker(("test", 32), lambda: Dataset("test"))
    monkeypatch.setenv(IN_TRIAL_ENV, "8")
    assert hpsearch.once_per_worker(("train", 32), lambda: Dataset("train")) is train
    hpsearch.once_per_worker(("test", 64), lambda: Dataset("test"))  # other data: drops the old test set only
    assert hpsearch.once_per_worker(("train", 32), lambda: Dataset("train")) is train
    assert set(WORKER_DATA.held) == {("train", 32), ("test", 64)}
    assert Dataset.built == 3


def test_a_later_trial_with_other_data_frees_the_earlier_trials_data_before_building(in_a_trial, monkeypatch):
    earlier = weakref.ref(hpsearch.once_per_worker(("cifar", 32), lambda: Dataset("cifar")))
    monkeypatch.setenv(IN_TRIAL_ENV, "8")

    def build_mnist():
        gc.collect()
        assert earlier() is None, "the worker would hold the earlier trial's data beside the new"
        return Dataset("mnist")

    mnist = hpsearch.once_per_worker(("mnist", 28), build_mnist)

    def build_mnist_test():
        assert WORKER_DATA.held[("mnist", 28)][0] is mnist, "this trial's own data was dropped"
        return Dataset("mnist-test")

    hpsearch.once_per_worker(("mnist-test", 28), build_mnist_test)
    assert Dataset.built == 3 and WORKER_DATA.reuses == 0


def test_a_failed_build_leaves_nothing_behind(in_a_trial):
    hpsearch.once_per_worker("a", lambda: Dataset("a"))

    def broken():
        raise OSError("disk gone")

    with pytest.raises(OSError):
        hpsearch.once_per_worker("b", broken)
    assert "b" not in WORKER_DATA.held
    assert hpsearch.once_per_worker("b", lambda: Dataset("b")).name == "b"
    assert Dataset.built == 2


def test_digits_tensors_are_loaded_once_per_worker(in_a_trial):
    first, second = DigitsDataModule(batch_size=16), DigitsDataModule(batch_size=64)
    assert second.load_tensors()[0].data_ptr() == first.load_tensors()[0].data_ptr()
    first.setup("fit"), second.setup("fit")
    # Splits are taken by copy: a trial cannot change the tensors the next one gets.
    assert first._splits["train"].tensors[0].data_ptr() != first.load_tensors()[0].data_ptr()
    assert torch.equal(first._splits["val"].tensors[0], second._splits["val"].tensors[0])
    assert WORKER_DATA.builds == 1


def test_reuse_in_worker_false_builds_its_own(in_a_trial):
    shared = DigitsDataModule()
    own = DigitsDataModule(reuse_in_worker=False)
    assert own.load_tensors()[0].data_ptr() != shared.load_tensors()[0].data_ptr()
    assert torch.equal(own.load_tensors()[0], shared.load_tensors()[0])


def test_synthetic_images_with_other_arguments_are_other_data(in_a_trial):
    small = SyntheticImagesDataModule(num_samples=64, image_size=4, data_seed=0)
    same = SyntheticImagesDataModule(num_samples=64, image_size=4, data_seed=0, batch_size=8)
    assert same.load_tensors()[0].data_ptr() == small.load_tensors()[0].data_ptr()
    reseeded = SyntheticImagesDataModule(num_samples=64, image_size=4, data_seed=1)
    assert not torch.equal(reseeded.load_tensors()[0], small.load_tensors()[0])
    noisier = SyntheticImagesDataModule(num_samples=64, image_size=4, data_seed=1, noise=2.0)
    assert not torch.equal(noisier.load_tensors()[0], reseeded.load_tensors()[0])
    assert WORKER_DATA.builds == 3


def test_an_image_folder_is_listed_once_per_worker_until_a_folder_of_it_changes(in_a_trial, tmp_path):
    root = make_image_folder(tmp_path / "images", per_class=3)
    first = ImageFolderDataModule(str(root))
    first.setup("fit")
    second = ImageFolderDataModule(str(root), batch_size=8)
    second.setup("fit")
    assert (WORKER_DATA.builds, WORKER_DATA.reuses) == (1, 1)
    assert sorted(map(str, second._splits["train"].files)) == sorted(map(str, first._splits["train"].files))
    added = root / first.classes[0] / "added.png"
    shutil.copy(next((root / first.classes[0]).glob("*.png")), added)
    os.utime(added.parent, ns=(time.time_ns(), time.time_ns() + 10**9))  # a coarse clock may not move
    third = ImageFolderDataModule(str(root))
    assert added in third.list_files()[0] and WORKER_DATA.builds == 2
    # one added in a sub-folder too: the key held the class folders' times only (audit 50)
    sub = root / first.classes[1] / "more"
    sub.mkdir()
    assert ImageFolderDataModule(str(root)).list_files()[0] == third.list_files()[0]  # an empty folder: no file
    builds = WORKER_DATA.builds
    deeper = sub / "deeper.png"
    shutil.copy(added, deeper)
    os.utime(sub, ns=(time.time_ns(), time.time_ns() + 2 * 10**9))
    assert deeper in ImageFolderDataModule(str(root)).list_files()[0] and WORKER_DATA.builds == builds + 1
    assert ImageFolderDataModule(str(root)).list_files()[0].count(deeper) == 1 and WORKER_DATA.builds == builds + 1
    # a linked file's target removed outside the root: its folder was never looked at again (audit 52)
    pool = tmp_path / "pool"
    pool.mkdir()
    shutil.copy(added, pool / "far.png")
    (root / first.classes[2] / "far.png").symlink_to(pool / "far.png")
    assert root / first.classes[2] / "far.png" in ImageFolderDataModule(str(root)).list_files()[0]
    (pool / "far.png").unlink()
    os.utime(pool, ns=(time.time_ns(), time.time_ns() + 3 * 10**9))
    assert root / first.classes[2] / "far.png" not in ImageFolderDataModule(str(root)).list_files()[0]
