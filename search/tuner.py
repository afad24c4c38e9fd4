"""One search session on Ray: start or join Ray, check resources, run the Tuner.

A study may take several sessions (``run``, then ``resume`` after an interruption).
The Optuna journal is the study's memory between them; each session is a fresh Ray
Tune experiment under ``EXP_DIR/tune/session-N``, so nothing depends on unpickling
Ray's own state across versions or machines.
"""

from __future__ import annotations

import logging
import os
from .components import user_code_roots
from .config import ExperimentConfig
from .errors import ResourceError
from .experiment import ExperimentDir
from .outcome import PruneLog
from .trials_table import TrialsTable

# Ray reads these in the driver and in every worker: no per-trial CSV/JSON/TensorBoard
# loggers of its own (hpsearch writes TensorBoard where users look for it), and trials
# keep the working directory they started in, so relative paths in a config resolve.
RAY_ENV = {"TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1", "RAY_CHDIR_TO_TRIAL_DIR": "0", "RAY_AIR_NEW_OUTPUT": "0"}


def start_ray(config: ExperimentConfig, address: str | None, verbose: bool) -> None:
    """Start a local Ray (no address) or join a cluster; ship the user's code to workers."""
    import ray

    os.environ.update(RAY_ENV)
    runtime_env = {"env_vars": dict(RAY_ENV)}
    roots = user_code_roots(config)
    if roots:
        runtime_env["py_modules"] = roots
    if ray.is_initialized():
        return
    ray.init(
        address=address,
        runtime_env=runtime_env,
        include_dashboard=False,
        logging_level=logging.INFO if verbose else logging.WARNING,
        log_to_driver=verbose,
        configure_logging=True,
    )
    if not verbose:
        for name in ("ray.tune", "ray.train", "ray.air"):
            logging.getLogger(name).setLevel(logging.ERROR)


def check_resources(config: ExperimentConfig, nodes: list[dict]) -> None:
    """Refuse a trial that no single node can hold, naming the numbers, before any trial starts."""
    need_cpu, need_gpu = config.resources.cpus_per_trial, config.resources.gpus_per_trial
    alive = [n.get("Resources", {}) for n in nodes if n.get("Alive", True)]
    most_cpu = max((r.get("CPU", 0.0) for r in alive), default=0.0)
    most_gpu = max((r.get("GPU", 0.0) for r in alive), default=0.0)
    fitting = [r for r in alive if r.get("CPU", 0.0) >= need_cpu and r.get("GPU", 0.0) >= need_gpu]
    if not fitting:
        raise ResourceError(
            f"a trial asks for resources.cpus_per_trial={need_cpu:g} and resources.gpus_per_trial={need_gpu:g}, "
            f"but the largest node has {most_cpu:g} CPUs and {most_gpu:g} GPUs ({len(alive)} node(s)); "
            "lower the request or add a larger node"
        )


def run_session(config: ExperimentConfig, exp: ExperimentDir, verbose: bool) -> bool:
    """Run trials until the study is complete or the user interrupts; True if complete."""
    from ray import tune

    from .scheduler import StudyASHA, make_scheduler
    from .searcher import OptunaSearcher
    from .trial import train_trial
    from .tune_callbacks import ProgressDisplay, TrialsTableRecorder

    prunes = PruneLog()
    searcher = OptunaSearcher(config, exp.root, prunes)
    scheduler = make_scheduler(config, prunes)
    if isinstance(scheduler, StudyASHA):
        scheduler.seed_rungs(searcher.history())
    table = TrialsTable.load(exp.trials_csv, config.metric, config.mode, list(config.space))
    callbacks = [TrialsTableRecorder(table, exp.trials_csv, prunes),
                 ProgressDisplay(table, searcher.trial_limit)]
    trainable = tune.with_resources(
        tune.with_parameters(train_trial, experiment=config.model_dump(mode="json"), experiment_dir=str(exp.root)),
        {"cpu": config.resources.cpus_per_trial, "gpu": config.resources.gpus_per_trial},
    )
    exp.tune_dir.mkdir(exist_ok=True)
    session = f"session-{len(list(exp.tune_dir.glob('session-*'))) + 1}"
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=searcher,
            scheduler=scheduler,
            num_samples=-1,  # the searcher says when the study has all its trials
            max_concurrent_trials=config.search.max_concurrent,
            time_budget_s=config.search.time_budget_s,
            reuse_actors=True,  # one warm worker process serves many short trials
        ),
        run_config=tune.RunConfig(
            name=session,
            storage_path=str(exp.tune_dir),
            callbacks=callbacks,
            verbose=2 if verbose else 0,
            failure_config=tune.FailureConfig(max_failures=config.failure.max_retries),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
        ),
    )
    tuner.fit()
    return searcher.is_complete()
