"""A trial that does nothing but wait a fixed time: for measuring platform bookkeeping."""

import time

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset


class WaitingModel(pl.LightningModule):
    """One training step that sleeps ``seconds`` and a validation step that logs ``val_loss``."""

    def __init__(self, seconds: float = 1.0, lr: float = 0.1):
        super().__init__()
        self.seconds = seconds
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch, batch_idx):
        time.sleep(self.seconds)
        return self.layer(batch[0]).sum()

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.layer(batch[0]).sum().abs())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.get("lr", 0.1) if self.hparams else 0.1)


class OneBatch(pl.LightningDataModule):
    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.ones(1, 1)), batch_size=1)

    def val_dataloader(self):
        return DataLoader(TensorDataset(torch.ones(1, 1)), batch_size=1)
