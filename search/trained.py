"""A finished trial's trained model, back in the user's Python session (``hpsearch.load_trial``).

After a search, what a user wants next is the best model itself: to predict with it, to
train it further, to export it. Its checkpoint alone does not give it back unless the
model saved its hyperparameters, and then only with the arguments the user passed and
not the ones hpsearch filled in (from the DataModule, the sampled values). So the model
is built here as its trial built it (``init_args``, the trial's sampled values, the
settings it trained with), and given the weights of its best checkpoint.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError, HpsearchError


@dataclass
class LoadedTrial:
    """A trial's model, with the weights of its best epoch and in eval mode, and the
    DataModule as the trial built it, set up for the test stage (as the study's test
    evaluation set it up)."""

    model: Any  # the LightningModule
    datamodule: Any  # the LightningDataModule
    trial: int
    params: dict[str, Any]  # its sampled values, exactly as sampled
    value: float | None  # its best value of the study's metric
    checkpoint: Path  # the best.ckpt its weights are from
    # what it ran in (trials.csv's precision, e.g. "bf16-mixed"): its values are of that
    # precision, and a Trainer of another gives others (audit 80); None if not recorded
    precision: str | None = None


def load_trial(experiment_dir: str | Path, trial: int | None = None, *, map_location: Any = "cpu") -> LoadedTrial:
    """Trial ``trial`` of the study (its best trial when None), loaded for use in this
    process. ``experiment_dir`` may be the study's URI; the checkpoint is fetched then. The
    user's classes are imported as ``run`` imports them (from the current directory): run
    it from where the search ran. Raises ``HpsearchError`` for a trial that has no
    checkpoint to load (not started, or its ``best.ckpt`` removed by ``keep_checkpoints``)."""
    if trial is not None:
        if isinstance(trial, bool) or not hasattr(type(trial), "__index__"):
            raise TypeError(f"trial is a trial's number, an int (got {trial!r})")
        trial = operator.index(trial)  # a NumPy integer too, as a pandas table of result.trials has (audit 51)
    from .seeding import generators_kept

    with generators_kept():  # the caller's generators as they were: the imports below move them too
        return _loaded(experiment_dir, trial, map_location)


def _loaded(experiment_dir: str | Path, trial: int | None, map_location: Any) -> LoadedTrial:
    from .checkpoints import BEST_CHECKPOINT, checkpoint_dir
    from .config_loading import load_config
    from .experiment import TRIAL_SETTINGS, trial_name
    from .results import trained_seed, trained_with
    from .searcher import existing_study
    from .storage import StudyHome, study_address
    from .trials_table import TrialsTable

    exp, mirror = StudyHome.existing(experiment_dir)
    config = load_config(exp.config_file, stored=True)
    table = TrialsTable.load(exp.trials_csv, config.metric, config.mode, list(config.space))
    row = table.best_row() if trial is None else table.rows.get(trial)
    study = study_address(exp.root)  # a URI study's errors named its working copy
    if row is None:
        raise HpsearchError(f"{study}: no trial has finished with a result yet" if trial is None else
                            f"{study} has no trial {trial} (its trials: {_numbers(table.rows)})")
    number = int(row["trial"])
    if mirror is not None:
        mirror.pull(f"trials/{trial_name(number)}/checkpoints/{BEST_CHECKPOINT}",
                    f"trials/{trial_name(number)}/{TRIAL_SETTINGS}")
    checkpoint = checkpoint_dir(exp.trial_dir(trial_name(number))) / BEST_CHECKPOINT
    shown = mirror.address_of(checkpoint) if mirror is not None else checkpoint
    _check_loadable(checkpoint, shown, number, row, config.search.keep_checkpoints)
    config = trained_with(config, exp, number)
    # read as a reader: a search may be running on the study, and its journal is its own
    # (repairing it here could cut the record that search is writing)
    params = dict(existing_study(exp.root, config.name, repair=False).trials[number].params)
    model, datamodule = _built_with_weights(config, params, checkpoint, map_location, exp, trained_seed(row))
    value = row.get("best")
    return LoadedTrial(model, datamodule, number, params, None if value in (None, "") else float(value), checkpoint,
                       row.get("precision") or None)


def _numbers(rows: dict[int, Any]) -> str:
    numbers = sorted(rows)
    return "none" if not numbers else f"{numbers[0]}-{numbers[-1]}" if len(numbers) > 1 else str(numbers[0])


def _check_loadable(checkpoint: Path, shown: str | Path, number: int, row: dict[str, Any], keep: int | None) -> None:
    """Why trial ``number`` has no checkpoint this can load, as an ``HpsearchError``
    naming it as ``shown`` (its address in cloud storage, for a study there)."""
    if checkpoint.is_dir():
        raise HpsearchError(f"trial {number}'s best checkpoint is a directory of DeepSpeed shards ({shown}): "
                            f"make one file of it with pytorch_lightning.utilities.deepspeed."
                            f"convert_zero_checkpoint_to_fp32_state_dict, and load its state_dict into the model")
    if checkpoint.is_file():
        return
    if not str(row.get("epochs") or "").strip() or row.get("epochs") in (0, "0"):
        raise HpsearchError(f"trial {number} has no checkpoint: it finished no epoch (state {row.get('state')})")
    removed = f" (search.keep_checkpoints is {keep}: the other ended trials' best.ckpt are removed)" if keep else ""
    raise HpsearchError(f"trial {number} has no best.ckpt any more{removed}: {shown}")


def _data_as_the_preflights(config, params: dict[str, Any]) -> bool:
    """Whether the trial's DataModule got the values the preflight's did, but a batch size
    (which changes no class): the study's class names are that DataModule's."""
    from .preflight import names_a_batch_size, preflight_params

    def data_values(values: dict[str, Any]) -> dict[str, Any]:
        return {name: value for name, value in config.params_for("data", values).items()
                if not names_a_batch_size(name)}

    return data_values(params) == data_values(preflight_params(config))


def _built_with_weights(config, params: dict[str, Any], checkpoint: Path, map_location: Any, exp,
                        seed: int | None):
    """The trial's DataModule, set up for the test stage, and its model holding the
    checkpoint's weights (and each class the state it saved there), in eval mode. Both are
    built, and the DataModule set up, from the trial's seed, as the study's test
    evaluation does (``seeded_as_its_trial``): a DataModule that splits with the global
    generator then gives the test split the evaluation scored. The model is made whole as
    Lightning's own loading makes it: ``configure_model`` (where a model may build its
    layers), then ``on_load_checkpoint``, then the weights. A model whose weights it still
    lacks builds (or compiles) them in ``setup``, which the evaluation's test loop runs
    first: it runs ``setup("test")`` too (it failed on the weights; audit 63)."""
    from .seeding import seeded_as_its_trial

    with seeded_as_its_trial(seed):  # all of it: imports and printing move the generators too
        import torch
        from pytorch_lightning import LightningModule
        from pytorch_lightning.utilities.model_helpers import is_overridden

        from .api import _naming_the_last_sessions_directory
        from .components import build_datamodule, build_model, check_components
        from .data_classes import changed_classes, classes_of
        from .devices import trial_device
        from .lightning_trainer import lightning_quieted

        try:
            model_class, data_class = check_components(config)
        except ConfigError as exc:  # a module of the user's that imports only where the search ran
            raise _naming_the_last_sessions_directory(exc, exp, "run it from there") from None
        device = trial_device(config.with_trainer_params(params), config.loader, config.resources)
        with lightning_quieted():
            datamodule = build_datamodule(config, data_class, params, device.loader_options)
            model = build_model(config, model_class, params, datamodule)
            datamodule.prepare_data()  # as Lightning's test loop begins
            datamodule.setup("test")
        # The study's names are its preflight's: a trial whose data values (but a batch size)
        # differ from those may have its own, a searched root say (one was refused; audit 72)
        changed = changed_classes(exp, classes_of(datamodule)) \
            if exp is not None and _data_as_the_preflights(config, params) else None
        if changed is not None:
            raise HpsearchError(f"{exp.root}: {changed}")
        state = torch.load(checkpoint, map_location=map_location, weights_only=False)
        if is_overridden("configure_model", model, LightningModule):
            model.configure_model()
        if is_overridden("setup", model, LightningModule) and not set(state["state_dict"]) <= set(model.state_dict()):
            with lightning_quieted():
                model.setup("test")
        model.on_load_checkpoint(state)
        model.load_state_dict(state["state_dict"])
        if type(datamodule).__qualname__ in state:
            datamodule.load_state_dict(state[type(datamodule).__qualname__])
    return model.eval(), datamodule
