"""Bookkeeping benchmark (issue 5): many trivial trials, wall time against the ideal.

    python benchmarks/bookkeeping.py [--trials 300] [--seconds 1.0] [--no-baseline]

Each hpsearch trial is a Lightning model whose one training step waits ``--seconds``;
on 2 CPUs the ideal wall time is trials x seconds / 2. hpsearch runs twice in fresh
processes (100 trials, then ``--trials``) to show the driver's peak memory does not
grow with the trial count. The baseline, run in the same invocation: plain Ray Tune on
the shape of Ray's own release test (a function that sleeps ``--seconds`` and reports
once, no Lightning, no study on disk), with ``reuse_actors=True``; Ray's test passes
at 1.28x the ideal. The target here is 1.15x.

Besides wall/ideal, each row splits the wall time into the fixed start (command start
to the first trial's start: imports, validation, Ray's start, the first workers'
imports) and the steady state (first trial's start to the last trial's end, over the
ideal): what the run costs once, and what every further trial costs.
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


def run_hpsearch(trials: int, seconds: float, storage: str, timer) -> None:
    import hpsearch

    hpsearch.run({
        "name": "bookkeeping", "storage": storage,
        "model": {"class_path": "trivial_trials:WaitingModel", "init_args": {"seconds": seconds}},
        "data": {"class_path": "trivial_trials:OneBatch"},
        "space": {"model.lr": {"type": "float", "low": 0.01, "high": 1.0, "log": True}},
        "metric": "val_loss", "mode": "min",
        "search": {"num_trials": trials, "max_concurrent": SLOTS, "sampler": "random", "preflight": False},
        "scheduler": {"type": "none", "max_epochs": 1},
        "trainer": {"early_stopping_patience": None},
    }, callbacks=[timer])


def run_plain_tune(trials: int, seconds: float, storage: str, timer) -> None:
    import ray
    from ray import tune

    def sleeper(config):
        time.sleep(seconds)
        tune.report({"loss": config["x"]})

    ray.init(num_cpus=SLOTS, include_dashboard=False, log_to_driver=False)
    tune.Tuner(
        tune.with_resources(sleeper, {"cpu": 1}),
        param_space={"x": tune.uniform(0.0, 1.0)},
        tune_config=tune.TuneConfig(num_samples=trials, max_concurrent_trials=SLOTS, reuse_actors=True,
                                    metric="loss", mode="min"),
        run_config=tune.RunConfig(storage_path=storage, callbacks=[timer], verbose=0),
    ).fit()


def child(way: str, trials: int, seconds: float) -> None:
    started = time.monotonic()
    from _timing import TrialTimer

    timer = TrialTimer("hps_epoch_time_s")
    with tempfile.TemporaryDirectory(prefix="hpsearch-bookkeeping-") as storage:
        (run_hpsearch if way == "hpsearch" else run_plain_tune)(trials, seconds, storage, timer)
        wall = time.monotonic() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    first_start, last_end = min(timer.started_at.values()), max(timer.ended_at.values())
    print(json.dumps({"way": way, "trials": trials, "wall_s": wall, "peak_rss_mb": peak_mb,
                      "start_s": first_start - started, "span_s": last_end - first_start}))


def measure(way: str, trials: int, seconds: float) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", way, str(trials), "--seconds", str(seconds)],
                         cwd=HERE, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--no-baseline", action="store_true", help="skip the plain Ray Tune run")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), args.seconds)
        return 0
    runs = [("hpsearch", n) for n in sorted({min(100, args.trials), args.trials})]
    if not args.no_baseline:
        runs.append(("plain Ray Tune", args.trials))
    rows = [measure("hpsearch" if way == "hpsearch" else "tune", n, args.seconds) | {"label": way}
            for way, n in runs]
    print(f"\n{'way':<16}{'trials':>7}{'wall s':>9}{'ideal s':>9}{'wall/ideal':>12}{'start s':>9}"
          f"{'steady/ideal':>14}{'driver peak MB':>16}")
    for row in rows:
        ideal = row["trials"] * args.seconds / SLOTS
        row["ratio"], row["steady"] = row["wall_s"] / ideal, row["span_s"] / ideal
        print(f"{row['label']:<16}{row['trials']:>7}{row['wall_s']:>9.1f}{ideal:>9.1f}{row['ratio']:>11.2f}x"
              f"{row['start_s']:>9.1f}{row['steady']:>13.2f}x{row['peak_rss_mb']:>16.0f}")
    ours = [row for row in rows if row["label"] == "hpsearch"]
    growth = ours[-1]["peak_rss_mb"] / ours[0]["peak_rss_mb"]
    line = (f"ratios: wall/ideal at {ours[-1]['trials']} trials = {ours[-1]['ratio']:.2f}x (target 1.15x), "
            f"steady state {ours[-1]['steady']:.2f}x; driver peak memory {ours[-1]['trials']} vs "
            f"{ours[0]['trials']} trials = {growth:.2f}x")
    if not args.no_baseline:
        line += f"; hpsearch / plain Ray Tune wall = {ours[-1]['wall_s'] / rows[-1]['wall_s']:.2f}x"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
