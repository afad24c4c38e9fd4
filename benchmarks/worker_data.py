"""Data built once per trial worker against once per trial: a search over a big in-memory dataset.

    python benchmarks/worker_data.py                          # 50,000 CIFAR-sized images, 8 trials, 2 rounds
    python benchmarks/worker_data.py --samples 2000 --trials 4 --rounds 1

The same search runs both ways, alternating, each in a fresh process: 8 short trials
(one epoch of a few batches) of the built-in MLP on ``synthetic-images`` of ``--samples``
3x32x32 images (600 MB at 50,000), 2 at a time on 2 CPUs. The baseline sets the
DataModule's ``reuse_in_worker: false``, so every trial generates its tensors, as an
in-memory DataModule does without hpsearch's ``once_per_worker``; hpsearch's default
generates them once per trial worker. Generating stands in for loading a dataset into
memory. The table gives the medians over the rounds of the search's wall time (from
before ``hpsearch.run``), the trials' mean start-up (``startup_s``: the trial's start to
its training's start, which holds the data) and how many trials reused their worker's
data; the last line, the ratios hpsearch/baseline.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SLOTS = 2


def search(reuse: bool, samples: int, trials: int, storage: str) -> dict:
    import hpsearch

    started = time.monotonic()
    hpsearch.run({
        "name": "worker-data", "storage": storage,
        "model": {"class_path": "mlp", "init_args": {"hidden_units": 32, "depth": 1}},
        "data": {"class_path": "synthetic-images",
                 "init_args": {"num_samples": samples, "image_size": 32, "channels": 3, "batch_size": 64,
                               "reuse_in_worker": reuse}},
        "space": {"model.lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True}},
        "metric": "val_acc", "mode": "max",
        "search": {"num_trials": trials, "max_concurrent": SLOTS, "sampler": "random", "seed": 0},
        "scheduler": {"type": "none", "max_epochs": 1},
        "trainer": {"limit_train_batches": 4, "limit_val_batches": 2, "early_stopping_patience": None},
    })
    wall = time.monotonic() - started
    with open(next(Path(storage).glob("*/trials.csv"))) as handle:
        rows = list(csv.DictReader(handle))
    return {"wall_s": wall, "startup_s": statistics.mean(float(r["startup_s"]) for r in rows),
            "reused": sum(r["data_reused"] == "True" for r in rows)}


def measure(reuse: bool, samples: int, trials: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", str(int(reuse)), "--samples", str(samples),
                          "--trials", str(trials)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=50_000)
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        with tempfile.TemporaryDirectory(prefix="hpsearch-worker-data-") as storage:
            print(json.dumps(search(bool(int(args.child)), args.samples, args.trials, storage)))
        return 0
    labels = {False: "every trial builds its data (baseline)", True: "hpsearch: once per worker"}
    runs: dict[bool, list[dict]] = {False: [], True: []}
    for round_number in range(args.rounds):
        for reuse in ((False, True) if round_number % 2 == 0 else (True, False)):
            runs[reuse].append(measure(reuse, args.samples, args.trials))
    medians = {reuse: {key: statistics.median(run[key] for run in measured) for key in measured[0]}
               for reuse, measured in runs.items()}
    print(f"{'way':<42}{'wall s':>8}{'mean trial start-up s':>23}{'trials reusing':>16}")
    for reuse, row in medians.items():
        print(f"{labels[reuse]:<42}{row['wall_s']:>8.1f}{row['startup_s']:>23.2f}{row['reused']:>16.0f}")
    base, ours = medians[False], medians[True]
    print(f"ratios hpsearch/baseline: search wall {ours['wall_s'] / base['wall_s']:.2f}x, trial start-up "
          f"{ours['startup_s'] / base['startup_s']:.2f}x ({args.trials} trials, {args.samples} images of 3x32x32, "
          f"medians of {args.rounds} rounds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
