"""The study's outcome: the best trial evaluated on the test split, written to best.json."""

from __future__ import annotations

import sys
from typing import Any

from .config import ExperimentConfig
from .errors import HpsearchError, exception_chain, own_line
from .experiment import TRIAL_SETTINGS, ExperimentDir, trial_name, write_json
from .checkpoints import BEST_CHECKPOINT, checkpoint_dir, epochs_trained
from .storage import Mirror
from .trials_table import TrialsTable


EVALUATION_ERROR = "evaluation-error.txt"  # the traceback of a failed test evaluation


def finalize(config: ExperimentConfig, exp: ExperimentDir, mirror: Mirror | None = None) -> dict[str, Any] | None:
    """Evaluate the best trial's best checkpoint and write ``best.json``; None if no trial scored.
    With URI storage the checkpoint is fetched first (another node may have written it)."""
    table = TrialsTable.load(exp.trials_csv, config.metric, config.mode, list(config.space))
    row = table.best_row()
    ahead = table.ahead_of_best(row)
    if row is None:
        return None
    number = int(row["trial"])
    params = sampled_params(config, exp, number)
    if mirror is not None:
        mirror.pull(f"trials/{trial_name(number)}/checkpoints/{BEST_CHECKPOINT}",
                    f"trials/{trial_name(number)}/{TRIAL_SETTINGS}")
    config = trained_with(config, exp, number)
    checkpoint = checkpoint_dir(exp.trial_dir(trial_name(number))) / BEST_CHECKPOINT
    test_metrics, test_error = {}, None
    _drop_earlier_evaluations(exp, number)
    if checkpoint.exists():
        if _has_test_split(config, params):  # it can take a while: say what runs
            # progress, with the search's own on stderr: stdout holds the result (audit 51)
            print(f"evaluating the best trial ({number}) on the test split", file=sys.stderr, flush=True)
        try:
            test_metrics = evaluate_on_cluster(config, params, str(checkpoint), mirror, seed=trained_seed(row))
            (exp.root / EVALUATION_ERROR).unlink(missing_ok=True)  # an earlier session's, now out of date
        except HpsearchError:
            raise
        except Exception as exc:  # the user's test code: the search's result is still written
            if any(isinstance(error, KeyboardInterrupt) for error in exception_chain(exc)):
                # A Ctrl+C that Lightning's teardown met, and failed on in its own handling
                # ("Writer is closed"): an interrupt, not the test code's fault (audit 32)
                raise KeyboardInterrupt from exc
            test_error = _evaluation_failure(exc, exp)
    best_epoch = epochs_trained(checkpoint) if checkpoint.exists() else None
    best = {
        "experiment": config.name,
        "experiment_dir": str(exp.root),
        "metric": config.metric,
        "mode": config.mode,
        "value": row["best"],
        "trial": int(row["trial"]),
        "state": row["state"],
        "epochs": row.get("epochs"),
        # the epoch whose checkpoint scored the value, and was evaluated (a trial goes on after its best)
        "best_epoch": best_epoch,
        "seed": trained_seed(row),  # it trained with (seeding.py)
        # what it ran on and with (trials.csv's columns): config's trainer.precision is the
        # one asked for, which a machine without it replaces (16-mixed on CPU: bf16-mixed)
        "device": row.get("device") or None,
        "precision": row.get("precision") or None,
        "params": params,
        "config": resolved_config(config, params, row),
        "checkpoint": str(checkpoint) if checkpoint.exists() else None,
        "checkpoint_uri": mirror.address_of(checkpoint) if mirror is not None and checkpoint.exists() else None,
        "test_metrics": test_metrics,
        "test_error": test_error,  # why the evaluation failed; hpsearch resume runs it again
        # a pruned or failed trial that scored better: not a candidate (TrialsTable.best_row), but said
        "ahead": None if ahead is None else {"trial": int(ahead["trial"]), "state": ahead["state"],
                                             "value": ahead["best"], "epochs": ahead.get("epochs")},
    }
    write_json(exp.best_json, best)
    if test_metrics:
        _test_metrics_in_tensorboard(config, exp, number, params, test_metrics, best_epoch, mirror)
    return best


def _drop_earlier_evaluations(exp: ExperimentDir, best: int) -> None:
    """The test folders of trials that were the best at an earlier evaluation: a resume may
    pick another best, and each former best's test/ stayed beside it, as if evaluated
    now (audit 21, D2). The best trial's own is replaced by its evaluation."""
    import shutil

    for folder in exp.root.glob("trials/*/test"):
        if folder.parent.name != trial_name(best):
            shutil.rmtree(folder, ignore_errors=True)


def _test_metrics_in_tensorboard(config: ExperimentConfig, exp: ExperimentDir, number: int, params: dict[str, Any],
                                 metrics: dict[str, float], epoch: int, mirror: Mirror | None) -> None:
    """A failure here (a full disk, say) costs TensorBoard's copy, never the result."""
    import warnings

    from .tensorboard_layout import write_test_metrics

    try:
        written = write_test_metrics(exp.tensorboard_dir, config, number, params, metrics, epoch)
        if mirror is not None:
            mirror.push(str(written.relative_to(exp.root)))
    except Exception as exc:  # noqa: BLE001 - best.json has the metrics
        warnings.warn(f"the best trial's test metrics were not written to TensorBoard: {exc}", stacklevel=2)


def _has_test_split(config: ExperimentConfig, params: dict[str, Any]) -> bool:
    from .components import resolve_class
    from .evaluation import has_test_split

    test_fraction = params.get("data.test_fraction", config.data.init_args.get("test_fraction"))
    return has_test_split(resolve_class("model", config.model.class_path),
                          resolve_class("data", config.data.class_path), test_fraction)


def trained_with(config: ExperimentConfig, exp: ExperimentDir, number: int) -> ExperimentConfig:
    """The experiment's settings trial ``number`` last trained with (a resume may have
    changed some since, such as the precision): the best trial is evaluated, and described
    in best.json, as it was trained. The current settings for a trial that did not record
    them (one of a study begun before trials kept them)."""
    import json

    recorded = exp.trial_dir(trial_name(number)) / TRIAL_SETTINGS
    try:
        return ExperimentConfig.model_validate(json.loads(recorded.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return config


def _evaluation_failure(exc: Exception, exp: ExperimentDir) -> str:
    """One line for best.json and the console, naming the user's line that raised; the
    full traceback goes to ``evaluation-error.txt`` in the experiment directory."""
    import traceback

    from .components import raised_at

    cause = getattr(exc, "cause", None)  # a Ray task's error (the evaluation on a GPU node) wraps it
    error = cause if isinstance(cause, Exception) else exc
    saved = exp.root / EVALUATION_ERROR
    saved.write_text("".join(traceback.format_exception(exc)), encoding="utf-8")
    where = raised_at(error)
    return (f"{type(error).__name__}: {own_line(error)[:240]}{f' (at {where})' if where else ''}; "
            f"traceback: {saved}")


def sampled_params(config: ExperimentConfig, exp: ExperimentDir, number: int) -> dict[str, Any]:
    """Trial ``number``'s values exactly as sampled, from the Optuna study. trials.csv
    shows them for reading (floats to 6 digits, None as an empty cell, the string "007"
    as a number) and cannot give them back: the test evaluation rebuilt the best model
    with what it read there, which failed for a None or a numeric-looking string."""
    from .searcher import open_study

    return dict(open_study(exp.root, config.name, config.mode).trials[number].params)


def resolved_config(config: ExperimentConfig, params: dict[str, Any],
                    row: dict[str, Any] | None = None) -> dict[str, Any]:
    """The experiment with the sampled values merged in: what the best trial actually ran,
    with the loader workers and pinned memory it had where ``row`` (its trials.csv row)
    recorded them: "auto" left a retraining by README's recipe to guess, and another
    worker count draws other seeds (audit 80)."""
    resolved = config.model_dump(mode="json", exclude={"space", "search", "storage"})
    for section in ("model", "data"):
        resolved[section]["init_args"].update(config.params_for(section, params))
    resolved["trainer"] = config.with_trainer_params(params).model_dump(mode="json")
    for setting in ("num_workers", "pin_memory"):
        used = (row or {}).get(setting)
        if used not in (None, ""):
            resolved["loader"][setting] = int(used) if setting == "num_workers" else str(used) == "True"
    return resolved


def trained_seed(row: dict[str, Any]) -> int | None:
    """The seed a trial trained with, as trials.csv records it (a resume that changed
    ``search.seed`` left the trials started before with their own); None if unseeded."""
    seed = row.get("seed")
    return None if seed in (None, "") else int(seed)


def evaluation_needs_ray(config: ExperimentConfig) -> bool:
    """Whether the test evaluation runs as a Ray task: where one rank of a trial has a GPU.
    One rank's resources: a distributed trial's GPUs may be given per worker alone, and its
    evaluation then ran on the driver's CPU; and a resume that ran only the evaluation
    started no Ray for it, and Ray's task started a default one of its own."""
    return config.resources.worker_gpus > 0


def evaluate_on_cluster(config: ExperimentConfig, params: dict[str, Any], checkpoint: str,
                        mirror: Mirror | None = None, seed: int | None = None) -> dict[str, float]:
    """The test evaluation: in the driver for CPU trials (it has torch loaded already, and a
    new worker process would cost seconds), as a Ray task with a trial's GPUs otherwise
    (which fetches the checkpoint from URI storage if its node lacks it). ``seed``: the
    trial's training seed (``evaluate_checkpoint``)."""
    from .evaluation import evaluate_checkpoint

    if not evaluation_needs_ray(config):
        return evaluate_checkpoint(config.model_dump(mode="json"), params, checkpoint, seed=seed)
    import ray

    task = ray.remote(num_cpus=config.resources.worker_cpus, num_gpus=config.resources.worker_gpus)(
        evaluate_checkpoint
    )
    return ray.get(task.remote(config.model_dump(mode="json"), params, checkpoint,
                               mirror.uri if mirror is not None else None, seed))
