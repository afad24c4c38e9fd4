"""A user's folder of class subfolders of image files, decoded lazily in loader workers."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import Dataset, default_collate

from ..search.errors import UnreadableDataFile
from ..search.worker_data import once_per_worker
from ._batch_slots import BatchSlots, workers_are_forked
from ._loading import SplitLoaders, check_fractions, stratified_split

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff"})
# 16-bit greyscale (and PIL's 32-bit integer mode, in which it opened such PNGs before)
WIDE_GREYSCALE = frozenset({"I;16", "I;16L", "I;16B", "I;16N", "I"})
# Folder names of a dataset already split, which are not classes.
SPLIT_FOLDER_NAMES = frozenset({"train", "training", "val", "valid", "validation", "dev", "test", "testing", "eval"})


class ImageFileDataset(Dataset):
    """Decodes one file per item, so the folder is never held in memory at once.
    Items are ``(uint8 CHW tensor, label)``."""

    def __init__(self, files: list[Path], labels: list[int], image_size: int, channels: int) -> None:
        self.files, self.labels = files, labels
        self.image_size, self.mode = image_size, "L" if channels == 1 else "RGB"
        self.decoded_shape = (image_size, image_size, channels)  # PIL's row-major HWC bytes

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int):
        """One decode and two copies of the pixels (out of PIL, then into CHW order), in
        numpy: torch's per-call overhead on a 96x96 JPEG cost 12% of the decode rate
        (one process, interleaved A/B; README, Performance). A file that does not decode
        raises ``UnreadableDataFile`` naming it, which ends its trial without a retry; an
        error of the file system's (a file gone, an I/O error) may pass on a retry, and is
        raised as it is."""
        from PIL import Image

        path = self.files[index]
        try:
            with Image.open(path) as image:
                pixels = np.frombuffer(self._decoded(image).tobytes(), dtype=np.uint8)
        except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
            if isinstance(exc, OSError) and exc.errno is not None and not isinstance(exc, IsADirectoryError):
                raise
            raise UnreadableDataFile(f"cannot decode image file {str(path)!r}: {type(exc).__name__}: {exc}") from exc
        chw = np.ascontiguousarray(pixels.reshape(self.decoded_shape).transpose(2, 0, 1))
        if not chw.flags.writeable:  # one channel: no copy was needed, and torch warns of a read-only array
            chw = chw.copy()
        return torch.from_numpy(chw), self.labels[index]  # uint8; see on_after_batch_transfer

    def _decoded(self, image):
        """The image upright (a phone's photo carries its rotation in EXIF), in the mode and
        square size asked for (stretched, not cropped). 16-bit greyscale is scaled into 8
        bits (a value / 257), since PIL's conversion clips it: every pixel above 255 came
        out white (audit 48)."""
        from PIL import Image, ImageOps

        if "exif" in image.info or image.format == "TIFF":  # else it has no rotation to read: 2-3% of a decode
            ImageOps.exif_transpose(image, in_place=True)
        if image.mode == "F":  # PIL's conversion rounds [0, 1] floats to black (audit 71)
            raise ValueError("a 32-bit float image, whose range of values is its own: image-folder reads 8- and "
                             "16-bit images; save it as one")
        if image.mode in WIDE_GREYSCALE:
            wide = np.asarray(image).astype(np.int64)
            if wide.size and (int(wide.min()) < 0 or int(wide.max()) > 65535):  # clipped, it came out white
                raise ValueError(f"a 32-bit integer image with values {int(wide.min())} to {int(wide.max())}, beyond "
                                 f"16 bits: image-folder reads 8- and 16-bit images; save it as one")
            image = Image.fromarray((wide // 257).astype(np.uint8), "L")
        if image.mode != self.mode:
            image = image.convert(self.mode)
        if image.size != (self.image_size, self.image_size):
            image = image.resize((self.image_size, self.image_size), Image.BILINEAR)
        return image


class ImageBatches:
    """A batch as ``(uint8 images, int64 labels)``.

    The images go into one of the loader worker's reused shared-memory slots where
    ``slots`` is given (``BatchSlots``: no new segment per batch), else torch stacks them.
    The labels stay a small numpy array that travels inside the batch message, because as
    a tensor they would cost a shared-memory segment of their own per batch: 3-6 points
    of loader throughput on 2 CPUs (``benchmarks/loader.py``). ``on_after_batch_transfer``
    makes them a tensor."""

    def __init__(self, slots: BatchSlots | None = None) -> None:
        self.slots = slots

    def __call__(self, samples: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, np.ndarray]:
        images = [image for image, _ in samples]
        stacked = self.slots.stack(images) if self.slots is not None else default_collate(images)
        labels = np.fromiter((label for _, label in samples), dtype=np.int64, count=len(samples))
        return stacked, labels


class ImageFolderDataModule(SplitLoaders, pl.LightningDataModule):
    """``root/<class name>/<image file>``; classes are the sorted subfolder names.

    Each class's files are split into train/val/test in proportion (``stratified_split``:
    by a hash of each file's path and ``split_seed``, so adding files moves few others).
    Decoding happens in
    ``num_workers`` loader processes (hpsearch sizes them to the trial's CPUs), which
    stack their batches into reused shared-memory slots unless ``reuse_batch_buffers``
    is off (see ``collate_for``).
    """

    def __init__(
        self,
        root: str,
        image_size: int = 32,
        channels: int = 3,
        batch_size: int = 64,
        eval_batch_size: int | None = None,
        val_fraction: float = 0.15,
        test_fraction: float = 0.15,
        split_seed: int = 0,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = True,
        prefetch_factor: int | None = None,
        reuse_batch_buffers: bool = True,
    ) -> None:
        super().__init__()
        self.root = Path(root).expanduser()
        if not self.root.is_dir():
            raise FileNotFoundError(f"image-folder root {str(self.root)!r} is not a directory")
        if channels not in (1, 3):
            raise ValueError(f"channels must be 1 or 3, got {channels}")
        if int(image_size) < 1:
            raise ValueError(f"image_size must be >= 1, got {image_size}")
        check_fractions(val_fraction, test_fraction)
        # hidden folders (.ipynb_checkpoints, .git) are no class: Jupyter makes one beside
        # the files, and it became a class of its own (audit 26)
        self.classes = sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))
        if len(self.classes) < 2:
            raise ValueError(f"image-folder root {str(self.root)!r} needs at least two class subfolders")
        if {name.lower() for name in self.classes} <= SPLIT_FOLDER_NAMES:
            # they became the classes, and the model learned which split a file is in (audit 71)
            train = next((name for name in self.classes if name.lower() in ("train", "training")), self.classes[0])
            raise ValueError(f"image-folder root {str(self.root)!r} holds {', '.join(self.classes)}: folders of "
                             f"splits, not classes. image-folder splits one folder of class folders itself "
                             f"(val_fraction, test_fraction): give a folder of the classes as root (say "
                             f"{str(self.root / train)!r}), or join the splits' class folders into one")
        self.image_size, self.channels = int(image_size), int(channels)
        if eval_batch_size is not None and int(eval_batch_size) < 1:
            raise ValueError(f"eval_batch_size must be >= 1 (or left out: 4 x batch_size), got {eval_batch_size}")
        self.batch_size = int(batch_size)
        self.eval_batch_size = int(eval_batch_size or 4 * self.batch_size)
        self.val_fraction, self.test_fraction, self.split_seed = val_fraction, test_fraction, split_seed
        self.effective_num_workers = int(num_workers)
        self.pin_memory, self.persistent_workers = bool(pin_memory), bool(persistent_workers)
        self.prefetch_factor = prefetch_factor
        self.reuse_batch_buffers = bool(reuse_batch_buffers)
        self.input_shape = (self.channels, self.image_size, self.image_size)
        self.num_classes = len(self.classes)
        self._splits: dict[str, ImageFileDataset] | None = None

    def list_files(self) -> tuple[list[Path], list[int]]:
        """Every image file under the class folders, and its class; listed once per trial
        worker (``once_per_worker``): listing a million files takes seconds. The listing
        holds the modification times of every folder it read, sub-folders and linked ones
        too, and a later trial lists again when one changed: a file added or removed in
        any of them, or a folder added (its parent's time). The key held only the class
        folders' times, and a file added in a sub-folder went unseen (audit 50)."""
        files, labels, _ = once_per_worker((str(self.root.resolve()), tuple(self.classes)), self._walk,
                                           still_valid=_folders_unchanged)
        return files, labels

    def _walk(self) -> tuple[list[Path], list[int], tuple[tuple[str, int], ...]]:
        """Each class's files (``_image_files``), each file in one class only: a file two
        classes reach, by links or by a class folder that is a link, belongs to the class
        whose folder holds it, links resolved (of those that reach it), else to the first
        class that reaches it. Two labels put one file in two splits (audits 50 and 52).
        Only a file a class reaches outside its own folder, or one under class folders that
        overlap, is looked up so: all of them made a listing files x classes (audit 53)."""
        real_classes = [os.path.realpath(self.root / name) for name in self.classes]
        linked_classes = [(self.root / name).is_symlink() for name in self.classes]
        overlapping = _overlapping(real_classes)
        reached, stamps, looked_up = [], [], set()
        for label, name in enumerate(self.classes):
            found, folders = _image_files(self.root, name)
            inside = real_classes[label] + os.sep
            for path, real in found:
                reached.append((label, path, real))
                if label in overlapping or not real.startswith(inside):
                    looked_up.add(real)
            stamps += folders
        reaching: dict[str, list[int]] = {}
        for label, _, real in reached:
            if real in looked_up:
                reaching.setdefault(real, []).append(label)
        holders = {real: _holder(real, labels, real_classes, linked_classes) for real, labels in reaching.items()}
        files, labels = [], []
        for label, path, real in reached:
            if holders.get(real, label) == label:
                files.append(path)
                labels.append(label)
        if not files:
            raise ValueError(f"no image files ({', '.join(sorted(IMAGE_SUFFIXES))}) under {str(self.root)!r}")
        seen = set(labels)
        empty = [name for label, name in enumerate(self.classes) if label not in seen]
        if empty:  # a class the model would have an output for and never see
            raise ValueError(f"class folders with no image files of their own ({', '.join(sorted(IMAGE_SUFFIXES))}) "
                             f"under {str(self.root)!r}: {', '.join(empty)}")
        return files, labels, tuple(stamps)

    def setup(self, stage: str | None = None) -> None:
        if self._splits is not None:
            return
        files, labels = self.list_files()
        # each file's path below the root, its key for the split, cut from its string: Path's
        # relative_to took 0.22 s of every trial's set-up at 90,000 files, this 0.08 s
        below = len(str(self.root / "x")) - 1  # the root's string and a separator: none for a root of "."
        keys = [str(path)[below:].replace(os.sep, "/") for path in files]
        splits = stratified_split(keys, labels, self.val_fraction, self.test_fraction, self.split_seed)
        self._splits = {}
        for name, picked in zip(("train", "val", "test"), splits):
            self._splits[name] = ImageFileDataset(
                [files[i] for i in picked], [labels[i] for i in picked], self.image_size, self.channels
            )

    @property
    def uses_batch_slots(self) -> bool:
        """Whether loader workers stack into reused batch slots (reported per trial)."""
        return self.reuse_batch_buffers and self.effective_num_workers > 0 and workers_are_forked()

    def collate_for(self, batch_size: int) -> ImageBatches:
        """Loader workers stack into reused shared-memory slots (``BatchSlots``), one more
        per worker than the batches the DataLoader keeps in flight for it: 3-18 points of
        loader throughput on 2 CPUs (``benchmarks/loader.py``)."""
        if not self.uses_batch_slots:
            return ImageBatches()
        in_flight = self.prefetch_factor if self.prefetch_factor is not None else 2  # torch's default
        return ImageBatches(BatchSlots(
            self.effective_num_workers, in_flight + 1, (batch_size, *self.input_shape), torch.uint8,
            pin_memory=self.pin_memory,
        ))

    def on_after_batch_transfer(self, batch, dataloader_idx: int):
        """Images travel from the loader workers as uint8 (4x less to copy between
        processes and to the GPU) and become float in [0, 1] on the training device;
        labels become a tensor there (see ``ImageBatches``)."""
        images, labels = batch
        if not isinstance(labels, torch.Tensor):
            labels = torch.from_numpy(labels).to(images.device)
        # in the model's own float type: a ``64-true`` or ``bf16-true`` model converts its
        # inputs before this hook, when they are still uint8 (audit 26)
        model = self.trainer.lightning_module if self.trainer is not None else None
        dtype = getattr(model, "dtype", torch.float32)
        return images.to(dtype if dtype.is_floating_point else torch.float32).div_(255.0), labels


def _overlapping(real_classes: list[str]) -> set[int]:
    """The classes whose folders, links resolved, are one folder or lie one inside another."""
    by_folder: dict[str, list[int]] = {}
    for label, folder in enumerate(real_classes):
        by_folder.setdefault(folder, []).append(label)
    overlapping = {label for labels in by_folder.values() if len(labels) > 1 for label in labels}
    for label, folder in enumerate(real_classes):
        above = os.path.dirname(folder)
        while above != os.path.dirname(above):  # up to the file system's root
            if above in by_folder:
                overlapping.update([label, *by_folder[above]])
            above = os.path.dirname(above)
    return overlapping


def _holder(real: str, reaching: list[int], real_classes: list[str], linked_classes: list[bool]) -> int:
    """The class a file belongs to, of the classes that reach it (in class order): the one
    whose folder holds it, the deepest; of two that are one folder, the one whose folder
    is no link, then the first; none holding it, the first that reaches it."""
    holding = [(len(real_classes[label]), not linked_classes[label], -label) for label in reaching
               if real.startswith(real_classes[label] + os.sep)]
    return -max(holding)[2] if holding else reaching[0]


def _folders_unchanged(listing: tuple) -> bool:
    """Whether every folder a listing read (``_walk``) has the modification time it had then."""
    try:
        return all(os.stat(folder).st_mtime_ns == stamp for folder, stamp in listing[2])
    except OSError:  # one is gone
        return False


def _image_files(root: Path, name: str) -> tuple[list[tuple[Path, str]], list[tuple[str, int]]]:
    """The image files under the class folder ``root/name``, sorted, each with its real
    path; and each folder read, with its modification time as read (a linked file's
    target's folder too). Sub-folders and symlinked folders are read, each once (a link
    back into the class ends there). Skipped: hidden files and folders; a link to the root
    or a folder above it (every class's files, which are theirs: see ``_walk``); a second
    link to a file listed already here; links that lead nowhere or round in a loop
    (audit 50); folders named like an image. One ``scandir`` per folder, whose entries
    know their type: a file's real path is looked up only where a link leads to it."""
    real_root = os.path.realpath(root)
    found, read, seen_folders, stack = [], [], set(), [root / name]
    while stack:
        here = stack.pop()
        real_here = os.path.realpath(here)
        if real_here in seen_folders or os.path.commonpath([real_here, real_root]) == real_here:
            continue  # read already, or the root or above it
        seen_folders.add(real_here)
        read.append((str(here), os.stat(here).st_mtime_ns))  # before its entries: a file added meanwhile shows
        with os.scandir(here) as entries:
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                try:  # a link's target is looked at: none, for one that leads nowhere
                    is_dir, is_file, linked = entry.is_dir(), entry.is_file(), entry.is_symlink()
                except OSError:  # a link in a loop (ELOOP) raised: it leads nowhere either
                    continue
                if is_dir:
                    stack.append(Path(entry.path))
                elif is_file and os.path.splitext(entry.name)[1].lower() in IMAGE_SUFFIXES:
                    real = os.path.realpath(entry.path) if linked else os.path.join(real_here, entry.name)
                    found.append((entry.path, real))
    kept, seen_files, targets = [], set(), set()
    # in the order of paths, part by part (the separator below every character), sorted as
    # strings: sorting Path objects took most of a listing's time (audit 53)
    for path, real in sorted(found, key=lambda item: item[0].replace(os.sep, "\0")):
        if real not in seen_files:
            seen_files.add(real)
            kept.append((Path(path), real))
            if os.path.dirname(real) not in seen_folders:  # a linked file's, which no folder read holds
                targets.add(os.path.dirname(real))
    read += [(folder, os.stat(folder).st_mtime_ns) for folder in sorted(targets)]
    return kept, read
