"""Built-in models and DataModules: shapes, fixed splits, lazy image decoding."""

from __future__ import annotations

import copy
import json
import re
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


def test_a_datamodule_built_without_a_test_split_is_not_evaluated_on_one(example_config):
    """``test_fraction: 0`` is a valid setting of the built-in DataModules, which then have no
    test split; their ``test_dataloader`` is still defined (and says so), and the preflight
    ran the test batch it refuses: every search with it was refused."""
    from hpsearch.search.components import check_components
    from hpsearch.search.config_loading import load_config
    from hpsearch.search.evaluation import has_test_split
    from hpsearch.search.preflight import run_preflight
    from hpsearch.search.results import _has_test_split

    model = CNNClassifier(input_shape=(1, 8, 8), num_classes=10)
    assert has_test_split(model, DigitsDataModule(test_fraction=0.2))
    assert not has_test_split(model, DigitsDataModule(test_fraction=0.0))
    example_config["data"]["init_args"]["test_fraction"] = 0.0
    config = load_config(example_config)
    assert "val_acc" in run_preflight(config, *check_components(config))
    assert not _has_test_split(config, {}) and _has_test_split(config, {"data.test_fraction": 0.1})


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
    with pytest.raises(ValueError, match=re.escape("num_classes (100) is more than num_samples (50)")):
        SyntheticImagesDataModule(num_samples=50, num_classes=100)


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


def test_image_folder_refuses_a_root_of_split_folders(tmp_path):
    """train/val/test folders became three classes, and the model learned which split a file
    was in (audit 71); a folder of classes of its own is read."""
    for split in ("train", "val", "test"):
        make_image_folder(tmp_path / "images" / split, per_class=2)
    with pytest.raises(ValueError, match=r"holds test, train, val: folders of splits, not classes\. .*\(say "
                                         r"'.*images/train'\)"):
        ImageFolderDataModule(str(tmp_path / "images"))
    assert ImageFolderDataModule(str(tmp_path / "images" / "train")).classes == ["cat", "dog", "eel"]


def test_a_class_folder_that_is_a_link_gets_no_other_classs_files(tmp_path):
    """A class folder linked to another class's folder (or into it), or classes kept
    outside the root that link to each other, gave a file two labels (audit 52)."""
    from PIL import Image

    root = make_image_folder(tmp_path / "images", per_class=2)
    (root / "eel").rename(tmp_path / "eel-real")
    (root / "eel").symlink_to(root / "dog", target_is_directory=True)
    with pytest.raises(ValueError, match="class folders with no image files of their own .*: eel"):
        ImageFolderDataModule(str(root)).list_files()
    outside = tmp_path / "ext"
    for name in ("cat", "dog"):
        (outside / name).mkdir(parents=True)
        Image.new("RGB", (4, 4)).save(outside / name / f"{name}.png")
    (outside / "cat" / "dogs").symlink_to(outside / "dog", target_is_directory=True)
    (outside / "cat" / "up").symlink_to(outside, target_is_directory=True)
    linked = tmp_path / "linked"
    linked.mkdir()
    for name in ("cat", "dog"):
        (linked / name).symlink_to(outside / name, target_is_directory=True)
    dm = ImageFolderDataModule(str(linked))
    files, labels = dm.list_files()
    assert sorted((path.name, dm.classes[label]) for path, label in zip(files, labels)) == [
        ("cat.png", "cat"), ("dog.png", "dog")]
    # a file under another class's folder that its own listing skips (hidden there) is the linking class's:
    # it was given to the class that never reached it, and so to none (audit 53)
    (outside / "dog" / ".kept").mkdir()
    Image.new("RGB", (4, 4)).save(outside / "dog" / ".kept" / "hidden.png")
    (outside / "cat" / "h").symlink_to(outside / "dog" / ".kept", target_is_directory=True)
    dm = ImageFolderDataModule(str(linked))
    files, labels = dm.list_files()
    assert sorted((path.name, dm.classes[label]) for path, label in zip(files, labels)) == [
        ("cat.png", "cat"), ("dog.png", "dog"), ("hidden.png", "cat")]


@pytest.mark.parametrize("arguments, message", [
    ({"image_size": 0}, "image_size must be >= 1, got 0"),
    ({"val_fraction": 0}, "val_fraction must be above 0 and below 1, got 0"),
    ({"test_fraction": 1.0}, "test_fraction must be at least 0 and below 1, got 1.0"),
    ({"val_fraction": 0.5, "test_fraction": 0.5}, "leave no samples for training: their sum must be below 1"),
])
def test_image_folder_names_the_argument_it_refuses(tmp_path, arguments, message):
    """Pillow's "height and width must be > 0" was blamed on the class, and a
    val_fraction of 0 was said to need [0, 1) (audit 48)."""
    root = make_image_folder(tmp_path / "images", per_class=1)
    with pytest.raises(ValueError, match=re.escape(message)):
        ImageFolderDataModule(str(root), **arguments)


def test_too_few_images_say_what_each_split_takes(tmp_path):
    root = make_image_folder(tmp_path / "images", per_class=1)
    with pytest.raises(ValueError, match=re.escape("3 samples are too few for these splits: validation takes 2 and "
                                                   "the test 1 (each split at least one), which leaves none")):
        split_lengths(ImageFolderDataModule(str(root), val_fraction=0.5, test_fraction=0.4))


def _folder_of(tmp_path: Path, counts: dict[str, int], size: int = 4) -> Path:
    from PIL import Image

    root = tmp_path / "images"
    for name, count in counts.items():
        (root / name).mkdir(parents=True)
        for index in range(count):
            Image.new("RGB", (size, size), (index % 256, 0, 0)).save(root / name / f"{index}.png")
    return root


def _split_files(dm) -> dict[str, list[str]]:
    dm.setup("fit")
    return {split: [path.relative_to(dm.root).as_posix() for path in dm._splits[split].files]
            for split in ("train", "val", "test")}


def test_image_folder_splits_each_class_in_proportion(tmp_path):
    """A shuffle of all files left the minority class out of validation for 5 seeds of 20
    (190 images against 10), a one-image class out of training, and half of 20 classes
    of 4 images out of validation (audit 48)."""
    root = _folder_of(tmp_path, {"common": 190, "rare": 10, "single": 1})
    for seed in range(5):
        splits = _split_files(ImageFolderDataModule(str(root), split_seed=seed))
        by_class = {split: sorted({f.partition("/")[0] for f in files}) for split, files in splits.items()}
        counts = {split: {name: sum(f.startswith(name + "/") for f in files) for name in ("common", "rare")}
                  for split, files in splits.items()}
        for split in ("val", "test"):  # 15% of each class, as whole files allow
            assert 28 <= counts[split]["common"] <= 29 and 1 <= counts[split]["rare"] <= 2, (seed, counts)
        assert len(splits["val"]) == len(splits["test"]) == 30  # round(201 x 15%)
        assert "single" in by_class["train"] and "single" not in by_class["val"] + by_class["test"], seed
        assert sorted(sum(splits.values(), [])) == sorted({f for files in splits.values() for f in files})
    many = _folder_of(tmp_path / "many", {f"class{n:02d}": 4 for n in range(20)})
    splits = _split_files(ImageFolderDataModule(str(many)))
    assert len(splits["val"]) == len(splits["test"]) == 12
    # 12 of 20 classes in each held-out split, and each class in one of them at least
    assert len({f.partition("/")[0] for f in splits["val"] + splits["test"]}) == 20


def test_adding_images_moves_few_of_the_others_between_splits(tmp_path):
    """A random permutation of the whole list moved 24 validation files into training when
    a file was added, on a resume too (audit 48): each file's place now follows a hash of
    its path."""
    from PIL import Image

    root = _folder_of(tmp_path, {"a": 60, "b": 60})
    before = _split_files(ImageFolderDataModule(str(root)))
    for name in ("a", "b"):
        for index in range(5):
            Image.new("RGB", (4, 4)).save(root / name / f"new{index}.png")
    after = _split_files(ImageFolderDataModule(str(root)))
    moved = sum(len(set(before[split]) - set(after[split])) for split in before)
    assert moved <= 4, (moved, before, after)
    assert _split_files(ImageFolderDataModule(str(root))) == after  # the same files split the same way


def test_a_relative_root_splits_as_its_absolute_path_does(tmp_path, monkeypatch):
    """Each file's split key is its path below the root, cut from the path's string: the
    same for a root given as ".", relative or absolute."""
    root = _folder_of(tmp_path, {"a": 30, "b": 30})
    expected = _split_files(ImageFolderDataModule(str(root)))
    monkeypatch.chdir(root)
    assert _split_files(ImageFolderDataModule(".")) == expected
    monkeypatch.chdir(tmp_path)
    assert _split_files(ImageFolderDataModule("images")) == expected


def test_image_folder_lists_what_it_can_read_once_each(tmp_path):
    """Symlinked sub-folders are followed (``rglob`` dropped them), a link to a file listed
    already is one sample (the two landed in two splits), and links that lead nowhere or
    loop, folders named like an image and links into another class are no files of this
    class; GIF and TIFF are read (audits 48 and 50)."""
    from PIL import Image

    from hpsearch.models.image_folder import _image_files

    root = make_image_folder(tmp_path / "images", per_class=2)
    outside = tmp_path / "pool" / "inner"
    outside.mkdir(parents=True)
    Image.new("RGB", (4, 4)).save(outside / "far.png")
    (root / "cat" / "linked").symlink_to(outside.parent, target_is_directory=True)
    (root / "cat" / "again.jpg").symlink_to(root / "cat" / "0.jpg")
    (root / "cat" / "nowhere.jpg").symlink_to(tmp_path / "missing.jpg")
    (root / "cat" / "folder.jpg").mkdir()
    (root / "cat" / "loop").symlink_to(root / "cat", target_is_directory=True)
    # links to the root, or into another class, would give its files two labels in two splits (audit 50)
    (root / "cat" / "rootloop").symlink_to(root, target_is_directory=True)
    (root / "cat" / "dogs").symlink_to(root / "dog", target_is_directory=True)
    (root / "cat" / "a_dog.png").symlink_to(root / "dog" / "1.png")
    (root / "cat" / "self").symlink_to(root / "cat" / "self")  # round in a loop: ELOOP stopped the listing
    Image.new("P", (4, 4)).save(root / "cat" / "anim.gif")
    Image.new("RGB", (4, 4)).save(root / "cat" / "scan.TIFF")
    listed = [path.relative_to(root).as_posix() for path, _ in _image_files(root, "cat")[0]]
    assert listed == ["cat/0.jpg", "cat/1.png", "cat/a_dog.png", "cat/anim.gif", "cat/dogs/0.jpg",
                      "cat/linked/inner/far.png", "cat/scan.TIFF"], listed  # the dog's files, once: see below
    dm = ImageFolderDataModule(str(root), image_size=4)
    files, labels = dm.list_files()
    labelled = {path.relative_to(root).as_posix(): dm.classes[label] for path, label in zip(files, labels)}
    # the dog's files reached from the cat's folder are the dog's, once (audits 50 and 52)
    assert labelled == {"cat/0.jpg": "cat", "cat/1.png": "cat", "cat/anim.gif": "cat",
                        "cat/linked/inner/far.png": "cat", "cat/scan.TIFF": "cat", "dog/0.jpg": "dog",
                        "dog/1.png": "dog", "eel/0.jpg": "eel", "eel/1.png": "eel"}, labelled
    dm.setup()
    assert len(dm._splits["train"]) + len(dm._splits["val"]) + len(dm._splits["test"]) == 9
    for split in dm._splits.values():
        for index in range(len(split)):
            assert split[index][0].shape == (3, 4, 4)


def test_float_images_and_integers_beyond_sixteen_bits_are_refused_naming_the_file(tmp_path):
    """PIL's conversion rounded a float image of 0.5 to black, and clipped 70000 to white,
    with no word (audit 71)."""
    from PIL import Image

    from hpsearch.models.image_folder import ImageFileDataset
    from hpsearch.search.errors import UnreadableDataFile

    Image.fromarray(np.full((4, 4), 0.5, dtype=np.float32)).save(tmp_path / "float.tiff")
    Image.fromarray(np.full((4, 4), 70000, dtype=np.int32)).save(tmp_path / "wide.tiff")
    for name, said in (("float.tiff", "a 32-bit float image"),
                       ("wide.tiff", "a 32-bit integer image with values 70000 to 70000, beyond 16 bits")):
        for channels in (1, 3):
            with pytest.raises(UnreadableDataFile, match=rf"cannot decode image file '.*{name}': ValueError: {said}"):
                ImageFileDataset([tmp_path / name], [0], image_size=4, channels=channels)[0]


def test_a_file_name_that_is_not_utf8_is_split_by_its_bytes(tmp_path):
    """Its path's surrogates failed the split's hash: the set-up crashed, naming no file (audit 71)."""
    from hpsearch.models._loading import stratified_split

    keys = [f"cat/{i}.png" for i in range(8)] + ["cat/caf\udce9.bmp"]
    assert sorted(sum(stratified_split(keys, [0] * 9, 0.2, 0.2, seed=0), [])) == list(range(9))


def test_sixteen_bit_and_rotated_images_decode_as_seen(tmp_path):
    """16-bit greyscale came out white (PIL's conversion clips it), and a photo's EXIF
    rotation was ignored (audit 48); a one-channel image was a read-only array, which
    torch warned of in every trial's output.log."""
    import warnings

    from PIL import Image

    from hpsearch.models.image_folder import ImageFileDataset

    wide = np.array([[0, 257 * 100], [65535, 257 * 7]], dtype=np.uint16)
    Image.fromarray(wide).save(tmp_path / "wide.png")
    with Image.open(tmp_path / "wide.png") as image:
        assert image.mode in ("I;16", "I")
    upright = np.zeros((2, 4, 3), dtype=np.uint8)  # 2 rows by 4 columns, the top left pixel white
    upright[0, 0] = 255
    sideways = Image.fromarray(np.rot90(upright, k=1).copy())  # stored turned, EXIF says how to turn it back
    exif = sideways.getexif()
    exif[0x0112] = 6  # "rotate 90 clockwise to view"
    sideways.save(tmp_path / "photo.png", exif=exif)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        grey = ImageFileDataset([tmp_path / "wide.png"], [0], image_size=2, channels=1)[0][0]
    assert grey.tolist() == [[[0, 100], [255, 7]]]
    Image.fromarray(upright).save(tmp_path / "upright.png")
    with Image.open(tmp_path / "photo.png") as image:
        assert image.size == (2, 4)  # stored 2 wide and 4 high, the white pixel at the bottom left
    photo, seen = (ImageFileDataset([tmp_path / name], [0], image_size=4, channels=3)[0][0]
                   for name in ("photo.png", "upright.png"))
    assert torch.equal(photo, seen) and photo[:, 0, 0].tolist() == [255, 255, 255], photo


def test_an_image_that_does_not_decode_ends_its_trial_naming_the_file(tmp_path):
    """A truncated JPEG and a folder named like an image raised errors that were retried,
    without the file's name (audit 48); a file system's error may pass on a retry and is
    raised as it is."""
    from PIL import Image

    from hpsearch.models.image_folder import ImageFileDataset
    from hpsearch.search.errors import UnreadableDataFile
    from hpsearch.search.trial import _failure_reason

    Image.new("RGB", (64, 64), (200, 10, 10)).save(tmp_path / "whole.jpg", quality=95)
    data = (tmp_path / "whole.jpg").read_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[:len(data) // 2])
    (tmp_path / "dir.jpg").mkdir()
    (tmp_path / "text.png").write_text("not an image")
    for name in ("cut.jpg", "dir.jpg", "text.png"):
        dataset = ImageFileDataset([tmp_path / name], [0], image_size=8, channels=3)
        with pytest.raises(UnreadableDataFile, match=re.escape(f"cannot decode image file '{tmp_path / name}'")) \
                as caught:
            dataset[0]
        reason = _failure_reason(caught.value)
        assert reason.startswith(f"unreadable file: cannot decode image file '{tmp_path / name}'") and \
            reason.endswith("not retried: the same file would fail again"), reason
    with pytest.raises(FileNotFoundError):
        ImageFileDataset([tmp_path / "gone.jpg"], [0], image_size=8, channels=3)[0]
    assert _failure_reason(FileNotFoundError(2, "No such file or directory", "gone.jpg")) is None


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
