"""The search space: experiment ``space`` entries as Optuna distributions.

Parameter names keep their dotted form (``model.lr``), which is also how they appear
in the Optuna study, trials.csv and TensorBoard. A parameter with a ``when`` is sampled
only in the trials whose earlier values meet it (``is_sampled``); the others lack it.
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from typing import TYPE_CHECKING, Any

from .config import CategoricalParam, ExperimentConfig, FloatParam, IntParam, same_choice
from .errors import ConfigError, warn_user

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution


def to_distribution(param: FloatParam | IntParam | CategoricalParam) -> BaseDistribution:
    """Optuna's distribution for one parameter. A stepped range that stops short of its
    ``high`` is said so once, by ``check_steps`` in hpsearch's words: Optuna's own warning
    for it, which followed, is left out. (Optuna is imported here, not with the module: a
    config check that fails must not wait for it.)"""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"The distribution is specified by .* not divisible by `step`")
        if isinstance(param, FloatParam):
            return FloatDistribution(param.low, param.high, log=param.log, step=param.step)
        if isinstance(param, IntParam):
            return IntDistribution(param.low, param.high, log=param.log, step=param.step)
    return CategoricalDistribution(param.choices)


def to_distributions(config: ExperimentConfig) -> dict[str, BaseDistribution]:
    return {key: to_distribution(param) for key, param in config.space.items()}


def is_sampled(param: FloatParam | IntParam | CategoricalParam, earlier: dict[str, Any]) -> bool:
    """Whether a trial samples ``param``, given the values it sampled before it: each
    parameter its ``when`` names has one of the values listed (one not sampled has none)."""
    return all(parent in earlier and any(same_choice(earlier[parent], value) for value in values)
               for parent, values in (param.when or {}).items())


def sampled_only(config: ExperimentConfig, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` without those that a trial with them would not sample (their parameter's
    condition fails), in the space's order."""
    kept: dict[str, Any] = {}
    for key, param in config.space.items():
        if key in values and is_sampled(param, kept):
            kept[key] = values[key]
    return kept


def with_value(config: ExperimentConfig, values: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """A trial's values with ``key`` at ``value``: each parameter that must have certain
    values for a trial to sample it (``needed_to_sample``), and does not, gets the first of
    them, and what is then no longer sampled is left out. ``values`` holds one for every
    parameter (sampled or not), so that a parameter a changed condition now samples has one."""
    changed = {**values, key: value}
    for parent, allowed in config.needed_to_sample(key).items():
        if parent not in changed or not any(same_choice(changed[parent], option) for option in allowed):
            changed[parent] = allowed[0]
    return sampled_only(config, changed)


def grid_values(param: FloatParam | IntParam | CategoricalParam) -> list[Any]:
    """Every value a grid search visits for one parameter (floats need a ``step``)."""
    if isinstance(param, CategoricalParam):
        return list(param.choices)
    if isinstance(param, IntParam):
        return list(range(param.low, param.high + 1, param.step))
    return [float(round(param.low + i * param.step, 12)) for i in range(param.grid_points())]


def grid_size(config: ExperimentConfig) -> int:
    return math.prod(param.grid_points() for param in config.space.values())


def trial_limit(config: ExperimentConfig) -> int:
    """How many trials the study holds when its search is done: ``num_trials``, or a
    smaller grid's size."""
    if config.search.sampler == "grid":
        return min(config.search.num_trials, grid_size(config))
    return config.search.num_trials


def check_steps(config: ExperimentConfig) -> None:
    """A range whose ``high`` is not ``low`` plus whole steps is said to stop short of it:
    no sampler ever gives that ``high``, and nothing said so."""
    for key, param in config.space.items():
        if isinstance(param, (FloatParam, IntParam)) and param.step is not None:
            top = param.edge_values()[-1]
            if abs(top - param.high) > 1e-9 * max(1.0, abs(param.high)):
                warn_user(f"space.{key}: high ({param.high:g}) is not low plus whole steps of {param.step:g}: "
                          f"the highest value sampled is {top:g}")


def check_sampler(config: ExperimentConfig) -> None:
    """Before anything starts: the sampler's optional package is installed, a grid
    smaller than ``num_trials`` is said to end the search early, and a sampler that models
    only the parameters every trial has (or, CMA-ES, only numeric ones) is said to sample the
    others at random."""
    if config.search.sampler == "gp" and importlib.util.find_spec("scipy") is None:
        # Optuna's GP sampler imports SciPy only once its first 10 random trials are done.
        raise ConfigError([config.problem(
            "search.sampler", "'gp' needs SciPy, which is not installed: pip install 'hpsearch[gp]'")])
    if config.search.sampler == "grid" and grid_size(config) < config.search.num_trials:
        warn_user(f"search.num_trials is {config.search.num_trials} but the grid has {grid_size(config)} points: "
                  f"the search ends after {grid_size(config)} trials")
    elif config.search.sampler == "grid" and grid_size(config) > config.search.num_trials:
        # 8 of 1,350 points ran, unsaid (audit 86): a subset in the grid sampler's shuffled order
        warn_user(f"the grid has {grid_size(config):,} points and search.num_trials is {config.search.num_trials}: "
                  f"the search runs {config.search.num_trials} of them, in Optuna's shuffled order "
                  f"(search.num_trials: {grid_size(config)} runs every point)")
    categorical = [key for key, param in config.space.items() if param.type == "categorical" and not param.when]
    if categorical and config.search.sampler == "cmaes":
        # Optuna's CMA-ES leaves them to its independent sampler, whose warning hpsearch turns off
        # (it would come at every trial): nothing said so (audit 66)
        warn_user(f"search.sampler 'cmaes' models only numeric parameters (CMA-ES has no categories): "
                  f"{', '.join(categorical)} (categorical) will be sampled at random; 'tpe' models them")
    conditional = [key for key, param in config.space.items() if param.when]
    if conditional and config.search.sampler in ("cmaes", "gp"):
        warn_user(f"search.sampler '{config.search.sampler}' models only the parameters every trial samples: "
                  f"{', '.join(conditional)} (conditional) will be sampled at random; 'tpe' models each "
                  "parameter over the trials that sample it")
