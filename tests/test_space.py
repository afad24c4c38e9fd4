"""Search-space conversion to Optuna distributions, grids and representative values."""

from __future__ import annotations

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from hpsearch.search.config_loading import load_config
from hpsearch.search.errors import ConfigError
from hpsearch.search.preflight import representative_params
from hpsearch.search.space import grid_size, grid_values, to_distributions


def test_example_space_converts_with_log_and_choices(example_config):
    dists = to_distributions(load_config(example_config))
    assert dists["model.lr"] == FloatDistribution(1e-4, 1e-1, log=True)
    assert dists["model.channels"] == CategoricalDistribution([8, 16, 32])
    assert dists["data.batch_size"] == IntDistribution(32, 256, log=True)


def test_step_reaches_optuna(example_config):
    example_config["space"]["model.dropout"] = {"type": "float", "low": 0.0, "high": 0.5, "step": 0.1}
    example_config["space"]["data.batch_size"] = {"type": "int", "low": 16, "high": 64, "step": 16}
    dists = to_distributions(load_config(example_config))
    assert dists["model.dropout"].step == 0.1
    assert dists["data.batch_size"] == IntDistribution(16, 64, step=16)


def test_grid_values_and_size(example_config):
    example_config["search"]["sampler"] = "grid"
    example_config["space"] = {
        "model.lr": {"type": "float", "low": 0.01, "high": 0.03, "step": 0.01},
        "model.channels": {"type": "categorical", "choices": [8, 16]},
        "data.batch_size": {"type": "int", "low": 32, "high": 96, "step": 32},
    }
    config = load_config(example_config)
    assert grid_values(config.space["model.lr"]) == [0.01, 0.02, 0.03]
    assert grid_values(config.space["data.batch_size"]) == [32, 64, 96]
    assert grid_size(config) == 18


def test_representative_values_lie_inside_the_space(example_config):
    config = load_config(example_config)
    values = representative_params(config)
    for key, dist in to_distributions(config).items():
        assert dist._contains(dist.to_internal_repr(values[key])), key


@pytest.mark.parametrize("sampler", ["tpe", "random", "cmaes", "gp"])
def test_every_sampler_builds_and_samples(sampler, example_config, tmp_path):
    import optuna

    from hpsearch.search.searcher import make_sampler

    example_config["search"]["sampler"] = sampler
    config = load_config(example_config)
    study = optuna.create_study(sampler=make_sampler(config), direction="maximize")
    trial = study.ask(fixed_distributions=to_distributions(config))
    assert set(trial.params) == set(config.space)


def test_cmaes_learns_from_the_trials_asha_pruned(example_config):
    """CMA-ES by default waits for a population of complete trials: in a search where ASHA
    pruned two thirds, every trial it sampled was of its first generation (audit 78)."""
    import warnings

    import optuna
    from optuna.trial import TrialState

    from hpsearch.search.searcher import make_sampler

    example_config["search"]["sampler"] = "cmaes"
    example_config["space"] = {"model.lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True},
                               "model.dropout": {"type": "float", "low": 0.0, "high": 0.5}}
    config = load_config(example_config)
    study = optuna.create_study(sampler=make_sampler(config), direction="minimize")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for number in range(24):  # one complete (which fixes CMA-ES's space), the rest pruned at rung 1
            trial = study.ask(fixed_distributions=to_distributions(config))
            trial.report(trial.params["model.dropout"], 1)
            if number == 0:
                study.tell(trial, trial.params["model.dropout"])
            else:
                study.tell(trial, state=TrialState.PRUNED)
    generations = {value for trial in study.trials for key, value in trial.system_attrs.items()
                   if key.endswith("generation")}
    assert max(generations) >= 2, generations


@pytest.mark.parametrize("sampler", ["tpe", "random", "cmaes"])
def test_a_resumed_search_samples_a_stream_no_fresh_study_of_another_seed_samples(sampler, example_config):
    """The seed of a resumed session was the study's seed plus its trials so far: a study of
    seed 0 resumed after 3 trials sampled exactly what a fresh study of seed 3 did (audit 22)."""
    import optuna

    from hpsearch.search.searcher import make_sampler

    def first_draws(seed: int, trials_before: int) -> list[dict]:
        example_config["search"].update(sampler=sampler, seed=seed)
        config = load_config(example_config)
        study = optuna.create_study(sampler=make_sampler(config, trials_before), direction="maximize")
        return [study.ask(fixed_distributions=to_distributions(config)).params for _ in range(3)]

    resumed = first_draws(0, 3)
    assert resumed == first_draws(0, 3)  # still reproducible
    assert all(resumed != first_draws(seed, 0) for seed in range(8))
    assert first_draws(3, 0) == first_draws(3, 0) != first_draws(4, 0)  # a first session keeps its seed


def test_gp_without_scipy_is_refused_naming_the_field(example_config, monkeypatch):
    import importlib.util

    from hpsearch.search.errors import ConfigError
    from hpsearch.search.space import check_sampler

    example_config["search"]["sampler"] = "gp"
    config = load_config(example_config)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "scipy" else real_find_spec(name, *a))
    with pytest.raises(ConfigError, match=r"search\.sampler.*'gp' needs SciPy.*hpsearch\[gp\]"):
        check_sampler(config)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    check_sampler(config)


def test_a_grid_smaller_than_num_trials_is_announced(example_config):
    from hpsearch.search.space import check_sampler

    example_config["search"].update(sampler="grid", num_trials=6)
    example_config["space"] = {"model.lr": {"type": "float", "low": 0.01, "high": 0.02, "step": 0.01}}
    with pytest.warns(UserWarning, match="num_trials is 6 but the grid has 2 points"):
        check_sampler(load_config(example_config))


def test_a_grid_larger_than_num_trials_says_it_runs_a_part_of_it(example_config):
    """8 of 1,350 points ran in a shuffled order, unsaid (audit 86)."""
    from hpsearch.search.space import check_sampler

    example_config["search"].update(sampler="grid", num_trials=2)
    example_config["space"] = {"model.lr": {"type": "float", "low": 0.01, "high": 0.05, "step": 0.01}}
    with pytest.warns(UserWarning, match=r"the grid has 5 points and search.num_trials is 2: the search runs 2 of "
                                         r"them, in Optuna's shuffled order \(search.num_trials: 5 runs every point\)"):
        check_sampler(load_config(example_config))


def test_a_grid_refuses_a_log_int_range_as_it_refuses_a_log_float_one(example_config):
    """batch_size 32-256 with log: every whole number, 225 points of the grid, unsaid (audit 86)."""
    example_config["search"]["sampler"] = "grid"
    example_config["space"] = {"data.batch_size": {"type": "int", "low": 32, "high": 256, "log": True}}
    with pytest.raises(ConfigError) as caught:
        load_config(example_config)
    [problem] = caught.value.problems
    assert problem.field == "space.data.batch_size.log" and "every whole number from 32 to 256 (225 values)" \
        in problem.message and "choices: [32, 64, 128, 256]" in problem.message, problem


def test_a_range_that_stops_short_of_its_high_is_said(example_config):
    """low 0, high 1, step 0.3: 1.0 is never sampled (the last point is 0.9), silently."""
    import warnings

    from hpsearch.search.space import check_steps

    example_config["space"]["model.dropout"] = {"type": "float", "low": 0.0, "high": 1.0, "step": 0.3}
    example_config["space"]["data.batch_size"] = {"type": "int", "low": 32, "high": 256, "step": 32}  # 256 is reached
    with pytest.warns(UserWarning) as caught:
        check_steps(load_config(example_config))
    assert [str(w.message) for w in caught] == [
        "space.model.dropout: high (1) is not low plus whole steps of 0.3: the highest value sampled is 0.9"]
    # ... and only so: Optuna's own warning for it followed hpsearch's (audit 21)
    from hpsearch.search.space import to_distributions

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dropout = to_distributions(load_config(example_config))["model.dropout"]
    assert (dropout.high, dropout.step) == (0.9, 0.3)  # the range Optuna samples from, as before
    example_config["space"]["model.dropout"]["step"] = 0.25
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_steps(load_config(example_config))


@pytest.mark.parametrize("sampler, said", [("cmaes", True), ("tpe", False), ("gp", False), ("random", False)])
def test_cmaes_says_it_samples_categorical_parameters_at_random(example_config, sampler, said, recwarn, monkeypatch):
    """Optuna's CMA-ES has no categories: it leaves them to its independent sampler, at
    random, whose warning hpsearch turns off; the example's channels were sampled so with
    no word (audit 66)."""
    import importlib.util

    from hpsearch.search.space import check_sampler

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())  # gp's SciPy, as if installed
    example_config["search"]["sampler"] = sampler
    check_sampler(load_config(example_config))
    assert any("model.channels (categorical) will be sampled at random" in str(w.message) for w in recwarn) == said
