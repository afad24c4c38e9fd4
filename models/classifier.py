"""Shared Lightning logic for the built-in image classifiers.

Subclasses only say how to build their network; the training, validation and test
steps, the metrics they log and the optimiser live here once.
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

    Each step only adds its loss and its correct predictions to running sums on the
    model's device; the epoch means are logged once an epoch, with ``sync_dist=True``
    so every DDP rank agrees on them. Lightning's ``self.log`` costs about half a
    millisecond per call on a CPU core (it re-checks the stored metric's device on
    every call): two calls in every step cost the CNN on digits 16% of its epoch at
    batch 32, 3% at batch 128.
    """

    def __init__(
        self,
        input_shape: tuple[int, int, int] = (1, 8, 8),
        num_classes: int = 10,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        optimizer: str = "adamw",
        momentum: float = 0.9,
    ) -> None:
        super().__init__()
        if optimizer not in ("adamw", "sgd"):
            raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {optimizer!r}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum (SGD's; AdamW has none) must be in [0, 1), got {momentum!r}")
        self.save_hyperparameters()
        self.network = self.build_network(tuple(input_shape), int(num_classes))
        # stage -> (sum of per-sample losses, correct predictions, samples) of this epoch so far
        self._epoch_sums: dict[str, tuple[torch.Tensor, torch.Tensor, int]] = {}

    def build_network(self, input_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
        raise NotImplementedError

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.network(images)

    def _shared_step(self, batch, stage: str) -> torch.Tensor:
        images, labels = batch
        logits = self(images)
        loss = F.cross_entropy(logits, labels)
        count = labels.shape[0]
        loss_sum, correct, seen = self._epoch_sums.get(stage, (0.0, 0, 0))
        self._epoch_sums[stage] = (loss_sum + loss.detach().float() * count,
                                   correct + (logits.argmax(dim=1) == labels).sum(), seen + count)
        return loss

    def _log_epoch_means(self, stage: str) -> None:
        sums = self._epoch_sums.pop(stage, None)
        if sums is None:  # no batch in this epoch
            return
        loss_sum, correct, seen = sums
        self.log(f"{stage}_loss", loss_sum / seen, on_step=False, on_epoch=True, sync_dist=True,
                 prog_bar=stage == "train", batch_size=seen)
        self.log(f"{stage}_acc", correct / seen, on_step=False, on_epoch=True, sync_dist=True, batch_size=seen)

    def on_train_epoch_start(self) -> None:
        self._epoch_sums.pop("train", None)  # what an interrupted epoch left

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        loss = self._shared_step(batch, "train")
        # Logged at the epoch's last batch rather than in on_train_epoch_end, which runs
        # after the callbacks' (TuneReporter reports there, with this epoch's metrics).
        # A step called outside a Trainer (by hand, in a notebook) has no epoch to log.
        if self._trainer is not None and self.trainer.is_last_batch:  # also a limited epoch's last
            self._log_epoch_means("train")
        return loss

    def on_validation_epoch_start(self) -> None:
        self._epoch_sums.pop("val", None)

    def validation_step(self, batch, batch_idx: int) -> None:
        self._shared_step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        self._log_epoch_means("val")

    def on_test_epoch_start(self) -> None:
        self._epoch_sums.pop("test", None)

    def test_step(self, batch, batch_idx: int) -> None:
        self._shared_step(batch, "test")

    def on_test_epoch_end(self) -> None:
        self._log_epoch_means("test")

    def configure_optimizers(self):
        hp = self.hparams
        if hp.optimizer == "sgd":
            return torch.optim.SGD(self.parameters(), lr=hp.lr, momentum=hp.momentum,
                                   weight_decay=hp.weight_decay)
        return torch.optim.AdamW(self.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
