"""A multi-layer perceptron over flattened images."""

from __future__ import annotations

from torch import nn

from .classifier import ImageClassifier


class MLPClassifier(ImageClassifier):
    """``depth`` hidden layers of ``hidden_units`` each, with dropout between them."""

    def __init__(
        self,
        input_shape: tuple[int, int, int] = (1, 8, 8),
        num_classes: int = 10,
        hidden_units: int = 128,
        depth: int = 2,
        dropout: float = 0.1,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        optimizer: str = "adamw",
        momentum: float = 0.9,
    ) -> None:
        self._hidden_units, self._depth, self._dropout = int(hidden_units), int(depth), float(dropout)
        super().__init__(input_shape, num_classes, lr, weight_decay, optimizer, momentum)

    def build_network(self, input_shape, num_classes):
        features = 1
        for size in input_shape:
            features *= int(size)
        layers: list[nn.Module] = [nn.Flatten()]
        for _ in range(self._depth):
            layers += [nn.Linear(features, self._hidden_units), nn.ReLU(), nn.Dropout(self._dropout)]
            features = self._hidden_units
        layers.append(nn.Linear(features, num_classes))
        return nn.Sequential(*layers)
