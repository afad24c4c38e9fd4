"""The 8x8 handwritten digits bundled with hpsearch: the embedded default, no download."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .tensor_data import InMemoryImageDataModule

DIGITS_FILE = Path(__file__).resolve().parent / "data" / "digits.csv.gz"  # source: data/README.md


class DigitsDataModule(InMemoryImageDataModule):
    """1,797 grey 8x8 images of the digits 0-9, scaled to [0, 1], shape ``(1, 8, 8)``.

    The same data, in the same order, as scikit-learn's ``load_digits``."""

    def build_tensors(self):
        rows = np.loadtxt(DIGITS_FILE, delimiter=",", dtype=np.float32)
        images = torch.from_numpy(rows[:, :-1].reshape(-1, 1, 8, 8) / 16.0)
        labels = torch.from_numpy(rows[:, -1].astype(np.int64))
        return images, labels

    def tensor_key(self):
        stat = DIGITS_FILE.stat()
        return str(DIGITS_FILE), stat.st_size, stat.st_mtime_ns
