"""Conditional parameters (``when``): checked before anything starts, sampled only in the
trials whose earlier values meet their condition, and checked by the preflight with the
values that make a trial sample them."""

from __future__ import annotations

import pytest

from conftest import preflight_refusal
from hpsearch.search.components import check_components
from hpsearch.search.config_loading import load_config
from hpsearch.search.errors import ConfigError
from hpsearch.search.outcome import PruneLog
from hpsearch.search.preflight import run_preflight
from hpsearch.search.searcher import OptunaSearcher, open_study
from hpsearch.search.space import check_sampler, sampled_only, with_value

OPTIMIZER = {"type": "categorical", "choices": ["adamw", "sgd"]}
MOMENTUM = {"type": "float", "low": 0.5, "high": 0.99, "when": {"model.optimizer": "sgd"}}


def conditional(example_config, **space):
    example_config["space"] = {**example_config["space"], "model.optimizer": OPTIMIZER, "model.momentum": MOMENTUM,
                               **space}
    return example_config


def test_a_condition_is_kept_as_a_list_and_only_where_it_is_set(example_config):
    config = load_config(conditional(example_config))
    assert config.space["model.momentum"].when == {"model.optimizer": ["sgd"]}
    dumped = config.model_dump(mode="json")["space"]
    assert "when" not in dumped["model.optimizer"]  # experiment.yaml as it always was
    assert dumped["model.momentum"]["when"] == {"model.optimizer": ["sgd"]}
    assert load_config({**example_config, "space": dumped}).space == config.space  # as resume reads it back


@pytest.mark.parametrize("space, sampler, message", [
    ({"model.momentum": MOMENTUM, "model.optimizer": OPTIMIZER}, "tpe", "which is listed after model.momentum"),
    ({"model.momentum": MOMENTUM}, "tpe", "names 'model.optimizer', which is not a searched parameter"),
    ({"model.optimizer": OPTIMIZER, "model.momentum": {**MOMENTUM, "when": {"model.optimizer": "adam"}}}, "tpe",
     "'adam' is not one of model.optimizer's choices ['adamw', 'sgd']"),
    ({"model.lr": {"type": "float", "low": 0.001, "high": 0.1},
      "model.momentum": {**MOMENTUM, "when": {"model.lr": 0.01}}}, "tpe", "names model.lr, a float range"),
    ({"model.optimizer": OPTIMIZER, "model.momentum": {**MOMENTUM, "when": {}}}, "tpe", "is empty"),
    ({"model.optimizer": OPTIMIZER, "model.momentum": {**MOMENTUM, "when": {"model.optimizer": []}}}, "tpe",
     "no value given"),
    ({"model.optimizer": OPTIMIZER, "model.momentum": {**MOMENTUM, "when": {"model.momentum": 0.5}}}, "tpe",
     "names model.momentum itself"),
    ({"model.flag": {"type": "categorical", "choices": [0, 1]},
      "model.momentum": {**MOMENTUM, "when": {"model.flag": True}}}, "tpe", "True is not one of model.flag's"),
    ({"model.optimizer": OPTIMIZER, "model.momentum": {**MOMENTUM, "step": 0.1}}, "grid", "sampler 'grid'"),
    # each part holds alone, not together: it raised a KeyError in the preflight (audit 41)
    ({"model.optimizer": OPTIMIZER, "model.dropout": {"type": "categorical", "choices": [0.1], "when":
                                                      {"model.optimizer": "adamw"}},
      "model.momentum": {**MOMENTUM, "when": {"model.optimizer": "sgd", "model.dropout": 0.1}}}, "tpe",
     "can never hold: with the conditions of the parameters it names, no value of model.optimizer is left"),
    ({"model.flag": {"type": "categorical", "choices": ["yes", "no"]},
      "model.momentum": {**MOMENTUM, "when": {"model.flag": True}}}, "tpe", "quote the word"),
])
def test_a_condition_that_cannot_work_is_refused_naming_its_field(example_config, space, sampler, message):
    example_config["space"] = space
    example_config["search"]["sampler"] = sampler
    with pytest.raises(ConfigError) as caught:
        load_config(example_config)
    assert "space.model.momentum.when:" in str(caught.value) and message in str(caught.value), str(caught.value)


def test_the_values_a_trial_samples_follow_the_conditions_in_a_chain(example_config):
    config = load_config(conditional(example_config, **{
        "model.momentum": {"type": "categorical", "choices": [0.5, 0.9], "when": {"model.optimizer": "sgd"}},
        "model.nesterov": {"type": "categorical", "choices": [False, True], "when": {"model.momentum": 0.9}},
    }))
    everything = {"model.optimizer": "adamw", "model.momentum": 0.5, "model.nesterov": True}
    assert sampled_only(config, everything) == {"model.optimizer": "adamw"}
    assert sampled_only(config, {**everything, "model.optimizer": "sgd"}) == \
        {"model.optimizer": "sgd", "model.momentum": 0.5}
    # Setting the last of the chain sets the values it needs, each to the first that meets it.
    assert with_value(config, everything, "model.nesterov", False) == \
        {"model.optimizer": "sgd", "model.momentum": 0.9, "model.nesterov": False}
    assert with_value(config, everything, "model.optimizer", "sgd") == \
        {"model.optimizer": "sgd", "model.momentum": 0.5}


@pytest.mark.parametrize("sampler", ["tpe", "random", "cmaes", "gp"])
def test_every_sampler_samples_a_conditional_parameter_exactly_where_its_condition_holds(
        example_config, tmp_path, sampler):
    """Trials told their values so that model-based samplers, past their 10 random ones, model
    them (GP's model needs SciPy, an extra: without it, only its random start is run)."""
    import importlib.util

    trials = 8 if sampler == "gp" and importlib.util.find_spec("scipy") is None else 14
    conditional(example_config)
    example_config["search"].update(sampler=sampler, num_trials=trials, max_concurrent=1)
    searcher = OptunaSearcher(load_config(example_config), tmp_path, PruneLog())
    for index in range(trials):
        params = searcher.suggest(str(index))["params"]
        assert ("model.momentum" in params) == (params["model.optimizer"] == "sgd"), params
        searcher.on_trial_result(str(index), {"epoch": 1, "val_acc": params["model.lr"]})
        searcher.on_trial_complete(str(index), {"epoch": 1, "val_acc": params["model.lr"], "hps_finished": True,
                                                "hps_stop_reason": "max_epochs"})
    trials = open_study(tmp_path, "digits-cnn", "max").trials
    assert {t.params["model.optimizer"] for t in trials} == {"adamw", "sgd"}
    assert all(("model.momentum" in t.params) == (t.params["model.optimizer"] == "sgd") for t in trials)
    assert all(0.5 <= t.params["model.momentum"] <= 0.99 for t in trials if "model.momentum" in t.params)


def test_an_interrupted_trial_gets_the_conditional_values_it_lacks_and_no_others(example_config, tmp_path):
    """A driver killed while a trial was being sampled left it with some of its values."""
    config = load_config(conditional(example_config))
    study = open_study(tmp_path, config.name, config.mode)
    for optimizer in ("sgd", "adamw"):
        partial = study.ask()  # RUNNING, as the kill left it
        partial.suggest_categorical("model.optimizer", ["adamw", "sgd"])
        study._storage.set_trial_param(partial._trial_id, "model.optimizer", ["adamw", "sgd"].index(optimizer),
                                       OptunaSearcher(config, tmp_path, PruneLog()).distributions["model.optimizer"])
    searcher = OptunaSearcher(config, tmp_path, PruneLog())
    first, second = searcher.suggest("a")["params"], searcher.suggest("b")["params"]
    assert first["model.optimizer"] == "sgd" and "model.momentum" in first, first
    assert second["model.optimizer"] == "adamw" and "model.momentum" not in second, second
    assert set(first) == set(config.space) and set(second) == set(config.space) - {"model.momentum"}


def test_the_preflight_builds_a_conditional_value_with_the_values_that_make_a_trial_sample_it(example_config):
    """The built-in models refuse a momentum of 1 or more; the first optimizer (adamw) does
    not sample momentum, so the trials that would fail are those with sgd."""
    conditional(example_config, **{"model.momentum": {**MOMENTUM, "high": 1.0}})
    assert str(preflight_refusal(example_config)).startswith(
        "space.model.momentum: 1.0 (with model.optimizer='sgd') can be sampled, but CNNClassifier(...) raised "
        "ValueError: momentum")
    example_config["space"]["model.momentum"]["high"] = 0.99
    assert "val_acc" in run_preflight(load_config(example_config), *check_components(load_config(example_config)))


def test_the_preflight_judges_a_value_a_constructor_refuses_under_one_condition_only(example_config, monkeypatch):
    """MomentumOnlyForSGD refuses a momentum with AdamW, and above 0.95 with SGD: built with
    the first optimizer (adamw), the preflight refused every momentum; built with the
    optimizer that samples it, only 0.99."""
    from conftest import FIXTURES

    monkeypatch.syspath_prepend(str(FIXTURES))
    example_config["model"] = {"class_path": "userpkg.conditional:MomentumOnlyForSGD", "init_args": {"channels": 8}}
    conditional(example_config, **{"model.momentum": {**MOMENTUM, "high": 0.9}})
    config = load_config(example_config)
    assert "val_acc" in run_preflight(config, *check_components(config))
    example_config["space"]["model.momentum"]["high"] = 0.99
    problem = preflight_refusal(example_config)
    assert problem.field == "space.model.momentum" and problem.message.startswith(
        "0.99 (with model.optimizer='sgd') can be sampled, but MomentumOnlyForSGD(...) raised ValueError: SGD "
        "momentum 0.99 above 0.95 diverges"), problem


def test_the_preflight_trains_a_conditional_precision_with_the_classes_its_condition_builds(example_config,
                                                                                          monkeypatch):
    """A precision sampled only with SGD trained the model built with the first optimizer
    (adamw), and passed a float64 that SGD's trials could not train in (audit 41)."""
    from conftest import FIXTURES

    monkeypatch.syspath_prepend(str(FIXTURES))
    example_config["model"]["class_path"] = "userpkg.conditional:SGDNotIn64"
    conditional(example_config, **{"trainer.precision": {"type": "categorical", "choices": ["32-true", "64-true"],
                                                         "when": {"model.optimizer": "sgd"}}})
    del example_config["space"]["model.momentum"]
    problem = preflight_refusal(example_config)
    assert problem.field == "space.trainer.precision" and "sgd path cannot train in float64" in problem.message


def test_a_conditional_batch_fraction_that_leaves_no_batch_is_refused(example_config):
    """Not sampled at the preflight's values (adamw first), its range was never tried, and
    the trials with SGD failed in Lightning (audit 41)."""
    conditional(example_config, **{"trainer.limit_train_batches": {"type": "float", "low": 0.001, "high": 0.01,
                                                                   "when": {"model.optimizer": "sgd"}}})
    problem = preflight_refusal(example_config)
    assert problem.field == "space.trainer.limit_train_batches" and "0.001 of the" in problem.message, problem


@pytest.mark.parametrize("sampler, said", [("cmaes", True), ("tpe", False), ("random", False)])
def test_a_sampler_that_models_only_the_shared_parameters_says_it_samples_the_conditional_ones_at_random(
        example_config, sampler, said, recwarn):
    example_config["search"]["sampler"] = sampler
    check_sampler(load_config(conditional(example_config)))
    assert any("model.momentum (conditional) will be sampled at random" in str(w.message) for w in recwarn) == said


def test_status_leaves_a_value_not_sampled_out_of_the_shared_params_column():
    """Many parameters share one column at a narrow width: a conditional one the trial did
    not sample is left out of it, rather than shown as 'momentum=-'."""
    from rich.console import Console

    from hpsearch.search.status_view import _layout, _marked_not_sampled, _trials_table

    params = [f"model.p{index}" for index in range(8)] + ["model.momentum"]
    space = {**{key: {"type": "categorical", "choices": [None, 1.5, 2.5]} for key in params[:-1]},
             "model.momentum": {**MOMENTUM, "when": {"model.p1": [2.5]}}}
    rows = [{"trial": 0, "state": "COMPLETE", "best": 0.5, "epochs": 1, **{key: 1.5 for key in params[:-1]}},
            {"trial": 1, "state": "COMPLETE", "best": 0.6, "epochs": 1, **{key: 2.5 for key in params}}]
    rows[0]["model.p7"] = None  # a sampled null, which trials.csv leaves empty too: still shown (audit 41)
    rows = _marked_not_sampled(rows, space)
    console = Console(width=80, record=True)
    console.print(_trials_table("study", rows, params, "val_acc", *_layout(console, "study", rows, params, "val_acc")))
    shown = console.export_text()
    assert shown.count("momentum=") == 1 and "momentum=2.5" in shown and shown.count("p7=") == 2, shown
    assert "p7=-" in shown, shown


def test_check_says_each_parameters_condition(example_config):
    from hpsearch.search.cli import _said_with_condition

    conditional(example_config, **{"model.momentum": {**MOMENTUM, "when": {"model.optimizer": ["sgd"],
                                                                         "model.channels": [8, 16]}}})
    assert _said_with_condition(load_config(example_config))[-2:] == \
        ["model.optimizer", "model.momentum if model.optimizer=sgd and model.channels=8|16"]


@pytest.mark.e2e
def test_a_search_passes_a_conditional_value_only_to_the_trials_that_sample_it(tmp_path):
    """Through the command line: trials.csv, the checkpoints' hyperparameters and the
    optimizers, and TensorBoard's run names agree on which trials had a momentum."""
    import torch
    from conftest import run_cli, shrunk_example, write_yaml

    from hpsearch.search.trials_table import read_rows

    config = shrunk_example(tmp_path / "runs", **{
        "search/sampler": "random", "search/seed": 3, "scheduler/max_epochs": 2, "scheduler/type": "none",
        "space": {"model.lr": {"type": "float", "low": 0.01, "high": 0.1, "log": True},
                  "model.optimizer": OPTIMIZER, "model.momentum": MOMENTUM}})
    result = run_cli("run", str(write_yaml(tmp_path / "exp.yaml", config)), cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    exp_dir = tmp_path / "runs" / config["name"]
    rows = read_rows(exp_dir / "trials.csv")
    assert {row["model.optimizer"] for row in rows} == {"adamw", "sgd"}, rows
    for row in rows:
        sampled = row["model.optimizer"] == "sgd"
        assert (row["model.momentum"] != "") == sampled, row
        checkpoint = torch.load(exp_dir / "trials" / f"trial_{int(row['trial']):04d}" / "checkpoints" / "best.ckpt",
                                map_location="cpu", weights_only=False)
        momentum = checkpoint["hyper_parameters"]["momentum"]
        assert momentum == (row["model.momentum"] if sampled else 0.9), (row, momentum)  # else its default
        assert checkpoint["optimizer_states"][0]["param_groups"][0].get("momentum") == (momentum if sampled else None)
        [run] = (exp_dir / "tensorboard").glob(f"trial_{int(row['trial']):04d}-*")
        assert ("momentum=" in run.name) == sampled, run.name
