"""A small convolutional network for images of any size."""

from __future__ import annotations

from torch import nn

from .classifier import ImageClassifier


class CNNClassifier(ImageClassifier):
    """Two conv blocks of ``channels`` and ``2 * channels`` filters, global pooling, a linear head."""

    def __init__(
        self,
        input_shape: tuple[int, int, int] = (1, 8, 8),
        num_classes: int = 10,
        channels: int = 16,
        dropout: float = 0.1,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        optimizer: str = "adamw",
        momentum: float = 0.9,
    ) -> None:
        self._channels, self._dropout = int(channels), float(dropout)
        super().__init__(input_shape, num_classes, lr, weight_decay, optimizer, momentum)

    def build_network(self, input_shape, num_classes):
        in_channels, c = int(input_shape[0]), self._channels
        return nn.Sequential(
            nn.Conv2d(in_channels, c, kernel_size=3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
            nn.Conv2d(c, 2 * c, kernel_size=3, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU(),
            nn.MaxPool2d(2) if min(input_shape[1:]) >= 4 else nn.Identity(),
            nn.Conv2d(2 * c, 2 * c, kernel_size=3, padding=1), nn.BatchNorm2d(2 * c), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(self._dropout),
            nn.Linear(2 * c, num_classes),
        )
