"""The preflight: two training steps, one validation batch and one test batch in the
driver, before Ray starts.

It builds the DataModule and model exactly as a trial would (with a representative
value of every searched parameter) and runs them on the CPU through a Trainer with the
trial's own training settings and a logger, as a trial's Trainer has: two training
steps (a second step is where a per-step scheduler first acts), one validation batch,
and, when the classes have a test split, one test batch (the final evaluation's). Then
it builds each class again with every other choice and both ends of every range of its
parameters. A constructor that raises, data that cannot load, a step that fails, a
Trainer setting the model cannot train with, a metric the model never logs, or a value
the search can sample that a constructor refuses is then a config error reported in
seconds, with no experiment directory created.
"""

from __future__ import annotations

import re
import tempfile
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from .checkpoint_callbacks import ModelCheckpointsInTrialDir
from .components import build_datamodule, build_model, innermost_user_frame, raised_at, raised_by
from .config import CategoricalParam, ExperimentConfig, FloatParam, IntParam
from .devices import loader_options, resolve_precision, training_loaders
from .errors import NO_TRAINING_BATCH, ConfigError, warn_user
from .lightning_trainer import ctrl_c_interrupts, lightning_quieted
from .space import sampled_only, with_value


# The most the preflight spends building classes with the other values of the space.
OTHER_VALUES_BUDGET_S = 5.0


def representative_params(config: ExperimentConfig) -> dict[str, Any]:
    """A valid value for every searched parameter: the middle of its range, the first choice
    (for the conditional ones too; ``sampled_only`` keeps those a trial would sample)."""
    values: dict[str, Any] = {}
    for key, param in config.space.items():
        if isinstance(param, CategoricalParam):
            values[key] = param.choices[0]
        elif isinstance(param, IntParam):
            values[key] = param.low
        elif isinstance(param, FloatParam):
            values[key] = (param.low * param.high) ** 0.5 if param.log else param.low
    return values


def preflight_params(config: ExperimentConfig) -> dict[str, Any]:
    """The searched values the preflight's classes are built with: the representative ones
    a trial with them would sample."""
    return sampled_only(config, representative_params(config))


def names_a_batch_size(argument: str) -> bool:
    """Whether a data argument (``batch_size``, ``data.eval_batch_size``) is named for a
    batch size: one that changes how the data is batched, not which data it is."""
    return "batch" in argument


def _preflight_loader(config: ExperimentConfig) -> dict[str, Any]:
    """The trials' own loader options, with no loader processes to start for a few batches."""
    return loader_options(config.loader.model_copy(update={"num_workers": 0, "pin_memory": False}),
                          config.resources, on_gpu=False)


def trained_with(config: ExperimentConfig) -> str:
    """The searched values the preflight trains with, as its errors show them
    (`` with the searched values model.lr=0.00316228, ...``; empty with none searched)."""
    return _searched(config, preflight_params(config))


def run_preflight(config: ExperimentConfig, model_class: type, data_class: type,
                  on_data: Callable[[Any], None] | None = None) -> list[str]:
    """Train one step and validate one batch; return the metrics the model logged at
    validation. Raises ``ConfigError``. Seeded as the study's trial 0 is (its weights, its
    shuffled batches; seed 0's trial 0 for a study without a seed, whose trials are
    unseeded), so that ``check`` and ``run`` train the same batches: unseeded, a bad
    file the training split holds was met by one ``check`` in six (audit 48). The caller's
    generators are left as they were (a Python session's, a notebook's). ``on_data``: given
    the DataModule once it has trained (set up), for what the study keeps of it."""
    from .seeding import seeded_as_its_trial, training_seed

    with seeded_as_its_trial(training_seed(0 if config.search.seed is None else config.search.seed, 0)):
        return _preflight(config, model_class, data_class, on_data)


def data_classes_from_constructor(config: ExperimentConfig, data_class: type) -> list[str] | None:
    """The DataModule's class names as its constructor gives them, for a session whose
    preflight is off: the study's check of them was skipped, and a renamed class folder
    shifted every label again (audit 72). Names set only in ``setup`` are not seen; a
    constructor that fails is left to the trials. The caller's generators are kept."""
    from .data_classes import classes_of
    from .seeding import seeded_as_its_trial

    loader, values = _preflight_loader(config), preflight_params(config)
    with seeded_as_its_trial(None):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return classes_of(build_datamodule(config, data_class, values, loader))
        except Exception:  # noqa: BLE001 - the trials will say it
            return None


def _preflight(config: ExperimentConfig, model_class: type, data_class: type,
               on_data: Callable[[Any], None] | None) -> list[str]:
    values = representative_params(config)
    params = sampled_only(config, values)
    loader = _preflight_loader(config)
    data_built = f"{data_class.__name__}(...{_searched(config, params, 'data')})"
    try:
        with _warnings_naming(data_built):
            datamodule = build_datamodule(config, data_class, params, loader)
    except Exception as exc:
        raise ConfigError([config.problem(_argument_named(config, "data", exc, params),
                                          f"{data_built} raised {type(exc).__name__}: {exc}{_at(exc)}")]) from None
    model_built = f"{model_class.__name__}(...{_searched(config, params, 'model')})"
    try:
        with _warnings_naming(model_built):
            model = build_model(config, model_class, params, datamodule)
    except Exception as exc:
        raise ConfigError([config.problem(_argument_named(config, "model", exc, params),
                                          f"{model_built} raised {type(exc).__name__}: {exc}{_at(exc)}")]) from None
    with lightning_quieted():  # the driver may be the user's own Python session
        seen = _a_few_batches(config, params, model, datamodule, model_class, data_class)
        logged = seen.logged
        if on_data is not None:
            on_data(datamodule)
        for precision in _other_searched_precisions(config, params):
            variant = with_value(config, values, "trainer.precision", precision)
            pair = _classes_for(config, variant, params, datamodule, model_class, data_class, loader)
            if pair is not None:  # else a class refuses these values, which the builds below report
                _a_few_batches(config, variant, *pair, model_class, data_class, blame="space.trainer.precision")
        if config.metric not in logged:
            raise ConfigError([config.problem(
                "metric",
                f"{config.metric!r} is not logged at the first validation (every trial reports it at each one); "
                f"{model_class.__name__} logs there: "
                f"{', '.join(logged) or 'nothing'}"
                + (f" ({config.metric!r} only in training, whose value validation would not change)"
                   if config.metric in seen.in_training else "")
                + (f" ({config.metric!r} at each validation batch only, logged with on_step=True and "
                   f"on_epoch=False: log it with on_epoch=True, Lightning's default in validation, for the "
                   f"epoch's value)" if config.metric in seen.at_steps_only else ""),
            )])
        # after: its builds draw random numbers
        _limits_at_the_largest_batch_sizes(config, values, data_class, loader, seen.may_drop_batches)
        problems = _manual_optimization_problems(config, model_class, model)
        problems += _values_the_classes_refuse(config, model_class, data_class, values, model, datamodule, loader)
        if problems and config.resources.worker_gpus > 0 and not _driver_has_gpu():
            # The builds ran here, on a driver without a GPU (a laptop, a CPU head node), for
            # trials that will have one: a value may need the GPU, so this is not proof.
            for problem in problems:
                warn_user(f"{problem} (built on this driver, which has no GPU; the trials have one, "
                          "so its trials will tell)")
        elif problems:
            raise ConfigError(problems)
        return logged


def _classes_for(config: ExperimentConfig, variant: dict[str, Any], params: dict[str, Any], datamodule,
                 model_class: type, data_class: type, loader: dict[str, Any]):
    """The (model, DataModule) to train ``variant`` with: a model built for it, never one
    trained before (a ``64-true`` or ``bf16-true`` precision converts the model it trains in
    place, and the next precision trained a model of doubles: audit 50), and the DataModule
    built for ``params`` unless a condition made the variant's data values differ (a
    conditional precision trained the classes built for the first choices; audit 41).
    None if a class refuses the variant's values."""
    try:
        data = datamodule if config.params_for("data", variant) == config.params_for("data", params) else \
            build_datamodule(config, data_class, variant, loader)
        return build_model(config, model_class, variant, data), data
    except Exception:  # noqa: BLE001 - reported by _values_the_classes_refuse
        return None


def _argument_named(config: ExperimentConfig, section: str, exc: Exception, params: dict[str, Any]) -> str:
    """The argument a constructor's error names in quotes (e.g. a class taking ``**kwargs``
    that passes on a misspelt 'hiden'), or else names with its value, as the field at
    fault, searched or set; else the section's ``init_args``."""
    searched = list(config.params_for(section, config.space))
    for name in [*searched, *getattr(config, section).init_args]:
        if f"'{name}'" in str(exc):
            return f"space.{section}.{name}" if name in searched else f"{section}.init_args.{name}"
    mentioned = _arguments_mentioned(config, exc, params, sections=(section,))
    return mentioned[0] if len(mentioned) == 1 else f"{section}.init_args"


def _arguments_mentioned(config: ExperimentConfig, exc: Exception, params: dict[str, Any],
                         sections: tuple[str, ...] = ("model", "data")) -> list[str]:
    """The fields an error's message names together with their value, as a refused value
    is named ("Invalid weight_decay value: -0.0001", the optimizer's; "got
    batch_size=16.0", Lightning's): an ``init_args`` value, or a searched one as sampled
    (``params``). Both must appear: a name alone (say 'channels' in a shape error) may not
    be at fault. A whole number counts as a number of its own, outside a shape's list:
    "channels" and an 8 in "input[1, 64, 8, 8]" blamed ``channels: 8`` for tensors missing
    a dimension (audit 71), and an 8 inside 128 counted too."""
    message, fields = str(exc), []
    outside_shapes = _SHAPE.sub(" ", message)
    for section in sections:
        searched = config.params_for(section, params)
        given = {**getattr(config, section).init_args, **searched}
        for name, value in given.items():
            if not isinstance(value, (int, float, str)) or not re.search(rf"\b{re.escape(name)}\b", message):
                continue
            if isinstance(value, int) and not isinstance(value, bool):
                quoted = re.search(rf"(?<![\w.-]){value}(?!\w|\.\d)", outside_shapes)
            else:
                quoted = str(value) in message
            if quoted:
                fields.append(f"space.{section}.{name}" if name in searched else f"{section}.init_args.{name}")
    return fields


# A list of whole numbers in brackets, as shapes and sizes are printed: [1, 64, 8, 8], (8, 8)
_SHAPE = re.compile(r"[\[(]\s*-?\d+(?:\s*,\s*-?\d+)+\s*,?\s*[\])]")


def _driver_has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def preflight_precision(config: ExperimentConfig, precision: str) -> str:
    """The precision the preflight trains in: the trials' own when they run on CPU, as the
    preflight does (a training step that fails only in bf16 passed it, then failed every
    trial); 32-true for GPU trials, which a CPU cannot stand in for (float16 autocast is
    for GPUs, and some operations have no bf16 kernel on CPU)."""
    return resolve_precision(precision, on_gpu=False) if config.resources.worker_gpus == 0 else "32-true"


def _other_searched_precisions(config: ExperimentConfig, params: dict[str, Any]) -> list[str]:
    """A searched precision's other choices that CPU trials would train in otherwise than
    the one already tried."""
    param = config.space.get("trainer.precision")
    if not isinstance(param, CategoricalParam):
        return []
    tried = {preflight_precision(config, str(params.get("trainer.precision", config.trainer.precision)))}
    others = []
    for choice in map(str, param.choices):
        trains_in = preflight_precision(config, choice)
        if trains_in not in tried:
            tried.add(trains_in)
            others.append(choice)
    return others


def _a_few_batches(config: ExperimentConfig, params: dict[str, Any], model, datamodule,
                   model_class: type, data_class: type, blame: str | None = None) -> Any:
    """Two training steps and one validation batch in one ``fit`` (the DataModule is set
    up once), then one test batch if there is a test split, in the trials' precision (see
    ``preflight_precision``). A training_step, loader, configure_optimizers, scheduler or
    test_step that raises would otherwise fail every trial, each try after Ray started
    (or, for test_step, the search's final evaluation). Returns what the batches showed:
    the metrics logged by validation's end (``logged``), those logged only in training
    (``in_training``), those logged at steps only (``at_steps_only``: not an epoch's value),
    and whether a larger batch size could leave the training loader none
    (``may_drop_batches``). ``blame``: the field a failure is put on (by default, the one the
    error points to)."""
    import pytorch_lightning as pl
    import torch
    from pytorch_lightning.loggers import TensorBoardLogger

    from .evaluation import has_test_split, test_with_fewest_gradients
    from .reporting import logged_since

    class Watch(pl.Callback):
        """Which phase runs, and what was logged by validation's end (where a trial's
        reporter looks for the metric)."""

        def __init__(self) -> None:
            self.phase, self.logged, self.in_training, self.at_steps_only = \
                "the set-up before the first batch", [], [], []
            self.before_validation: dict = {}
            self.batches: dict = {}  # the trials' loaders' lengths, by the limit setting that cuts them
            self.trained = 0  # training batches run
            self.loader_workers = self.most_loader_workers = 0  # of the training DataLoaders: all, one's most
            self.iterable, self.train_dataset = False, None
            self.may_drop_batches = True
            self.test_in_inference_mode = True  # see test_with_fewest_gradients

        def on_train_start(self, trainer, pl_module) -> None:
            self.batches["limit_train_batches"] = _length(trainer.train_dataloader)
            loaders = training_loaders(trainer.train_dataloader)
            self.loader_workers = sum(int(loader.num_workers) for loader in loaders)  # processes beside training
            self.most_loader_workers = max((int(loader.num_workers) for loader in loaders), default=0)
            self.train_dataset = getattr(trainer.train_dataloader, "dataset", None)
            self.iterable = isinstance(self.train_dataset, torch.utils.data.IterableDataset)
            self.may_drop_batches = _may_drop_batches(trainer.train_dataloader)

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.phase = f"training batch {batch_idx + 1}"

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.trained += 1
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if batch_idx == 0 and isinstance(loss, torch.Tensor) and loss.numel() == 1 \
                    and not bool(torch.isfinite(loss.detach())):
                # on the initial weights, before any step: no learning rate made it (every
                # trial failed on it at its first check, named by its loss only; audit 71)
                raise ValueError(f"its loss is {float(loss)} on the model's initial weights: the batch holds NaN or "
                                 f"infinite values, or the model's forward makes them (a log of 0, a division by 0)")
            if batch_idx + 1 >= trainer.num_training_batches:  # Lightning sets validation up next
                self.phase = "the validation's set-up (val_dataloader, validation_step's arguments)"

        def on_validation_start(self, trainer, pl_module) -> None:
            self.phase = "one validation batch"
            self.batches["limit_val_batches"] = _length(trainer.val_dataloaders)
            self.before_validation = dict(trainer.callback_metrics)

        def on_validation_end(self, trainer, pl_module) -> None:
            self.logged = sorted(logged_since(trainer, self.before_validation))
            self.in_training = sorted(set(trainer.callback_metrics) - set(self.logged))
            # logged with on_step=True only: at each batch to the logger, never as the epoch's value
            self.at_steps_only = sorted(set(trainer.logged_metrics) - set(trainer.callback_metrics))
            self.phase = "the epoch's end, after validation (LR schedulers, epoch-end hooks)"

        def on_test_start(self, trainer, pl_module) -> None:
            self.phase = "one test batch (the best trial's final evaluation runs test_step)"

    watch, settings = Watch(), config.with_trainer_params(params)
    precision = preflight_precision(config, settings.precision)
    with tempfile.TemporaryDirectory(prefix="hpsearch-preflight-") as scratch, warnings.catch_warnings():
        # the model's own ModelCheckpoint writes in the scratch folder, as a trial's in its own
        own_checkpoints = ModelCheckpointsInTrialDir(Path(scratch) / "model_checkpoints")
        warnings.simplefilter("ignore")
        # A logger, as trials have: with one, Lightning also merges and logs the model's
        # and the DataModule's saved hyperparameters, and refuses a clash between them.
        trainer = pl.Trainer(accelerator="cpu", devices=1, enable_checkpointing=False, precision=precision,
                             logger=TensorBoardLogger(scratch, name="", version="", default_hp_metric=False),
                             enable_progress_bar=False, enable_model_summary=False, max_epochs=1,
                             limit_train_batches=2, limit_val_batches=1, limit_test_batches=1, num_sanity_val_steps=0,
                             gradient_clip_val=settings.gradient_clip_val,
                             accumulate_grad_batches=settings.accumulate_grad_batches,
                             callbacks=[watch, own_checkpoints], default_root_dir=scratch)
        try:
            with ctrl_c_interrupts():
                trainer.fit(model, datamodule=datamodule)
                if has_test_split(model, datamodule):
                    watch.phase = "the test split's set-up (setup('test'), test_dataloader)"
                    _, watch.test_in_inference_mode = test_with_fewest_gradients(trainer, model, datamodule,
                                                                                  verbose=False)
        except Exception as exc:
            in_precision = f" (in {precision} precision, the trials')" if precision != "32-true" else ""
            field = blame or _field_at_fault(config, exc, params, model_class, data_class)
            # The values it trained with, as a constructor's error shows them: a class at fault
            # may have been given a bad value of the space (channels 0, audit 36).
            searched = "" if field.startswith("space.") else _searched(config, params)
            raise ConfigError([config.problem(field, f"{watch.phase} failed{in_precision}: {type(exc).__name__}: "
                                                     f"{exc}{_relative_path_note(exc)}{_label_note(exc)}{_at(exc)}"
                                                     f"{'; it ran' + searched if searched else ''}")]) from None
    if not watch.test_in_inference_mode:
        warn_user(f"{model_class.__name__}'s test_step makes gradients, which torch.inference_mode refuses: the best "
                  f"trial's test evaluation runs it under torch.no_grad() instead")
    for named in own_checkpoints.moved:
        warn_user(f"{model_class.__name__}'s ModelCheckpoint names dirpath={named}, into which every trial would "
                  f"write files of the same names, over each other's: each trial's go in its own "
                  f"trials/trial_NNNN/model_checkpoints/{Path(own_checkpoints.moved[named]).name}/ instead")
    if watch.trained == 0:  # no validation ran either: the metric was blamed (audit 77)
        raise ConfigError([config.problem(blame or _batch_size_field(config),
                                          f"the training DataLoader gave no batch{_searched(config, params)}: "
                                          f"{NO_TRAINING_BATCH}")])
    _limits_leave_batches(config, settings, params, watch.batches)
    if blame is None:  # the preflight's own values, once
        _warn_of_loader_workers_of_its_own(config, data_class, watch.loader_workers)
        if watch.iterable:
            _warn_of_an_iterable_read_by_every_worker(config, data_class, watch.train_dataset,
                                                      watch.most_loader_workers)
    return watch


def _warn_of_loader_workers_of_its_own(config: ExperimentConfig, data_class: type, workers: int) -> None:
    """The preflight gives the DataModule no loader workers (``num_workers=0``): any its
    training DataLoader starts are its own choice, which hpsearch's ``loader`` does not size
    to the trial. More than the CPUs a trial worker holds share them with training, unseen
    (audit 45; a number given in init_args or searched is warned of by ``loader_setting_warnings``)."""
    cpus = config.resources.worker_cpus
    given = "num_workers" in config.data.init_args or "data.num_workers" in config.space
    if workers > cpus and not given:
        warn_user(f"{data_class.__name__}'s training DataLoader starts {workers} loader processes of its own, which "
                  f"share the {cpus:g} CPU(s) each trial worker holds with its training: pass a num_workers argument "
                  f"of its constructor to its DataLoaders, and hpsearch sizes it to the trial (loader.num_workers)")


def _warn_of_an_iterable_read_by_every_worker(config: ExperimentConfig, data_class: type, dataset: Any,
                                              own_workers: int) -> None:
    """Each loader worker reads the whole of an IterableDataset that does not shard itself
    by ``get_worker_info()``: hpsearch gives the DataModule the trial's worker count, and a
    DataModule right at its own default of none then held every item once per worker in an
    epoch, unwarned (audit 77). The most workers any trial can give it (a searched count's
    largest: audit 79); none said for a dataset seen to shard itself."""
    from .components import Signature
    from .devices import datamodule_worker_counts

    own_counts = datamodule_worker_counts(config.data.init_args, config.space)
    if own_counts:
        given = max(own_counts.values())
    elif "num_workers" in Signature.of(data_class).names:
        given = loader_options(config.loader, config.resources, on_gpu=config.resources.worker_gpus > 0)["num_workers"]
    else:
        given = 0
    workers = max(own_workers, given)
    if workers > 1 and not _shards_itself(dataset):
        warn_user(f"{data_class.__name__}'s training data is an IterableDataset, and a trial's DataLoader can read it "
                  f"with {workers} loader processes: each reads all of it unless the dataset shards itself by "
                  f"torch.utils.data.get_worker_info(), and an epoch then holds every item {workers} times; shard "
                  f"it so, or give the DataModule 1 loader worker (loader.num_workers: 1)")


def _shards_itself(dataset: Any, items: int = 2) -> bool:
    """Whether an IterableDataset gives two loader workers other items: its first ``items``
    as worker 0 of 2 and as worker 1 of 2, told by torch's ``get_worker_info()``. A dataset
    that shards itself correctly was warned of as one that does not (audit 79); one that
    cannot be so asked (its items do not pickle, its iteration fails here) is taken as not."""
    import itertools
    import pickle

    from torch.utils.data._utils import worker

    def first_items(worker_id: int) -> list[bytes]:
        worker._worker_info = worker.WorkerInfo(id=worker_id, num_workers=2, seed=0, dataset=dataset)
        try:
            return [pickle.dumps(item) for item in itertools.islice(iter(dataset), items)]
        finally:
            worker._worker_info = None

    try:
        return first_items(0) != first_items(1)
    except Exception:  # noqa: BLE001 - the warning stands
        return False


def _may_drop_batches(loader: Any) -> bool:
    """Whether a larger batch size could leave this training loader no batch: one that
    drops a last short batch, or batches in a way of its own (a batch sampler of the
    user's, several loaders). torch's own batching without ``drop_last`` always gives one."""
    from torch.utils.data import BatchSampler, DataLoader

    if isinstance(loader, DataLoader) and type(loader.batch_sampler) is BatchSampler:
        return bool(loader.batch_sampler.drop_last)
    return True


def _length(loaders: Any) -> int | None:
    """How many batches a loader (or Lightning's list of them: the first) gives, if it says."""
    loader = loaders[0] if isinstance(loaders, (list, tuple)) and loaders else loaders
    try:
        return len(loader)
    except (TypeError, NotImplementedError):  # Lightning's ``has_len`` takes both as no length (audit 79)
        return None


def _limits_leave_batches(config: ExperimentConfig, settings, params: dict[str, Any],
                          batches: dict[str, int | None], at: str = "") -> None:
    """A fraction of the batches that leaves none (0.01 of 17) at these values: Lightning
    refuses it in a trial, and the preflight, which runs two batches of its own, had not
    tried it (audit 36). ``at``: the searched value that gives these batches, if not the
    values' own (``_limits_at_the_largest_batch_sizes``), where a searched limit's every
    edge is tried (its smallest, with the largest batch size: audit 73)."""
    for name, length in batches.items():
        limits = [getattr(settings, name)]
        param = config.space.get(f"trainer.{name}")
        if param is not None and (at or f"trainer.{name}" not in params):
            # conditional, and not sampled at these values: its range was never tried (audit 41)
            limits += param.edge_values()
        for limit in limits:
            if _is_fraction(limit) and (length is None or int(length * limit) == 0):
                break
        else:
            continue
        field = f"space.trainer.{name}" if f"trainer.{name}" in config.space else f"trainer.{name}"
        which = "training" if name == "limit_train_batches" else "validation"
        if length is None:  # the preflight trains two batches, by an int of its own (audit 77)
            raise ConfigError([config.problem(field, f"{limit:g} is a fraction of the {which} batches, and the "
                                                     f"{which} DataLoader has no length (an IterableDataset): "
                                                     f"Lightning refuses a fraction for it in a trial; give a "
                                                     f"whole number of batches (an int), or 1.0")])
        searched = at or _searched(config, params)
        larger = "" if at else " (more where a larger batch size gives fewer batches)"
        raise ConfigError([config.problem(field, f"{limit:g} of the {length} {which} batches"
                                                 f"{searched} is none, which Lightning refuses "
                                                 f"in a trial: give at least {1 / length:.3g}{larger}"
                                                 f", or a whole number of batches (an int)")])


def _batch_size_field(config: ExperimentConfig) -> str:
    """The field an empty training loader is put on: the data's batch size, searched or
    set, most often; else the DataModule."""
    def training(name: str) -> bool:  # not an evaluation's batch size, nor drop_last_batch (audit 79)
        return "batch_size" in name and not re.search(r"eval|val|test|predict", name)

    searched = sorted((key for key in config.space if key.startswith("data.") and training(key)),
                      key=lambda key: key != "data.batch_size")
    given = sorted((name for name in config.data.init_args if training(name)), key=lambda name: name != "batch_size")
    return f"space.{searched[0]}" if searched else f"data.init_args.{given[0]}" if given else "data.class_path"


def _is_fraction(limit: Any) -> bool:
    return isinstance(limit, float) and limit < 1.0


def _limits_at_the_largest_batch_sizes(config: ExperimentConfig, values: dict[str, Any], data_class: type,
                                       loader: dict[str, Any], may_drop_batches: bool = True) -> None:
    """``_limits_leave_batches`` at the largest value of each searched data argument named
    for a batch size, conditional ones too: the preflight trained at one, and a fraction
    that left batches at 32 left none at 256 (audit 69); and a training loader that gives
    no batch there (``drop_last`` with a batch larger than the split: audit 77). Measured
    as the DataModule, built and set up with it, gives its loaders (a fixed
    ``eval_batch_size``, a sampler that draws more samples than the data holds: audit 70);
    a DataModule that cannot be so asked is left to the trials. Built only where it can
    matter: a fraction of the batches is set or searched, or the training loader may drop
    batches (``may_drop_batches``); a DataModule whose setup takes seconds paid them again
    at every check (audit 79)."""
    limited = {name for name in ("limit_train_batches", "limit_val_batches")
               if _is_fraction(getattr(config.trainer, name)) or f"trainer.{name}" in config.space}
    if not limited and not may_drop_batches:
        return
    for key, param in config.space.items():
        if not key.startswith("data.") or not names_a_batch_size(key):
            continue
        largest = max((value for value in param.edge_values()
                       if isinstance(value, int) and not isinstance(value, bool)), default=None)
        if largest is None:
            continue
        variant = with_value(config, values, key, largest)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                datamodule = build_datamodule(config, data_class, variant, loader)
                datamodule.setup("fit")
                batches = {"limit_train_batches": _length(datamodule.train_dataloader()),
                           "limit_val_batches": _length(datamodule.val_dataloader())}
        except Exception:  # noqa: BLE001 - its loaders need a trainer, say: the trials will tell
            continue
        if batches["limit_train_batches"] == 0:  # every trial that samples it ended with no result (audit 77)
            # the data's other values it was built with: the preflight's (audit 79)
            others = ", ".join(f"{name}={_shown(value)}" for name, value in variant.items()
                               if name.startswith("data.") and name != key and name in config.space)
            raise ConfigError([config.problem(f"space.{key}", f"at {key}={largest} (the space's largest"
                                                              f"{f', with {others}' if others else ''}) the training "
                                                              f"DataLoader gives no batch: {NO_TRAINING_BATCH}")])
        _limits_leave_batches(config, config.with_trainer_params(variant), variant,
                              {name: length for name, length in batches.items() if name in limited},
                              at=f" at {key}={largest} (the space's largest)")


# Trainer settings Lightning refuses for a model that optimizes manually, and their "off" values.
NOT_FOR_MANUAL_OPTIMIZATION = {"gradient_clip_val": (None, 0, 0.0), "accumulate_grad_batches": (1,)}


def _manual_optimization_problems(config: ExperimentConfig, model_class: type, model) -> list:
    """A searched clipping or accumulation a model that optimizes manually cannot have:
    Lightning refuses it when the trial starts, so every trial that samples it would fail.
    The preflight's batches trained with one value of the range only."""
    if getattr(model, "automatic_optimization", True):
        return []
    problems = []
    for name, off in NOT_FOR_MANUAL_OPTIMIZATION.items():
        param = config.space.get(f"trainer.{name}")
        values = (param.choices if isinstance(param, CategoricalParam) else param.edge_values()) if param else []
        refused = [value for value in values if value not in off]
        if refused:
            instead = ("clip in training_step (self.clip_gradients)" if name == "gradient_clip_val"
                       else "accumulate in training_step")
            problems.append(config.problem(
                f"space.trainer.{name}", f"{refused[0]!r} can be sampled, and {model_class.__name__} optimizes "
                f"manually (automatic_optimization = False), for which Lightning refuses {name}; {instead} "
                "instead, or search only its off value"))
    return problems


def _field_at_fault(config: ExperimentConfig, exc: Exception, params: dict[str, Any], model_class: type,
                    data_class: type) -> str:
    """The trainer setting Lightning's error names (e.g. "Remove Trainer(gradient_clip_val=1.0)"
    for a model that optimizes manually); for a clash of the two classes' saved
    hyperparameters, the argument it names; else the class whose code raised (a
    DataModule's setup or loader raises here too)."""
    for name in type(config.trainer).model_fields:
        if f"{name}=" in str(exc):
            return f"space.trainer.{name}" if f"trainer.{name}" in config.space else f"trainer.{name}"
    if "merging hparams" in str(exc):
        for section in ("data", "model"):
            if (field := _argument_named(config, section, exc, params)) != f"{section}.init_args":
                return field
    if (class_count := _class_count_field(config, exc, params)) is not None:
        return class_count
    mentioned = _arguments_mentioned(config, exc, params)
    if len(mentioned) == 1:
        return mentioned[0]
    # A searched value and one set by hand, named together ("val_fraction (0.2) and
    # test_fraction (-0.1) must be in [0, 1)"): the one set by hand is every trial's,
    # where the searched one here is a value from inside its range. It had been blamed on
    # the searched one, which the user had not touched (audit 21).
    set_by_hand = [field for field in mentioned if not field.startswith("space.")]
    if len(set_by_hand) == 1:
        return set_by_hand[0]
    by_value = _searched_fractions_quoted(config, exc, params)
    if len(by_value) == 1:
        return by_value[0]
    at_fault = raised_by(exc, model_class, data_class) or (data_class if _raised_loading_a_batch(exc) else None)
    return "data.class_path" if at_fault is data_class else "model.class_path"


def _raised_loading_a_batch(exc: Exception) -> bool:
    """Raised inside torch's DataLoader (a Dataset's ``__getitem__``, a transform, a
    collate function; re-raised from a loader worker too): the data's fault, though the
    class that raised is a Dataset of the DataModule's, not the DataModule itself. An
    unreadable image was blamed on the model (audit 30)."""
    import traceback

    return any("/torch/utils/data/" in frame.filename.replace("\\", "/")
               for frame in traceback.extract_tb(exc.__traceback__))


def _searched_fractions_quoted(config: ExperimentConfig, exc: Exception, params: dict[str, Any]) -> list[str]:
    """The searched values with a fractional part that an error's message quotes without
    naming them: torch's optimizers say "Invalid learning rate: -0.1" of an ``lr``. Whole
    numbers are left out: they show up in shapes and sizes of any error."""
    message, fields = str(exc), []
    for section in ("model", "data"):
        for name, value in config.params_for(section, params).items():
            if isinstance(value, float) and not value.is_integer() \
                    and re.search(rf"(?<![\w.]){re.escape(str(value))}(?![\w.])", message):
                fields.append(f"space.{section}.{name}")
    return fields


def _at(exc: Exception) -> str:
    """Where in the user's code ``exc`` was raised, as trials say it: `` (at file:line in fn)``."""
    where = raised_at(exc)
    return f" (at {where})" if where else ""


# torch's cross_entropy and nll_loss for a label at or beyond the model's output size
_LABEL_OUT_OF_RANGE = re.compile(r"Target (-?\d+) is out of bounds")
_CLASS_COUNT = re.compile(r"(num_|n_)?(classes|labels)|num_outputs|output_size|out_features")


def _class_count_field(config: ExperimentConfig, exc: Exception, params: dict[str, Any]) -> str | None:
    """The model's class count, set or searched, for a label beyond it: the error names
    no argument, and ``num_classes: 5`` on 10-class data was blamed on ``model.class_path``."""
    found = _LABEL_OUT_OF_RANGE.search(str(exc))
    if found is None or int(found.group(1)) < 0:
        return None
    searched = config.params_for("model", params)
    for name in [*searched, *config.model.init_args]:
        if _CLASS_COUNT.fullmatch(name):
            return f"space.model.{name}" if name in searched else f"model.init_args.{name}"
    return None


def _label_note(exc: Exception) -> str:
    """For a label the loss cannot take: what it means in the user's terms."""
    found = _LABEL_OUT_OF_RANGE.search(str(exc))
    if found is None:
        return ""
    label = int(found.group(1))
    if label < 0:
        return f" (a batch holds the label {label}: class labels count from 0)"
    return (f" (a batch holds the label {label}, and the model's output has fewer classes: give the model as many "
            f"classes as the data holds, at least {label + 1})")


def _relative_path_note(exc: Exception) -> str:
    """For a file not found by a relative path: where that path was looked for."""
    import os

    name = getattr(exc, "filename", None)
    if isinstance(exc, FileNotFoundError) and isinstance(name, str) and not os.path.isabs(name):
        return f" (a relative path, looked for from the current directory {os.getcwd()})"
    return ""


def _searched(config: ExperimentConfig, params: dict[str, Any], section: str | None = None) -> str:
    """The searched values to show beside an error: the fault may lie in the space (a
    range's low end) rather than in init_args. A ``section``'s, by argument name, as its
    constructor got them (``, searched: lr=0.001, channels=0``); else all those a step ran
    with, by dotted key (`` with the searched values model.channels=0, data.batch_size=32``)."""
    given = config.params_for(section, params) if section else {k: v for k, v in params.items() if k in config.space}
    shown = ", ".join(f"{name}={_shown(value)}" for name, value in given.items())
    return "" if not shown else f", searched: {shown}" if section else f" with the searched values {shown}"


def _shown(value: Any) -> str:
    """A sampled value as the constructor got it: a float keeps its point (16.0, not 16,
    which a float-for-int error needs shown) and at most 6 significant digits."""
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.6g}"
    return repr(value)


def _values_the_classes_refuse(config: ExperimentConfig, model_class: type, data_class: type,
                               values: dict[str, Any], model, datamodule, loader: dict[str, Any]) -> list:
    """Each model and data parameter's other choices and range ends, one at a time, given
    to its class's constructor (a conditional parameter's with the values that make a
    trial sample it; ``values`` holds one for each parameter): a value the constructor
    refuses, or one that makes the model's and the DataModule's saved hyperparameters
    disagree (beside the other class as built above), would fail every trial that samples
    it. Then each of ``search.first_trials``, whose values are given to both classes as its
    trial will give them. Models are built on torch's meta device, so no weights are
    allocated (and on the CPU when that fails: some constructors need real tensors). A
    DataModule that loads its data in its constructor costs a load per value, so no build
    starts after ``OTHER_VALUES_BUDGET_S``, and a warning names the parameters left unchecked."""

    problems, unchecked = [], []
    deadline = time.perf_counter() + OTHER_VALUES_BUDGET_S
    params = sampled_only(config, values)
    classes = (model_class, data_class, model, datamodule, loader, deadline)
    for key, param in config.space.items():
        section = key.partition(".")[0]
        if section not in ("model", "data"):
            continue
        for value in param.edge_values():
            if key in params and repr(value) == repr(params[key]):
                continue  # built and validated above
            variant = with_value(config, values, key, value)
            conditions = ", ".join(f"{parent}={variant[parent]!r}" for parent in config.needed_to_sample(key))
            value_said = f"{value!r} (with {conditions})" if conditions else repr(value)
            refusal = _classes_refuse(config, (section,), variant, *classes,
                                      built_with=f"space.{key} = {value!r} (a value the search can sample)")
            if refusal is _OUT_OF_TIME:
                unchecked.append(f"space.{key}")
                break
            if refusal:
                problems.append(config.problem(f"space.{key}", f"{value_said} can be sampled, but {refusal}"))
    for index, point in enumerate(config.search.first_trials):
        refusal = _first_trial_refused(config, index, point, values, params, classes)
        if refusal is _OUT_OF_TIME:
            unchecked.append("search.first_trials")
            break
        if refusal:
            problems.append(config.problem(f"search.first_trials.{index}", f"its values are in the space, but "
                                                                           f"{refusal}"))
    if unchecked:
        warn_user(f"the preflight's {OTHER_VALUES_BUDGET_S:g} s for building the classes with other values ran out; "
                  f"not checked: some values of {', '.join(unchecked)} (their trials still will be)")
    return problems


_OUT_OF_TIME = "out of time"  # a refusal _classes_refuse could not judge: the preflight's budget was spent


def _first_trial_refused(config: ExperimentConfig, index: int, point: dict[str, Any], values: dict[str, Any],
                         params: dict[str, Any], classes: tuple) -> str | None:
    """Why a first trial would fail, the sentence's end after "but": its constructors refuse
    its values, the pair saves two values of one hyperparameter, or the preflight's batches
    fail (``_a_few_batches``: configure_optimizers, a scheduler, a step). None if it passes,
    ``_OUT_OF_TIME`` past the budget's deadline. A sampled value is tried at the range's
    ends only by its constructor; a first trial is certain to run, so it is trained too
    (audit 45: an optimizer's refusal), with its classes built once, for real (a DataModule
    that loads its data in its constructor loaded twice when they were built on the meta
    device first); its DataModule is the preflight's own where its data values are."""
    model_class, data_class, *_, deadline = classes
    trial_params = sampled_only(config, {**values, **point})
    # A model of its own, never one trained before (see _classes_for), after new data where
    # its data values differ: a model may take its shapes from the DataModule.
    data_differs = config.params_for("data", trial_params) != config.params_for("data", params)
    sections = ("data", "model") if data_differs else ("model",)
    pair = _built_pair(config, sections, trial_params, *classes, built_with=f"search.first_trials.{index}",
                       on_meta=False)
    if isinstance(pair, str):
        return pair
    if time.perf_counter() > deadline:
        return _OUT_OF_TIME
    try:
        _a_few_batches(config, trial_params, *pair, model_class, data_class, blame="search.first_trials")
    except ConfigError as exc:
        return "; ".join(problem.message for problem in exc.problems)
    return None


def _classes_refuse(config: ExperimentConfig, sections: tuple[str, ...], variant: dict[str, Any],
                    model_class: type, data_class: type, model, datamodule, loader: dict[str, Any], deadline: float,
                    built_with: str) -> str | None:
    """Why the classes of ``sections`` ('data' before 'model'), built again with the values
    of ``variant`` (a model on torch's meta device), would fail a trial; None if they would
    not, ``_OUT_OF_TIME`` if a build could not start before ``deadline``."""
    pair = _built_pair(config, sections, variant, model_class, data_class, model, datamodule, loader, deadline,
                       built_with=built_with, on_meta=True)
    return pair if isinstance(pair, str) else None


def _built_pair(config: ExperimentConfig, sections: tuple[str, ...], variant: dict[str, Any], model_class: type,
                data_class: type, model, datamodule, loader: dict[str, Any], deadline: float, built_with: str,
                on_meta: bool) -> tuple | str:
    """The (model, DataModule) pair with the classes of ``sections`` ('data' before
    'model') built again with the values of ``variant``; or why it would fail a trial, the
    sentence's end after "but": a constructor raises, or the pair saves two values of one
    hyperparameter. ``_OUT_OF_TIME`` if a build could not start before ``deadline``."""
    pair = (model, datamodule)
    for section in sections:
        if time.perf_counter() > deadline:
            return _OUT_OF_TIME
        try:
            with _warnings_naming(built_with):
                pair = _built_with(config, section, variant, *pair, model_class, data_class, loader, deadline,
                                   on_meta)
        except Exception as exc:
            name = (data_class if section == "data" else model_class).__name__
            return f"{name}(...) raised {type(exc).__name__}: {exc}"
        if pair is None:
            return _OUT_OF_TIME
    if clash := _hparams_clash(*pair):
        return (f"then {model_class.__name__} and {data_class.__name__} save different values of "
                f"{', '.join(clash)} in their hparams, which Lightning refuses as a trial starts (\"Error while "
                "merging hparams\")")
    return pair


def _built_with(config: ExperimentConfig, section: str, variant: dict[str, Any], model, datamodule,
                model_class: type, data_class: type, loader: dict[str, Any], deadline: float, on_meta: bool):
    """The (model, DataModule) pair with one class built again for ``variant``: a model
    on the CPU, or with ``on_meta`` on torch's meta device, and on the CPU when that fails
    and time is left (None if not)."""
    import torch

    if section == "data":
        return model, build_datamodule(config, data_class, variant, loader)
    if not on_meta:
        return build_model(config, model_class, variant, datamodule), datamodule
    try:
        with torch.device("meta"):
            return build_model(config, model_class, variant, datamodule), datamodule
    except Exception:
        if time.perf_counter() > deadline:
            return None
        return build_model(config, model_class, variant, datamodule), datamodule


@contextmanager
def _warnings_naming(built_with: str) -> Iterator[None]:
    """Warnings a class gives when the preflight builds it, said with the values it was
    built with: a bare "Initializing zero-element tensors is a no-op" did not say which
    value of the space (here ``hidden`` = 0) would give it to trials."""
    heard: list[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as heard:
            warnings.simplefilter("always")
            yield
    finally:
        for message in dict.fromkeys(str(warning.message) for warning in heard if not _a_librarys_deprecation(warning)):
            warn_user(f"{built_with}: {message}")


def _a_librarys_deprecation(warning: warnings.WarningMessage) -> bool:
    """A deprecation warned of inside torch, Lightning or Python, such as those of the parts
    of torch its first ``torch.compile`` imports: Python hides them by default, and no value
    of the space causes them (audit 63: "torch.jit.script_method is deprecated" was said
    of the value a model compiled with)."""
    return issubclass(warning.category, (DeprecationWarning, PendingDeprecationWarning)) and \
        innermost_user_frame([(warning.filename, warning.lineno, "")]) is None


def _hparams_clash(model, datamodule) -> list[str]:
    """The names both classes save (``save_hyperparameters``) with different values: with a
    logger, Lightning refuses such a pair when training starts. Its own test, made safe
    for tensors."""
    import torch

    if not (getattr(model, "_log_hyperparams", False) and getattr(datamodule, "_log_hyperparams", False)):
        return []
    ours, theirs = model.hparams_initial, datamodule.hparams_initial

    def differ(a, b) -> bool:
        if type(a) is not type(b) or isinstance(a, torch.Tensor):
            return type(a) is not type(b) or a is not b
        try:
            return bool(a != b)
        except Exception:  # noqa: BLE001 - a value with no plain comparison
            return True

    return sorted(k for k in ours.keys() & theirs.keys() if k != "_class_path" and differ(ours[k], theirs[k]))
