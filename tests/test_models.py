"""Built-in models and DataModules: shapes, fixed splits, lazy image decoding."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from hpsearch.models.cnn import CNNClassifier
from hpsearch.models.digits import DigitsDataModule
from hpsearch.models.image_folder import ImageFolderDataModule
from hpsearch.models.mlp import MLPClassifier
from hpsearch.models.synthetic import SyntheticImagesDataModule

from conftest import make_image_folder

ROOT = Path(__file__).resolve().parent.parent


def split_lengths(dm):
    dm.setup("fit")
    return [len(dm._splits[s]) for s in ("train", "val", "test")]


def test_digits_ships_with_hpsearch_and_splits_deterministically():
    dm = DigitsDataModule(batch_size=32)
    assert dm.input_shape == (1, 8, 8) and dm.num_classes == 10
    assert sum(split_lengths(dm)) == 1797
    images, labels = dm.build_tensors()
    # the UCI test set's class sizes; pixels are counts of 0..16 scaled by 16
    assert torch.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    assert torch.equal(images * 16, (images * 16).round()) and images.min() == 0 and images.max() == 1
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (32, 1, 8, 8) and images.max() <= 1.0
    again = DigitsDataModule(batch_size=32)
    again.setup()
    assert torch.equal(dm._splits["val"].tensors[1], again._splits["val"].tensors[1])
    other_seed = DigitsDataModule(batch_size=32, split_seed=1)
    other_seed.setup()
    assert not torch.equal(dm._splits["val"].tensors[1], other_seed._splits["val"].tensors[1])


def runtime_dependencies(name: str, extras: frozenset[str] = frozenset(), found: set[str] | None = None) -> set[str]:
    """The installed distributions ``name`` (with ``extras``) needs at run time, recursively."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found = set() if found is None else found
    try:
        declared = requires(name) or []
    except PackageNotFoundError:  # an optional marker's package that is not installed
        return found
    for line in declared:
        requirement = Requirement(line)
        wanted = requirement.marker is None or any(
            requirement.marker.evaluate({"extra": extra}) for extra in (extras or {""}))
        dependency = canonicalize_name(requirement.name)
        if wanted and dependency not in found:
            found.add(dependency)
            runtime_dependencies(dependency, frozenset(requirement.extras), found)
    return found


def test_runtime_dependencies_do_not_bring_scipy():
    """With SciPy installed, every Lightning import also imports ``scipy.signal``
    (torchmetrics does), about 1.3 CPU-seconds in each trial worker here; the digits data
    ships with hpsearch instead of coming from scikit-learn for that reason."""
    needed = runtime_dependencies("hpsearch")
    assert {"torch", "pytorch-lightning", "ray", "optuna", "torchmetrics", "pandas"} <= needed  # the walk works
    assert not needed & {"scipy", "scikit-learn"}


def test_shipped_code_imports_only_declared_dependencies():
    """A module that arrives only through another package's dependency breaks when that
    package goes: ``cloudpickle`` came with scikit-learn (through joblib) and was imported
    by name until scikit-learn was dropped."""
    import ast
    import sys
    from importlib.metadata import packages_distributions

    from packaging.utils import canonicalize_name

    providers = packages_distributions()
    declared = runtime_dependencies("hpsearch")
    undeclared = []
    for source in sorted([*ROOT.glob("search/*.py"), *ROOT.glob("models/*.py")]):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for top in {name.split(".")[0] for name in names} - set(sys.stdlib_module_names) - {"hpsearch"}:
                if not {canonicalize_name(d) for d in providers.get(top, [])} & declared:
                    undeclared.append(f"{source.relative_to(ROOT)}: {top}")
    assert not undeclared


def test_eval_loaders_use_the_larger_eval_batch():
    dm = DigitsDataModule(batch_size=16)
    dm.setup()
    assert dm.val_dataloader().batch_size == 64


def test_synthetic_images_have_the_requested_shape_and_classes():
    dm = SyntheticImagesDataModule(num_samples=200, image_size=12, channels=3, num_classes=5)
    assert dm.input_shape == (3, 12, 12) and dm.num_classes == 5
    assert sum(split_lengths(dm)) == 200


@pytest.mark.parametrize("model_class", [MLPClassifier, CNNClassifier])
@pytest.mark.parametrize("shape", [(1, 8, 8), (3, 16, 16)])
def test_models_produce_logits_for_any_image_size(model_class, shape):
    model = model_class(input_shape=shape, num_classes=7, lr=0.01)
    assert model(torch.zeros(2, *shape)).shape == (2, 7)
    assert model.hparams.lr == 0.01


def test_image_folder_decodes_lazily_in_worker_processes(tmp_path):
    root = make_image_folder(tmp_path / "images")
    dm = ImageFolderDataModule(str(root), image_size=8, batch_size=4, num_workers=2, persistent_workers=False)
    assert dm.classes == ["cat", "dog", "eel"] and dm.num_classes == 3
    assert sum(split_lengths(dm)) == 18
    loader = dm.train_dataloader()
    assert loader.num_workers == 2 and loader.collate_fn.slots is not None  # workers reuse batch slots
    images, labels = next(iter(loader))
    assert images.shape == (4, 3, 8, 8) and images.dtype == torch.uint8 and labels.max() <= 2
    floats, label_tensor = dm.on_after_batch_transfer((images, labels), 0)
    assert floats.dtype == torch.float32 and 0.0 <= floats.min() and floats.max() <= 1.0
    assert label_tensor.dtype == torch.long and label_tensor.tolist() == list(labels)


def test_image_files_decode_to_their_own_pixels_in_channel_first_order(tmp_path):
    """Lossless files, so every pixel can be checked: RGB as written, other modes
    converted as PIL converts them, off-size images resized, grey for channels=1."""
    from PIL import Image

    from hpsearch.models.image_folder import ImageFileDataset

    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 256, (6, 6, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / "rgb.png")
    Image.fromarray(rgb[..., 0]).save(tmp_path / "grey.png")
    Image.fromarray(np.dstack([rgb, rgb[..., :1]])).save(tmp_path / "rgba.png")
    Image.fromarray(rng.integers(0, 256, (9, 7, 3), dtype=np.uint8)).save(tmp_path / "big.png")
    files = [tmp_path / n for n in ("rgb.png", "grey.png", "rgba.png", "big.png")]

    def expected(path, mode):
        with Image.open(path) as image:
            image = image.convert(mode).resize((6, 6), Image.BILINEAR)
            return np.asarray(image).reshape(6, 6, -1).transpose(2, 0, 1)

    for channels, mode in ((3, "RGB"), (1, "L")):
        dataset = ImageFileDataset(files, [0, 1, 2, 3], image_size=6, channels=channels)
        for index, path in enumerate(files):
            image, label = dataset[index]
            assert image.dtype == torch.uint8 and image.shape == (channels, 6, 6) and label == index
            assert np.array_equal(image.numpy(), expected(path, mode)), (path.name, mode)
    assert np.array_equal(ImageFileDataset(files, [0] * 4, 6, 3)[0][0].numpy(), rgb.transpose(2, 0, 1))


def test_loader_workers_hand_batches_over_by_shared_memory_name(tmp_path):
    """hpsearch's default hand-over (see devices.use_sharing_strategy) delivers the same
    batches as decoding in one process would."""
    import torch.multiprocessing as torch_mp

    from hpsearch.search.config import LoaderConfig
    from hpsearch.search.devices import use_sharing_strategy

    root = make_image_folder(tmp_path / "images")
    previous = torch_mp.get_sharing_strategy()  # process-wide: put back for the other tests
    try:
        assert use_sharing_strategy(LoaderConfig()) == "file_system" == torch_mp.get_sharing_strategy()
        dm = ImageFolderDataModule(str(root), image_size=8, batch_size=4, num_workers=2, persistent_workers=False,
                                   reuse_batch_buffers=False)  # images, too, go by the hand-over
        dm.setup()
        dataset = dm._splits["val"]
        loader = dm._loader("val", batch_size=len(dataset), shuffle=False)
        images, labels = next(iter(loader))
        expected = [dataset[i] for i in range(len(dataset))]
        assert torch.equal(images, torch.stack([image for image, _ in expected]))
        assert labels.tolist() == [label for _, label in expected]
        assert use_sharing_strategy(LoaderConfig(sharing_strategy="file_descriptor")) == "file_descriptor"
    finally:
        torch_mp.set_sharing_strategy(previous)


def test_the_cnn_trains_on_an_image_folder_read_by_loader_workers(tmp_path):
    import pytorch_lightning as pl

    root = make_image_folder(tmp_path / "images")
    dm = ImageFolderDataModule(str(root), image_size=8, batch_size=4, num_workers=2, persistent_workers=False)
    model = CNNClassifier(input_shape=dm.input_shape, num_classes=dm.num_classes, channels=4)
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=dm)
    metrics = trainer.callback_metrics
    assert torch.isfinite(metrics["val_loss"]) and 0.0 <= float(metrics["val_acc"]) <= 1.0


def test_image_folder_rejects_a_missing_root(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a directory"):
        ImageFolderDataModule(str(tmp_path / "nope"))


def test_a_training_step_runs_outside_a_trainer():
    model = CNNClassifier(channels=4)
    loss = model.training_step((torch.zeros(4, 1, 8, 8), torch.tensor([0, 1, 2, 3])), 0)
    assert loss.shape == () and torch.isfinite(loss)


def _epoch_means(model, batches):
    """Sample-weighted mean loss and accuracy of ``model`` over ``batches``, computed directly."""
    import torch.nn.functional as F

    losses, correct, seen = 0.0, 0, 0
    with torch.no_grad():
        for images, labels in batches:
            logits = model(images)
            losses += float(F.cross_entropy(logits, labels)) * len(labels)
            correct += int((logits.argmax(dim=1) == labels).sum())
            seen += len(labels)
    return losses / seen, correct / seen


@pytest.mark.parametrize("limit_train_batches", [1.0, 0.5])
def test_classifiers_log_the_sample_weighted_means_of_every_stage(limit_train_batches):
    """The built-in models sum per step and log once an epoch: the figures must be the
    epoch's true means, also when the epoch ends early (limit_train_batches) and the
    last batch is smaller."""
    import pytorch_lightning as pl

    class Batches(pl.Callback):
        def __init__(self):
            self.seen = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.seen.append(batch)

    dm = DigitsDataModule(batch_size=100, eval_batch_size=70)  # uneven last batches
    # lr 0 and no dropout: the weights stay put, so a step's loss can be recomputed after.
    model = CNNClassifier(channels=4, dropout=0.0, lr=0.0)
    batches = Batches()
    trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, callbacks=[batches],
                         limit_train_batches=limit_train_batches)
    trainer.fit(model, datamodule=dm)
    logged = {k: float(v) for k, v in trainer.callback_metrics.items()}
    assert len(batches.seen) == trainer.num_training_batches
    # In training mode (batch statistics, as the steps saw them), on a copy: that mode
    # moves the running statistics validation uses.
    expected_loss, expected_acc = _epoch_means(copy.deepcopy(model).train(), batches.seen)
    assert logged["train_loss"] == pytest.approx(expected_loss, rel=1e-5)
    assert logged["train_acc"] == pytest.approx(expected_acc, abs=1e-6)
    model.eval()
    for stage, loader in (("val", dm.val_dataloader()), ("test", dm.test_dataloader())):
        if stage == "test":
            logged.update({k: float(v) for k, v in trainer.test(model, datamodule=dm, verbose=False)[0].items()})
        expected_loss, expected_acc = _epoch_means(model, loader)
        assert logged[f"{stage}_loss"] == pytest.approx(expected_loss, rel=1e-5), stage
        assert logged[f"{stage}_acc"] == pytest.approx(expected_acc, abs=1e-6), stage


def test_in_memory_loaders_hand_out_the_same_batches_as_per_sample_loading():
    """Whole-batch indexing (TensorBatches) must not change what a seeded trial trains on."""
    from torch.utils.data import DataLoader, TensorDataset

    dm = DigitsDataModule(batch_size=50)
    dm.setup("fit")
    train = dm._splits["train"]
    torch.manual_seed(3)
    batched = list(dm.train_dataloader())
    torch.manual_seed(3)
    per_sample = list(DataLoader(TensorDataset(*train.tensors), batch_size=50, shuffle=True))
    assert len(batched) == len(per_sample) == -(-len(train) // 50)
    for (images, labels), (images_ref, labels_ref) in zip(batched, per_sample):
        assert torch.equal(images, images_ref) and torch.equal(labels, labels_ref)
        assert images.dtype == torch.float32 and labels.dtype == torch.long

    class Wrapped(torch.utils.data.Dataset):  # what a subclass might put in a split: no __getitems__
        def __init__(self, dataset):
            self.dataset = dataset

        def __len__(self):
            return 30

        def __getitem__(self, index):
            return self.dataset[index]

    dm._splits["val"] = Wrapped(dm._splits["val"])
    images, labels = next(iter(dm.val_dataloader()))
    assert images.shape == (30, 1, 8, 8) and labels.shape == (30,)


class MetricsPerRank(pl.Callback):
    """Writes each rank's epoch metrics to ``folder/rank-N.json``."""

    def __init__(self, folder) -> None:
        self.folder = folder

    def on_train_epoch_end(self, trainer, pl_module):
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
        (self.folder / f"rank-{trainer.global_rank}.json").write_text(json.dumps(metrics))

    def teardown(self, trainer, pl_module, stage):
        # Both ranks leave the gloo group together: left to Lightning's exit handler, one rank
        # once aborted at exit ("terminate called without an active exception", SIGABRT) while
        # the other had already closed its side (CI of 2026-12-06, at 8a7cb01).
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def test_ddp_ranks_agree_on_the_epoch_means(tmp_path):
    """Each rank logs its own shard's epoch means once; sync_dist must make them one figure
    (gloo, two CPU processes)."""
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[MetricsPerRank(tmp_path)])
    trainer.fit(CNNClassifier(channels=4), datamodule=DigitsDataModule(batch_size=64))
    ranks = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    assert set(ranks[0]) == {"train_loss", "train_acc", "val_loss", "val_acc"}
    assert ranks[0] == pytest.approx(ranks[1], rel=1e-6)
