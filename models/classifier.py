"""Shared Lightning logic for the built-in image classifiers.

Subclasses only say how to build their network; the training, validation and test
steps, the metrics they log and the optimiser live here once. Metrics are logged with
``sync_dist=True`` so every DDP rank agrees on them.
"""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from torch import nn
from torch.nn import functional as F


class ImageClassifier(pl.LightningModule):
    """Cross-entropy classifier logging ``{stage}_loss`` and ``{stage}_acc`` per epoch.

    ``input_shape`` and ``num_classes`` are normally filled in from the DataModule's
    attributes of the same names (see ``hpsearch.search.components``).
    """

    def __init__(
        self,
        input_shape: tuple[int, int, int] = (1, 8, 8),
        num_classes: int = 10,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        optimizer: str = "adamw",
    ) -> None:
        super().__init__()
        if optimizer not in ("adamw", "sgd"):
            raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {optimizer!r}")
        self.save_hyperparameters()
        self.network = self.build_network(tuple(input_shape), int(num_classes))

    def build_network(self, input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
        raise NotImplementedError

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.network(images)

    def _shared_step(self, batch, stage: str) -> torch.Tensor:
        images, labels = batch
        logits = self(images)
        loss = F.cross_entropy(logits, labels)
        accuracy = (logits.argmax(dim=1) == labels).float().mean()
        on_step = stage == "train"
        self.log(f"{stage}_loss", loss, on_step=False, on_epoch=True, sync_dist=True,
                 prog_bar=on_step, batch_size=labels.shape[0])
        self.log(f"{stage}_acc", accuracy, on_step=False, on_epoch=True, sync_dist=True,
                 batch_size=labels.shape[0])
        return loss

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self._shared_step(batch, "train")

    def validation_step(self, batch, batch_idx: int) -> None:
        self._shared_step(batch, "val")

    def test_step(self, batch, batch_idx: int) -> None:
        self._shared_step(batch, "test")

    def configure_optimizers(self):
        hp = self.hparams
        if hp.optimizer == "sgd":
            return torch.optim.SGD(self.parameters(), lr=hp.lr, momentum=0.9,
                                   weight_decay=hp.weight_decay)
        return torch.optim.AdamW(self.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
