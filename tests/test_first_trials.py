"""``search.first_trials``: values to try before the sampler picks. Checked before anything
starts as points of the space, queued in the study once each (a resume adds the new
ones that fit under num_trials), and handed out before any sampled trial."""

from __future__ import annotations

import pytest

from conftest import preflight_refusal
from hpsearch.search.components import check_components
from hpsearch.search.config_loading import load_config
from hpsearch.search.errors import ConfigError
from hpsearch.search.outcome import PruneLog
from hpsearch.search.preflight import run_preflight
from hpsearch.search.searcher import OptunaSearcher, first_trials_to_queue, open_study, queue_first_trials

OPTIMIZER = {"type": "categorical", "choices": ["adamw", "sgd"]}
MOMENTUM = {"type": "float", "low": 0.5, "high": 0.99, "when": {"model.optimizer": "sgd"}}


def with_first_trials(example_config, *points, **space):
    example_config["space"] = {**example_config["space"], "model.optimizer": OPTIMIZER, "model.momentum": MOMENTUM,
                               **space}
    example_config["search"]["first_trials"] = list(points)
    return example_config


def refusal(config) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    [problem] = caught.value.problems
    return str(problem)


@pytest.mark.parametrize("points, space, search, expected", [
    ([{"model.lrr": 0.01}], {}, {}, "search.first_trials.0.model.lrr: is not a searched parameter (searched: model.lr"),
    ([{"model.lr": 0.5}], {}, {}, "search.first_trials.0.model.lr: 0.5 is outside the range [0.0001, 0.1] "
                                  "(space.model.lr)"),
    ([{"model.lr": "0.01"}], {}, {}, "search.first_trials.0.model.lr: a number is needed, not the string '0.01'"),
    ([{"model.lr": [0.01]}], {}, {}, "search.first_trials.0.model.lr: is a list: a trial gives each parameter one"),
    ([{"model": {"lr": 0.01}}], {}, {}, "search.first_trials.0.model: is a mapping: name each parameter by its whole "
                                        "dotted key, as the space does (model.lr: ...)"),
    ([{"model.channels": 12}], {}, {},
     "search.first_trials.0.model.channels: 12 is not one of the choices [8, 16, 32]"),
    ([{"data.batch_size": 64.0}], {}, {}, "search.first_trials.0.data.batch_size: a whole number is needed, not 64.0"),
    ([{"data.batch_size": 65}], {"data.batch_size": {"type": "int", "low": 32, "high": 256, "step": 2}}, {},
     "65 is not low (32) plus whole steps of 2"),
    ([{"model.dropout": 0.25}], {"model.dropout": {"type": "float", "low": 0.0, "high": 0.5, "step": 0.1}}, {},
     "0.25 is not low (0.0) plus whole steps of 0.1"),
    ([{"model.optimizer": True}], {}, {}, "True is not one of the choices ['adamw', 'sgd'] (YAML reads yes/no"),
    ([{"model.momentum": 0.9}], {}, {}, "search.first_trials.0.model.momentum: is sampled only when "
                                        "model.optimizer=sgd, and this trial does not give model.optimizer"),
    ([{"model.optimizer": "adamw", "model.momentum": 0.9}], {}, {}, "and this trial gives model.optimizer='adamw'"),
    ([{}], {}, {}, "search.first_trials.0: is empty"),
    ([{"model.lr": 0.01}, {"model.lr": 0.02}, {"model.lr": 0.01}], {}, {},
     "search.first_trials.2: repeats search.first_trials.0"),
    ([{"model.lr": 0.01}, {"model.lr": 0.02}], {}, {"num_trials": 1},
     "search.first_trials: 2 trials given, more than search.num_trials (1)"),
    ([{"model.lr": 0.01}], {"model.momentum": {**MOMENTUM, "when": None, "step": 0.01},
                            "model.lr": {"type": "float", "low": 0.01, "high": 0.1, "step": 0.01}},
     {"sampler": "grid"}, "search.first_trials: sampler 'grid' runs every point of its grid"),
])
def test_a_first_trial_the_search_could_not_have_sampled_is_refused_naming_its_field(
        example_config, points, space, search, expected):
    with_first_trials(example_config, *points, **space)
    example_config["search"].update(search)
    assert expected in refusal(example_config)


def test_first_trials_null_is_none(example_config):
    """A ``first_trials:`` key whose items are all commented out reads as null."""
    example_config["search"]["first_trials"] = None
    assert load_config(example_config).search.first_trials == []


def test_a_first_trial_is_kept_as_the_sampler_would_give_it(example_config):
    """A whole number for a float parameter is kept as a float (a repeat is then found by
    value), and a chain's values may be given together."""
    config = load_config(with_first_trials(example_config, {"model.lr": 1, "model.optimizer": "sgd",
                                                            "model.momentum": 0.9},
                                           **{"model.lr": {"type": "float", "low": 0.5, "high": 2.0}}))
    [point] = config.search.first_trials
    assert point == {"model.lr": 1.0, "model.optimizer": "sgd", "model.momentum": 0.9}
    assert isinstance(point["model.lr"], float)
    example_config["search"]["first_trials"].append({"model.lr": 1.0, "model.optimizer": "sgd",
                                                      "model.momentum": 0.9})
    assert "search.first_trials.1: repeats search.first_trials.0" in refusal(example_config)


def test_a_refusal_names_the_line_of_the_first_trial_or_the_option_that_gave_it(example_config, tmp_path):
    from conftest import write_yaml

    path = write_yaml(tmp_path / "exp.yaml", with_first_trials(example_config, {"model.lr": 0.01},
                                                               {"model.lr": 0.5}))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    [problem] = caught.value.problems
    lines = path.read_text().splitlines()
    assert problem.field == "search.first_trials.1.model.lr" and "0.5" in lines[problem.line - 1], problem
    # an item written as a block, its keys on lines of their own: the key's own line
    example_config["search"]["first_trials"] = [{"model.channels": 8, "model.lr": 0.5}]
    path.write_text(path.read_text().split("  first_trials:")[0] + "  first_trials:\n  - model.channels: 8\n"
                    "    model.lr: 0.5\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    [problem] = caught.value.problems
    lines = path.read_text().splitlines()
    assert lines[problem.line - 1] == "    model.lr: 0.5", (problem, lines)
    # given again by --set: the file's line of the trial it replaced would name the wrong one
    with pytest.raises(ConfigError) as caught:
        load_config(path, ["search.first_trials=[{model.lr: 0.7}]"])
    [problem] = caught.value.problems
    assert (problem.field, problem.line, problem.source) == ("search.first_trials.0.model.lr", None, "--set"), problem


def test_set_reaches_into_one_first_trial_adds_one_or_replaces_one(example_config, tmp_path):
    """``--set search.first_trials.1.model.lr=0.05`` changes one value of one item; the next
    place adds an item; a whole item given replaces it. It used to replace the whole list."""
    from conftest import write_yaml

    path = write_yaml(tmp_path / "exp.yaml", with_first_trials(example_config, {"model.lr": 0.01},
                                                               {"model.lr": 0.02, "model.channels": 8}))
    config = load_config(path, ["search.first_trials.1.model.lr=0.05", "search.first_trials.2.model.lr=0.07"])
    assert config.search.first_trials == [{"model.lr": 0.01}, {"model.lr": 0.05, "model.channels": 8},
                                          {"model.lr": 0.07}]
    config = load_config(path, ["search.first_trials.1={model.channels: 16}"])
    assert config.search.first_trials == [{"model.lr": 0.01}, {"model.channels": 16}]
    assert load_config(path, ["search.first_trials.0=null"]).search.first_trials == [  # taken out
        {"model.lr": 0.02, "model.channels": 8}]
    # a list the file lacks starts at place 0, reached into or given whole (audit 46: a dict was made)
    example_config["search"].pop("first_trials")
    config = load_config(example_config, {"search.first_trials.0.model.lr": 0.03})
    assert config.search.first_trials == [{"model.lr": 0.03}]
    config = load_config(example_config, ["search.first_trials.0={model.lr: 0.03}",
                                          "search.first_trials.1.model.lr=0.04"])
    assert config.search.first_trials == [{"model.lr": 0.03}, {"model.lr": 0.04}]
    assert load_config(example_config, ["model.init_args.sizes.0=32"]).model.init_args["sizes"] == [32]
    with pytest.raises(ConfigError) as caught:
        load_config(path, ["search.first_trials.3.model.lr=0.05"])
    assert str(caught.value.problems[0]) == (
        "search.first_trials.3.model.lr (--set): search.first_trials is a list: its items are search.first_trials.0 "
        "to search.first_trials.1, and search.first_trials.2 adds one"), caught.value.problems
    for place in ("1", "x"):  # a list the file lacks, reached past its start (audit 45) or by a name (audit 46)
        with pytest.raises(ConfigError) as caught:
            load_config(example_config, {f"search.first_trials.{place}.model.lr": 0.05})
        assert str(caught.value.problems[0]) == (f"search.first_trials.{place}.model.lr (overrides): search."
                                                 "first_trials is a list: it is empty; search.first_trials.0 adds one")
    # null takes a value out of a first trial, which then samples it (audit 45: it was refused as a choice)
    config = load_config(path, ["search.first_trials.1.model.channels=null"])
    assert config.search.first_trials == [{"model.lr": 0.01}, {"model.lr": 0.02}]


def test_an_error_in_a_first_trial_set_by_the_command_line_blames_it_and_the_others_keep_their_lines(
        example_config, tmp_path):
    from conftest import write_yaml

    path = write_yaml(tmp_path / "exp.yaml", with_first_trials(example_config, {"model.lr": 0.5},
                                                               {"model.lr": 0.02, "model.channels": 8}))
    lines = path.read_text().splitlines()

    def problem(*overrides):
        with pytest.raises(ConfigError) as caught:
            load_config(path, list(overrides))
        [problem] = caught.value.problems
        return problem.field, problem.line and lines[problem.line - 1].strip(), problem.source

    # item 0's value, in the file, keeps its line; item 1's, set here, is the option's
    assert problem("search.first_trials.1.model.channels=12") == (
        "search.first_trials.0.model.lr", "- model.lr: 0.5", str(path))
    assert problem("search.first_trials.0.model.lr=0.01", "search.first_trials.1.model.lr=0.9") == (
        "search.first_trials.1.model.lr", None, "--set")
    # an item replaced whole: its file line, now another item's value, is not named
    assert problem("search.first_trials.0.model.lr=0.01", "search.first_trials.1={model.channels: 12}") == (
        "search.first_trials.1.model.channels", None, "--set")


def test_taking_first_trials_out_keeps_the_order_given_and_the_files_lines(example_config, tmp_path):
    """``--set search.first_trials.N=null`` moves the later trials up a place: overrides apply
    in the order given, a key given twice twice (they were merged by key, audit 47), and an
    error in a trial the file gives still names its line, not the option (audit 47)."""
    from conftest import write_yaml

    path = write_yaml(tmp_path / "exp.yaml", with_first_trials(example_config, {"model.lr": 0.01},
                                                               {"model.lr": 0.02}, {"model.lr": 0.5}))
    drop_three = ["search.first_trials.2=null", "search.first_trials.0=null", "search.first_trials.0=null"]
    assert load_config(path, drop_three).search.first_trials == []
    assert load_config(path, ["search.first_trials.2=null", "search.first_trials.1.model.lr=0.05",
                              "search.first_trials.0=null", "search.first_trials.1.model.lr=0.06"]
                       ).search.first_trials == [{"model.lr": 0.05}, {"model.lr": 0.06}]
    lines = path.read_text().splitlines()
    with pytest.raises(ConfigError) as caught:
        load_config(path, ["search.first_trials.0=null"])
    [problem] = caught.value.problems
    assert problem.field == "search.first_trials.1.model.lr" and problem.source == str(path), problem
    assert "0.5" in lines[problem.line - 1], (problem, lines)
    with pytest.raises(ConfigError) as caught:
        load_config(path, ["search.first_trials.3=null"])
    assert str(caught.value.problems[0]) == ("search.first_trials.3 (--set): there is no search.first_trials.3 to "
                                             "take out")
    # elsewhere null is a value: a null choice, as before
    assert load_config(path, ["search.first_trials.2=null", "space.model.channels.choices.0=null"]
                       ).space["model.channels"].choices == [None, 16, 32]


def test_set_reaches_into_a_condition(example_config):
    """``--set space.model.momentum.when.model.optimizer=adamw``: the condition's key holds a dot."""
    config = load_config(with_first_trials(example_config), ["space.model.momentum.when.model.optimizer=adamw"])
    assert config.space["model.momentum"].when == {"model.optimizer": ["adamw"]}


def test_first_trials_are_handed_out_first_with_the_rest_sampled(example_config, tmp_path):
    config = load_config(with_first_trials(example_config, {"model.lr": 0.002, "model.optimizer": "adamw"},
                                           {"model.optimizer": "sgd", "model.momentum": 0.95, "model.channels": 8}))
    study = open_study(tmp_path, config.name, config.mode)
    assert queue_first_trials(study, config) == {0: 0, 1: 1}
    assert queue_first_trials(study, config) == {}  # once: a second session's start queues nothing
    searcher = OptunaSearcher(config, tmp_path, PruneLog())
    first, second, third = (searcher.suggest(str(index))["params"] for index in range(3))
    assert first["model.lr"] == 0.002 and first["model.optimizer"] == "adamw" and "model.momentum" not in first
    assert set(first) == {"model.lr", "model.optimizer", "model.channels", "data.batch_size"}  # the others sampled
    assert (second["model.optimizer"], second["model.momentum"], second["model.channels"]) == ("sgd", 0.95, 8)
    assert set(second) == set(config.space)
    assert third["model.lr"] not in (0.002,) and len(open_study(tmp_path, config.name, config.mode).trials) == 3


@pytest.mark.parametrize("sampler", ["random", "tpe"])
def test_a_resumed_session_draws_anew_for_what_its_first_trials_leave_out(example_config, tmp_path, sampler):
    """The seed offset counted the queued first trials, which had drawn nothing: a resume
    that had handed out one trial since found as many trials as the first session had, and
    gave the next first trial the draws of the one before (audit 42)."""
    example_config["search"].update(sampler=sampler, num_trials=6)
    config = load_config(with_first_trials(example_config, {"model.lr": 0.01}, {"model.lr": 0.02},
                                           {"model.lr": 0.03}))
    queue_first_trials(open_study(tmp_path, config.name, config.mode), config)
    drawn = []
    for session in range(3):  # each session hands out one trial, which ends, and is stopped
        searcher = OptunaSearcher(config, tmp_path, PruneLog())
        params = searcher.suggest(str(session))["params"]
        searcher.on_trial_complete(str(session), {"val_acc": 0.5, "epoch": 1, "hps_finished": True})
        assert params["model.lr"] == [0.01, 0.02, 0.03][session]
        drawn.append((params["model.channels"], params["data.batch_size"]))
    assert len(set(drawn)) == 3, drawn


def test_a_resume_queues_the_first_trials_the_study_lacks_while_num_trials_leaves_room(example_config, tmp_path):
    """A first trial is known by its values: one given before is not run again, an edited
    one is new; beyond num_trials, it is left out (and the resume says so)."""
    config = load_config(with_first_trials(example_config, {"model.lr": 0.002}, {"model.lr": 0.003}))
    study = open_study(tmp_path, config.name, config.mode)
    queue_first_trials(study, config)
    resumed = load_config(example_config, ["search.num_trials=4", "search.first_trials=[{model.lr: 0.003}, "
                                           "{model.lr: 0.004}, {model.lr: 0.005}, {model.lr: 0.006}]"])
    assert first_trials_to_queue(study, resumed) == ([1, 2], [3])
    assert queue_first_trials(study, resumed) == {1: 2, 2: 3}
    assert [t.user_attrs["hps_first_trial"]["model.lr"] for t in study.trials] == [0.002, 0.003, 0.004, 0.005]
    assert first_trials_to_queue(study, resumed) == ([], [3])


def test_a_resume_says_which_first_trials_do_not_fit_and_the_resume_that_runs_them(example_config, tmp_path):
    """It said "the study already has its num_trials (5) trials" of a study of 4, whose
    fifth was the first trial this resume queued; and a resume that runs no session keeps
    experiment.yaml, so raising num_trials alone next time ran a sampled trial (audit 42)."""
    from hpsearch.search.api import _first_trials_that_fit

    config = load_config(with_first_trials(example_config, {"model.lr": 0.002}, {"model.lr": 0.003}))
    study = open_study(tmp_path, config.name, config.mode)
    queue_first_trials(study, config)
    for _ in range(4):
        study.ask()  # the two queued handed out, then two sampled: the study holds 4
    resumed = load_config(example_config, ["search.num_trials=5", "search.first_trials=[{model.lr: 0.004}, "
                                           "{model.lr: 0.005}, {model.lr: 0.006}]"])
    with pytest.warns(UserWarning) as said:
        assert _first_trials_that_fit(study, resumed) == [0]
    assert str(said[0].message) == (
        "search.first_trials.1, search.first_trials.2 will not run: search.num_trials (5) leaves room for 1 more "
        "trial besides the study's 4; resume with --set search.num_trials=7 and this search.first_trials to run them")


def test_a_first_trial_an_earlier_session_queued_is_said_to_run_first(example_config, tmp_path, capsys):
    """Optuna's queue has no way to take a trial out: one queued by a session that ended
    before running it runs, though the list given now no longer holds it (audit 42)."""
    from hpsearch.search.api import _queue_first_trials
    from hpsearch.search.experiment import ExperimentDir

    exp = ExperimentDir.make(tmp_path / "study")
    _queue_first_trials(exp, load_config(with_first_trials(example_config, {"model.lr": 0.002}, {"model.lr": 0.003})))
    assert "running 2 trials with given values first: trial 0 (search.first_trials.0), 1 " in capsys.readouterr().out
    _queue_first_trials(exp, load_config(example_config, ["search.first_trials=[{model.lr: 0.003}, "
                                                          "{model.lr: 0.004}]"]))
    assert capsys.readouterr().out.splitlines() == [
        "running 1 trial with given values first: trial 2 (search.first_trials.1)",
        "trial 0 still runs first the values an earlier session's search.first_trials gave (queued before it ended)"]


def test_the_preflight_refuses_a_first_trial_a_constructor_refuses(example_config, monkeypatch):
    """WideNeedsSmallSteps refuses 32 channels with a learning rate above 0.01: every value
    of each range and choice passes alone (the other values as the preflight's trial has
    them), and only a first trial gives both."""
    from conftest import FIXTURES

    monkeypatch.syspath_prepend(str(FIXTURES))
    example_config["model"] = {"class_path": "userpkg.conditional:WideNeedsSmallSteps", "init_args": {}}
    with_first_trials(example_config, {"model.channels": 32, "model.lr": 0.001},
                      {"model.channels": 32, "model.lr": 0.05})
    problem = preflight_refusal(example_config)
    assert problem.field == "search.first_trials.1" and problem.message == (
        "its values are in the space, but WideNeedsSmallSteps(...) raised ValueError: 32 channels diverge at lr "
        "0.05"), problem
    example_config["search"]["first_trials"].pop()
    assert "val_acc" in run_preflight(load_config(example_config), *check_components(load_config(example_config)))


def test_the_preflight_builds_a_first_trials_data_values_too(example_config, monkeypatch):
    """SmallBatchesForLargeValidation refuses batches of 128 or more with a validation split
    of 0.4 or more: a first trial that gives both is refused, naming it."""
    from conftest import FIXTURES

    monkeypatch.syspath_prepend(str(FIXTURES))
    example_config["data"] = {"class_path": "userpkg.conditional:SmallBatchesForLargeValidation", "init_args": {}}
    with_first_trials(example_config, {"data.batch_size": 64, "data.val_fraction": 0.4},
                      {"data.batch_size": 128, "data.val_fraction": 0.4},
                      **{"data.val_fraction": {"type": "float", "low": 0.1, "high": 0.4}})
    problem = preflight_refusal(example_config)
    assert problem.field == "search.first_trials.1" and problem.message == (
        "its values are in the space, but SmallBatchesForLargeValidation(...) raised ValueError: batch_size 128 with "
        "val_fraction 0.4 leaves too few batches"), problem


def test_the_preflight_trains_a_first_trial_whose_optimizer_refuses_its_values(example_config, monkeypatch):
    """PlateauScheduled's scheduler, made in configure_optimizers, refuses a factor of 2.0,
    which its constructor takes: a first trial that gives it would fail for certain, and
    passed the checks, which trained only the preflight's own values (audit 45)."""
    from conftest import FIXTURES

    monkeypatch.syspath_prepend(str(FIXTURES))
    example_config["model"] = {"class_path": "userpkg.conditional:PlateauScheduled", "init_args": {}}
    with_first_trials(example_config, {"model.factor": 0.5}, {"model.factor": 2.0, "model.lr": 0.01},
                      **{"model.factor": {"type": "categorical", "choices": [0.5, 2.0]}})
    problem = preflight_refusal(example_config)
    assert problem.field == "search.first_trials.1" and problem.message.startswith(
        "its values are in the space, but the set-up before the first batch failed: ValueError: Factor should be "
        "< 1.0."), problem
    assert "model.factor=2.0" in problem.message and "model.lr=0.01" in problem.message, problem
    example_config["search"]["first_trials"].pop()
    assert "val_acc" in run_preflight(load_config(example_config), *check_components(load_config(example_config)))


def test_check_says_how_many_trials_run_given_values_first(example_config):
    from hpsearch.search.cli import _given_first

    assert _given_first(load_config(with_first_trials(example_config, {"model.lr": 0.002}))) == \
        " (1 with the values search.first_trials gives, first)"
    assert _given_first(load_config(with_first_trials(example_config))) == ""


@pytest.mark.e2e
def test_a_search_runs_its_first_trials_first_and_a_resume_adds_new_ones(tmp_path):
    """Through the command line: the given values reach the trials (trials.csv, the
    checkpoint's hyperparameters); a resume with room runs a new one and not the old; one
    without room runs nothing and says why."""
    import torch
    from conftest import run_cli, shrunk_example, write_yaml

    from hpsearch.search.trials_table import read_rows

    config = shrunk_example(tmp_path / "runs", **{
        "search/num_trials": 3, "scheduler/max_epochs": 1, "scheduler/type": "none",
        "search/first_trials": [{"model.lr": 0.002, "model.channels": 8}, {"data.batch_size": 100}]})
    result = run_cli("run", str(write_yaml(tmp_path / "exp.yaml", config)), cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "running 2 trials with given values first: trial 0 (search.first_trials.0), 1 (search.first_trials.1)" \
        in result.stdout, result.stdout
    exp_dir = tmp_path / "runs" / config["name"]
    rows = {int(row["trial"]): row for row in read_rows(exp_dir / "trials.csv")}
    assert (rows[0]["model.lr"], rows[0]["model.channels"], rows[1]["data.batch_size"]) == (0.002, 8, 100), rows
    checkpoint = torch.load(exp_dir / "trials" / "trial_0000" / "checkpoints" / "best.ckpt", map_location="cpu",
                            weights_only=False)
    assert (checkpoint["hyper_parameters"]["lr"], checkpoint["hyper_parameters"]["channels"]) == (0.002, 8)

    again = ["search.first_trials=[{model.lr: 0.002, model.channels: 8}, {model.lr: 0.05, model.channels: 32}]"]
    result = run_cli("resume", str(exp_dir), "--set", "search.num_trials=4", "--set", again[0], cwd=tmp_path,
                     timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "running 1 trial with given values first: trial 3 (search.first_trials.1)" in result.stdout, result.stdout
    rows = {int(row["trial"]): row for row in read_rows(exp_dir / "trials.csv")}
    assert len(rows) == 4 and (rows[3]["model.lr"], rows[3]["model.channels"]) == (0.05, 32), rows

    result = run_cli("resume", str(exp_dir), "--set", "search.first_trials=[{model.lr: 0.07}]", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "search.first_trials.0 will not run: the study holds 4 trials, all that search.num_trials (4) allows; " \
           "resume with --set search.num_trials=5 and this search.first_trials to run it" in result.stderr, \
        result.stderr
    assert len(read_rows(exp_dir / "trials.csv")) == 4


def test_status_counts_the_trials_queued_in_the_study(example_config, tmp_path):
    """A session stopped before handing its first trials out left them only in the journal:
    status said "1 trial: 1 paused" of a study with two more to run (audit 42)."""
    from rich.console import Console

    from hpsearch.search.api import _queue_first_trials
    from hpsearch.search.experiment import ExperimentDir, write_config
    from hpsearch.search.status_view import print_status

    config = load_config(with_first_trials(example_config, {"model.lr": 0.002}, {"model.lr": 0.003}))
    exp = ExperimentDir.make(tmp_path / "study")
    write_config(exp, config.model_dump(mode="json"))
    _queue_first_trials(exp, config)

    def said() -> str:
        console = Console(width=300, record=True)
        print_status(exp, console)
        return console.export_text()

    assert "no trial has started yet" in said() and "2 more trials are queued in the study to run first" in said()
    open_study(exp.root, config.name, config.mode).ask()  # one handed out (it pops the queue's first)
    assert "1 more trial is queued in the study to run first" in said()


def test_the_preflight_builds_each_first_trials_classes_once(example_config, monkeypatch):
    """A first trial's classes are built once, for real, and trained: they were built on the
    meta device first, and a DataModule that loads its data in its constructor loaded it
    twice per first trial."""
    from hpsearch.search import preflight

    builds = []
    build_datamodule = preflight.build_datamodule
    monkeypatch.setattr(preflight, "build_datamodule", lambda config, data_class, params, loader: (
        builds.append(params["data.batch_size"]), build_datamodule(config, data_class, params, loader))[1])
    with_first_trials(example_config, {"data.batch_size": 48, "model.lr": 0.01}, {"data.batch_size": 40})
    example_config["space"]["data.batch_size"] = {"type": "int", "low": 32, "high": 64}
    config = load_config(example_config)
    assert "val_acc" in run_preflight(config, *check_components(config))
    assert builds.count(48) == 1 and builds.count(40) == 1, builds


def test_a_first_trial_is_trained_on_a_model_of_its_own(example_config):
    """The preflight's model, trained in each precision the space searches, was converted to
    doubles by ``64-true``; a first trial with the preflight's own model values (or only
    trainer values) was trained on it and refused: "Input type (float) and bias type
    (double) should be the same" (audit 50)."""
    from hpsearch.search.preflight import representative_params

    example_config["space"]["trainer.gradient_clip_val"] = {"type": "float", "low": 0.1, "high": 1.0}
    example_config["space"]["trainer.precision"] = {"type": "categorical", "choices": ["32-true", "64-true"]}
    own = representative_params(load_config(example_config))
    example_config["search"]["first_trials"] = [own, {"trainer.gradient_clip_val": 0.9},
                                                {"trainer.precision": "64-true"}]
    config = load_config(example_config)
    assert "val_acc" in run_preflight(config, *check_components(config))
