"""Overhead benchmark (issue 5): the same search three ways in one process tree.

    python benchmarks/overhead.py [--trials 16] [--max-epochs 10]

1. hpsearch (``hpsearch.run``);
2. the Ray Tune documentation's recipe as a user writes it: a function trainable with
   Lightning and ``TuneReportCheckpointCallback``, ``OptunaSearch`` + ``ASHAScheduler``,
   Ray's defaults;
3. that recipe with ``reuse_actors=True``.

Workload: the built-in CNN on digits, ASHA grace 1 and reduction factor 3, 2 trials at
a time on 2 CPUs, the same seeds and trial count. Printed per way: search wall time,
time to first result, slot efficiency (sum of per-epoch train+validation time over wall
time x concurrency), mean trial start-up; then hpsearch's ratios against each baseline.

Each repeat also measures, on the idle machine, the CPU time of what any implementation
must do besides the epochs: start Ray, and import Ray Tune, torch, Lightning and the model
into a trial process, counted once (Ray Tune runs each trial in a process of its own, so
every way here imports twice, but a process forked from one that has imported would not).
Added to the epochs' own CPU time and spread over the two CPUs, it gives the bound: the
shortest wall time in which any implementation could run that way's epochs here. A
baseline's wall time over its bound is the largest lead any implementation could take
over it on this machine.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _timing, when run as a script

import pytorch_lightning as pl  # noqa: E402
import ray  # noqa: E402
from _timing import TrialTimer  # noqa: E402
from ray import tune  # noqa: E402

CONCURRENCY = 2
SPACE = {"lr": (1e-4, 1e-1), "channels": [8, 16, 32], "batch_size": (32, 256)}


class EpochTimer(pl.Callback):
    """Logs train+validation seconds of each epoch, wall and CPU, so the recipe reports them
    to Tune (hpsearch reports both itself)."""

    def on_train_epoch_start(self, trainer, pl_module):
        self.started, self.cpu_started = time.perf_counter(), time.process_time()

    def on_validation_epoch_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            pl_module.log("bench_epoch_s", time.perf_counter() - self.started)
            pl_module.log("bench_epoch_cpu_s", time.process_time() - self.cpu_started)


def recipe_trainable(config):
    """What the Ray docs show for Lightning under Tune (with the built-in model and data)."""
    from ray.tune.integration.pytorch_lightning import TuneReportCheckpointCallback

    from hpsearch.models.cnn import CNNClassifier
    from hpsearch.models.digits import DigitsDataModule

    data = DigitsDataModule(batch_size=config["batch_size"])
    model = CNNClassifier(lr=config["lr"], channels=config["channels"])
    # Lightning writes its logs under the working directory: Tune's default makes that the
    # trial's folder, which this process tree turns off for hpsearch (RAY_CHDIR_TO_TRIAL_DIR).
    trainer = pl.Trainer(
        max_epochs=config["max_epochs"], enable_progress_bar=False, logger=True,
        default_root_dir=tune.get_context().get_trial_dir(),
        callbacks=[EpochTimer(), TuneReportCheckpointCallback(on="validation_end")],
    )
    trainer.fit(model, datamodule=data)


def measure_fixed_costs() -> dict[str, float]:
    """CPU seconds, all processes together, of Ray's start (as hpsearch starts it, without
    the processes a local search does not use: the least any way needs), and of the imports
    a trial process needs before its first epoch beyond Ray itself (which Ray's start
    already counted), with the collector off: the fastest this import gets here. Linux only
    (the machine's busy time is read from /proc/stat)."""
    from hpsearch.search.tuner import local_ray_without_idle_services

    busy_before = _machine_busy_s()
    with local_ray_without_idle_services(local=True, verbose=False):
        ray.init(num_cpus=CONCURRENCY, include_dashboard=False, log_to_driver=False)
    ray_start = _machine_busy_s() - busy_before
    ray.shutdown()
    stack = _import_cpu_s("ray.tune, pytorch_lightning, hpsearch.models.cnn, hpsearch.models.digits")
    return {"ray_start_cpu_s": ray_start, "stack_import_cpu_s": stack - _import_cpu_s("ray")}


def _machine_busy_s() -> float:
    with open("/proc/stat") as stat:
        ticks = [int(field) for field in stat.readline().split()[1:]]
    idle = ticks[3] + ticks[4]  # idle, iowait
    return (sum(ticks) - idle) / os.sysconf("SC_CLK_TCK")


def _import_cpu_s(modules: str) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", f"import gc; gc.disable(); import {modules}"], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def run_recipe(trials: int, max_epochs: int, reuse_actors: bool, storage: str) -> dict:
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search.optuna import OptunaSearch

    timer = TrialTimer("bench_epoch_s", cpu_key="bench_epoch_cpu_s")
    started = time.monotonic()  # Ray's start-up counts for every way, as it does for hpsearch
    ray.init(num_cpus=CONCURRENCY, include_dashboard=False, log_to_driver=False)
    tuner = tune.Tuner(
        tune.with_resources(recipe_trainable, {"cpu": 1}),
        param_space={
            "lr": tune.loguniform(*SPACE["lr"]), "channels": tune.choice(SPACE["channels"]),
            "batch_size": tune.lograndint(SPACE["batch_size"][0], SPACE["batch_size"][1] + 1),
            "max_epochs": max_epochs,
        },
        tune_config=tune.TuneConfig(
            metric="val_acc", mode="max", num_samples=trials, max_concurrent_trials=CONCURRENCY,
            search_alg=OptunaSearch(seed=0),
            scheduler=ASHAScheduler(max_t=max_epochs, grace_period=1, reduction_factor=3),
            reuse_actors=reuse_actors,
        ),
        run_config=tune.RunConfig(storage_path=storage, callbacks=[timer], verbose=0),
    )
    tuner.fit()
    wall = time.monotonic() - started
    ray.shutdown()
    return timer.summary(started, wall, CONCURRENCY)


def run_hpsearch(trials: int, max_epochs: int, storage: str) -> dict:
    import hpsearch

    # Epoch start to validation's end, as the recipe's EpochTimer measures: less the
    # checkpoint writes that end hpsearch's epoch.
    timer = TrialTimer("hps_epoch_time_s", excluded_key="hps_checkpoint_s", cpu_key="hps_epoch_cpu_s")
    started = time.monotonic()  # includes validation, the preflight batch, Ray's start and best.json
    hpsearch.run({
        "name": "overhead", "storage": storage,
        "model": {"class_path": "cnn"}, "data": {"class_path": "digits"},
        "space": {
            "model.lr": {"type": "float", "low": SPACE["lr"][0], "high": SPACE["lr"][1], "log": True},
            "model.channels": {"type": "categorical", "choices": SPACE["channels"]},
            "data.batch_size": {"type": "int", "low": SPACE["batch_size"][0], "high": SPACE["batch_size"][1],
                                "log": True},
        },
        "metric": "val_acc", "mode": "max",
        "search": {"num_trials": trials, "max_concurrent": CONCURRENCY, "seed": 0},
        "scheduler": {"type": "asha", "max_epochs": max_epochs, "grace_period": 1, "reduction_factor": 3},
        "trainer": {"early_stopping_patience": None},
    }, callbacks=[timer])
    wall = time.monotonic() - started
    ray.shutdown()
    return timer.summary(started, wall, CONCURRENCY)


def main() -> int:
    parser = argparse.ArgumentParser(description="hpsearch vs the Ray Tune docs recipe, same search")
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--max-epochs", type=int, default=10)
    parser.add_argument("--only", choices=["hpsearch", "recipe", "reuse"], action="append")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run every way this many times (interleaved) and report medians: "
                             "asynchronous sampling makes single runs differ in epochs run")
    args = parser.parse_args()
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "0")
    ways = args.only or ["hpsearch", "recipe", "reuse"]
    runs: dict[str, list[dict]] = {way: [] for way in ways}
    fixed: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="hpsearch-overhead-") as storage:
        for repeat in range(args.repeat):
            fixed.append(measure_fixed_costs())
            for way in ways:
                where = f"{storage}/{repeat}"
                if way == "hpsearch":
                    runs[way].append(run_hpsearch(args.trials, args.max_epochs, where))
                else:
                    runs[way].append(run_recipe(args.trials, args.max_epochs, way == "reuse", where))
    start = {key: statistics.median(f[key] for f in fixed) for key in fixed[0]}
    fixed_s = (start["ray_start_cpu_s"] + start["stack_import_cpu_s"]) / CONCURRENCY
    for results_of_way in runs.values():
        for r in results_of_way:
            r["bound_s"] = fixed_s + r["cpu_floor_s"]
    results = {way: {key: statistics.median(r[key] for r in results_of_way) for key in results_of_way[0]}
               for way, results_of_way in runs.items()}
    if args.repeat > 1:
        print(f"\nmedians of {args.repeat} runs per way; wall s of each run: "
              + "; ".join(way + " " + ", ".join(f"{r['wall_s']:.1f}" for r in rs) for way, rs in runs.items()))
    names = {"hpsearch": "hpsearch", "recipe": "Ray docs recipe", "reuse": "recipe + reuse_actors"}
    print(f"\n{'way':<24}{'wall s':>9}{'first result s':>16}{'slot eff.':>11}{'startup s':>11}{'epochs':>8}"
          f"{'floor s':>9}{'bound s':>9}{'wall/bound':>12}")
    for way, r in results.items():
        print(f"{names[way]:<24}{r['wall_s']:>9.1f}{r['first_result_s']:>16.1f}{r['slot_efficiency']:>10.0%}"
              f"{r['startup_s']:>11.2f}{r['epochs']:>8.0f}{r['compute_floor_s']:>9.1f}{r['bound_s']:>9.1f}"
              f"{r['wall_s'] / r['bound_s']:>11.2f}x")
    print("floor s: the epochs' own train+validation time over the slots (a perfect scheduler's wall time)")
    print(f"bound s: the epochs' CPU time over the slots + (Ray's start as hpsearch starts it, "
          f"{start['ray_start_cpu_s']:.1f} CPU s, + one "
          f"import of Ray Tune, torch, Lightning and the model, {start['stack_import_cpu_s']:.1f} CPU s) over "
          f"{CONCURRENCY} CPUs, {fixed_s:.1f} s: the shortest wall time in which any implementation could run "
          "that way's epochs on this machine (medians)")
    if "hpsearch" in results:
        hps = results["hpsearch"]
        print(f"at its bound, hpsearch's run would have a slot efficiency of {hps['compute_floor_s'] / hps['bound_s']:.0%}"
              " (its epochs' wall time over the bound's wall time, both slots)")
        ratios = [f"{names[w]} / hpsearch wall time = {r['wall_s'] / hps['wall_s']:.2f}x "
                  f"(any implementation: at most {r['wall_s'] / r['bound_s']:.2f}x)"
                  for w, r in results.items() if w != "hpsearch"]
        print("ratios: " + "; ".join(ratios) if ratios else "ratios: (no baseline run)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
