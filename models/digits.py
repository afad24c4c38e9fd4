"""scikit-learn's bundled 8x8 handwritten digits: the embedded default, no download."""

from __future__ import annotations

import torch

from .tensor_data import InMemoryImageDataModule


class DigitsDataModule(InMemoryImageDataModule):
    """1,797 grey 8x8 images of the digits 0-9, scaled to [0, 1], shape ``(1, 8, 8)``."""

    def build_tensors(self):
        from sklearn.datasets import load_digits

        bunch = load_digits()
        images = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1) / 16.0
        labels = torch.tensor(bunch.target, dtype=torch.long)
        return images, labels
