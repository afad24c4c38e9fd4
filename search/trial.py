"""One trial: build the user's DataModule and model with the sampled values, train, report.

``train_trial`` is the Ray Tune function trainable. A trial keeps its own files in
``EXP_DIR/trials/<trial name>/``: when it is started again (a retry after a failure,
or ``hpsearch resume``) it continues from its ``last.ckpt`` there, so the global step
and epoch continue rather than restart.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .components import build_datamodule, build_model, resolve_class
from .config import ExperimentConfig
from .devices import trial_device
from .experiment import ExperimentDir, trial_name
from .lightning_trainer import LAST_CHECKPOINT, build_trainer, checkpoint_dir, quiet_lightning
from .outcome import TRIAL_NUMBER
from .reporting import TuneReporter


@dataclass(frozen=True)
class Parallelism:
    """How this process takes part in its trial: alone, or as one DDP/FSDP/DeepSpeed rank."""

    world_size: int = 1
    strategy: Any = "auto"  # a Lightning strategy object for distributed ranks
    strategy_name: str = "single"
    report_on_every_rank: bool = False  # Ray Train collects a report from every rank


def train_trial(trial_config: dict[str, Any], *, experiment: dict[str, Any], experiment_dir: str) -> None:
    """Ray Tune function trainable for single-process trials: trains in the Tune worker itself."""
    from ray import tune

    fit_trial(trial_config, experiment, experiment_dir, report=tune.report, parallel=Parallelism())


def fit_trial(trial_config: dict[str, Any], experiment: dict[str, Any], experiment_dir: str, *,
              report: Callable[[dict], None], parallel: Parallelism) -> None:
    """Train one sampled configuration in this process, reporting after every validation."""
    started = time.perf_counter()
    config = ExperimentConfig.model_validate(experiment)
    params: dict[str, Any] = trial_config["params"]
    number = int(trial_config[TRIAL_NUMBER])
    trial_dir = ExperimentDir(Path(experiment_dir)).trial_dir(trial_name(number))
    trial_dir.mkdir(parents=True, exist_ok=True)
    quiet_lightning()

    import pytorch_lightning as pl
    import torch

    torch.set_num_threads(max(1, int(config.resources.worker_cpus)))
    if config.search.seed is not None:
        # Each trial's weights and shuffling are reproducible, and differ between trials;
        # every rank of a trial starts from the same weights.
        pl.seed_everything(config.search.seed + number, workers=True, verbose=False)
    settings = config.with_trainer_params(params)
    device = trial_device(settings, config.loader, config.resources)
    datamodule = build_datamodule(config, resolve_class("data", config.data.class_path), params,
                                  device.loader_options)
    model = build_model(config, resolve_class("model", config.model.class_path), params, datamodule)
    resume_from = _resume_checkpoint(trial_dir)
    static_fields = {
        TRIAL_NUMBER: number,
        "hps_trial_dir": str(trial_dir),
        "hps_device": device.accelerator,
        "hps_precision": device.precision,
        "hps_world_size": parallel.world_size,
        "hps_strategy": parallel.strategy_name,
        "hps_num_workers": getattr(datamodule, "effective_num_workers", device.loader_options["num_workers"]),
        "hps_pin_memory": device.loader_options["pin_memory"],
        "hps_resumed": resume_from is not None,
    }
    reporter = TuneReporter(config.metric, config.mode, config.scheduler.max_epochs,
                            report=_timed(report, started), static_fields=static_fields,
                            hparams=None if resume_from else params,
                            report_on_every_rank=parallel.report_on_every_rank)
    trainer = build_trainer(settings, device=device, metric=config.metric, mode=config.mode,
                            max_epochs=config.scheduler.max_epochs, trial_dir=trial_dir, callbacks=[reporter],
                            strategy=parallel.strategy)
    trainer.fit(model, datamodule=datamodule, ckpt_path=str(resume_from) if resume_from else None)


def _timed(report: Callable[[dict], None], started: float) -> Callable[[dict], None]:
    """``report`` that also records, once, how long the trial took to produce its first result."""
    first = {"done": False}

    def timed_report(metrics: dict[str, Any]) -> None:
        if not first["done"]:
            metrics["hps_first_result_s"] = time.perf_counter() - started
            first["done"] = True
        report(metrics)

    return timed_report


def _resume_checkpoint(trial_dir: Path) -> Path | None:
    last = checkpoint_dir(trial_dir) / LAST_CHECKPOINT
    return last if last.is_file() and last.stat().st_size > 0 else None
