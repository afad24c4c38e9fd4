"""The Optuna searcher and the outcome rules, driven directly with Tune-shaped results (no Ray cluster)."""

from __future__ import annotations

import math

import pytest
from ray.tune.search import Searcher

from hpsearch.search.config_loading import load_config
from hpsearch.search.outcome import COMPLETE, FAILED, PRUNED, TRIAL_NUMBER, PruneLog, classify
from hpsearch.search.searcher import OptunaSearcher, open_study


@pytest.fixture
def config(example_config):
    example_config["search"].update(num_trials=3, max_concurrent=1)
    return load_config(example_config)


def result(epoch, value, finished=False, reason=""):
    return {"epoch": epoch, "val_acc": value, "hps_finished": finished, "hps_stop_reason": reason}


def states(tmp_path, config):
    study = open_study(tmp_path, config.name, config.mode)
    return [(t.state.name, t.value) for t in study.get_trials()]


def test_complete_pruned_and_failed_trials_reach_optuna_as_such(tmp_path, config):
    prunes = PruneLog()
    searcher = OptunaSearcher(config, tmp_path, prunes)
    ids = ["a", "b", "c"]
    suggestions = [searcher.suggest(i) for i in ids]
    assert [s["hps_trial_number"] for s in suggestions] == [0, 1, 2]
    assert searcher.suggest("d") == Searcher.FINISHED

    searcher.on_trial_result("a", result(1, 0.5))
    searcher.on_trial_complete("a", result(2, 0.7, finished=True, reason="max_epochs"))
    searcher.on_trial_result("b", result(1, 0.2))
    prunes.record("b", 1)
    searcher.on_trial_complete("b", result(1, 0.2))
    searcher.on_trial_complete("c", None, error=True)

    assert states(tmp_path, config) == [("COMPLETE", 0.7), ("PRUNED", 0.2), ("FAIL", None)]
    study = open_study(tmp_path, config.name, config.mode)
    assert study.trials[1].user_attrs["hps_stop_reason"] == "pruned by ASHA after epoch 1"
    assert study.trials[0].intermediate_values == {1: 0.5, 2: 0.7}


def test_complete_value_is_the_best_epoch_not_the_last(tmp_path, config):
    searcher = OptunaSearcher(config, tmp_path, PruneLog())
    searcher.suggest("a")
    searcher.on_trial_result("a", result(1, 0.9))
    searcher.on_trial_complete("a", result(2, 0.6, finished=True, reason="early_stopping"))
    assert states(tmp_path, config)[0] == ("COMPLETE", 0.9)


def test_a_resumed_studys_table_keeps_a_pruned_trials_best_epoch_not_its_last(tmp_path, config):
    """Each session rebuilds trials.csv's finished rows from the study; a PRUNED trial's
    value there is its last epoch's (Optuna's rule), and it overwrote the best one."""
    prunes = PruneLog()
    searcher = OptunaSearcher(config, tmp_path, prunes)
    searcher.suggest("a")
    for epoch, value in enumerate([0.33, 0.55, 0.30], start=1):
        searcher.on_trial_result("a", result(epoch, value))
    prunes.record("a", 3)
    searcher.on_trial_complete("a", result(3, 0.30))
    rows = OptunaSearcher(config, tmp_path, PruneLog()).finished_trials()  # the next session's
    assert [(r["state"], r["best"], r["last"]) for r in rows] == [("PRUNED", 0.55, 0.30)]


def test_a_fresh_searcher_resumes_interrupted_trials_first_and_keeps_the_limit(tmp_path, config):
    first = OptunaSearcher(config, tmp_path, PruneLog())
    first.suggest("a")
    first.on_trial_complete("a", result(3, 0.8, finished=True))
    interrupted = first.suggest("b")  # running when the driver died
    assert interrupted["hps_known_epochs"] == 0
    first.on_trial_result("b", result(1, 0.6))
    first.on_trial_result("b", result(2, 0.7))

    second = OptunaSearcher(config, tmp_path, PruneLog())
    again = second.suggest("b2")
    # same number, same params: it continues, not duplicated; told the epochs the study has
    assert again == {**interrupted, "hps_known_epochs": 2}
    new = second.suggest("c2")
    assert new["hps_trial_number"] == 2
    assert second.suggest("d2") == Searcher.FINISHED
    assert len(open_study(tmp_path, config.name, config.mode).trials) == 3
    # trials.csv, written every few seconds, had only the first of them at a kill: the
    # second is sent again, or its time would never reach the trial's compute_s
    third = OptunaSearcher(config, tmp_path, PruneLog())
    third.epochs_recorded({1: {"trial": 1, "epochs": 1}})
    assert third.suggest("b3") == {**interrupted, "hps_known_epochs": 1}


def test_a_trial_interrupted_while_being_sampled_resumes_with_every_value_of_the_space(tmp_path, config):
    """Each sampled value is a journal record of its own: a driver killed between them left
    a RUNNING trial with some values, which resumed with the model's defaults for the rest
    and could become the best trial, its best.json naming only the values it had."""
    space = OptunaSearcher(config, tmp_path, PruneLog()).distributions
    first = next(iter(space))
    partial = open_study(tmp_path, config.name, config.mode).ask()  # RUNNING, as the kill left it
    partial.suggest_float(first, space[first].low, space[first].high, log=space[first].log)
    given = partial.params[first]

    resumed = OptunaSearcher(config, tmp_path, PruneLog()).suggest("b")
    assert resumed["hps_trial_number"] == partial.number and set(resumed["params"]) == set(space), resumed
    assert resumed["params"][first] == given  # what it had stays
    stored = open_study(tmp_path, config.name, config.mode).trials[partial.number]
    assert set(stored.params) == set(space) and stored.state.name == "RUNNING"


def test_a_trial_the_table_has_finished_and_the_study_lost_the_end_of_is_not_trained_again(tmp_path, config):
    """A kill mid-append tore the journal's record of a trial's end, and resume dropped it:
    the study had the trial RUNNING, trials.csv had it COMPLETE, and a later resume trained
    it again, over its best.ckpt."""
    first = OptunaSearcher(config, tmp_path, PruneLog())
    first.suggest("a")
    for epoch, value in ((1, 0.6), (2, 0.8), (3, 0.7)):
        first.on_trial_result("a", result(epoch, value))  # its end, never recorded

    second = OptunaSearcher(config, tmp_path, PruneLog())
    assert second.settle_finished({0: {"trial": 0, "state": "COMPLETE", "reason": "max_epochs", "epochs": 3,
                                       "best": 0.8}}) == [0]
    [trial] = open_study(tmp_path, config.name, config.mode).trials
    assert (trial.state.name, trial.value, trial.user_attrs["hps_stop_reason"]) == ("COMPLETE", 0.8, "max_epochs")
    assert second.suggest("b")["hps_trial_number"] == 1  # a new trial, not trial 0 again


def test_random_sampler_does_not_replay_its_samples_after_resume(tmp_path, example_config):
    example_config["search"].update(num_trials=4, sampler="random")
    config = load_config(example_config)
    first = OptunaSearcher(config, tmp_path, PruneLog())
    a = first.suggest("a")["params"]
    first.on_trial_complete("a", result(1, 0.5, finished=True))
    second = OptunaSearcher(config, tmp_path, PruneLog())
    b = second.suggest("b")["params"]
    assert a != b


def test_history_feeds_asha(tmp_path, config):
    searcher = OptunaSearcher(config, tmp_path, PruneLog())
    searcher.suggest("a")
    searcher.on_trial_result("a", result(1, 0.4))
    assert searcher.history() == {0: {1: 0.4}}


def test_searcher_survives_pickling_without_its_open_study(tmp_path, config):
    import pickle

    searcher = OptunaSearcher(config, tmp_path, PruneLog())
    searcher.suggest("a")
    clone = pickle.loads(pickle.dumps(searcher))
    assert clone._study is None and clone.suggest("a")["hps_trial_number"] == 0


@pytest.mark.parametrize("trial_result, error, pruned, expected", [
    (result(3, 0.9, finished=True, reason="early_stopping"), False, False, (COMPLETE, "early_stopping")),
    (result(1, 0.3), False, True, (PRUNED, "pruned by ASHA after epoch 1")),
    (result(2, 0.3), False, False, (PRUNED, "stopped after epoch 2")),
    (result(2, math.nan), False, False, (FAILED, "val_acc is not finite (nan)")),
    (None, True, False, (FAILED, "error")),
])
def test_classify(trial_result, error, pruned, expected):
    prunes = PruneLog()
    if pruned:
        prunes.record("t", 1)
    outcome = classify("t", trial_result, error, "val_acc", prunes)
    assert (outcome.state, outcome.reason) == expected


def test_best_json_gives_the_values_exactly_as_sampled(tmp_path, example_config):
    """trials.csv shows values for reading (6 digits, None as an empty cell); best.json and
    the test evaluation must get the sampled ones back."""
    import json

    from hpsearch.search.experiment import ExperimentDir
    from hpsearch.search.results import finalize
    from hpsearch.search.trials_table import TrialsTable

    example_config["space"] = {"model.lr": {"type": "float", "low": 1e-4, "high": 0.1, "log": True},
                               "model.optimizer": {"type": "categorical", "choices": [None]},
                               "data.split_seed": {"type": "categorical", "choices": ["007"]}}
    example_config["search"].update(num_trials=1, max_concurrent=1)
    config = load_config(example_config)
    searcher = OptunaSearcher(config, tmp_path, PruneLog())
    sampled = searcher.suggest("a")["params"]
    searcher.on_trial_complete("a", result(1, 0.9, finished=True, reason="max_epochs"))
    table = TrialsTable(config.metric, config.mode, list(config.space))
    table.row(0).update(state="COMPLETE", best=0.9, device="cpu", precision="bf16-mixed", num_workers=1,
                        pin_memory=False, **sampled)
    table.save(tmp_path / "trials.csv")
    assert TrialsTable.load(tmp_path / "trials.csv", config.metric, config.mode, list(config.space)).rows[0] \
        .get("data.split_seed") == "007"  # read back as written, no longer as the number 7

    best = finalize(config, ExperimentDir(tmp_path))
    assert best["params"] == sampled == json.loads((tmp_path / "best.json").read_text())["params"]
    assert sampled["model.optimizer"] is None and sampled["data.split_seed"] == "007"
    assert best["config"]["data"]["init_args"]["split_seed"] == "007"
    # the loader it had, not "auto": another worker count draws other seeds (audit 80)
    assert (best["config"]["loader"]["num_workers"], best["config"]["loader"]["pin_memory"]) == (1, False)
    assert best["ahead"] is None
    assert (best["device"], best["precision"]) == ("cpu", "bf16-mixed")  # what it ran with (audit 33)
    # A pruned trial that scored better is named in best.json, though it is not the best (audit 33).
    table.row(1).update(state="PRUNED", best=0.95, epochs=1, **sampled)
    table.save(tmp_path / "trials.csv")
    best = finalize(config, ExperimentDir(tmp_path))
    assert best["trial"] == 0 and best["ahead"] == {"trial": 1, "state": "PRUNED", "value": 0.95, "epochs": 1}
    # and a trial that failed after a better epoch (audit 74)
    table.row(2).update(state="FAILED", best=0.97, epochs=2, **sampled)
    table.save(tmp_path / "trials.csv")
    best = finalize(config, ExperimentDir(tmp_path))
    assert best["trial"] == 0 and best["ahead"] == {"trial": 2, "state": "FAILED", "value": 0.97, "epochs": 2}


def test_a_trial_sampled_but_not_started_when_the_session_ends_is_paused_with_the_running(tmp_path, example_config):
    """A trial gets its row when it starts: one the study had handed out, still waiting
    for its worker when the time budget ran out, was missing from trials.csv, status and
    the count of paused trials, though resume went on to continue it (audit 22)."""
    from hpsearch.search.trials_table import TrialsTable
    from hpsearch.search.tuner import pause_the_unfinished

    config = load_config(example_config)
    searcher = OptunaSearcher(config, tmp_path, PruneLog())
    started = searcher.suggest("a")
    waiting = searcher.suggest("b")  # handed out; its trial never started
    table = TrialsTable(config.metric, config.mode, list(config.space))
    table.row(started[TRIAL_NUMBER]).update(state="RUNNING", **started["params"])  # as on_trial_start does
    assert pause_the_unfinished(table, searcher, "time budget reached") == 2
    row = table.rows[waiting[TRIAL_NUMBER]]
    assert (row["state"], row["reason"]) == ("PAUSED", "time budget reached")
    assert {key: row[key] for key in config.space} == waiting["params"]
    assert table.rows[started[TRIAL_NUMBER]]["state"] == "PAUSED"


def test_a_grid_search_ends_at_the_grids_size_without_an_error(tmp_path, example_config):
    example_config["space"] = {"model.lr": {"type": "float", "low": 0.01, "high": 0.02, "step": 0.01}}
    example_config["search"].update(sampler="grid", num_trials=6, max_concurrent=1)
    config = load_config(example_config)
    searcher = OptunaSearcher(config, tmp_path, PruneLog())
    for trial_id in ("a", "b"):
        searcher.suggest(trial_id)
        searcher.on_trial_complete(trial_id, result(1, 0.5, finished=True, reason="max_epochs"))
    assert searcher.suggest("c") == Searcher.FINISHED
    study = open_study(tmp_path, config.name, config.mode)
    assert sorted(t.params["model.lr"] for t in study.trials) == [0.01, 0.02]
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]


def grid_config(example_config, num_trials: int):
    example_config["space"] = {"model.lr": {"type": "categorical", "choices": [0.001, 0.01, 0.1]},
                               "model.channels": {"type": "int", "low": 4, "high": 5}}
    example_config["search"].update(sampler="grid", num_trials=num_trials, max_concurrent=1, seed=0)
    return load_config(example_config)


def run_trials(searcher, ids) -> None:
    for trial_id in ids:
        assert searcher.suggest(trial_id) != Searcher.FINISHED
        searcher.on_trial_complete(trial_id, result(1, 0.5, finished=True, reason="max_epochs"))


@pytest.mark.parametrize("first_seed", [0, None])
def test_a_resumed_grid_search_visits_every_point_once(tmp_path, example_config, first_seed):
    """Each session seeded the grid's shuffle anew (the seed plus the trials so far), and
    the study names its trials' points by their place in that shuffle: the resumed
    session repeated points and never ran others. A grid begun with no seed (which Optuna
    shuffles as by seed 0) took the resume's (audit 66)."""
    first_config = grid_config(example_config, 4)
    first_config.search.seed = first_seed
    run_trials(OptunaSearcher(first_config, tmp_path, PruneLog()), "abcd")
    resumed_config = grid_config(example_config, 6)
    resumed_config.search.seed = 5  # a resume may change the seed: the grid keeps the one it began with
    resumed = OptunaSearcher(resumed_config, tmp_path, PruneLog())
    run_trials(resumed, "ef")
    assert resumed.suggest("g") == Searcher.FINISHED
    trials = open_study(tmp_path, "digits-cnn", "max").trials
    points = [(t.params["model.lr"], t.params["model.channels"]) for t in trials]
    assert sorted(points) == sorted((lr, c) for lr in (0.001, 0.01, 0.1) for c in (4, 5)), points


def test_a_finished_grid_smaller_than_num_trials_is_a_complete_search(tmp_path, example_config):
    """Its resume said nothing was left only when the study held num_trials trials: a
    finished 6-point grid with num_trials 10 ran its test evaluation again at every resume."""
    import time

    from hpsearch.search.api import _search_complete
    from hpsearch.search.experiment import ExperimentDir, record_session
    from hpsearch.search.trials_table import TrialsTable

    config = grid_config(example_config, 10)
    exp = ExperimentDir(tmp_path)
    table = TrialsTable(config.metric, config.mode, list(config.space))
    for number in range(6):
        table.row(number).update(state="COMPLETE", best=0.5)
    table.save(exp.trials_csv)
    record_session(exp, time.time(), time.time(), "complete", search_complete=True)
    assert _search_complete(exp, config)
    table.row(5)["state"] = "PAUSED"
    table.save(exp.trials_csv)
    assert not _search_complete(exp, config)


def test_a_finished_grids_failed_points_run_again_as_trials_beyond_it(tmp_path, example_config):
    """A grid's failed point was never run again: once the cause was fixed, the grid could
    only be searched anew (audit 27). resume --retry-failed queues each failed trial's
    configuration once, as a trial beyond the grid's size, which the grid's sampler leaves be."""
    from hpsearch.search.searcher import failed_configurations_run_since, run_failed_again

    config = grid_config(example_config, 6)
    searcher = OptunaSearcher(config, tmp_path, PruneLog())
    for trial_id in "abcdef":
        searcher.suggest(trial_id)
        searcher.on_trial_complete(trial_id, None, error=trial_id in "be")  # b and e failed
    assert searcher.suggest("g") == Searcher.FINISHED
    study = open_study(tmp_path, config.name, config.mode)
    assert run_failed_again(study) == {1: 6, 4: 7}
    assert run_failed_again(study) == {1: 6, 4: 7}  # queued once, however often asked
    again = OptunaSearcher(config, tmp_path, PruneLog())
    assert again.trial_limit == 8
    run_trials(again, "hi")
    assert again.suggest("j") == Searcher.FINISHED and again.is_complete()
    trials = open_study(tmp_path, config.name, config.mode).trials
    assert [(t.number, t.state.name) for t in trials[6:]] == [(6, "COMPLETE"), (7, "COMPLETE")]
    assert (trials[6].params, trials[7].params) == (trials[1].params, trials[4].params)
    assert run_failed_again(open_study(tmp_path, config.name, config.mode)) == {}  # each has run since
    assert failed_configurations_run_since(open_study(tmp_path, config.name, config.mode)) == {1: 6, 4: 7}


def test_retry_failed_names_the_failed_trials_it_leaves_and_not_those_whose_retry_failed_too(
        tmp_path, example_config, capsys):
    """A second --retry-failed after the retries failed again said it ran them again and, in
    the next line, that the first failures' configurations were not run again (audit 46); a
    failure whose configuration a later trial ran was left without a word (audit 45)."""
    from hpsearch.search.api import _run_failed_again

    config = grid_config(example_config, 6)
    searcher = OptunaSearcher(config, tmp_path, PruneLog())
    for trial_id in "abcdef":
        searcher.suggest(trial_id)
        searcher.on_trial_complete(trial_id, None, error=trial_id in "be")  # trials 1 and 4 failed
    _run_failed_again(open_study(tmp_path, config.name, config.mode))
    assert capsys.readouterr().out == ("running again the configurations of 2 failed trials (trial 1 as 6, 4 as 7); "
                                       "the failed trials stay in the study as they ended\n")
    again = OptunaSearcher(config, tmp_path, PruneLog())
    for trial_id in "gh":  # and fail again
        again.suggest(trial_id)
        again.on_trial_complete(trial_id, None, error=True)
    _run_failed_again(open_study(tmp_path, config.name, config.mode))
    assert capsys.readouterr().out == ("running again the configurations of 2 failed trials (trial 6 as 8, 7 as 9); "
                                       "the failed trials stay in the study as they ended\n")
    last = OptunaSearcher(config, tmp_path, PruneLog())
    run_trials(last, "ij")  # they pass
    _run_failed_again(open_study(tmp_path, config.name, config.mode))
    assert capsys.readouterr().out == ("not running again 4 failed trials whose configuration a later trial has "
                                       "(trial 1 as 8, 4 as 9, 6 as 8, 7 as 9)\n")


def test_a_started_trial_keeps_its_training_seed_when_a_resume_changes_the_studys_seed(example_config, tmp_path):
    """trials.csv kept a paused trial's seed, and the resume's warning said it kept it, but
    the trial was seeded again from the new search.seed: a DataModule that splits with the
    global generator trained its later epochs on another split (audit 44)."""
    from hpsearch.search.outcome import TRAINING_SEED
    from hpsearch.search.seeding import training_seed

    example_config["search"]["seed"] = 3
    first = OptunaSearcher(load_config(example_config), tmp_path, PruneLog())
    assert first.suggest("a")[TRAINING_SEED] == training_seed(3, 0)  # then the session stops, trial 0 running
    example_config["search"]["seed"] = 4
    resumed = OptunaSearcher(load_config(example_config), tmp_path, PruneLog())
    paused, new = resumed.suggest("b"), resumed.suggest("c")
    assert (paused[TRIAL_NUMBER], paused[TRAINING_SEED]) == (0, training_seed(3, 0))
    assert (new[TRIAL_NUMBER], new[TRAINING_SEED]) == (1, training_seed(4, 1))
