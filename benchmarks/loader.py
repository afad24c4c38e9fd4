"""Loader benchmark (issue 5): images/s through the DataLoader hpsearch builds.

    python benchmarks/loader.py [--images 2000] [--size 96] [--cpus 2]

Generates a folder of JPEGs, then measures (1) one process decoding as fast as it can
(the same decode code the dataset uses), and (2) the ``image-folder`` DataLoader with
the options hpsearch gives a trial of ``--cpus`` CPUs, both for a GPU trial (every CPU
decodes) and a CPU trial (one CPU is left to training). Target: the GPU-trial loader
reaches 85% of single-process rate x CPUs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from hpsearch.models.image_folder import ImageFolderDataModule
from hpsearch.search.config import LoaderConfig, ResourcesConfig
from hpsearch.search.devices import loader_options


def make_images(root: Path, count: int, size: int, classes: int = 10) -> None:
    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / f"class_{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = (rng.random((size, size, 3)) * 255).astype("uint8")
        Image.fromarray(pixels).save(folder / f"{i}.jpg", quality=90)


def single_process_rate(dm: ImageFolderDataModule, repeats: int = 3) -> float:
    """The best of a few passes: one process decoding as fast as it can."""
    dataset = dm._splits["train"]
    best = 0.0
    for _ in range(repeats):
        started = time.perf_counter()
        for i in range(len(dataset)):
            dataset[i]
        best = max(best, len(dataset) / (time.perf_counter() - started))
    return best


def loader_rate(root: Path, size: int, options: dict, epochs: int = 3) -> tuple[float, float]:
    """(steady-state images/s over epochs after the first, images/s including worker start-up)."""
    dm = ImageFolderDataModule(str(root), image_size=size, batch_size=64, **options)
    dm.setup()
    loader = dm.train_dataloader()
    count = len(dm._splits["train"])
    started = time.perf_counter()
    first_epoch_end = None
    for epoch in range(epochs):
        for _ in loader:
            pass
        if epoch == 0:
            first_epoch_end = time.perf_counter()
    total = time.perf_counter() - started
    steady = (epochs - 1) * count / (time.perf_counter() - first_epoch_end)
    return steady, epochs * count / total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--cpus", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpsearch-loader-") as tmp:
        root = Path(tmp)
        make_images(root, args.images, args.size)
        probe = ImageFolderDataModule(str(root), image_size=args.size)
        probe.setup()
        single = single_process_rate(probe)
        resources = ResourcesConfig(cpus_per_trial=args.cpus)
        rows = [("single process decode", 0, single, single, 1.0)]
        for label, on_gpu in (("hpsearch loader, GPU trial", True), ("hpsearch loader, CPU trial", False)):
            options = loader_options(LoaderConfig(), resources, on_gpu=on_gpu)
            options["pin_memory"] = False  # no GPU here; pinning is a copy cost, not decode
            steady, with_startup = loader_rate(root, args.size, options)
            rows.append((label, options["num_workers"], steady, with_startup, steady / (single * args.cpus)))
    print(f"\n{'way':<30}{'workers':>8}{'img/s':>9}{'img/s incl. start':>19}{'of target':>11}")
    for label, workers, steady, start, share in rows:
        print(f"{label:<30}{workers:>8}{steady:>9.0f}{start:>19.0f}{share:>10.0%}")
    print(f"ratios: GPU-trial loader = {rows[1][4]:.2f} of single x {args.cpus} CPUs (target 0.85); "
          f"CPU-trial loader = {rows[2][4]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
