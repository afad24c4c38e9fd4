"""The experiment file's schema: typed, self-validating, and strict about unknown keys.

This module checks everything that can be checked from the file alone. Checks that
need the user's classes (constructor arguments, import paths) live in
``hpsearch.search.components``; the metric is checked by the preflight.
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Annotated, Any, Literal, Union
from urllib.parse import urlsplit

from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, Strict, ValidationError,
                      field_validator, model_serializer, model_validator)

# A whole number, strictly: pydantic would take ``true`` as 1 and ``3.0`` as 3.
WholeNumber = Annotated[int, Strict()]
# A count: a whole number above 0.
PositiveInt = Annotated[int, Strict(), Field(gt=0)]
# A number, strictly: a whole number or a float, not a quoted '1' or a YAML yes (true),
# which pydantic would take as 1.0 (``gpus_per_trial: yes`` asked for a GPU).
Number = Annotated[float, Strict(), Field(allow_inf_nan=False)]
PositiveNumber = Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]
# Optuna's samplers take seeds numpy takes: 0 to 2**32 - 1.
Seed = Annotated[int, Strict(), Field(ge=0, le=2**32 - 1)]
# Optuna's grid sampler lists every point of the grid up front (itertools.product).
GRID_POINTS_LIMIT = 100_000
# pydantic writes (model_dump) at most about 250 levels of nesting, and experiment.yaml is
# written so after Ray has started: a value nested 300 deep passed the check (audit 38).
INIT_ARGS_NESTING_LIMIT = 100
# Ray's ASHA builds one rung per power of the reduction factor up to max_epochs / grace_period.
ASHA_RUNGS_LIMIT = 10_000

SEARCHABLE_SECTIONS = ("model", "data", "trainer")
# The command-line option whose values are read as YAML, as a key's origin (config_loading).
SET = "--set"
# Trainer settings that change how fast a trial runs, not what it learns: searching
# them would only add noise to the study.
NOT_SEARCHABLE = {
    "strategy": "the parallel strategy changes speed, not results; set trainer.strategy instead of searching it",
    "deepspeed_stage": "the ZeRO stage changes memory use, not results; set trainer.deepspeed_stage instead",
}
Scalar = Union[None, bool, int, float, str]
# URI schemes pyarrow.fs opens (see storage.py); "file" is a local or shared directory.
STORAGE_SCHEMES = ("s3", "gs", "gcs", "abfs", "abfss", "hdfs", "viewfs", "file")


class FieldValueError(ValueError):
    """A check across fields that blames one of them: ``field`` is dotted, relative to the
    model that raises it, so the error names it and its line (a plain ``ValueError`` in a
    model validator is located at the model itself)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class StrictModel(BaseModel):
    """Rejects unknown keys, so a typo is an error and not a silently ignored setting."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ComponentConfig(StrictModel):
    """A user class and the keyword arguments its constructor gets before sampling."""

    class_path: str = Field(min_length=1, description="built-in name or 'package.module:ClassName'")
    init_args: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _init_args_are_plain_values(self):
        """experiment.yaml keeps them, and resume reads them back: a lambda, a tensor or an
        object passed the check and broke the run after Ray had started, leaving a folder
        that was not a study (audit 36)."""
        for key, value in self.init_args.items():
            if (depth := _nesting(value)) > INIT_ARGS_NESTING_LIMIT:
                raise FieldValueError(f"init_args.{key}", f"nests {depth} levels deep: experiment.yaml, which resume "
                                      f"reads back, keeps at most {INIT_ARGS_NESTING_LIMIT}")
            odd = _first_unwritable(value)
            if odd is not None:
                kind = type(odd).__qualname__ if type(odd).__module__ == "builtins" else \
                    f"{type(odd).__module__}.{type(odd).__qualname__}"
                raise FieldValueError(f"init_args.{key}", f"a {kind} cannot "
                                      "be kept in experiment.yaml, which resume reads back: give plain values "
                                      "(null, true/false, numbers, strings, lists and mappings of them) and "
                                      "build objects in the class's constructor")
        return self

    @field_validator("class_path")
    @classmethod
    def _looks_like_a_path(cls, value: str) -> str:
        if ":" in value:
            module, _, attr = value.partition(":")
            if not module or not attr or not re.fullmatch(r"[A-Za-z_][\w.]*", module) \
                    or not re.fullmatch(r"[A-Za-z_][\w.]*", attr):
                raise ValueError(f"{value!r} is not of the form 'package.module:ClassName'")
        return value


def _nesting(value: Any) -> int:
    """How many lists and mappings deep ``value`` goes (0 for a plain value); counted
    without recursion, since the point is a value too deep for it."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, tuple, dict)):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _first_unwritable(value: Any) -> Any:
    """The first value in ``value`` that YAML cannot write back as it is, or None."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return None
    if isinstance(value, (list, tuple)):
        return next((odd for odd in map(_first_unwritable, value) if odd is not None), None)
    if isinstance(value, dict):
        return next((odd for odd in map(_first_unwritable, [*value, *value.values()]) if odd is not None), None)
    return value


def same_choice(value: Any, choice: Any) -> bool:
    """Whether ``value`` is ``choice``, as a condition compares a sampled value: equal and of
    one kind (a number with a number, but ``true`` is not 1, nor ``"1"`` 1)."""
    numbers = (int, float)
    if isinstance(value, bool) or isinstance(choice, bool) or not isinstance(value, numbers) \
            or not isinstance(choice, numbers):
        return type(value) is type(choice) and value == choice
    return value == choice


def condition_text(when: dict[str, list[Any]]) -> str:
    """A ``when`` as a person reads it, its values as YAML has them:
    ``model.optimizer=sgd|rmsprop and model.flag=true``."""
    def said(value: Any) -> str:
        return value if isinstance(value, str) else json.dumps(value)

    return " and ".join(f"{parent}={'|'.join(map(said, values))}" for parent, values in when.items())


class SearchedParam(StrictModel):
    """What every kind of parameter has: the condition under which it is sampled."""

    when: dict[str, list[Scalar]] | None = Field(
        None, description="sample this parameter only in trials where each categorical parameter named (listed "
                          "before it) has one of the values given; in the others its class keeps its own value")

    @field_validator("when", mode="before")
    @classmethod
    def _one_value_is_a_list_of_one(cls, when: Any) -> Any:
        if isinstance(when, dict):
            return {key: value if isinstance(value, list) else [value] for key, value in when.items()}
        return when

    @field_validator("when")
    @classmethod
    def _names_values(cls, when: dict[str, list[Scalar]] | None) -> dict[str, list[Scalar]] | None:
        if when is not None and not when:
            raise ValueError("is empty: name a categorical parameter and its values (when: {model.optimizer: sgd}), "
                             "or leave 'when' out")
        for key, values in (when or {}).items():
            if not values:
                raise ValueError(f"{key}: no value given; the parameter would never be sampled")
        return when

    @model_serializer(mode="wrap")
    def _when_only_if_set(self, handler):
        """experiment.yaml and a study's recorded settings hold ``when`` only where it is set:
        studies from before it existed compare equal, and unconditional parameters read as
        they always have."""
        dumped = handler(self)
        when = dumped.pop("when", None)
        return dumped if self.when is None else {**dumped, "when": when}


class FloatParam(SearchedParam):
    type: Literal["float"]
    low: Number
    high: Number
    log: bool = False
    step: PositiveNumber | None = None

    @model_validator(mode="after")
    def _check(self):
        _check_range(self.low, self.high, self.log)
        if self.log and self.step is not None:
            raise ValueError("'step' and 'log' cannot be combined (Optuna samples either on a grid or log-uniformly)")
        _check_step(self.low, self.high, self.step)
        return self

    def grid_points(self) -> int:
        """How many values a grid search visits (``step`` given)."""
        return math.floor((self.high - self.low) / self.step + 1e-9) + 1

    def edge_values(self) -> list[float]:
        """The lowest and highest values a sampler can give (on a grid, its last point)."""
        top = self.high if self.step is None else round(self.low + (self.grid_points() - 1) * self.step, 12)
        return [self.low] if top == self.low else [self.low, top]

    def refusal(self, value: Any) -> str | None:
        """Why a sampler could never give ``value`` (None if it could)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"a number is needed, not {_kind_of(value)}"
        return _outside_range(value, self.low, self.high, self.step)


class IntParam(SearchedParam):
    type: Literal["int"]
    low: WholeNumber
    high: WholeNumber
    log: bool = False
    step: PositiveInt = 1

    @model_validator(mode="after")
    def _check(self):
        _check_range(self.low, self.high, self.log)
        if self.log and self.step != 1:
            raise ValueError("'log: true' needs 'step: 1' for int parameters (Optuna's rule)")
        _check_step(self.low, self.high, self.step)
        return self

    def grid_points(self) -> int:
        return (self.high - self.low) // self.step + 1

    def edge_values(self) -> list[int]:
        """The lowest and highest values a sampler can give."""
        top = self.low + (self.grid_points() - 1) * self.step
        return [self.low] if top == self.low else [self.low, top]

    def refusal(self, value: Any) -> str | None:
        """Why a sampler could never give ``value`` (None if it could)."""
        if isinstance(value, bool) or not isinstance(value, int):
            return f"a whole number is needed, not {_kind_of(value)}"
        return _outside_range(value, self.low, self.high, self.step)


class CategoricalParam(SearchedParam):
    type: Literal["categorical"]
    choices: list[Scalar] = Field(min_length=1)

    @field_validator("choices", mode="before")
    @classmethod
    def _scalars(cls, choices: Any) -> Any:
        """One clear error for a list or mapping among the choices (pydantic gave one line
        per union member for each: eight lines for two list choices)."""
        if isinstance(choices, list):
            for index, choice in enumerate(choices):
                if not isinstance(choice, (type(None), bool, int, float, str)):
                    raise ValueError(
                        f"choice {index} ({choice!r}) is a {type(choice).__name__}: choices must be null, true/false, "
                        "numbers or strings (Optuna stores them as such). To search over lists or mappings, "
                        "give names as choices and map each name to its value in your class's constructor")
        return choices

    @field_validator("choices")
    @classmethod
    def _distinct(cls, choices: list[Scalar]) -> list[Scalar]:
        for index, later in enumerate(choices):
            for earlier in choices[:index]:
                if repr(earlier) == repr(later):
                    raise ValueError(f"choices must be distinct: {later!r} is given twice")
                if earlier == later:  # Optuna finds a sampled value's choice by ==
                    raise ValueError(
                        f"choices {earlier!r} and {later!r} are one choice to Optuna, which tells them apart by == "
                        "(in Python 0 == 0.0 and True == 1): keep one of them, or give names as choices")
        return choices

    def grid_points(self) -> int:
        return len(self.choices)

    def edge_values(self) -> list[Scalar]:
        """Every choice: any of them can be sampled."""
        return list(self.choices)

    def refusal(self, value: Any) -> str | None:
        """Why a sampler could never give ``value`` (None if it could)."""
        if any(same_choice(value, choice) for choice in self.choices):
            return None
        return f"{value!r} is not one of the choices {self.choices}{_yaml_boolean_hint(value, self.choices)}"


def _kind_of(value: Any) -> str:
    """``the string '0.01'`` (quoted in YAML, or a str from Python), ``true``, ``null``, ``64.0``."""
    if isinstance(value, str):
        return f"the string {value!r}"
    return json.dumps(value) if value is None or isinstance(value, bool) else repr(value)


def _yaml_boolean_hint(value: Any, choices: list[Scalar]) -> str:
    """For a boolean given where the choices are words: YAML 1.1 reads yes/no and on/off so."""
    if isinstance(value, bool) and any(isinstance(choice, str) for choice in choices):
        return " (YAML reads yes/no and on/off as booleans: quote the word)"
    return ""


def _log_spaced(low: int, high: int) -> list[int]:
    """Whole numbers from ``low`` to ``high`` a factor of 2 apart (a suggestion for a grid)."""
    values, value = [], max(low, 1)
    while value <= high and len(values) < 6:
        values.append(value)
        value *= 2
    return values


def _check_range(low: float, high: float, log: bool) -> None:
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError("low and high must be finite numbers")
    if low > high:
        raise ValueError(f"low ({low}) must be <= high ({high})")
    if log and low <= 0:
        raise ValueError(f"log: true needs low > 0 (got low={low})")


def _outside_range(value: float, low: float, high: float, step: float | None) -> str | None:
    """Why a range could never give ``value``: beyond its ends, or off its steps (Optuna's
    own test of a value against a distribution, to the same tolerance)."""
    if not math.isfinite(value) or not low <= value <= high:
        return f"{value!r} is outside the range [{low!r}, {high!r}]"
    if step is not None and abs((value - low) / step - round((value - low) / step)) >= 1e-8:
        return f"{value!r} is not low ({low!r}) plus whole steps of {step!r}"
    return None


def _check_step(low: float, high: float, step: float | None) -> None:
    if step is not None and high > low and step > high - low:
        raise ValueError(f"step ({step}) is larger than high - low ({high - low:g}): only low would ever be sampled")


Param = Annotated[Union[FloatParam, IntParam, CategoricalParam], Field(discriminator="type")]


class SearchConfig(StrictModel):
    num_trials: PositiveInt = 16
    max_concurrent: PositiveInt = 2
    sampler: Literal["tpe", "random", "cmaes", "gp", "grid"] = "tpe"
    seed: Seed | None = 0
    time_budget_s: PositiveNumber | None = None
    keep_checkpoints: PositiveInt | None = Field(
        None, description="ended trials that keep their best.ckpt: the best N by the metric (and the study's best); "
                          "null keeps every one's")
    preflight: bool = Field(True, description="run two training steps, one validation and one test batch in the "
                                              "driver before Ray starts (see preflight.py)")
    first_trials: list[dict[str, Scalar]] = Field(
        default_factory=list, description="values to try before the sampler picks (a configuration known to work, "
        "say), a trial each, counted in num_trials; a parameter a trial leaves out is sampled")

    @field_validator("first_trials", mode="before")
    @classmethod
    def _one_value_per_parameter(cls, points: Any) -> Any:
        """One clear error for a list or mapping given as a parameter's value (pydantic gave
        one line per kind of value it tried). ``null`` (a key whose items are all commented
        out) is none, as the README's table says."""
        if points is None:
            return []
        for index, point in enumerate(points if isinstance(points, list) else []):
            for key, value in (point.items() if isinstance(point, dict) else ()):
                if isinstance(value, dict) and value:  # {model: {lr: 0.001}}: its keys are the space's, dotted
                    example = next(iter(value))
                    raise FieldValueError(f"{index}.{key}", f"is a mapping: name each parameter by its whole "
                                                            f"dotted key, as the space does ({key}.{example}: ...)")
                if not isinstance(value, (type(None), bool, int, float, str)):
                    raise FieldValueError(f"{index}.{key}", f"is a {type(value).__name__}: a trial gives each "
                                                            "parameter one value (null, true/false, a number or a "
                                                            "string)")
        return points


class SchedulerConfig(StrictModel):
    type: Literal["asha", "none"] = "asha"
    max_epochs: PositiveInt = 20
    grace_period: PositiveInt = 1
    reduction_factor: Number = Field(3, gt=1)

    @property
    def rung_epochs(self) -> list[int]:
        """The epochs at which ASHA may stop a trial: the milestones of Ray's one ASHA
        bracket, short of ``max_epochs``, where every trial ends anyway. Ray decides at the
        first report at or past a milestone, so one that is not a whole epoch (6.25, with a
        reduction factor of 2.5) is decided at the next whole epoch."""
        if self.type != "asha":
            return []
        count = int(math.log(self.max_epochs / self.grace_period) / math.log(self.reduction_factor) + 1)
        milestones = {math.ceil(self.grace_period * self.reduction_factor ** k) for k in range(count)}
        return sorted(m for m in milestones if m < self.max_epochs)

    @model_validator(mode="after")
    def _grace_within_budget(self):
        if self.grace_period > self.max_epochs:
            raise FieldValueError("grace_period", f"grace_period ({self.grace_period}) must be <= max_epochs "
                                  f"({self.max_epochs})")
        if self.type == "asha" and self.max_epochs > self.grace_period:
            # Ray's ASHA builds every rung when the scheduler is made: 1.000001 took 3 s and 670 MB.
            rungs = math.log(self.max_epochs / self.grace_period) / math.log(self.reduction_factor)
            if rungs > ASHA_RUNGS_LIMIT:
                lowest = (self.max_epochs / self.grace_period) ** (1 / ASHA_RUNGS_LIMIT)
                raise FieldValueError("reduction_factor", f"{self.reduction_factor} makes Ray's ASHA build "
                                      f"{int(rungs):,} rungs (one per power of it up to max_epochs / grace_period),"
                                      f" at most {ASHA_RUNGS_LIMIT:,}: give at least {math.ceil(lowest * 1e4) / 1e4:g}"
                                      f" (ASHA keeps about 1 in reduction_factor trials at each rung; 2 to 4 is usual)")
        return self


class TrainerConfig(StrictModel):
    """The Lightning ``Trainer`` settings hpsearch exposes; every one may be searched."""

    precision: Literal["auto", "32-true", "16-mixed", "bf16-mixed", "bf16-true", "64-true"] = Field(
        "auto", description="'auto': mixed precision on a GPU (bf16-mixed, or 16-mixed where it lacks bf16), "
                            "32-true on a CPU")
    strategy: Literal["auto", "ddp", "fsdp", "deepspeed"] = Field(
        "auto", description="'auto': one process, or DDP when resources.workers_per_trial > 1")
    deepspeed_stage: Literal[2, 3] = 2
    early_stopping_patience: PositiveInt | None = 10
    early_stopping_min_delta: Number = Field(0.0, ge=0)
    gradient_clip_val: Number | None = Field(None, ge=0)
    accumulate_grad_batches: PositiveInt = 1
    limit_train_batches: PositiveNumber | PositiveInt = 1.0
    limit_val_batches: PositiveNumber | PositiveInt = 1.0
    deterministic: bool = False

    @field_validator("limit_train_batches", "limit_val_batches", mode="before")
    @classmethod
    def _fraction_or_count(cls, value: Any) -> Any:
        """Lightning's rule: a float is a fraction of the batches, an int a number of them; None,
        Lightning's default, is all of them (it was refused as "not a valid number"; audit 66)."""
        if value is None:
            return 1.0
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0:
            # said once here: each member of the union said "greater than 0", joined by "or"
            raise ValueError("must be above 0: a fraction of the batches (a float, at most 1.0) or a number of "
                             "them (an int)")
        if isinstance(value, float) and value > 1.0:
            raise ValueError(f"a float is a fraction of the batches and must be at most 1.0 (got {value:g}); "
                             "give a whole number (an int) for a count of batches")
        return value


class LoaderConfig(StrictModel):
    """DataLoader options hpsearch passes to DataModules that accept them; 'auto' follows the trial's resources."""

    num_workers: Literal["auto"] | Annotated[int, Field(ge=0)] = "auto"
    pin_memory: Literal["auto"] | bool = "auto"
    persistent_workers: bool = True
    prefetch_factor: PositiveInt | None = None
    # How loader workers hand batches to the trial process (set for the whole trial
    # process, so the user's own DataLoaders get it too); see devices.use_sharing_strategy.
    sharing_strategy: Literal["file_system", "file_descriptor"] = "file_system"


class ResourcesConfig(StrictModel):
    """What one trial holds. A trial of ``workers_per_trial`` > 1 runs that many DDP ranks,
    each with ``cpus_per_worker``/``gpus_per_worker`` (which default to the per-trial values)."""

    cpus_per_trial: PositiveNumber = 1
    gpus_per_trial: Number = Field(0, ge=0)
    workers_per_trial: PositiveInt = 1
    cpus_per_worker: PositiveNumber | None = None
    gpus_per_worker: Number | None = Field(None, ge=0)

    @property
    def worker_cpus(self) -> float:
        return self.cpus_per_worker if self.cpus_per_worker is not None else self.cpus_per_trial

    @property
    def worker_gpus(self) -> float:
        return self.gpus_per_worker if self.gpus_per_worker is not None else self.gpus_per_trial

    @property
    def distributed(self) -> bool:
        return self.workers_per_trial > 1

    @model_validator(mode="after")
    def _a_one_process_trial_is_its_worker(self):
        """A trial of one process is its one worker: a per-worker request given for it is the
        trial's. Ray reserved the per-trial values while the fit check, torch's threads, the
        loader's workers and the choice of a GPU followed the per-worker ones: trials of
        ``cpus_per_worker: 0.5`` each held 1 CPU and used half, and ``gpus_per_worker: 1``
        trained on a GPU that Ray had not reserved for it."""
        if self.distributed:
            return self
        for kind in ("cpus", "gpus"):
            per_worker, per_trial = getattr(self, f"{kind}_per_worker"), f"{kind}_per_trial"
            if per_worker is None:
                continue
            if per_trial in self.model_fields_set and getattr(self, per_trial) != per_worker:
                raise FieldValueError(f"{kind}_per_worker", f"a trial of one process is its one worker: "
                                      f"{kind}_per_worker ({per_worker:g}) and {per_trial} "
                                      f"({getattr(self, per_trial):g}) must agree (set one of them)")
            object.__setattr__(self, per_trial, per_worker)
        return self

    @model_validator(mode="after")
    def _gpu_fractions_fit_one_device(self):
        # The field a rank's GPU request came from: its own, or the per-trial one it inherits.
        field = "gpus_per_worker" if self.gpus_per_worker is not None else "gpus_per_trial"
        if self.worker_gpus > 1 and self.worker_gpus != int(self.worker_gpus):
            raise FieldValueError(field, f"a GPU request above 1 must be whole (got {self.worker_gpus:g})")
        if self.distributed and 0 < self.worker_gpus < 1:
            # Seen on a GPU machine (benchmarks/nccl_check.py, NCCL 2.28): two ranks on one
            # device fail at their first collective with "Duplicate GPU detected".
            raise FieldValueError(field, f"DDP ranks cannot share a GPU (got {self.worker_gpus:g} per rank "
                                         f"for {self.workers_per_trial} ranks): NCCL refuses two ranks on one "
                                         "device; give each rank a whole GPU, or 0 for CPU ranks")
        return self


class FailureConfig(StrictModel):
    max_retries: WholeNumber = Field(2, ge=0, description="restarts of a failed trial from its last checkpoint, for "
                                     "faults a retry may outlive (a bug in the code, say a TypeError, fails the trial "
                                     "at once)")
    max_consecutive_failures: PositiveInt | None = Field(
        5, description="the session stops once this many trials in a row have failed, none finishing between "
        "them: a fault every trial meets (broken data, a bug at any setting) would fail the rest of the study "
        "too; resume continues once it is fixed. null: never stop for failures")
    hang_timeout_s: Annotated[PositiveNumber, Field(ge=1)] | None = Field(
        None, description="a trial that finishes no training or validation batch for this long (from the "
        "training's start) is ended, the stack of each of its threads written to its error.txt, and retried "
        "as a process that died; none by default. At least 1 s: 0.001 ended every trial in its first batch "
        "(audit 69)")


class ExperimentConfig(StrictModel):
    """One experiment file. Field names are the user contract; keep them stable."""

    name: str = Field(max_length=100, description="the study's folder name under storage")
    model: ComponentConfig
    data: ComponentConfig
    space: dict[str, Param]
    metric: str = Field(min_length=1)
    mode: Literal["min", "max"]
    search: SearchConfig = Field(default_factory=SearchConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    loader: LoaderConfig = Field(default_factory=LoaderConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    failure: FailureConfig = Field(default_factory=FailureConfig)
    storage: str = Field("./runs", min_length=1, description="a directory (shared on a cluster) or a cloud URI")

    @field_validator("name")
    @classmethod
    def _name_is_one_folder(cls, value: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", value):
            raise ValueError(f"{value!r} names the study's folder: use letters, digits, '.', '_' and '-', "
                             "starting with a letter or digit (no '/' or spaces)")
        return value

    @field_validator("storage")
    @classmethod
    def _known_storage_scheme(cls, value: str) -> str:
        if "://" in value:
            scheme = value.split("://", 1)[0].lower()
            if scheme not in STORAGE_SCHEMES:
                raise ValueError(f"unsupported storage scheme {scheme!r}; use a path or one of "
                                 f"{', '.join(s + '://' for s in STORAGE_SCHEMES)}")
        # Each of these went somewhere other than meant, with no word (audit 36).
        scheme, colon, rest = value.partition(":")
        if colon and scheme.lower() in STORAGE_SCHEMES and not rest.startswith("//"):
            raise ValueError(f"{value!r} looks like a {scheme}:// URI with a slash missing; as it is, it is a "
                             f"local folder named {scheme + ':'!r}")
        expanded = os.path.expandvars(value)  # as storage.local_path reads it: file://$HOME/runs
        host = urlsplit(expanded).netloc
        if value.startswith("file://") and host not in ("", "localhost"):
            raise ValueError(f"{value!r} names the host {host!r}: a file URI's path follows three "
                             f"slashes (file:///home/me/runs); or give the path itself (./runs)")
        unset = None if "://" in value and not value.startswith("file://") else \
            re.search(r"\$\{?([A-Za-z_]\w*)", expanded)
        if unset:  # the set ones are expanded, as ~ is (storage.local_path)
            raise ValueError(f"{value!r} holds ${unset.group(1)}, which is not set in this environment")
        return value

    # Where each key came from (YAML line, or the command-line option that set it), so
    # that later checks that need the user's classes can still point at the fault.
    _lines: dict[tuple[str, ...], int | str] = PrivateAttr(default_factory=dict)
    _origin: str = PrivateAttr("<dict>")

    def overridden_under(self, field: str) -> str | None:
        """The shallowest field under ``field`` that an override (--set, or the API's
        overrides) set, or None: an error about the section is then named by it."""
        parts = split_field(field)
        set_by_override = [path for path, line in self._lines.items()
                           if path[:len(parts)] == parts and isinstance(line, str)]
        return ".".join(min(set_by_override, key=len)) if set_by_override else None

    def read_as_yaml(self, field: str) -> bool:
        """Whether ``field``'s value was written as YAML (a file's line, ``--set``) rather than
        given as a Python value (a dict, the API's overrides): advice on quotes and on YAML's
        booleans is for the first only."""
        parts = split_field(field)
        line = next((self._lines[parts[:end]] for end in range(len(parts), 0, -1) if parts[:end] in self._lines), None)
        return written_as_yaml(line, self._origin)

    def problem(self, field: str, message: str):
        """A ``Problem`` for ``field`` (dotted; space keys keep their dots), located in the file."""
        from .errors import Problem

        parts = split_field(field)
        for end in range(len(parts), 0, -1):
            line = self._lines.get(parts[:end])
            if isinstance(line, str):
                return Problem(field, message, None, line)
            if line is not None:
                return Problem(field, message, line, self._origin)
        return Problem(field, message)

    @field_validator("space")
    @classmethod
    def _space_keys_name_a_section(cls, space: dict[str, Any]) -> dict[str, Any]:
        if not space:
            raise ValueError("space is empty: name at least one parameter to search")
        for key in space:
            section, dot, arg = key.partition(".")
            if not dot or section not in SEARCHABLE_SECTIONS or not arg:
                raise FieldValueError(key, "a space key is 'model.<arg>', 'data.<arg>' or 'trainer.<setting>'")
            if section == "trainer" and arg == "max_epochs":
                raise FieldValueError(key, "the epochs are scheduler.max_epochs, which is not searched: ASHA sets "
                                           "its rungs by it, and stops weak trials early on its own")
            if section == "trainer" and arg not in TrainerConfig.model_fields:
                known = ", ".join(name for name in TrainerConfig.model_fields if name not in NOT_SEARCHABLE)
                raise FieldValueError(key, f"trainer has no searchable setting {arg!r} (searchable: {known})")
            if section == "trainer" and arg in NOT_SEARCHABLE:
                raise FieldValueError(key, NOT_SEARCHABLE[arg])
        return space

    @model_validator(mode="after")
    def _strategy_needs_workers(self):
        strategy = self.trainer.strategy
        if strategy in ("ddp", "fsdp", "deepspeed") and not self.resources.distributed:
            # A trial of one process runs Lightning's single-device training: the strategy
            # would be dropped without a word.
            what = "runs one rank per worker" if strategy == "ddp" else "shards the model over a trial's ranks"
            raise FieldValueError("trainer.strategy", f"'{strategy}' {what}: it needs resources.workers_per_trial > 1")
        # (stage 2, the default, is in every study's frozen settings, whatever the strategy)
        if self.trainer.deepspeed_stage != 2 and strategy != "deepspeed":
            raise FieldValueError("trainer.deepspeed_stage", f"is DeepSpeed's ZeRO stage, and trainer.strategy is "
                                                            f"{strategy!r}: set strategy: deepspeed, or leave it out")
        if strategy in ("fsdp", "deepspeed") and self.resources.worker_gpus == 0:
            # Lightning's rule for both: every trial failed on it, each after a retry.
            raise FieldValueError("trainer.strategy", f"'{strategy}' shards over GPUs: give each rank one "
                                                     "(resources.gpus_per_trial or gpus_per_worker >= 1)")
        return self

    @model_validator(mode="after")
    def _trainer_params_valid_wherever_sampled(self):
        """A searched trainer setting is checked at every choice and both ends of its range,
        here, rather than in the trials that happen to sample a bad value."""
        for key, param in self.space.items():
            if key.startswith("trainer."):
                for value in param.edge_values():
                    try:
                        self.with_trainer_params({key: value})
                    except ValidationError as exc:
                        reason = exc.errors()[0]["msg"]
                        raise FieldValueError(f"space.{key}", f"{value!r} can be sampled but is not a valid "
                                                              f"{key}: {reason}") from None
        return self

    @model_validator(mode="after")
    def _conditions_name_earlier_choices(self):
        """A ``when`` names a categorical parameter listed before its own (parameters are
        sampled in the order listed, so its value is known) and values among its choices:
        otherwise the parameter would be sampled never, or by a condition that reads wrong."""
        order = list(self.space)
        for key, param in self.space.items():
            for parent, values in (param.when or {}).items():
                field = f"space.{key}.when"
                if parent == key:
                    raise FieldValueError(field, f"names {key} itself: a condition names another parameter")
                if parent not in self.space:
                    raise FieldValueError(field, f"names {parent!r}, which is not a searched parameter "
                                                 f"(searched: {', '.join(order)})")
                if order.index(parent) > order.index(key):
                    raise FieldValueError(field, f"names {parent}, which is listed after {key}: parameters are "
                                                 f"sampled in the order listed, so list {parent} first")
                choices = getattr(self.space[parent], "choices", None)
                if choices is None:
                    raise FieldValueError(field, f"names {parent}, a {self.space[parent].type} range: a condition "
                                                 "names values of a categorical parameter (make it one: type: "
                                                 "categorical, choices: [...])")
                for value in values:
                    if not any(same_choice(value, choice) for choice in choices):
                        hint = _yaml_boolean_hint(value, choices)
                        raise FieldValueError(field, f"{value!r} is not one of {parent}'s choices {choices}: {key} "
                                                     f"would never be sampled with it{hint}")
        for key, param in self.space.items():
            never = [parent for parent, allowed in self.needed_to_sample(key).items() if not allowed]
            if param.when and never:  # each holds alone, not together (audit 41: a KeyError in the preflight)
                raise FieldValueError(f"space.{key}.when", f"can never hold: with the conditions of the parameters "
                                                           f"it names, no value of {never[0]} is left for it")
        return self

    def needed_to_sample(self, key: str) -> dict[str, list[Scalar]]:
        """The values a trial's parameters must have for it to sample ``key``: each one its
        condition names, in turn theirs, with the choices all the conditions on it allow
        (in choice order; none where they cannot all hold). Conditions are conjunctions of
        such sets, so one value from each set makes a trial sample ``key``."""
        needed: dict[str, list[Scalar]] = {}
        pending = [key]
        while pending:
            for parent, values in (self.space[pending.pop()].when or {}).items():
                allowed = [choice for choice in getattr(self.space[parent], "choices", [])
                           if any(same_choice(value, choice) for value in values)]
                if parent in needed:
                    needed[parent] = [choice for choice in needed[parent] if choice in allowed]
                else:
                    needed[parent] = allowed
                    pending.append(parent)
        return needed

    @model_validator(mode="after")
    def _first_trials_are_points_of_the_space(self):
        """Each of ``search.first_trials`` is a trial the search could have sampled: values of
        searched parameters, each one a sampler could give, a conditional one only with the
        values that make a trial sample it. Optuna would warn of a value out of its range
        and train with it, and drop one whose condition fails, without a word. (A searched
        trainer setting needs no check of its own: its every choice and both range ends are
        checked above, and its bounds are ranges.)"""
        points = self.search.first_trials
        if points and self.search.sampler == "grid":
            raise FieldValueError("search.first_trials", "sampler 'grid' runs every point of its grid, in an order "
                                                         "of its own: leave first_trials out, or use another sampler")
        if len(points) > self.search.num_trials:
            raise FieldValueError("search.first_trials", f"{len(points)} trials given, more than search.num_trials "
                                                         f"({self.search.num_trials})")
        for index, point in enumerate(points):
            field = f"search.first_trials.{index}"
            if not point:
                raise FieldValueError(field, "is empty: give the values of some searched parameters (the others are "
                                             "sampled)")
            for key, value in point.items():
                param = self.space.get(key)
                if param is None:
                    raise FieldValueError(f"{field}.{key}", f"is not a searched parameter (searched: "
                                                            f"{', '.join(self.space)})")
                if (refusal := param.refusal(value)) is not None:
                    raise FieldValueError(f"{field}.{key}", f"{refusal} (space.{key})")
                for parent, allowed in self.needed_to_sample(key).items():
                    if parent not in point or not any(same_choice(point[parent], choice) for choice in allowed):
                        given = f"this trial gives {parent}={point[parent]!r}" if parent in point else \
                            f"this trial does not give {parent}"
                        raise FieldValueError(f"{field}.{key}", f"is sampled only when "
                                              f"{condition_text(self.needed_to_sample(key))}, and {given}: a trial "
                                              f"that did not sample {key} would ignore it")
                if isinstance(param, FloatParam):
                    point[key] = float(value)  # as the sampler gives it, and as a repeat is compared
            for earlier in range(index):
                if points[earlier] == point:
                    raise FieldValueError(field, f"repeats search.first_trials.{earlier}")
        return self

    @model_validator(mode="after")
    def _grid_needs_finite_values(self):
        if self.search.sampler != "grid":
            return self
        conditional = next((key for key, param in self.space.items() if param.when), None)
        if conditional:
            raise FieldValueError(f"space.{conditional}.when", "sampler 'grid' visits every combination of "
                                  "every parameter's values, and a conditional parameter has no value in some: "
                                  "use another sampler, or list the combinations as the choices of one "
                                  "categorical parameter and map each in your class's constructor")
        for key, param in self.space.items():
            if isinstance(param, IntParam) and param.log:
                # every whole number from low to high, unsaid: batch sizes 32-256 made 225 points of
                # a grid (audit 86), where a float with log is refused
                raise FieldValueError(f"space.{key}.log", f"a grid has no log scale: this int parameter would be "
                                      f"every whole number from {param.low} to {param.high} "
                                      f"({param.grid_points():,} values); drop log (with a step), or list the values "
                                      f"as a categorical parameter (type: categorical, choices: "
                                      f"[{', '.join(str(v) for v in _log_spaced(param.low, param.high))}])")
            if isinstance(param, FloatParam) and param.step is None:
                fix = ("a grid has no log scale: list the values as a categorical parameter "
                       "(type: categorical, choices: [1.0e-4, 1.0e-3, 1.0e-2])" if param.log else
                       "give one, or list the values as a categorical parameter")
                raise FieldValueError(f"space.{key}", f"sampler 'grid' needs a 'step' on this float parameter: {fix}")
            rounded = isinstance(param, FloatParam) and (round(param.step, 12), round(param.low, 12))
            if rounded and rounded != (param.step, param.low):
                # its points, rounded so, were one value, below low (audit 66: five points of 0.0), or
                # not low plus whole steps (1.5e-12: 0, 2e-12, 3e-12, 5e-12; audit 67)
                field, what = ("step", "a step of more decimals") if round(param.step, 12) != param.step \
                    else ("low", "a low of more decimals")
                raise FieldValueError(f"space.{key}.{field}", f"a grid's points are rounded to 12 decimals (0.07, not "
                                      f"0.07000000000000001), which {what} does not survive; list the values as a "
                                      f"categorical parameter, or scale the parameter")
        # Counted, not listed: a step of 1e-9 made the check list a billion points (audit 36).
        size = math.prod(param.grid_points() for param in self.space.values())
        if size > GRID_POINTS_LIMIT:
            largest = max(self.space, key=lambda key: self.space[key].grid_points())
            raise FieldValueError(f"space.{largest}", f"the grid has {size:,} points "
                                  f"({self.space[largest].grid_points():,} values of this parameter), and Optuna's "
                                  f"grid sampler lists every point before the first trial: at most "
                                  f"{GRID_POINTS_LIMIT:,}; give larger steps or fewer choices, or use another sampler")
        return self

    def params_for(self, section: str, params: dict[str, Any]) -> dict[str, Any]:
        """The sampled values that belong to ``section`` ('model', 'data' or 'trainer'), by argument name."""
        prefix = section + "."
        return {key[len(prefix):]: value for key, value in params.items() if key.startswith(prefix)}

    def with_trainer_params(self, params: dict[str, Any]) -> TrainerConfig:
        """The trainer settings with any sampled ``trainer.*`` values applied (and validated)."""
        merged = {**self.trainer.model_dump(), **self.params_for("trainer", params)}
        return TrainerConfig.model_validate(merged)


def written_as_yaml(line: int | str | None, origin: str) -> bool:
    """Whether a field whose value came from ``line`` (a file's line, the option that set
    it, or None) of ``origin`` (a file, or ``<dict>``) was written as YAML: in a file or
    ``--set``, not as a Python value (a dict, the API's overrides)."""
    return isinstance(line, int) or line == SET or (line is None and origin != "<dict>")


def split_field(field: str) -> tuple[str, ...]:
    """``space.model.lr.low`` -> ``("space", "model.lr", "low")``: space keys hold a dot, and
    so do the parameters a condition or a first trial names."""
    parts = field.split(".")
    if parts[0] == "space" and len(parts) >= 3:
        parts = ["space", parts[1] + "." + parts[2], *parts[3:]]
        if len(parts) >= 5 and parts[2] == "when":  # space.model.momentum.when.model.optimizer
            parts = [*parts[:3], parts[3] + "." + parts[4], *parts[5:]]
    elif parts[:2] == ["search", "first_trials"] and len(parts) >= 5:  # search.first_trials.0.model.lr
        parts = [*parts[:3], parts[3] + "." + parts[4], *parts[5:]]
    return tuple(parts)
