"""Bookkeeping benchmark (issue 5): many trivial trials, wall time against the ideal.

    python benchmarks/bookkeeping.py [--trials 300] [--seconds 1.0]

Each trial waits ``--seconds`` in one training step; on 2 CPUs the ideal wall time is
trials x seconds / 2. The search runs twice in fresh processes (100 trials, then
``--trials``) to show the driver's peak memory does not grow with the trial count.
Ray's own release test for this shape passes at 1.28x the ideal; the target here is 1.15x.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SLOTS = 2


def child(trials: int, seconds: float) -> None:
    import hpsearch

    with tempfile.TemporaryDirectory(prefix="hpsearch-bookkeeping-") as storage:
        started = time.monotonic()
        hpsearch.run({
            "name": "bookkeeping", "storage": storage,
            "model": {"class_path": "trivial_trials:WaitingModel", "init_args": {"seconds": seconds}},
            "data": {"class_path": "trivial_trials:OneBatch"},
            "space": {"model.lr": {"type": "float", "low": 0.01, "high": 1.0, "log": True}},
            "metric": "val_loss", "mode": "min",
            "search": {"num_trials": trials, "max_concurrent": SLOTS, "sampler": "random", "preflight": False},
            "scheduler": {"type": "none", "max_epochs": 1},
            "trainer": {"early_stopping_patience": None},
        })
        wall = time.monotonic() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"trials": trials, "wall_s": wall, "peak_rss_mb": peak_mb}))


def measure(trials: int, seconds: float) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", str(trials), "--seconds", str(seconds)],
                         cwd=HERE, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.seconds)
        return 0
    rows = [measure(n, args.seconds) for n in sorted({min(100, args.trials), args.trials})]
    print(f"\n{'trials':>7}{'wall s':>9}{'ideal s':>9}{'wall/ideal':>12}{'driver peak MB':>16}")
    for row in rows:
        ideal = row["trials"] * args.seconds / SLOTS
        row["ratio"] = row["wall_s"] / ideal
        print(f"{row['trials']:>7}{row['wall_s']:>9.1f}{ideal:>9.1f}{row['ratio']:>11.2f}x{row['peak_rss_mb']:>16.0f}")
    growth = rows[-1]["peak_rss_mb"] / rows[0]["peak_rss_mb"]
    print(f"ratios: wall/ideal at {rows[-1]['trials']} trials = {rows[-1]['ratio']:.2f}x (target 1.15x); "
          f"driver peak memory {rows[-1]['trials']} vs {rows[0]['trials']} trials = {growth:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
