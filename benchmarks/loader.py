"""Loader benchmark (issue 5): images/s through the DataLoader hpsearch builds.

    python benchmarks/loader.py [--images 6000] [--size 96] [--cpus 2] [--rounds 10]

Generates a folder of JPEGs, then measures, in interleaved rounds (this machine's speed
drifts by +-15% within seconds, so every way is measured in every round, each measurement
sits between two short baseline passes and its ratio is taken against their mean; the
table shows medians over rounds):

* the baseline: one process decoding as fast as it can, with the dataset's own decode code;
* ``--cpus`` processes decoding independently: what the machine itself gives for that
  many CPUs, with no loader at all (the ceiling any loader can reach here);
* the ``image-folder`` DataLoader with the options hpsearch gives a GPU trial of
  ``--cpus`` CPUs (every CPU decodes) and a CPU trial (one CPU is left to training),
  with hpsearch's batch hand-over (``loader.sharing_strategy``, shared-memory names);
* the GPU-trial loader with a new shared-memory segment per batch instead of reused
  batch slots (``reuse_batch_buffers=False``), to show what the slots buy;
* the GPU-trial loader with torch's default hand-over (a file descriptor per tensor).
  Batch slots carry the image folder's batches either way, so this row runs the same
  loader as the GPU-trial row: how far the two differ shows this machine's noise.

"of target" is against single-process rate x CPUs, as the issue sets it; "of ceiling" is
against what the independent processes reached in the same round, each against its own
baseline passes.

Target: the GPU-trial loader reaches 85% of single-process rate x CPUs.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from hpsearch.models.image_folder import ImageFolderDataModule
from hpsearch.search.config import LoaderConfig, ResourcesConfig
from hpsearch.search.devices import loader_options, use_sharing_strategy
from PIL import Image

BATCH_SIZE = 64


def make_images(root: Path, count: int, size: int, classes: int = 10) -> None:
    rng = np.random.default_rng(0)
    for i in range(count):
        folder = root / f"class_{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        pixels = (rng.random((size, size, 3)) * 255).astype("uint8")
        Image.fromarray(pixels).save(folder / f"{i}.jpg", quality=90)


def train_split(root: Path, size: int):
    probe = ImageFolderDataModule(str(root), image_size=size)
    probe.setup()
    return probe._splits["train"]


def decode_pass(dataset, count: int | None = None) -> float:
    """Images/s of one process decoding the split's first ``count`` images (all by default)."""
    count = len(dataset) if count is None else min(count, len(dataset))
    started = time.perf_counter()
    for i in range(count):
        dataset[i]
    return count / (time.perf_counter() - started)


def _decode_after(barrier, dataset, rates) -> None:
    barrier.wait()  # every process starts decoding at the same moment
    rates.put(decode_pass(dataset))


def independent_rate(dataset, processes: int) -> float:
    """Images/s of ``processes`` forked processes decoding the split at the same time,
    with no loader: the sum of their own rates."""
    context = multiprocessing.get_context("fork")
    barrier, rates = context.Barrier(processes), context.Queue()
    workers = [context.Process(target=_decode_after, args=(barrier, dataset, rates)) for _ in range(processes)]
    for worker in workers:
        worker.start()
    total = sum(rates.get() for _ in workers)
    for worker in workers:
        worker.join()
    return total


def epoch_rate(loader, count: int) -> float:
    started = time.perf_counter()
    for _ in loader:
        pass
    return count / (time.perf_counter() - started)


def build_loader(root: Path, size: int, options: dict, sharing: str, reuse_buffers: bool):
    """A persistent-worker loader whose workers were forked under ``sharing``."""
    use_sharing_strategy(LoaderConfig(sharing_strategy=sharing))
    dm = ImageFolderDataModule(str(root), image_size=size, batch_size=BATCH_SIZE,
                               reuse_batch_buffers=reuse_buffers, **options)
    dm.setup()
    loader = dm.train_dataloader()
    started = time.perf_counter()
    epoch_rate(loader, 1)  # starts the workers; their start-up is reported separately
    return loader, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=6000)
    parser.add_argument("--size", type=int, default=96)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    hpsearch_sharing = LoaderConfig().sharing_strategy
    resources = ResourcesConfig(cpus_per_trial=args.cpus)
    gpu, cpu = "hpsearch loader, GPU trial", "hpsearch loader, CPU trial"
    fd, fresh = "GPU trial, torch's fd hand-over", "GPU trial, new segment per batch"
    ceiling = f"{args.cpus} processes, no loader"
    with tempfile.TemporaryDirectory(prefix="hpsearch-loader-") as tmp:
        root = Path(tmp)
        make_images(root, args.images, args.size)
        split = train_split(root, args.size)
        count = len(split)
        ways: dict[str, tuple] = {}  # label -> (loader, workers, first-epoch seconds)
        for label, on_gpu, sharing, reuse_buffers in (
            (gpu, True, hpsearch_sharing, True), (cpu, False, hpsearch_sharing, True),
            (fd, True, "file_descriptor", True), (fresh, True, hpsearch_sharing, False),
        ):
            options = loader_options(LoaderConfig(), resources, on_gpu=on_gpu)
            options["pin_memory"] = False  # no GPU here; pinning is a copy cost, not decode
            loader, first_epoch_s = build_loader(root, args.size, options, sharing, reuse_buffers)
            ways[label] = (loader, options["num_workers"], first_epoch_s)
        # per way and round: (its rate, the mean of the baseline passes just before and after it)
        rates: dict[str, list[tuple[float, float]]] = {label: [] for label in [ceiling, *ways]}
        bracket = max(BATCH_SIZE, count // 3)  # a baseline pass of about a third of an epoch
        measure = {ceiling: lambda: independent_rate(split, args.cpus)}
        measure.update({label: (lambda loader=loader: epoch_rate(loader, count)) for label, (loader, _, _) in ways.items()})
        for _ in range(args.rounds):
            before = decode_pass(split, bracket)
            for label, run_way in measure.items():
                rate = run_way()
                after = decode_pass(split, bracket)
                rates[label].append((rate, (before + after) / 2))
                before = after

    singles = [single for label in rates for _, single in rates[label]]

    def of_target(label: str) -> float:
        """Median over rounds of the way's rate against its bracketing single rate x CPUs."""
        return statistics.median(rate / (single * args.cpus) for rate, single in rates[label])

    def rate_of(label: str) -> float:
        return statistics.median(rate for rate, _ in rates[label])

    def of_ceiling(label: str) -> float:
        """Median over rounds of the way's share of its baseline against the independent
        processes' share of theirs, in the same round."""
        return statistics.median((rate / single) / (top / top_single)
                                 for (rate, single), (top, top_single) in zip(rates[label], rates[ceiling]))

    print(f"\n{args.images} JPEGs of {args.size}x{args.size}, batch {BATCH_SIZE}, {args.cpus} CPUs, "
          f"{args.rounds} interleaved rounds (medians); hpsearch hand-over: {hpsearch_sharing}")
    print(f"{'way':<34}{'workers':>8}{'img/s':>9}{'1st epoch s':>13}{'of target':>11}{'of ceiling':>12}")
    print(f"{'single process decode':<34}{0:>8}{statistics.median(singles):>9.0f}{'':>13}{'100%':>11}")
    print(f"{ceiling:<34}{args.cpus:>8}{rate_of(ceiling):>9.0f}{'':>13}{of_target(ceiling):>10.0%}")
    for label, (_, workers, first_epoch_s) in ways.items():
        print(f"{label:<34}{workers:>8}{rate_of(label):>9.0f}{first_epoch_s:>13.2f}"
              f"{of_target(label):>10.0%}{of_ceiling(label):>11.0%}")
    print(f"ratios: GPU-trial loader = {of_target(gpu):.2f} of single x {args.cpus} CPUs (target 0.85); "
          f"machine ceiling = {of_target(ceiling):.2f}, GPU-trial loader / ceiling = {of_ceiling(gpu):.2f}; "
          f"torch's fd hand-over = {of_target(fd):.2f}; new segment per batch = {of_target(fresh):.2f}; "
          f"CPU-trial loader = {of_target(cpu):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
