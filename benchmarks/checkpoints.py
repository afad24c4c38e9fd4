"""Checkpoint cost of one trial: hpsearch's callbacks against two plain ModelCheckpoints.

    python benchmarks/checkpoints.py                 # 25M parameters (300 MB with Adam), 5 rounds
    python benchmarks/checkpoints.py --layers 50 --rounds 3

Every way keeps what a trial needs: ``best.ckpt`` for the final evaluation and the two
newest epochs for resume. The ways:

* ``plain`` (the baseline): two plain ModelCheckpoints, which serialize an epoch that is
  both new and best twice, on the training thread;
* ``hpsearch``: ``build_trainer`` with hpsearch's reporter, as a trial runs: each epoch
  serialized once, straight into its file (``checkpoint_writes.py``), and copied to
  ``best.ckpt``;
* ``before``: the same with Lightning's own writer, which serializes into a buffer in
  memory first (hpsearch before ``checkpoint_writes.py``);
* ``async``: the baseline with Lightning's ``AsyncCheckpointIO``, which copies the state
  and writes it in a thread while training goes on: what taking the writes off the
  training path buys here.

Each round fits the same MLP of ``--layers`` 1000x1000 layers for ``--epochs`` epochs,
every way, in an order that changes each round. The metric improves at every epoch
but one, as it does early in most trials. The table gives the medians over the rounds of
the seconds spent checkpointing per epoch (the checkpoint callbacks' time at the end of
validation: for ``async``, taking a copy of the state; its wait for the last write counts
in the fit's time) and of the whole fit. The last line gives each way's ratios to the
baseline, and hpsearch's to ``before``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.plugins.io import AsyncCheckpointIO


class WideMLP(pl.LightningModule):
    """A model whose checkpoint is big and whose epochs are short: checkpointing dominates."""

    def __init__(self, layers: int, scores: list[float]) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(*[torch.nn.Linear(1000, 1000) for _ in range(layers)])
        self.scores = scores

    def training_step(self, batch, batch_idx):
        return self.net(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        pass

    def on_validation_epoch_end(self) -> None:
        self.log("score", self.scores[self.current_epoch])

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-6)


class CheckpointTimer(pl.Callback):
    """Seconds from the end of validation to the end of the epoch: the checkpoint
    callbacks' work (Lightning runs them last in ``on_validation_end``)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._started = 0.0

    def on_validation_end(self, trainer, pl_module) -> None:
        self._started = time.perf_counter()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.seconds.append(time.perf_counter() - self._started)


WAYS = {"plain": "plain ModelCheckpoint x2 (baseline)", "hpsearch": "hpsearch",
        "before": "before: hpsearch with Lightning's writer", "async": "async: plain, in Lightning's thread"}


def plain_callbacks(folder: Path) -> list[pl.Callback]:
    return [
        ModelCheckpoint(dirpath=folder, filename="best", monitor="score", mode="max", save_top_k=1,
                        enable_version_counter=False, save_on_train_epoch_end=False),
        ModelCheckpoint(dirpath=folder, filename="epoch-{epoch:04d}", auto_insert_metric_name=False,
                        monitor="step", mode="max", save_top_k=2, enable_version_counter=False,
                        save_on_train_epoch_end=False),
    ]


def fit_once(way: str, layers: int, epochs: int, batches: int, folder: Path) -> tuple[float, float, float]:
    """(checkpoint seconds per epoch, fit seconds, checkpoint MB) for one fit; ``way``:
    one of ``WAYS``."""
    from pytorch_lightning.plugins.io import TorchCheckpointIO

    from hpsearch.search.config import LoaderConfig, ResourcesConfig, TrainerConfig
    from hpsearch.search.devices import trial_device
    from hpsearch.search.lightning_trainer import build_trainer
    from hpsearch.search.reporting import TuneReporter

    torch.manual_seed(0)
    scores = [float(e) for e in range(epochs)]
    scores[-2], scores[-1] = scores[-1], scores[-2]  # one epoch that is not a new best
    data = torch.utils.data.TensorDataset(torch.randn(batches * 32, 1000))
    train = torch.utils.data.DataLoader(data, batch_size=32)
    val = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 1000)), batch_size=32)
    timer = CheckpointTimer()
    settings = TrainerConfig(early_stopping_patience=None)
    if way in ("hpsearch", "before"):
        reporter = TuneReporter("score", "max", epochs, report=lambda metrics: None, static_fields={})
        trainer = build_trainer(settings, device=trial_device(settings, LoaderConfig(), ResourcesConfig()),
                                metric="score", mode="max", max_epochs=epochs, trial_dir=folder,
                                tensorboard_run=folder / "tb", callbacks=[timer, reporter])
        if way == "before":
            trainer.strategy.checkpoint_io = TorchCheckpointIO()
    else:
        trainer = pl.Trainer(max_epochs=epochs, callbacks=[timer, *plain_callbacks(folder / "checkpoints")],
                             logger=False, enable_progress_bar=False, enable_model_summary=False,
                             num_sanity_val_steps=0, plugins=[AsyncCheckpointIO()] if way == "async" else None)
    started = time.perf_counter()
    trainer.fit(WideMLP(layers, scores), train, val)
    fit_s = time.perf_counter() - started
    megabytes = (folder / "checkpoints" / "best.ckpt").stat().st_size / 1e6
    return statistics.fmean(timer.seconds), fit_s, megabytes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=25, help="1000x1000 layers (1M parameters each)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batches", type=int, default=4, help="training batches of 32 per epoch")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from hpsearch.search.lightning_trainer import quiet_lightning

    quiet_lightning()
    ways = list(WAYS)
    measured: dict[str, list[tuple[float, float, float]]] = {way: [] for way in ways}
    for round_number in range(args.rounds):
        order = ways[round_number % len(ways):] + ways[:round_number % len(ways)]
        for way in order:
            with tempfile.TemporaryDirectory() as folder:
                measured[way].append(fit_once(way, args.layers, args.epochs, args.batches, Path(folder)))
    medians = {way: [statistics.median(run[i] for run in runs) for i in range(3)] for way, runs in measured.items()}
    print(f"{'way':<42}{'checkpoint MB':>14}{'checkpoint s/epoch':>20}{'fit s':>8}")
    for way, (per_epoch, fit_s, megabytes) in medians.items():
        print(f"{WAYS[way]:<42}{megabytes:>14.0f}{per_epoch:>20.2f}{fit_s:>8.2f}")
    base = medians["plain"]
    ratios = "; ".join(f"{way}/baseline: checkpoint time per epoch {medians[way][0] / base[0]:.2f}x, "
                       f"fit time {medians[way][1] / base[1]:.2f}x" for way in ways if way != "plain")
    print(f"ratios {ratios}; hpsearch/before: fit time {medians['hpsearch'][1] / medians['before'][1]:.2f}x "
          f"({args.epochs} epochs, {args.epochs - 1} new bests, medians of {args.rounds} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
