"""A user's folder of class subfolders of JPEG/PNG files, decoded lazily in loader workers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import Dataset, default_collate

from ..search.worker_data import once_per_worker
from ._batch_slots import BatchSlots, workers_are_forked
from ._loading import SplitLoaders, split_sizes

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp"})


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
        (one process, interleaved A/B; README, Performance)."""
        from PIL import Image

        with Image.open(self.files[index]) as image:
            if image.mode != self.mode:
                image = image.convert(self.mode)
            if image.size != (self.image_size, self.image_size):
                image = image.resize((self.image_size, self.image_size), Image.BILINEAR)
            pixels = np.frombuffer(image.tobytes(), dtype=np.uint8)
        chw = pixels.reshape(self.decoded_shape).transpose(2, 0, 1)
        return torch.from_numpy(np.ascontiguousarray(chw)), self.labels[index]  # uint8; see on_after_batch_transfer


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

    Files are split into train/val/test with a fixed ``split_seed``. Decoding happens in
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
        # hidden folders (.ipynb_checkpoints, .git) are no class: Jupyter makes one beside
        # the files, and it became a class of its own (audit 26)
        self.classes = sorted(p.name for p in self.root.iterdir() if p.is_dir() and not p.name.startswith("."))
        if len(self.classes) < 2:
            raise ValueError(f"image-folder root {str(self.root)!r} needs at least two class subfolders")
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
        worker (``once_per_worker``): listing a million files takes seconds. The key holds
        the class folders' modification times, so adding or removing a file directly in
        one lists again."""
        folders = [self.root / name for name in self.classes]
        key = (str(self.root.resolve()), tuple(self.classes), tuple(f.stat().st_mtime_ns for f in folders))
        return once_per_worker(key, self._walk)

    def _walk(self) -> tuple[list[Path], list[int]]:
        files, labels = [], []
        for label, name in enumerate(self.classes):
            for path in sorted((self.root / name).rglob("*")):
                if path.suffix.lower() in IMAGE_SUFFIXES and not any(part.startswith(".") for part in
                                                                      path.relative_to(self.root).parts):
                    files.append(path)
                    labels.append(label)
        if not files:
            raise ValueError(f"no image files ({', '.join(sorted(IMAGE_SUFFIXES))}) under {str(self.root)!r}")
        seen = set(labels)
        empty = [name for label, name in enumerate(self.classes) if label not in seen]
        if empty:  # a class the model would have an output for and never see
            raise ValueError(f"class folders with no image files ({', '.join(sorted(IMAGE_SUFFIXES))}) under "
                             f"{str(self.root)!r}: {', '.join(empty)}")
        return files, labels

    def setup(self, stage: str | None = None) -> None:
        if self._splits is not None:
            return
        files, labels = self.list_files()
        sizes = split_sizes(len(files), self.val_fraction, self.test_fraction)
        order = torch.randperm(len(files), generator=torch.Generator().manual_seed(self.split_seed)).tolist()
        bounds = [0, sizes[0], sizes[0] + sizes[1], sum(sizes)]
        self._splits = {}
        for name, lo, hi in zip(("train", "val", "test"), bounds[:-1], bounds[1:]):
            picked = order[lo:hi]
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
