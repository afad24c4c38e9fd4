"""The command line: argument handling, fast paths, and config errors that create nothing."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
import yaml

from conftest import pids_whose_command, run_cli, shrunk_example, write_yaml
from hpsearch.search.cli import EXIT_CONFIG_ERROR, build_parser, main


def test_run_arguments_are_parsed():
    args = build_parser().parse_args(["run", "exp.yaml", "--name", "n", "--storage", "s", "--address", "auto",
                                      "--set", "search.num_trials=4", "--set", "mode=min", "-v"])
    assert (args.config, args.name, args.storage, args.address) == ("exp.yaml", "n", "s", "auto")
    assert args.overrides == ["search.num_trials=4", "mode=min"] and args.verbose


def test_a_command_is_required(capsys):
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args([])
    assert caught.value.code == 2


@pytest.mark.parametrize("mistake", ["none, status", "the space", "the storage"])
def test_status_and_a_failed_check_do_not_import_the_heavy_stack(tmp_path, mistake):
    """A schema error came after 0.4-1 s: the check imported Optuna (and numpy) for the
    search space's distributions before validating; a storage that is a file was said
    after 6.5 s of the preflight's imports (audit 36)."""
    bad = shrunk_example(tmp_path / "runs")
    if mistake == "the space":
        bad["space"]["model.lr"]["low"] = 1.0  # low > high
    else:
        bad["storage"] = str(tmp_path / "a-file")
        (tmp_path / "a-file").write_text("")
    command, target = ("status", tmp_path) if mistake == "none, status" else (
        "check", write_yaml(tmp_path / "bad.yaml", bad))
    code = ("import sys; from hpsearch.search.cli import main\n"
            "try:\n    main([sys.argv[1], sys.argv[2]])\nexcept SystemExit: pass\n"
            "heavy = [m for m in ('torch', 'ray', 'optuna', 'pytorch_lightning', 'numpy') if m in sys.modules]\n"
            "print('HEAVY=' + ','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code, command, str(target)], capture_output=True, text=True)
    assert "HEAVY=\n" in out.stdout or out.stdout.strip().endswith("HEAVY="), out.stdout + out.stderr
    said = {"the space": "space.model.lr", "the storage": "- storage (", "none, status": ""}[mistake]
    assert said in out.stderr, out.stderr


def test_bad_config_exits_2_names_the_field_and_creates_nothing(tmp_path):
    storage = tmp_path / "runs"
    config = shrunk_example(storage)
    config["space"]["model.lr"]["low"] = 1.0  # low > high
    path = write_yaml(tmp_path / "bad.yaml", config)
    started = time.monotonic()
    result = run_cli("run", str(path), cwd=tmp_path, timeout=120)
    assert result.returncode == EXIT_CONFIG_ERROR, result.stderr
    assert "space.model.lr" in result.stderr and "line" in result.stderr
    assert not storage.exists()
    assert time.monotonic() - started < 60  # rejected before Ray could start


def test_metric_never_logged_exits_2_before_ray_starts(tmp_path):
    storage = tmp_path / "runs"
    path = write_yaml(tmp_path / "bad.yaml", shrunk_example(storage, metric="val_auc"))
    result = run_cli("run", str(path), cwd=tmp_path, timeout=180)
    assert result.returncode == EXIT_CONFIG_ERROR, result.stderr
    assert "'val_auc' is not logged at the first validation" in result.stderr and not storage.exists()
    assert "ray" not in result.stderr.lower().replace("array", "")


def test_check_validates_as_run_does_with_no_ray_and_no_directory(tmp_path):
    storage = tmp_path / "runs"
    # a grid of 3 points, smaller than num_trials (4): the search runs 3, and check says 3
    config = shrunk_example(storage, **{"search/sampler": "grid",
                                        "space": {"model.lr": {"type": "categorical", "choices": [0.01, 0.02, 0.03]}}})
    good = write_yaml(tmp_path / "exp.yaml", config)
    code = ("import sys; from hpsearch.search.cli import main\n"
            "code = main(['check', sys.argv[1]])\n"
            "import ray\n"
            "print(f'EXIT={code} RAY={ray.is_initialized()}')")
    out = subprocess.run([sys.executable, "-c", code, str(good)], capture_output=True, text=True, cwd=tmp_path)
    assert "EXIT=0 RAY=False" in out.stdout, out.stdout + out.stderr
    assert f"ok: {config['name']}: cnn on digits, 1 searched parameter (model.lr), val_acc (max) logged at " \
           f"validation" in out.stdout, out.stdout
    # which values it trained with: the others went to the constructors only (audit 45: ok implied all had run)
    assert "\n  trained two steps with the searched values model.lr=0.01; the space's other values were given to " \
           "the constructors only\n" in out.stdout, out.stdout
    # Without --address, run starts a Ray here: check says how many trials this machine holds.
    assert re.search(r"this machine \(\d+ CPUs, 0 GPUs\) holds \d+ at a time", out.stdout), out.stdout
    assert "the search ends after 3 trials" in out.stderr and "\n  3 trials, 2 at a time" in out.stdout, out
    assert str(storage / config["name"]) in out.stdout and not storage.exists()


@pytest.mark.parametrize("setting, field", [
    ({"data/init_args/eval_batch_size": 0}, "data.init_args.eval_batch_size"),
    ({"space/data.eval_batch_size": {"type": "int", "low": -4, "high": 64}}, "space.data.eval_batch_size"),
])
def test_check_refuses_a_built_in_datas_eval_batch_below_one_naming_it(tmp_path, capsys, setting, field):
    # 0 became 4 x the batch without a word; -5 was blamed on data.class_path, as torch's
    # "batch_size should be a positive integer" of a loader.
    path = write_yaml(tmp_path / "exp.yaml", shrunk_example(tmp_path / "runs", **setting))
    assert main(["check", str(path)]) == EXIT_CONFIG_ERROR
    err = capsys.readouterr().err
    assert f"- {field} (" in err and "eval_batch_size must be >= 1" in err, err


def test_check_refuses_a_distributed_trial_larger_than_this_machine(tmp_path, capsys):
    too_many = (os.cpu_count() or 1) + 1  # Ray counts no more CPUs than the OS does
    config = shrunk_example(tmp_path / "runs", **{"resources/workers_per_trial": too_many,
                                                            "resources/cpus_per_worker": 1})
    path = write_yaml(tmp_path / "exp.yaml", config)
    assert main(["check", str(path)]) == EXIT_CONFIG_ERROR  # as run refuses it: before Ray starts
    err = capsys.readouterr().err
    assert f"a trial needs {too_many} workers of 1 CPU(s)" in err and "on this machine" in err, err
    assert "- resources.workers_per_trial (" in err, err
    assert "--address" in err
    # Bound for a cluster: its room is checked when the search starts there, as run does.
    assert main(["check", str(path), "--address", "10.0.0.1:6379"]) == 0
    assert "checked when the search starts" in capsys.readouterr().out


def test_check_reports_what_run_would_refuse(tmp_path, capsys):
    storage = tmp_path / "runs"
    bad = write_yaml(tmp_path / "bad.yaml", shrunk_example(storage, metric="val_auc"))
    assert main(["check", str(bad)]) == EXIT_CONFIG_ERROR
    assert "'val_auc' is not logged at the first validation" in capsys.readouterr().err and not storage.exists()


def test_bad_set_override_is_reported_as_coming_from_set(tmp_path, capsys):
    path = write_yaml(tmp_path / "exp.yaml", shrunk_example(tmp_path / "runs"))
    assert main(["run", str(path), "--set", "search.num_trials=zero"]) == EXIT_CONFIG_ERROR
    err = capsys.readouterr().err
    assert "search.num_trials (--set)" in err
    assert not (tmp_path / "runs").exists()


def test_status_and_best_on_a_directory_that_is_not_an_experiment(tmp_path, capsys):
    assert main(["status", str(tmp_path)]) == 1
    assert "not an hpsearch experiment directory" in capsys.readouterr().err
    assert main(["best", str(tmp_path), "--json"]) == 1
    assert main(["resume", str(tmp_path / "runs" / "nope")]) == 1
    assert "does not exist" in capsys.readouterr().err
    experiment_file = write_yaml(tmp_path / "exp.yaml", shrunk_example(tmp_path / "runs"))
    assert main(["resume", str(experiment_file)]) == 1
    assert f"start a search from it with: hpsearch run {experiment_file}" in capsys.readouterr().err
    study = tmp_path / "runs" / "study"  # a study's own saved experiment.yaml: resume the study, not run it anew
    study.mkdir(parents=True)
    (study / "experiment.yaml").write_text(experiment_file.read_text())
    (study / "trials.csv").write_text("trial,state\n")
    assert main(["resume", str(study / "experiment.yaml")]) == 1
    assert f"continue that study with: hpsearch resume {study}" in capsys.readouterr().err
    assert main(["status", str(tmp_path / "runs")]) == 1  # the storage folder: name the studies in it
    assert f"it holds the studies study: give one of them, e.g. {study}" in capsys.readouterr().err


def test_resume_refuses_a_changed_search_space(tmp_path, capsys):
    from hpsearch.search.experiment import ExperimentDir, write_config
    from hpsearch.search.config_loading import load_config

    exp = ExperimentDir.create(str(tmp_path), "study")
    write_config(exp, load_config(shrunk_example(tmp_path)).model_dump(mode="json"))
    assert main(["resume", str(exp.root), "--set", "space.model.lr.high=0.5"]) == EXIT_CONFIG_ERROR
    # named by the override that changed it, not by the stored file's line of 'space'
    assert "space.model.lr.high (--set): space cannot change on resume" in capsys.readouterr().err
    assert main(["resume", str(exp.root), "--set", "space.model.lr=null"]) == EXIT_CONFIG_ERROR
    assert "space.model.lr (--set): space cannot change on resume" in capsys.readouterr().err  # not the file's line
    assert main(["resume", str(exp.root), "--set", "metric=val_loss"]) == EXIT_CONFIG_ERROR


def test_resume_refuses_to_turn_a_sampled_study_into_a_grid(tmp_path, capsys, example_config):
    """Optuna's grid gives the study's trial n its point n: a study of 6 random trials
    resumed as a grid never ran points 0-5, ran others twice, and then said every point of
    its grid had run (audit 66)."""
    from hpsearch.search.config_loading import load_config
    from hpsearch.search.experiment import ExperimentDir, write_config
    from hpsearch.search.searcher import OptunaSearcher
    from hpsearch.search.outcome import PruneLog

    exp = ExperimentDir.create(str(tmp_path), "study")
    example_config["search"]["sampler"] = "random"
    example_config["space"] = {"model.lr": {"type": "categorical", "choices": [0.001, 0.01, 0.1]}}
    config = load_config(example_config)
    write_config(exp, config.model_dump(mode="json"))
    OptunaSearcher(config, exp.root, PruneLog()).suggest("a")
    assert main(["resume", str(exp.root), "--set", "search.sampler=grid"]) == EXIT_CONFIG_ERROR
    assert "search.sampler (--set): a study whose trials were sampled otherwise cannot go on as a grid" in \
        capsys.readouterr().err
    # the study's own trials tell it, not experiment.yaml's sampler, which a person may edit (audit 67)
    exp.config_file.write_text(exp.config_file.read_text().replace("sampler: random", "sampler: grid"))
    assert main(["resume", str(exp.root)]) == EXIT_CONFIG_ERROR
    assert "a study whose trials were sampled otherwise cannot go on as a grid" in capsys.readouterr().err


def test_resume_refuses_a_new_name_or_fewer_trials_than_the_study_has(tmp_path, capsys):
    from hpsearch.search.experiment import ExperimentDir, write_config
    from hpsearch.search.config_loading import load_config
    from hpsearch.search.trials_table import TrialsTable

    exp = ExperimentDir.create(str(tmp_path), "study")
    config = load_config(shrunk_example(tmp_path))
    write_config(exp, config.model_dump(mode="json"))
    table = TrialsTable(config.metric, config.mode, list(config.space))
    for number in range(3):
        table.row(number).update(state="COMPLETE", best=0.5)
    table.save(exp.trials_csv)
    # The study is named in its Optuna journal: a new name would start an empty one.
    assert main(["resume", str(exp.root), "--set", "name=other"]) == EXIT_CONFIG_ERROR
    assert "name" in capsys.readouterr().err
    assert main(["resume", str(exp.root), "--set", "search.num_trials=2"]) == EXIT_CONFIG_ERROR
    assert "search.num_trials" in (err := capsys.readouterr().err) and "fewer than the 3 trials the study already has" in err
    assert "name: " + config.name in exp.config_file.read_text()


def test_resume_counts_the_trials_the_study_handed_out_before_they_had_a_row(tmp_path, capsys):
    """Interrupted just as trials were handed out, a study has them in its journal and
    none in trials.csv (a row comes when a trial starts); a smaller num_trials was taken,
    and the study ended with more trials than its file said ("2/1 done")."""
    from hpsearch.search.config_loading import load_config
    from hpsearch.search.experiment import ExperimentDir, write_config
    from hpsearch.search.searcher import open_study

    exp = ExperimentDir.create(str(tmp_path), "study")
    config = load_config(shrunk_example(tmp_path))
    write_config(exp, config.model_dump(mode="json"))
    study = open_study(exp.root, config.name, config.mode)
    study.ask(), study.ask()  # RUNNING, as the interruption left them
    assert not exp.trials_csv.is_file()
    assert main(["resume", str(exp.root), "--set", "search.num_trials=1"]) == EXIT_CONFIG_ERROR
    assert "fewer than the 2 trials the study already has" in capsys.readouterr().err


def test_the_saved_experiment_reads_back_as_the_study_was_searched_with(tmp_path):
    """Strings that YAML 1.2 reads as floats ("1e3", a commit hash such as "3e41508") were
    written bare under YAML 1.1's rules, read back as floats, and every resume of the study
    was refused as if experiment.yaml had been edited (audit 21)."""
    from hpsearch.search.api import _differs
    from hpsearch.search.config_loading import load_config
    from hpsearch.search.experiment import ExperimentDir, write_config

    raw = shrunk_example(tmp_path)
    raw["model"]["init_args"] = {**raw["model"].get("init_args", {}), "revision": "3e41508", "note": "5e-4"}
    raw["space"]["model.channels"] = {"type": "categorical", "choices": ["1e3", "1.5e3", "007", "1_000", None, 8]}
    config = load_config(raw)
    exp = ExperimentDir.create(str(tmp_path), "study")
    write_config(exp, config.model_dump(mode="json"))
    searched, saved = config.model_dump(mode="json"), load_config(exp.config_file, stored=True).model_dump(mode="json")
    assert saved == searched
    assert not any(_differs(searched[key], saved[key], key == "space") for key in ("model", "space"))
    assert exp.stored_config()["model"]["init_args"]["revision"] == "3e41508"  # status and compare read it so


def test_resume_refuses_a_study_whose_saved_file_was_edited(tmp_path, capsys):
    """Resume compared experiment.yaml with itself: an edited space, scheduler or mode in
    it was taken silently (or crashed Optuna), where --set the same was refused."""
    from hpsearch.search.config_loading import load_config
    from hpsearch.search.experiment import ExperimentDir, write_config
    from hpsearch.search.searcher import keep_settings

    exp = ExperimentDir.create(str(tmp_path), "study")
    config = load_config(shrunk_example(tmp_path))
    write_config(exp, config.model_dump(mode="json"))
    keep_settings(exp.root, config, ("name", "model", "data", "space", "metric", "mode", "scheduler"))
    saved = yaml.safe_load(exp.config_file.read_text())
    saved["space"]["model.lr"]["high"] = 0.5
    saved["mode"] = "min"
    exp.config_file.write_text(yaml.safe_dump(saved))
    assert main(["resume", str(exp.root)]) == EXIT_CONFIG_ERROR
    err = capsys.readouterr().err
    assert "space differs from what the study was searched with" in err and "mode differs" in err, err

    from hpsearch.search.api import _differs

    assert not _differs({"type": "asha"}, {"type": "asha", "added_by_a_later_hpsearch": 1})
    assert _differs({"model.lr": {"low": 0.1}}, {"model.lr": {"low": 0.1}, "model.wd": {"low": 0.0}}, True)
    assert _differs({"class_path": "cnn", "init_args": {}}, {"class_path": "cnn", "init_args": {"channels": 8}})
    # a condition added to a recorded parameter, or one more named in it, is a change
    momentum = {"type": "float", "low": 0.5, "high": 0.99}
    assert _differs({"model.momentum": momentum}, {"model.momentum": {**momentum, "when": {"o": ["sgd"]}}}, True)
    assert _differs({"model.momentum": {**momentum, "when": {"o": ["sgd"]}}},
                    {"model.momentum": {**momentum, "when": {"o": ["sgd"], "p": [1]}}}, True)
    assert not _differs({"model.momentum": {**momentum, "when": {"o": ["sgd"]}}},
                        {"model.momentum": {**momentum, "when": {"o": ["sgd"]}}}, True)


def _study_with(tmp_path, states, **overrides):
    from hpsearch.search.experiment import ExperimentDir, write_config
    from hpsearch.search.config_loading import load_config
    from hpsearch.search.trials_table import TrialsTable

    exp = ExperimentDir.create(str(tmp_path), "study")
    config = load_config(shrunk_example(tmp_path, **overrides))
    write_config(exp, config.model_dump(mode="json"))
    table = TrialsTable(config.metric, config.mode, list(config.space))
    for number, state in enumerate(states):
        table.row(number).update(state=state, **({"best": 0.5} if state == "COMPLETE" else {}))
    table.save(exp.trials_csv)
    return exp


def test_a_study_under_a_non_ascii_path_reads_in_a_locale_that_is_not_utf8(tmp_path):
    """Under LC_ALL=C without Python's UTF-8 mode, status crashed in UnicodeDecodeError on
    trials.csv, whose trial_dir column held the path (audit 81): the study's files are UTF-8."""
    from hpsearch.search.trials_table import TrialsTable

    exp = _study_with(tmp_path / "projet é 日本", ["COMPLETE", "PRUNED"])
    table = TrialsTable.load(exp.trials_csv, "val_acc", "max", [])
    table.row(0).update(trial_dir=str(exp.root / "trials" / "trial_0000"), error="échec: ✗")
    table.save(exp.trials_csv)
    environment = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    environment.pop("PYTHONIOENCODING", None)
    for command in (["status"], ["status", "--trial", "0"], ["compare"]):
        out = subprocess.run([sys.executable, "-c", "import sys; from hpsearch.search.cli import main; "
                              "sys.exit(main(sys.argv[1:]))", *command, str(exp.root)], capture_output=True,
                             env=environment, timeout=120)
        assert b"UnicodeDecodeError" not in out.stderr and b"Traceback" not in out.stderr, out.stderr.decode()[-2000:]
        assert out.returncode == 0, (command, out.stderr.decode()[-2000:])
        assert b"trial" in out.stdout + out.stderr, out.stdout


def test_a_rungs_kept_trials_are_those_asha_did_not_prune_there(tmp_path):
    """A trial early-stopped at a rung's epoch was counted as cut by ASHA there: "kept" was
    the trials that trained past it (audit 78)."""
    from hpsearch.search.study_summary import summarize
    from hpsearch.search.trials_table import TrialsTable

    exp = _study_with(tmp_path, ["PRUNED", "COMPLETE", "COMPLETE", "PRUNED"], **{"scheduler/max_epochs": 4})
    table = TrialsTable.load(exp.trials_csv, "val_acc", "max", [])
    for number, epochs in enumerate((1, 2, 4, 2)):  # trial 1 early-stopped at rung 2, trial 3 pruned there
        table.row(number).update(epochs=epochs)
    table.save(exp.trials_csv)
    rungs = {rung.epoch: (rung.reached, rung.kept) for rung in summarize(exp).rungs}
    assert rungs == {1: (4, 3), 2: (3, 2)}, rungs


def test_compare_and_report_say_when_the_best_trial_is_a_pruned_one(tmp_path, capsys):
    """With no trial complete, the best is a pruned one: best and status said so, compare
    and the report's best configuration did not (audit 49)."""
    from hpsearch.search.report import _cell, _html
    from hpsearch.search.study_summary import summarize
    from hpsearch.search.trials_table import TrialsTable

    exp = _study_with(tmp_path, ["PRUNED", "PAUSED"])
    table = TrialsTable.load(exp.trials_csv, "val_acc", "max", [])
    table.row(0).update(best=0.9667, epochs=6)
    table.save(exp.trials_csv)
    assert main(["compare", "--json", str(exp.root)]) == 0
    [record] = json.loads(capsys.readouterr().out)
    assert (record["best_trial"], record["best_state"]) == (0, "PRUNED"), record
    assert main(["compare", str(exp.root)]) == 0 and "0 (pruned)" in capsys.readouterr().out
    assert '<td data-value="state">state</td><td data-value="PRUNED">PRUNED</td>' in _html(summarize(exp), {})
    # a column's large figures without an exponent, as its whole numbers have none
    assert [_cell(v) for v in (19838.4, 9841, 0.123456)] == [
        '<td data-value="19838.4">19838</td>', '<td data-value="9841">9841</td>',
        '<td data-value="0.123456">0.1235</td>']


def test_compare_and_report_show_the_best_trial_before_best_json_is_written(tmp_path, capsys):
    """A second Ctrl+C (or a kill) ends a session before the best trial's evaluation
    writes best.json: its trials still have results, as status and trials.csv show."""
    from hpsearch.search.report import _html
    from hpsearch.search.study_summary import summarize

    from hpsearch.search.trials_table import TrialsTable

    exp = _study_with(tmp_path, ["COMPLETE", "PAUSED", "FAILED"])
    table = TrialsTable.load(exp.trials_csv, "val_acc", "max", [])
    table.row(0).update(best=0.9, epochs=1)
    table.row(1).update(epochs=1)  # paused after its first epoch: it reached the first rung
    table.save(exp.trials_csv)
    assert main(["compare", "--json", str(exp.root)]) == 0
    [record] = json.loads(capsys.readouterr().out)
    assert (record["best_value"], record["best_trial"], record["best_evaluated"]) == (0.9, 0, False)
    summary = summarize(exp)
    assert summary.rungs[0].epoch == 1 and summary.rungs[0].reached == 2
    page = _html(summary, {})
    assert "No trial has a result yet" not in page and f"hpsearch resume {exp.root}" in page
    assert main(["compare", str(exp.root)]) == 0 and "not evaluated yet (resume)" in capsys.readouterr().out
    # While its search runs: it had not ended, and resume would be refused.
    import os
    import socket
    import time

    from hpsearch.search.experiment import record_session, write_json

    record_session(exp, time.time() - 5, None, "running")
    write_json(exp.root / "driver.json", {"pid": os.getpid(), "host": socket.gethostname(), "since": "now",
                                          "command": "hpsearch run"})
    page = _html(summarize(exp), {})
    assert "the search is running" in page and "hpsearch resume" not in page
    assert main(["compare", str(exp.root)]) == 0 and "not evaluated yet (search running)" in capsys.readouterr().out


def test_a_user_package_that_does_not_import_says_where_to_run_from(tmp_path, monkeypatch, capsys):
    """User packages import from the current directory: a resume from elsewhere said only
    "No module named 'mylab'"."""
    import yaml

    from hpsearch.search.experiment import record_session

    project = tmp_path / "project"
    (project / "mylab_x7").mkdir(parents=True)
    (project / "mylab_x7" / "__init__.py").write_text("")
    monkeypatch.chdir(project)
    exp = _study_with(tmp_path / "runs", ["PAUSED"])
    record_session(exp, 1.0, 2.0, "interrupted")
    config = yaml.safe_load(exp.config_file.read_text())
    config["model"]["class_path"] = "mylab_x7.models:Net"
    exp.config_file.write_text(yaml.safe_dump(config))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # as the command line has it: no project folder
    assert main(["resume", str(exp.root)]) == 2
    err = capsys.readouterr().err
    assert f"No module named 'mylab_x7' (looked for in the current directory {tmp_path}" in err, err
    assert "run hpsearch from the folder that holds 'mylab_x7'" in err
    assert f"this study's last session ran from {project}: resume it from there" in err


def test_best_says_why_a_study_has_no_best_json(tmp_path, capsys):
    failed = _study_with(tmp_path / "a", ["FAILED", "FAILED"])
    assert main(["best", str(failed.root)]) == 1
    assert "no trial has a result yet (2 started, 2 failed" in capsys.readouterr().err
    one = _study_with(tmp_path / "d", ["COMPLETE", "FAILED"])
    assert main(["best", str(one.root)]) == 1 and "1 trial has a result, but" in capsys.readouterr().err
    cut_short = _study_with(tmp_path / "b", ["COMPLETE", "COMPLETE", "FAILED"])
    assert main(["best", str(cut_short.root)]) == 1
    assert "2 trials have results" in (err := capsys.readouterr().err) and f"hpsearch resume {cut_short.root}" in err
    # Trials with epochs but none finished (a search still running, or each failed after
    # an epoch): not "no result yet", which contradicted status.
    running = _study_with(tmp_path / "c", ["RUNNING", "FAILED"])
    table_path = running.trials_csv
    table_path.write_text(table_path.read_text().replace("RUNNING,,,", "RUNNING,,0.7,", 1).replace("FAILED,,,", "FAILED,,0.6,", 1))
    assert main(["best", str(running.root)]) == 1
    # (trials report results, and fail; the line said "2 reported epochs, 1 of them failed")
    assert "no trial has finished with a result yet (2 trials reported an epoch's result, 1 of them failed later" \
        in capsys.readouterr().err


def test_a_report_to_a_folder_that_cannot_be_made_is_one_error_line(tmp_path, capsys):
    exp = _study_with(tmp_path, ["COMPLETE"])
    (tmp_path / "a-file").write_text("")
    assert main(["report", str(exp.root), "--out", str(tmp_path / "a-file" / "report")]) == 1
    err = capsys.readouterr().err
    assert f"error: cannot write the report in {tmp_path / 'a-file' / 'report'}: Not a directory" in err, err
    assert "--out DIR" not in err  # the user chose it
    # the study's own folder, on a read-only mount: the way out is --out (audit 81)
    (exp.root / "report").write_text("")
    assert main(["report", str(exp.root)]) == 1
    err = capsys.readouterr().err
    assert err.strip().endswith("File exists; write it elsewhere with --out DIR"), err


def test_best_of_a_study_moved_elsewhere_names_its_own_checkpoint(tmp_path, capsys):
    """best.json keeps the paths where the study was written: a study copied from a
    cluster named the cluster's checkpoint, gone once that is."""
    import json

    exp = _study_with(tmp_path / "here", ["COMPLETE"])
    written_in = tmp_path / "cluster" / "study"
    checkpoint = exp.root / "trials" / "trial_0000" / "checkpoints" / "best.ckpt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"weights")
    exp.best_json.write_text(json.dumps({
        "experiment": "study", "experiment_dir": str(written_in), "metric": "val_acc", "mode": "max", "value": 0.5,
        "trial": 0, "state": "COMPLETE", "epochs": 1, "params": {}, "test_metrics": {},
        "checkpoint": str(written_in / "trials" / "trial_0000" / "checkpoints" / "best.ckpt")}))
    assert main(["best", str(exp.root)]) == 0
    assert f"checkpoint: {checkpoint}" in capsys.readouterr().out
    assert main(["best", str(exp.root), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["checkpoint"], shown["experiment_dir"]) == (str(checkpoint), str(exp.root))


def test_resuming_a_complete_study_whose_every_trial_failed_runs_nothing_and_says_so(tmp_path, capsys):
    """It said the best trial's test evaluation ran again (there is no best trial), and
    warned that a changed setting applied to trials from now on (none would run)."""
    import time

    from hpsearch.search.experiment import record_session

    failed = _study_with(tmp_path, ["FAILED", "FAILED"])
    record_session(failed, time.time() - 60, time.time() - 30, "complete", search_complete=True)
    assert main(["resume", str(failed.root), "--set", "search.num_trials=2", "--set", "search.seed=5"]) == 1
    out, err = capsys.readouterr()
    assert "the study was already complete (2 trials); nothing was run" in out, out
    assert "test evaluation ran again" not in out and "resume changes" not in err, (out, err)
    assert "no trial finished with a result: 2 of 2 failed" in err, err


def test_resuming_a_finished_grid_does_not_suggest_adding_trials(tmp_path, capsys):
    """More trials add nothing to a grid whose every point has run: the hint to raise
    search.num_trials sent the user round in a circle."""
    import time

    from hpsearch.search.experiment import record_session

    grid = _study_with(tmp_path, ["FAILED", "FAILED"], **{
        "search/sampler": "grid", "space": {"model.lr": {"type": "categorical", "choices": [0.01, 0.1]}}})
    record_session(grid, time.time() - 60, time.time() - 30, "complete", search_complete=True)
    main(["resume", str(grid.root)])
    out = capsys.readouterr().out
    assert "already complete (2 trials); nothing was run. Every point of its grid has run" in out, out
    assert "num_trials=N" not in out, out


def test_a_search_whose_every_trial_failed_exits_with_1_saying_so(tmp_path, capsys):
    from hpsearch.search.api import SearchResult
    from hpsearch.search.cli import _report

    result = SearchResult(tmp_path, "complete", None, [{"state": "FAILED"}, {"state": "FAILED"}], 9.0)
    assert _report(result) == 1
    assert "no trial finished with a result: 2 of 2 failed" in capsys.readouterr().err
    result = SearchResult(tmp_path, "complete", {"value": 0.9, "metric": "val_acc", "mode": "max", "trial": 0,
                                                 "params": {}, "state": "COMPLETE", "epochs": 1,
                                                 "checkpoint": None, "test_metrics": {}},
                          [{"state": "COMPLETE"}], 9.0)
    assert _report(result) == 0
    # a notebook shows it in one line (audit 51: 7,862 characters for 6 trials)
    assert repr(result) == (f"SearchResult(experiment_dir={str(tmp_path)!r}, outcome='complete', "
                            "best=<trial 0: val_acc = 0.9>, trials=<1>, elapsed_s=9.0)")


def test_a_sessions_end_tells_a_data_starved_study_what_its_file_lets_it_raise(tmp_path, capsys):
    """The advice named ``resources.cpus_per_trial`` too where the file set ``loader.num_workers``,
    which the CPUs then do not size."""
    from hpsearch.search.api import SearchResult
    from hpsearch.search.cli import _report

    (tmp_path / "experiment.yaml").write_text("name: s\nmetric: val_acc\nmode: max\nspace: {}\n"
                                              "loader: {num_workers: 2}\n")
    result = SearchResult(tmp_path, "complete", None, [{"trial": 0, "state": "PRUNED", "data_starved": True}], 9.0)
    _report(result)
    out = " ".join(capsys.readouterr().out.split())  # the console folds long lines
    assert "data-starved: trial 0 waited" in out and "loader.num_workers (the file sets 2)" in out, out


def test_a_search_stopped_before_any_trial_ended_says_none_was_evaluated(tmp_path, capsys):
    """The stop's message promises the best trial so far is evaluated; with no trial ended
    nothing was, and nothing said so (audit 21, D4)."""
    from hpsearch.search.api import SearchResult
    from hpsearch.search.cli import EXIT_INTERRUPTED, _report
    from hpsearch.search.outcome import SESSION_INTERRUPTED

    result = SearchResult(tmp_path, SESSION_INTERRUPTED, None, [{"state": "PAUSED"}, {"state": "PAUSED"}], 9.0)
    assert _report(result) == EXIT_INTERRUPTED
    assert "no trial had ended with a result, so none was evaluated" in capsys.readouterr().err
    best = {"value": 0.9, "metric": "val_acc", "mode": "max", "trial": 0, "params": {}, "state": "COMPLETE",
            "epochs": 1, "checkpoint": None, "test_metrics": {}}
    result = SearchResult(tmp_path, SESSION_INTERRUPTED, best, [{"state": "COMPLETE"}, {"state": "PAUSED"}], 9.0)
    assert _report(result) == EXIT_INTERRUPTED
    assert "none was evaluated" not in capsys.readouterr().err


def test_a_search_that_reached_its_time_budget_says_how_many_trials_finished(tmp_path, capsys):
    from hpsearch.search.api import SearchResult
    from hpsearch.search.cli import _report
    from hpsearch.search.outcome import SESSION_TIME_BUDGET

    result = SearchResult(tmp_path, SESSION_TIME_BUDGET, None, [{"state": "PRUNED"}, {"state": "PAUSED"}], 9.0)
    assert _report(result) == 0
    assert "time budget reached with 1 trial finished in this session (1 in the study) and 1 paused" \
        in capsys.readouterr().out
    # a resumed study's earlier trials are not this session's (audit 20, D7: "2541 trials finished"
    # after a session of 20 s that finished 140)
    earlier = [{"state": "COMPLETE"}] * 5
    result = SearchResult(tmp_path, SESSION_TIME_BUDGET, None, earlier + [{"state": "PRUNED"}, {"state": "PAUSED"}],
                          9.0, finished_before=5)
    assert _report(result) == 0
    assert "time budget reached with 1 trial finished in this session (6 in the study) and 1 paused" \
        in capsys.readouterr().out
    from hpsearch.search.status_view import print_best

    print_best({"trial": 3, "metric": "val_acc", "value": 0.9, "state": "PRUNED", "epochs": 1, "params": {}})
    assert "best trial 3: val_acc = 0.9 (pruned, 1 epoch)" in capsys.readouterr().out
    # the epoch of the best value, the seed, and the sampled values whole, to train it again with (audit 28)
    print_best({"trial": 1, "metric": "val_acc", "value": 0.9963, "state": "COMPLETE", "epochs": 5, "best_epoch": 2,
                "seed": 123, "params": {"model.lr": 0.002689685941170982, "model.channels": 16}})
    out = capsys.readouterr().out
    assert "best trial 1: val_acc = 0.9963 at epoch 2 (complete, 5 epochs, seed 123)" in out, out
    assert "model.lr = 0.002689685941170982" in out and "model.channels = 16" in out, out
    assert "ran with precision" not in out
    # the precision the trial ran with, where the one asked for was replaced (audit 33)
    print_best({"trial": 0, "metric": "val_acc", "value": 0.5, "state": "COMPLETE", "epochs": 1, "params": {},
                "config": {"trainer": {"precision": "16-mixed"}}, "device": "cpu", "precision": "bf16-mixed"})
    assert "ran with precision bf16-mixed on cpu (trainer.precision 16-mixed is not available there)" \
        in capsys.readouterr().out
    print_best({"trial": 0, "metric": "val_acc", "value": 0.5, "state": "COMPLETE", "epochs": 1, "params": {},
                "config": {"trainer": {"precision": "auto"}}, "device": "cpu", "precision": "32-true"})
    assert "ran with precision 32-true on cpu (trainer.precision auto: its choice there)" in capsys.readouterr().out
    # a pruned trial that scored better is named, with why it is not the best (audit 33)
    print_best({"trial": 7, "metric": "score", "value": 10.03, "state": "COMPLETE", "epochs": 5, "params": {},
                "pruned_ahead": {"trial": 2, "value": 10.71, "epochs": 1}})
    out = capsys.readouterr().out
    assert "pruned trial 2 scored better, score = 10.71 (in 1 epoch), but a pruned trial is the best only when " \
           "none completed" in " ".join(out.split()), out
    # a failed one too (audit 74); the best.json above is of before it, which named pruned ones only
    print_best({"trial": 7, "metric": "score", "value": 10.03, "state": "COMPLETE", "epochs": 5, "params": {},
                "ahead": {"trial": 3, "state": "FAILED", "value": 10.9, "epochs": 2}})
    out = " ".join(capsys.readouterr().out.split())
    assert "failed trial 3 scored better, score = 10.9 (in 2 epochs), but a failed trial is never the best" in out, out


def test_numeric_choices_of_ints_and_floats_get_their_hparams_columns_and_rows(tmp_path):
    """TensorBoard wants one Python type per column: choices [0, 1e-4, 1e-3] made it refuse
    the study's columns and every trial's row (a warning per trial, an empty HParams tab)."""
    from hpsearch.search.config_loading import load_config
    from hpsearch.search.tensorboard_layout import _stored_columns, write_hparams_columns, write_trial_session

    config = load_config(shrunk_example(tmp_path, **{"space/model.weight_decay": {
        "type": "categorical", "choices": [0, 1.0e-4, 1.0e-3]}}))
    write_hparams_columns(tmp_path / "tb", config, ["val_loss"])
    [columns] = _stored_columns(tmp_path / "tb")
    [decay] = [info for info in columns.hparam_infos if info.name == "model.weight_decay"]
    assert [value.number_value for value in decay.domain_discrete.values] == [0.0, 1e-4, 1e-3]
    run = write_trial_session(tmp_path / "tb", config, 0, {"model.weight_decay": 0, "model.lr": 0.01}, "COMPLETE", 3)
    assert list(run.glob("*.hparams"))


def test_hparams_columns_gain_the_metrics_a_later_trial_logged(tmp_path):
    """The columns were written once, with the first trial to end: one that failed before
    its first report left the study without a column for any of the model's own metrics."""
    from hpsearch.search.config_loading import load_config
    from hpsearch.search.tensorboard_layout import _stored_columns, write_hparams_columns

    config, tensorboard = load_config(shrunk_example(tmp_path)), tmp_path / "tb"

    def columns() -> set[str]:
        [stored] = _stored_columns(tensorboard)  # one set: TensorBoard reads one
        return {metric.name.tag for metric in stored.metric_infos}

    write_hparams_columns(tensorboard, config, [])  # the first trial to end failed at once
    assert "val_loss" not in columns()
    assert write_hparams_columns(tensorboard, config, ["val_acc", "val_loss", "train_loss"]) == {"val_loss",
                                                                                                   "train_loss"}
    assert {"hp/val_acc", "val_acc", "val_loss", "train_loss", "speed/samples_per_s"} <= columns()
    [written] = tensorboard.glob("events.out.tfevents.*")
    write_hparams_columns(tensorboard, config, ["val_loss"])  # nothing new: nothing written
    assert list(tensorboard.glob("events.out.tfevents.*")) == [written]
    write_hparams_columns(tensorboard, config, ["val_acc", "lr-AdamW"])  # one more, the others kept
    assert {"val_loss", "train_loss", "lr-AdamW"} <= columns()

    def groups() -> dict[str, str]:
        [stored] = _stored_columns(tensorboard)
        return {metric.name.tag: metric.name.group for metric in stored.metric_infos}

    # A metric logged at training steps is read from the trial's steps run (trial_logger),
    # and stays so when later columns are added.
    write_hparams_columns(tensorboard, config, ["val_acc", "step_loss"], {"step_loss"})
    write_hparams_columns(tensorboard, config, ["val_acc", "val_f1"])
    assert groups()["step_loss"] == "steps" and groups()["val_loss"] == groups()["val_f1"] == "", groups()

    # the search metric logged on_step and on_epoch: its last value is NAME_epoch's (audit 74)
    stepped = tmp_path / "stepped"
    write_hparams_columns(stepped, config, ["val_acc", "val_acc_epoch", "val_acc_step"], {"val_acc_step"})
    [stored] = _stored_columns(stepped)
    shown = {metric.name.tag: metric.display_name for metric in stored.metric_infos}
    assert shown["val_acc_epoch"] == "last val_acc" and "val_acc" not in shown, shown
    before = list(stepped.glob("events.out.tfevents.*"))
    write_hparams_columns(stepped, config, ["val_acc", "val_acc_epoch", "val_acc_step"])  # covered: not written again
    assert list(stepped.glob("events.out.tfevents.*")) == before


def test_the_hparams_columns_tensorboard_shows_first_hold_the_state_the_validation_metrics_and_the_speed(tmp_path):
    """TensorBoard shows the first five parameter columns (by its own order) and the first
    five metric columns until the user ticks more: with four parameters searched, the
    state was hidden, and pruned trials looked complete; val_loss and the speed were
    hidden behind lr-AdamW and train_*."""
    from tensorboard.plugins.hparams.backend_context import _sort_and_reduce_to_hparams_limit

    from hpsearch.search.config_loading import load_config
    from hpsearch.search.tensorboard_layout import _stored_columns, write_hparams_columns

    config = load_config(shrunk_example(tmp_path, **{
        "space/model.dropout": {"type": "float", "low": 0.0, "high": 0.5},
        "space/model.weight_decay": {"type": "float", "low": 1e-5, "high": 1e-3, "log": True}}))
    assert len(config.space) >= 4
    write_hparams_columns(tmp_path / "tb", config, ["lr-AdamW", "train_acc", "train_loss", "val_loss"])
    [columns] = _stored_columns(tmp_path / "tb")
    _sort_and_reduce_to_hparams_limit(columns)  # what TensorBoard's server does before the page shows five
    assert [info.name for info in columns.hparam_infos][0] == "state"
    assert [metric.name.tag for metric in columns.metric_infos][:5] == [
        "hp/val_acc", "val_acc", "val_loss", "speed/samples_per_s", "speed/epoch_time_s"]
    assert [metric.name.tag for metric in columns.metric_infos][5:] == ["train_acc", "train_loss", "lr-AdamW"]


def test_tensorboard_started_as_a_background_job_stops_at_ctrl_c_and_leaves_no_directory(tmp_path):
    """A script's ``hpsearch tensorboard ... &`` starts with SIGINT ignored: it ran on."""
    import signal
    import socket

    studies = [_study_with(tmp_path / folder, ["COMPLETE"]) for folder in ("a", "b")]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    # the same study twice is shown once
    given = [str(s.root) for s in (*studies, studies[0])]
    process = subprocess.Popen([sys.executable, "-m", "hpsearch.search.cli", "tensorboard", *given,
                                "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               env={**os.environ, "TMPDIR": str(scratch)},
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert process.stdout.readline().startswith("TensorBoard at")
        # which group is which study: both are named "study", and told apart by the folders above them
        legend = [process.stdout.readline() for _ in studies]
        assert legend == [f"  a/study: {studies[0].root}\n", f"  b/study: {studies[1].root}\n"], legend
        assert len(list(scratch.glob("hpsearch-tensorboard-*"))) == 1
        time.sleep(1)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        process.kill()
    assert not list(scratch.glob("hpsearch-tensorboard-*"))


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_tensorboard_ends_when_its_command_is_killed_outright(tmp_path):
    """kill -9 of hpsearch tensorboard left TensorBoard serving, the port taken (audit 32)."""
    import signal
    import socket

    study = _study_with(tmp_path / "a", ["COMPLETE"])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "hpsearch.search.cli", "tensorboard", str(study.root),
                                "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout.readline().startswith("TensorBoard at")
        served = None
        for _ in range(600):  # TensorBoard's start takes seconds
            served = pids_whose_command(lambda command: "tensorboard.main" in command and f"--port {port}" in command)
            if served:
                break
            time.sleep(0.05)
        assert served, "TensorBoard did not start"
        process.kill()
        process.wait(timeout=10)
        for _ in range(200):
            if not pids_whose_command(lambda command: "tensorboard.main" in command and f"--port {port}" in command):
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"TensorBoard {served} outlived its command")
    finally:
        process.kill()
        for pid in pids_whose_command(lambda command: "tensorboard.main" in command and f"--port {port}" in command):
            os.kill(pid, signal.SIGKILL)


def test_tensorboard_never_outlives_the_command_even_when_linking_new_runs_fails(tmp_path, monkeypatch):
    import socket

    from hpsearch.search import tensorboard

    started, popen = [], subprocess.Popen
    monkeypatch.setattr(subprocess, "Popen", lambda *args, **kwargs: started.append(popen(*args, **kwargs)) or started[-1])
    monkeypatch.setattr(tensorboard, "RELOAD_S", 0.2)

    def storage_gone():
        raise OSError("storage gone")

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(OSError, match="storage gone"):
        tensorboard._tensorboard(tmp_path, "127.0.0.1", port, every_reload=storage_gone)
    [process] = started
    assert process.poll() is not None


def test_tensorboard_refuses_a_port_out_of_range_and_a_host_that_does_not_resolve(tmp_path, capsys):
    """--port 99999 raised a traceback; --port 0 printed http://127.0.0.1:0/; a host that
    does not resolve was said to be a port in use (audit 39)."""
    from hpsearch.search.experiment import ExperimentDir, write_config

    exp = ExperimentDir.create(str(tmp_path), "study")
    write_config(exp, shrunk_example(tmp_path))
    for port in ("99999", "0"):
        with pytest.raises(SystemExit) as caught:
            main(["tensorboard", str(exp.root), "--port", port])
        assert caught.value.code == 2
        assert f"argument --port: {port} is not a port number (1-65535)" in capsys.readouterr().err
    assert main(["tensorboard", str(exp.root), "--host", "no.such.host.invalid", "--port", "6140"]) == 1
    err = capsys.readouterr().err
    assert "--host 'no.such.host.invalid' is no address of this machine" in err and "--port N" not in err, err


def test_tensorboard_on_a_port_in_use_says_so_and_starts_nothing(tmp_path, capsys):
    import socket

    from hpsearch.search.experiment import ExperimentDir

    exp = ExperimentDir.create(str(tmp_path), "study")
    (exp.root / "experiment.yaml").write_text("name: study\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["tensorboard", str(exp.root), "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert f"cannot serve TensorBoard on 127.0.0.1:{port}" in err and "--port" in err


def test_a_callback_that_is_not_a_tune_callback_is_refused_before_anything_starts(tmp_path):
    from pytorch_lightning.callbacks import LearningRateMonitor
    from ray import tune

    from hpsearch.search import api
    from hpsearch.search.errors import ConfigError

    storage = tmp_path / "runs"
    with pytest.raises(ConfigError) as caught:
        api.run(shrunk_example(storage), callbacks=[tune.Callback(), LearningRateMonitor()])
    [problem] = caught.value.problems
    assert problem.field == "callbacks[1]" and "LearningRateMonitor is not a ray.tune.Callback" in problem.message
    assert "configure_callbacks" in problem.message
    with pytest.raises(TypeError, match="callbacks must be a list of ray.tune.Callback objects, not one Callback"):
        api.run(shrunk_example(storage), callbacks=tune.Callback())  # one, not in a list
    assert not storage.exists()
    with pytest.raises(ConfigError, match=r"callbacks\[0\]"):
        api.resume(tmp_path / "no-such-study", callbacks=[print])


def test_studies_side_by_side_in_tensorboard_get_every_studys_columns_and_runs(tmp_path):
    """TensorBoard reads the HParams columns of one study only: the others' parameters and
    metrics were missing from its table. A path with a comma (which --logdir_spec split)
    is fine too."""
    from hpsearch.search.config_loading import load_config
    from hpsearch.search.tensorboard import StudiesSideBySide
    from hpsearch.search.tensorboard_layout import _stored_columns, write_hparams_columns, write_trial_session

    first, second = _study_with(tmp_path / "one", ["COMPLETE"]), _study_with(tmp_path / "a,b", ["COMPLETE"])
    config = shrunk_example(tmp_path)
    write_hparams_columns(first.tensorboard_dir, load_config(config), ["val_loss"])
    config["space"]["model.lr"] = {"type": "float", "low": 1e-5, "high": 1e-4, "log": True}
    config["space"]["model.dropout"] = {"type": "float", "low": 0.0, "high": 0.5}
    config["space"]["data.batch_size"] = {"type": "categorical", "choices": [16, 128]}  # was an int range 32..256
    config.update(metric="val_loss", mode="min")
    write_hparams_columns(second.tensorboard_dir, load_config(config),
                          ["val_acc", "train_acc", "train/loss", "train/loss_epoch", "train/loss_step"])
    # The same trial number with the same values in both studies (one run again with a change).
    runs = [write_trial_session(exp.tensorboard_dir, load_config(config), 0, {"model.lr": 0.01}, "COMPLETE", 3)
            for exp in (first, second)]
    for run in runs:
        (run / "events.out.tfevents.1.host").write_text("scalars")
    combined = tmp_path / "combined"
    combined.mkdir()
    studies = StudiesSideBySide(combined, [first, second, first])
    [columns] = _stored_columns(combined)
    infos = {info.name: info for info in columns.hparam_infos}
    assert set(infos) == {*config["space"], "state", "epochs", "study"}
    # each trial's study, a column of its own, first: the same values in two studies were two lines alike (audit 49)
    assert columns.hparam_infos[0].name == "study" and [value.string_value for value in
                                                        infos["study"].domain_discrete.values] == [
        "one/study", "a,b/study", "one/study-2"]
    assert infos["model.lr"].domain_interval.min_value == pytest.approx(1e-5)  # widened to cover both
    assert infos["model.lr"].domain_interval.max_value == pytest.approx(shrunk_example(tmp_path)["space"]["model.lr"]["high"])
    batch = infos["data.batch_size"].domain_interval  # a range and numeric choices: one range over both
    assert (batch.min_value, batch.max_value) == (16, 256)
    tags = [metric.name.tag for metric in columns.metric_infos]
    assert {"hp/val_acc", "hp/val_loss", "train_acc"} <= set(tags) and len(tags) == len(set(tags))
    # Logged on_step and on_epoch, train/loss is a TensorBoard series only as _step and _epoch.
    assert {"train/loss_step", "train/loss_epoch"} <= set(tags) and "train/loss" not in tags
    # two studies named "study", told apart by the folders above them, and the first given twice
    shown = {str(path.relative_to(combined)) for path in combined.glob("*/*/*")}
    assert shown == {f"{label}/{runs[0].name}" for label in ("one/study", "a,b/study", "one/study-2")}
    folder = combined / "a,b" / "study" / runs[1].name
    assert (folder / "events.out.tfevents.1.host").resolve() == runs[1] / "events.out.tfevents.1.host"
    # Each trial's record is its own row: TensorBoard groups rows by this name, and the
    # two studies' records both named trial_0000-..., so they became one row.
    [original] = runs[1].glob("*.hparams")
    assert _session_group(original) == runs[1].name and _session_group(folder / original.name) == ""
    assert _session_start(original).hparams.get("study") is None
    assert _session_start(folder / original.name).hparams["study"].string_value == "a,b/study"
    later = write_trial_session(second.tensorboard_dir, load_config(config), 1, {"model.lr": 0.02}, "PRUNED", 1)
    studies.link_new_runs()  # a trial that ended since
    assert _session_group(next((combined / "a,b" / "study" / later.name).glob("*.hparams"))) == ""
    # A file the study removed since (an earlier evaluation's test metrics) is not shown
    # as a link to nothing.
    removed = runs[1] / "events.out.tfevents.2.host.test"
    removed.write_text("test metrics")
    studies.link_new_runs()
    assert (folder / removed.name).is_file()
    removed.unlink()
    studies.link_new_runs()
    assert not (folder / removed.name).is_symlink()
    # serve() removes its directory at the end: the studies' own files stay.
    shutil.rmtree(combined)
    assert (runs[1] / "events.out.tfevents.1.host").is_file() and original.is_file()
    # A study whose first trial ends after TensorBoard started: its own columns come then
    # (they were merged once, at the start, and its parameters never got a column).
    shown_later = tmp_path / "shown-later"
    third = _study_with(tmp_path / "new", ["COMPLETE"])
    studies = StudiesSideBySide(shown_later, [first, third])
    assert "model.momentum" not in {info.name for info in _stored_columns(shown_later)[0].hparam_infos}
    config["space"]["model.momentum"] = {"type": "float", "low": 0.5, "high": 0.99}
    write_hparams_columns(third.tensorboard_dir, load_config(config), ["val_acc"])
    studies.link_new_runs()
    [columns] = _stored_columns(shown_later)  # one set: the earlier one removed
    assert "model.momentum" in {info.name for info in columns.hparam_infos}


def _session_start(record):
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import metadata

    [start] = [metadata.parse_session_start_info_plugin_data(value.metadata.plugin_data.content)
               for event in EventFileLoader(str(record)).Load() for value in event.summary.value
               if value.tag == metadata.SESSION_START_INFO_TAG]
    return start


def _session_group(record):
    return _session_start(record).group_name


@pytest.mark.parametrize("damage", ["empty experiment.yaml", "truncated best.json", "garbage journal line"])
def test_a_damaged_study_file_is_named_by_the_reading_commands_without_a_traceback(tmp_path, capsys, damage):
    exp = _study_with(tmp_path, ["COMPLETE"])
    (exp.root / "best.json").write_text('{"value": 0.5, "metric": "val_acc", "mode": "max", "trial": 0}\n')
    if damage == "empty experiment.yaml":
        exp.config_file.write_text("")
        commands, named = (["status"], ["compare"], ["report"]), exp.config_file
    elif damage == "truncated best.json":
        exp.best_json.write_text('{"value": 0.5, "met')
        commands, named = (["best"], ["compare"], ["report"]), exp.best_json
    else:
        from hpsearch.search.searcher import STUDY_FILE

        (exp.root / STUDY_FILE).write_text("this is not json\n{}\n")
        commands, named = (["report"],), exp.root / STUDY_FILE
    for command in commands:
        assert main([*command, str(exp.root)]) == 1, command
        err = capsys.readouterr().err
        assert str(named) in err and "damaged" in err and "Traceback" not in err, (command, err)


def test_a_retry_says_whether_it_starts_from_a_checkpoint_or_from_the_start(tmp_path, capsys):
    from types import SimpleNamespace

    from hpsearch.search.experiment import ExperimentDir
    from hpsearch.search.trials_table import TrialsTable
    from hpsearch.search.tune_callbacks import ProgressDisplay

    error = tmp_path / "error.txt"
    error.write_text("Traceback (most recent call last):\nRuntimeError: worker lost\n")
    exp = ExperimentDir.create(str(tmp_path), "study")
    display = ProgressDisplay(TrialsTable("val_acc", "max", []), 4, exp)
    display.setup()
    assert f"searching: 4 trials in all; results in {exp.root}" in capsys.readouterr().err
    ProgressDisplay(TrialsTable("val_acc", "max", []), 1, exp).setup()
    assert "searching: 1 trial in all" in capsys.readouterr().err
    # trial 2 reported no epoch, but wrote one's checkpoint: stopped between the two
    (exp.trial_dir("trial_0002") / "checkpoints").mkdir(parents=True)
    (exp.trial_dir("trial_0002") / "checkpoints" / "epoch-0000.ckpt").write_bytes(b"written")
    for number, last_result, said in ((0, {}, "from the start (no epoch finished)"),
                                      (1, {"epoch": 2}, "from its last checkpoint"),
                                      (2, {}, "from its last checkpoint")):
        trial = SimpleNamespace(config={"hps_trial_number": number}, last_result=last_result, error_file=str(error))
        display.on_trial_recover(0, [], trial)
        assert f"trial {number}: retrying {said} after RuntimeError: worker lost" in capsys.readouterr().err


@pytest.mark.e2e
def test_a_search_goes_on_when_its_console_reader_leaves(tmp_path):
    """``hpsearch run ... | head -1``: once the reader is gone, output is dropped and the
    search finishes. A BrokenPipeError in the progress display used to end the session as
    crashed and was charged to a trial as a retry."""
    config = shrunk_example(tmp_path / "runs", **{"name": "piped", "search/num_trials": 3,
                                                  "scheduler/type": "none", "scheduler/max_epochs": 1})
    path = write_yaml(tmp_path / "exp.yaml", config)
    process = subprocess.Popen([sys.executable, "-m", "hpsearch.search.cli", "run", str(path)], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    first = process.stdout.readline()
    process.stdout.close()  # as head does after its line
    assert process.wait(timeout=300) == 0, first
    rows = list(csv.DictReader((tmp_path / "runs" / "piped" / "trials.csv").open()))
    assert [(r["state"], r["attempts"], r["error"]) for r in rows] == [("COMPLETE", "1", "")] * 3
    assert json.loads((tmp_path / "runs" / "piped" / "sessions.json").read_text())[-1]["outcome"] == "complete"


def _status_text(tmp_path, trials_csv: str, width: int) -> str:
    """``status`` of a study whose trials.csv is ``trials_csv``, on a console ``width`` wide."""
    from rich.console import Console

    from hpsearch.search.experiment import ExperimentDir, write_config
    from hpsearch.search.status_view import print_status

    exp = ExperimentDir.make(tmp_path / "study")
    write_config(exp, shrunk_example(tmp_path))
    (exp.root / "trials.csv").write_text(trials_csv)
    console = Console(width=width, record=True)
    print_status(exp, console)
    return console.export_text()


def test_status_shows_a_failed_trials_traceback_path_whole(tmp_path):
    traceback = tmp_path / "study" / "trials" / "trial_0001" / "error.txt"
    text = _status_text(tmp_path, "trial,state,reason,best,epochs\n"
                        f"1,FAILED,TypeError: unsupported operand (at /home/me/project/model.py:55 in training_step); "
                        f"not retried (traceback: {traceback}),,1\n", width=110)
    shown = "".join(text.split())  # the table's cells, without its wrapping
    assert "".join(f"(traceback:{traceback})".split()) in shown.replace("│", ""), text
    assert "— 1 trial, val_acc (max; best of each trial)" in text, text  # not "1 trials"


def test_status_shows_the_error_of_a_trial_waiting_for_its_next_try_as_it_is(tmp_path):
    """A trial with no reason yet (waiting for its next try, or left so by a session whose
    cluster went away) showed its error after an empty reason: ": The actor died ..." (audit 21)."""
    text = _status_text(tmp_path, "trial,state,reason,best,epochs,error\n0,PENDING,,,0,The actor died unexpectedly\n",
                        width=110)
    row = next(line for line in text.splitlines() if "PENDING" in line)
    assert "The actor died" in row and ": The" not in row, row


def test_status_names_a_failed_trial_that_scored_better_than_the_best_beside_it(tmp_path, capsys):
    """``--top`` ranked a trial that diverged after its best epoch first, and the summary
    under it named another as the best, with no word why (audit 74)."""
    from hpsearch.search.trials_table import TrialsTable

    exp = _study_with(tmp_path, ["COMPLETE", "FAILED", "PRUNED"])
    table = TrialsTable.load(exp.trials_csv, "val_acc", "max", [])
    for number, best in enumerate((0.9, 0.95, 0.8)):
        table.row(number).update(best=best)
    table.row(1).update(epochs=2)
    table.save(exp.trials_csv)
    assert main(["status", str(exp.root), "--top", "2"]) == 0
    output = " ".join(capsys.readouterr().out.split())
    assert "best val_acc = 0.9 (trial 0); failed trial 1 scored better, val_acc = 0.95 (in 2 epochs), but a failed " \
           "trial is never the best (a later epoch of it failed: its reason says why)" in output, output


def test_status_of_a_large_study_shows_its_latest_running_and_best_trials_and_sums_it_up(tmp_path, capsys):
    """At 3,000 trials status printed 3,300 lines in 6 s, and nothing of the study as a
    whole: how many trials ended how, and which was best (audit 20, D3)."""
    from hpsearch.search.trials_table import TrialsTable

    states = ["PRUNED", "COMPLETE", "FAILED"] * 40 + ["COMPLETE"] * 20 + ["RUNNING"]
    states[10] = "PAUSED"
    exp = _study_with(tmp_path, states)
    table = TrialsTable.load(exp.trials_csv, "val_acc", "max", [])
    table.row(7).update(best=0.97)  # an early trial is the best
    table.row(10).update(best=0.99)  # a paused one has a better value so far
    table.row(9).update(best=0.98)  # a pruned one scored better: not a candidate, but named (audit 33)
    table.save(exp.trials_csv)

    def shown_trials(output: str) -> list[int]:
        return [int(line.split()[0]) for line in output.splitlines()
                if len(line.split()) > 2 and line.split()[1] in {"COMPLETE", "PRUNED", "FAILED", "RUNNING", "PAUSED"}]

    assert main(["status", str(exp.root)]) == 0
    output = capsys.readouterr().out
    assert shown_trials(output) == [7, 10, *range(len(states) - 40, len(states))], output
    assert f"{len(states) - 42} more trials not shown" in output and "--all` shows every one" in output, output
    assert (f"{len(states)} trials: 59 complete, 40 pruned, 40 failed, 1 running, 1 paused; "
            f"best val_acc = 0.97 (trial 7); pruned trial 9 scored better, val_acc = 0.98, but a pruned trial is "
            f"the best only when none completed (Optuna's rule: its value is from an epoch before ASHA judged it); "
            f"paused trial 10 has val_acc = 0.99 so far") in " ".join(output.split()), output
    assert main(["status", str(exp.root), "--all"]) == 0
    output = capsys.readouterr().out
    assert shown_trials(output) == list(range(len(states))) and "not shown" not in output, output
    # of one state: the count of that state's others, and an --all that keeps the state (audit 83)
    assert main(["status", str(exp.root), "--state", "complete"]) == 0
    output = " ".join(capsys.readouterr().out.split())
    assert (f"18 more trials in that state not shown (the latest 40 are, and those running or paused, and the best); "
            f"`hpsearch status {exp.root} --state COMPLETE --all` shows every one") in output, output
    # No trial ended yet: the paused one's value is said as what it is (audit 21, D4).
    young = _study_with(tmp_path / "young", ["PAUSED", "RUNNING"])
    table = TrialsTable.load(young.trials_csv, "val_acc", "max", [])
    table.row(0).update(best=0.5)
    table.row(1).update(best=1.0)
    table.save(young.trials_csv)
    assert main(["status", str(young.root)]) == 0
    assert "2 trials: 1 running, 1 paused; none ended yet, but running trial 1 has val_acc = 1 so far" \
        in capsys.readouterr().out


def test_status_shows_the_metric_with_the_digits_that_tell_trials_apart(tmp_path):
    """At four significant digits 1.005995 and 1.006423 both read 1.006 (audit 33)."""
    text = _status_text(tmp_path, "trial,state,reason,best,epochs\n0,COMPLETE,max_epochs,1.005995,3\n"
                        "1,COMPLETE,max_epochs,1.006423,3\n2,PRUNED,asha,0.25,1\n", width=200)
    cells = [line.split() for line in text.splitlines()]
    assert [cell[5] for cell in cells if cell and cell[0] in "012"] == ["1.006", "1.0064", "0.25"], cells


def test_status_shows_a_searched_precision_with_the_one_the_trial_ran(tmp_path, monkeypatch):
    """A sampled 16-mixed ran as bf16-mixed on CPU; status showed 16-mixed alone (audit 35)."""
    import hpsearch.search.status_view as status_view

    monkeypatch.setattr(status_view.ExperimentDir, "stored_config", lambda exp: {
        "name": "p", "metric": "val_acc", "mode": "max",
        "space": {"trainer.precision": {"type": "categorical", "choices": ["32-true", "16-mixed"]}}})
    text = _status_text(tmp_path, "trial,state,reason,best,epochs,trainer.precision,precision\n"
                        "0,COMPLETE,max_epochs,0.5,1,16-mixed,bf16-mixed\n"
                        "1,COMPLETE,max_epochs,0.6,1,32-true,32-true\n", width=200)
    rows = {line.split()[0]: line for line in text.splitlines() if "COMPLETE" in line and line.split()[0] in "01"}
    assert "16-mixed (ran bf16-mixed)" in rows["0"] and "(ran" not in rows["1"], text


def test_status_shows_the_data_starved_flag_and_bracketed_text_as_written(tmp_path):
    shown = _status_text(tmp_path, "trial,state,reason,best,epochs,data_starved,data_wait_s,train_s,error\n"
                         "0,COMPLETE,max_epochs,0.5,2,True,0.787,0.213,\n"
                         "1,FAILED,RuntimeError: [rank1] [bold]lost,,1,False,0.01,0.5,\n", width=200)
    # the share the flag is for (audit 31: the seconds alone told little)
    assert "max_epochs [data-starved: 79% of its training time waiting on data, 0.787 s in its last epoch]" \
        in shown, shown
    assert "RuntimeError: [rank1] [bold]lost" in shown, shown
    from rich.console import Console

    from hpsearch.search.status_view import print_best

    console = Console(width=200, record=True)
    print_best({"trial": 0, "metric": "val_acc", "value": 0.5, "state": "COMPLETE", "epochs": 2,
                "params": {"model.arch": "[red]wide"}, "checkpoint": "/runs/[b]/best.ckpt"}, console)
    shown = console.export_text()
    assert "model.arch = [red]wide" in shown and "checkpoint: /runs/[b]/best.ckpt" in shown, shown


def test_a_ctrl_c_during_a_resumes_start_up_repeats_the_resume_command(tmp_path, monkeypatch, capsys):
    from hpsearch.search import api

    def start_up_hit_by_ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt  # as in the preflight, before any trial

    monkeypatch.setattr(api, "resume", start_up_hit_by_ctrl_c)
    assert main(["resume", str(tmp_path / "study"), "--address", "10.1.2.3:6379"]) == 130
    err = capsys.readouterr().err
    assert f"nothing ran, and the study is as it was: continue it with:\n  hpsearch resume {tmp_path / 'study'} " \
           f"--address 10.1.2.3:6379" in err, err
    # --retry-failed may have queued the failed trials' configurations before the Ctrl+C (audit 29)
    assert main(["resume", str(tmp_path / "study"), "--retry-failed"]) == 130
    err = capsys.readouterr().err
    assert "the study is as it was (but for the failed trials' configurations queued to run again)" in err, err


def test_the_resume_hints_name_the_cluster_the_study_ran_on(tmp_path, monkeypatch):
    """Followed as printed, a resume without the cluster's address starts a Ray of its
    own on the head instead of using the cluster: status after the driver was killed, and
    a Ray job's stop (its cluster comes as RAY_ADDRESS), printed none."""
    import socket

    from rich.console import Console

    from hpsearch.search.errors import resume_command
    from hpsearch.search.experiment import ExperimentDir, record_session, write_config
    from hpsearch.search.status_view import print_status

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    exp = ExperimentDir.make(tmp_path / "study")
    write_config(exp, shrunk_example(tmp_path))
    (exp.root / "trials.csv").write_text("trial,state,reason,best,epochs\n3,RUNNING,,0.5,1\n")
    with socket.create_server(("127.0.0.1", 0)) as cluster:  # the cluster, still up
        address = f"127.0.0.1:{cluster.getsockname()[1]}"
        record_session(exp, 100.0, None, "running", address=address)
        record_session(exp, 100.0, None, "running", search_complete=False)  # a later update keeps it
        gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        (exp.root / "driver.json").write_text(json.dumps({"pid": int(gone.stdout), "host": socket.gethostname(),
                                                          "since": "then", "command": "hpsearch run"}))
        console = Console(width=300, record=True)
        print_status(exp, console)
        assert (f"trial 3 is not running; `hpsearch resume {exp.root} --address {address}` continues it."
                in console.export_text()), console.export_text()
    # The driver died with its node's Ray (`ray stop` on the head): the cluster is gone too
    console = Console(width=300, record=True)
    print_status(exp, console)
    assert (f"`hpsearch resume {exp.root} --address {address}` continues it (no cluster answers at {address} now: "
            f"without --address it continues on this machine" in console.export_text()), console.export_text()

    assert resume_command(exp.root) == f"hpsearch resume {exp.root}"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")  # a Ray job's driver
    assert resume_command(exp.root) == f"hpsearch resume {exp.root} --address 10.0.0.5:6379"


def test_status_says_a_killed_driver_is_gone_even_before_any_trial_had_a_row(tmp_path, monkeypatch):
    """Killed as its first trials were handed out (or during the test evaluation), a study
    has no RUNNING row: status said only "no trial has started yet", as if a search were
    still starting."""
    import socket

    from rich.console import Console

    from hpsearch.search.experiment import ExperimentDir, record_session, write_config
    from hpsearch.search.status_view import print_status

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    exp = ExperimentDir.make(tmp_path / "study")
    write_config(exp, shrunk_example(tmp_path))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (exp.root / "driver.json").write_text(json.dumps({"pid": int(gone.stdout), "host": socket.gethostname(),
                                                      "since": "then", "command": "hpsearch run"}))

    def status() -> str:
        console = Console(width=300, record=True)
        print_status(exp, console)
        return console.export_text()

    record_session(exp, 100.0, None, "running")
    said = status()
    assert "no trial has started yet" in said and f"`hpsearch resume {exp.root}` continues the study" in said, said
    record_session(exp, 100.0, 200.0, "complete")  # a driver that ended its session is not news
    assert "No search is running" not in status()
    # a session that crashed before its first trial leaves a journal of the study alone, which
    # status called the study's trials (audit 36)
    (exp.root / "optuna.journal").write_text('{"op_code": 0}\n')
    assert "no trial has started yet" in status()
    # a study whose trials.csv is gone has trials all the same: its journal holds them (audit 27)
    (exp.root / "optuna.journal").write_text('{"op_code": 0}\n{"op_code": 4, "study_id": 0}\n{"op_code"')
    said = " ".join(status().split())
    assert "trials.csv is missing, but the study's journal (optuna.journal) holds its trials" in said, said
    assert "no trial has started yet" not in said, said
    exp.trials_csv.write_text("garbage\n")
    assert "trials.csv has no trial rows, but the study's journal" in " ".join(status().split())


def test_status_of_another_tools_experiment_yaml_is_a_clean_error(tmp_path):
    (tmp_path / "experiment.yaml").write_text("x: 1\n")  # many tools write a file of that name
    result = run_cli("status", str(tmp_path), cwd=tmp_path, timeout=60)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert "is not an hpsearch study's (it has no name, metric, mode, space)" in result.stderr, result.stderr


def test_the_resume_command_pastes_into_a_shell_whatever_the_studys_path(monkeypatch):
    """A study under a folder with a space: the printed command, pasted, failed with
    "unrecognized arguments"."""
    import shlex

    from hpsearch.search.errors import resume_command

    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    command = resume_command("/data/my runs/it's here/study")
    assert shlex.split(command) == ["hpsearch", "resume", "/data/my runs/it's here/study"], command


def _a_complete_and_a_failed_trial(tmp_path, first_reason: str):
    """A study of three searched parameters whose second trial failed with a long reason:
    the study, and that reason."""
    from hpsearch.search.experiment import ExperimentDir, write_config

    exp = ExperimentDir.make(tmp_path / "study")
    write_config(exp, shrunk_example(tmp_path))
    reason = "ValueError: boom (at model.py:12); not retried (traceback: /runs/study/trials/trial_00003/error.txt)"
    (exp.root / "trials.csv").write_text(
        "trial,state,reason,best,epochs,attempts,model.lr,model.channels,data.batch_size,epoch_time_s,startup_s\n"
        f"0,COMPLETE,{first_reason},0.8444,7,1,0.004144,8,64,0.1234,3.21\n"
        f"1,FAILED,{reason},0.358,4,1,0.05052,16,32,0.1234,3.21\n")
    return exp, reason


def test_status_at_80_columns_fits_the_screen(tmp_path):
    """At 80 columns the table ran past the screen's edge: the last column was cut to
    "why it s" and a failed trial's reason lost a character a line. Telemetry columns
    now make room, saying so, and every value and reason is shown whole."""
    from rich.console import Console

    from hpsearch.search.status_view import print_status

    exp, reason = _a_complete_and_a_failed_trial(tmp_path, "max_epochs")
    console = Console(width=80, record=True)
    print_status(exp, console)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80, text
    header = next(line for line in text.splitlines() if "state" in line)
    assert header.split() == ["trial", "state", "params", "val_acc", "epochs", "tries", "why", "it", "stopped"], text
    assert "s/epoch and start-up s left out at this width" in text, text
    lines = text.splitlines()
    reasons = "".join("".join(line[header.index("why"):].split()) for line in lines)
    values = "".join(line[header.index("params"):header.index("val_acc")].strip() for line in lines)
    assert "".join(reason.split()) in reasons, text
    assert "lr=0.05052channels=16batch_size=32" in values, text
    assert "0.8444" in text and "0.358" in text, text

    console = Console(width=160, record=True)  # wide enough for everything
    print_status(exp, console)
    text = console.export_text()
    assert "left out" not in text and "3.21" in text, text


def test_status_piped_takes_the_width_columns_asks_for(monkeypatch):
    """Piped, the table was 160 columns whatever COLUMNS said (audit 83)."""
    from hpsearch.search.status_view import table_console

    monkeypatch.setattr(sys.stdout, "isatty", lambda: False, raising=False)
    monkeypatch.setenv("COLUMNS", "90")
    assert table_console().width == 90
    for unusable in ("", "wide", "0"):
        monkeypatch.setenv("COLUMNS", unusable)
        assert table_console().width == 160


@pytest.mark.parametrize("width", [80, 200])
def test_status_of_many_long_named_parameters_keeps_each_pair_whole_and_a_trial_to_a_few_lines(tmp_path, width):
    """32 parameters with long names and long categorical values: folded as one text, pairs
    broke mid-word with the next one on the same line, 41 trials made 3,963 lines at 80
    columns, and at 200 a quarter of the width went unused (audit 83)."""
    from rich.console import Console

    from hpsearch.search.experiment import ExperimentDir, write_config
    from hpsearch.search.status_view import PARAMS_LINES, print_status

    names = [f"model.augmentation_setting_number_{index}" for index in range(32)]
    config = shrunk_example(tmp_path)
    config["space"] = {name: {"type": "categorical", "choices": ["a", "b"]} for name in names}
    exp = ExperimentDir.make(tmp_path / "study")
    write_config(exp, config)
    values = {name: f"policy_{index}_v{index % 3}" for index, name in enumerate(names)}
    header = "trial,state,reason,best,epochs,attempts," + ",".join(names)
    rows = [f"{trial},COMPLETE,asha,0.{trial + 10},3,1," + ",".join(values.values()) for trial in range(3)]
    (exp.root / "trials.csv").write_text("\n".join([header, *rows]) + "\n")
    console = Console(width=width, record=True)
    print_status(exp, console)
    lines = console.export_text().splitlines()
    rule = next(number for number, line in enumerate(lines) if line.startswith("─"))
    table = lines[rule + 1:rule + 1 + 3 * PARAMS_LINES + 1]
    starts = [number for number, line in enumerate(table) if line.split()[:2] in (["0", "COMPLETE"],
                                                                                     ["1", "COMPLETE"])]
    assert len(starts) == 2 and starts[1] - starts[0] <= PARAMS_LINES, lines  # a trial's rows at most 8 lines
    first_trial = table[starts[0]:starts[1]]
    at = first_trial[0].index("augmentation")
    cells = [line[at:].split("  ")[0].strip() for line in first_trial]
    # each pair whole: on lines of its own where longer than the column (folded there, at
    # 80 columns), else beside others, never broken with the next one on its line
    joined = "".join(cells) if width == 80 else " ".join(cells)
    shown = [index for index, name in enumerate(names)
             if f"{name.rsplit('.')[-1]}={values[name]}" in joined]
    assert shown == list(range(len(shown))) and len(shown) >= 2, cells
    assert cells[-1] == f"+{32 - len(shown)} more", cells
    if width == 80:
        assert all(cell.startswith("augmentation") == (number % 3 == 0) for number, cell in enumerate(cells[:-1])), \
            cells
    if width == 200:  # the room not needed by the reasons goes to the values
        assert max(len(line) for line in table) >= 190, table


@pytest.mark.parametrize("width", [72, 64, 56])
def test_status_under_80_columns_folds_the_values_and_reasons_rather_than_cut_them(tmp_path, width):
    """Under about 73 columns even the least widths of the shared values and the reasons
    did not fit: the table ran past the screen's edge, which cut every reason there
    ("early_stoppin"). They now give up their least widths, evenly, and fold."""
    from rich.console import Console

    from hpsearch.search.status_view import print_status

    exp, reason = _a_complete_and_a_failed_trial(tmp_path, "early_stopping")
    console = Console(width=width, record=True)
    print_status(exp, console)
    text = console.export_text()
    # the table; the study's line after it is left to the terminal to wrap (soft_wrap)
    assert max(len(line) for line in text.splitlines() if not line.startswith("2 trials:")) <= width, text
    lines = text.splitlines()
    rule = next(number for number, line in enumerate(lines) if line.startswith("─"))
    first_row = lines[rule + 1]
    reasons_at = first_row.index("early")  # the reasons' column starts there
    values_at, values_end = first_row.index("lr="), first_row.index("0.8444")
    reasons = "".join(line[reasons_at:].strip() for line in lines[rule + 1:])
    values = "".join(line[values_at:values_end].strip() for line in lines[rule + 1:])
    assert "early_stopping" in reasons and "".join(reason.split()) in "".join(reasons.split()), text
    assert "lr=0.004144channels=8batch_size=64" in values, text
    assert "lr=0.05052channels=16batch_size=32" in values, text
    assert "0.8444" in text and "0.358" in text and "…" not in text, text


def test_status_at_120_columns_cuts_no_figure(tmp_path):
    """With 7 searched parameters at 120 columns, status cut every figure and header to
    "0.00…" and "mode…"; the values now share one folded column when a column each
    would not fit, and a column each is titled by its argument's name."""
    from rich.console import Console

    from hpsearch.search.experiment import ExperimentDir, write_config
    from hpsearch.search.status_view import print_status

    names = ["lr", "dropout", "hidden_units", "depth", "activation", "flag", "scale"]
    config = shrunk_example(tmp_path, **{"space": {f"model.{name}": {"type": "categorical", "choices": [1, 2]}
                                                   for name in names}})
    exp = ExperimentDir.make(tmp_path / "study")
    write_config(exp, config)
    values = [0.004430179, 0.4, 84, 3, "relu", False, 2.5]
    (exp.root / "trials.csv").write_text(
        "trial,state,reason,best,epochs," + ",".join(f"model.{n}" for n in names) + ",epoch_time_s,startup_s\n"
        + "".join(f"{t},COMPLETE,max_epochs,0.5703999,1," + ",".join(map(str, values)) + ",0.0906,3.581\n"
                  for t in range(3)))
    console = Console(width=120, record=True)
    print_status(exp, console)
    text = console.export_text()
    assert "…" not in text and "lr=0.00443" in text and "activation=relu" in text and "0.5704" in text, text
    assert "COMPLETE" in text and "3.581" in text, text

    write_config(exp, shrunk_example(tmp_path))  # three parameters: a column each, by its argument's name
    # Two sessions on one machine: two local Rays, each a node with an id of its own.
    (exp.root / "trials.csv").write_text("trial,state,reason,best,epochs,model.lr,data.batch_size,node_id,node_ip\n"
                                         "0,COMPLETE,max_epochs,0.5,1,0.004430179,64,ab12,10.0.0.5\n"
                                         "1,COMPLETE,max_epochs,0.5,1,0.004430179,64,cd34,10.0.0.5\n")
    console = Console(width=120, record=True)
    print_status(exp, console)
    text = console.export_text()
    header = next(line for line in text.splitlines() if "state" in line)
    assert header.split()[:5] == ["trial", "state", "lr", "channels", "batch_size"] and "0.00443" in text, text
    assert "node" not in header, text  # shown once the trials ran on more than one machine


@pytest.mark.parametrize("width", [60, 80, 120, 250])
def test_status_sets_each_figure_columns_width_as_rich_would_and_measures_only_the_reasons(width, monkeypatch):
    """``status --all`` at 3,600 trials took 6.4 s, most of it rich measuring every cell
    (twice where the table is wider than the terminal). The columns that never fold now get
    their widths from their cells, once: the table must come out as rich would lay it out,
    at any width, and only the reasons' cells be measured."""
    from rich.console import Console
    from rich.text import Text

    from hpsearch.search.status_view import _layout, _trials_table

    params = ["model.lr", "model.channels", "data.batch_size"]
    reasons = ["max_epochs", "pruned by ASHA after epoch 3",
               "ValueError: boom (at model.py:12); not retried (traceback: /runs/study/trials/trial_00003/error.txt)"]
    rows = [{"trial": number, "state": ["COMPLETE", "PRUNED", "FAILED", "RUNNING"][number % 4],
             "reason": reasons[number % 3], "best": 1 / (number + 3), "epochs": number % 11, "attempts": 1 + number % 2,
             "node_losses": 1 if number == 77 else None, "model.lr": 10 ** -(number % 7) * 1.2345678,
             "model.channels": 8 * (1 + number % 4), "data.batch_size": 32 + number, "epoch_time_s": 0.1 * number,
             "startup_s": 3.21, "node_ip": f"10.0.0.{number % 2}", "node_id": f"{number:08x}abc"}
            for number in range(120)]
    measured = []
    measure = Text.__rich_measure__
    monkeypatch.setattr(Text, "__rich_measure__",
                        lambda text, *args: measured.append(text.plain) or measure(text, *args))
    console = Console(width=width, record=True)
    layout = _layout(console, "study", rows, params, "val_acc")
    table = _trials_table("study", rows, params, "val_acc", *layout)
    console.print(table)
    shown = console.export_text()
    figures = {Text.from_markup(str(cell)).plain if isinstance(cell, str) else cell.plain
               for column in table.columns if column.no_wrap for cell in column._cells} - {""}
    assert not figures & set(measured), sorted(figures & set(measured))[:5]
    # the reasons' cells (left empty while the layout is chosen), in each of rich's passes
    assert len([text for text in measured if text]) <= 3 * (len(rows) + 1), len(measured)

    for column in table.columns:  # rich's own layout, measuring every cell
        if column.no_wrap:
            column.width = None
    console = Console(width=width, record=True)
    console.print(table)
    assert shown == console.export_text()


def test_every_public_name_of_the_package_resolves():
    """``hpsearch.load_config``, listed in ``__all__``, raised ImportError: it pointed at a
    module the function had moved out of."""
    import hpsearch

    for name in hpsearch.__all__:
        assert getattr(hpsearch, name) is not None, name
    assert callable(hpsearch.load_config) and hpsearch.load_config.__module__ == "hpsearch.search.config_loading"
    # what the README's Python API section names, to catch or filter (audit 32)
    from hpsearch.search import api, errors

    assert (hpsearch.Interrupted, hpsearch.CallbackError, hpsearch.ConfigError) == \
        (errors.Interrupted, errors.CallbackError, errors.ConfigError)
    assert (hpsearch.NoResultWarning, hpsearch.StoppedEarlyWarning) == (api.NoResultWarning, api.StoppedEarlyWarning)
    # what resume, load_trial and a cluster's run raise, and the types they return (audit 51: AttributeError)
    from hpsearch.search import cluster_join, storage, trained

    assert (hpsearch.ExperimentError, hpsearch.ResourceError, hpsearch.DiskFullError, hpsearch.UnreadableDataFile,
            hpsearch.ClusterError, hpsearch.StorageError, hpsearch.SearchResult, hpsearch.LoadedTrial) == (
        errors.ExperimentError, errors.ResourceError, errors.DiskFullError, errors.UnreadableDataFile,
        cluster_join.ClusterError, storage.StorageError, api.SearchResult, trained.LoadedTrial)


def test_a_ctrl_c_while_the_command_leaves_ray_is_ignored(monkeypatch):
    """A second Ctrl+C just after a stopped search printed its result landed in Ray's
    shutdown: the command ended with a traceback, or with status 1 and its last lines of
    output lost. The study is saved by then; the Ctrl+C is ignored until Ray is left."""
    import os
    import signal
    import time
    import types

    from hpsearch.search.cli import _disconnect_ray

    shut_down = []

    def shutdown():
        os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl+C, mid-shutdown
        time.sleep(0.2)
        shut_down.append(True)

    monkeypatch.setitem(sys.modules, "ray", types.SimpleNamespace(is_initialized=lambda: True, shutdown=shutdown))
    before = signal.getsignal(signal.SIGINT)
    _disconnect_ray()
    assert shut_down == [True] and signal.getsignal(signal.SIGINT) is before



def test_a_ctrl_c_while_the_result_prints_is_ignored(monkeypatch, tmp_path, capsys):
    """One landing as a completed search printed its result said "interrupted; nothing ran,
    and the study is as it was", cut the best trial's lines off and exited 130 (audit 24)."""
    import argparse
    import os
    import signal
    import time

    from hpsearch.search import api, cli, status_view

    def print_best(best):
        os.kill(os.getpid(), signal.SIGINT)  # the Ctrl+C, mid-print
        time.sleep(0.2)
        print(f"best trial {best['trial']}")

    monkeypatch.setattr(status_view, "print_best", print_best)
    monkeypatch.setattr(api, "resume", lambda *args, **kwargs: api.SearchResult(tmp_path, "complete", {"trial": 3}))
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        try:
            code = cli.cmd_resume(argparse.Namespace(experiment_dir=str(tmp_path), overrides=[], address=None,
                                                     verbose=False, retry_failed=False))
        except KeyboardInterrupt:
            pytest.fail("the Ctrl+C interrupted the printing of a completed search's result")
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)
    assert code == 0 and "best trial 3" in capsys.readouterr().out


def test_once_the_command_has_decided_its_exit_status_stop_signals_are_ignored(tmp_path, example_config):
    """What is left is the interpreter's exit, 1.5 s after a search here, in which a Ctrl+C
    or SIGTERM ended the command with 130 or 143 instead of its status (audit 32). Only for
    the command's own process: main([...]) called from Python leaves them as they were."""
    from conftest import write_yaml

    path = write_yaml(tmp_path / "exp.yaml", example_config)
    script = f"""
import signal, sys
from hpsearch.search import cli
sys.argv = ["hpsearch", "check", {str(path)!r}]
called = cli.main(["check", {str(path)!r}])
kept = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
code = cli.main()
ignored = [signal.getsignal(s) == signal.SIG_IGN for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)]
print(called, code, kept[0] is signal.default_int_handler, kept[1] == signal.SIG_DFL, ignored)
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "0 0 True True [True, True, True]", done.stdout + done.stderr


def test_a_command_started_with_nohup_keeps_ignoring_hang_ups():
    """nohup ignores SIGHUP so that the command outlives the terminal; hpsearch took the
    hang-up at the logout for a stop and ended the search (audit 32)."""
    import signal

    from hpsearch.search import cli

    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as nohup starts it
        cli._stop_signals_act_as_ctrl_c()
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        assert callable(signal.getsignal(signal.SIGTERM))  # a stop signal still
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # started without it, a hang-up stops the search
        cli._stop_signals_act_as_ctrl_c()
        assert callable(signal.getsignal(signal.SIGHUP))
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_a_sigterm_once_the_search_has_returned_is_ignored_as_a_ctrl_c_is():
    """The study is saved by then, and the command prints its result: a SIGTERM there cut
    the report off with "interrupted" (or, with Ray's handler left, exited with 15; audit 30)."""
    import os
    import signal

    from hpsearch.search import cli

    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        cli._stop_signals_act_as_ctrl_c()
        with cli._ctrl_c_ignored():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)  # the handler runs here, between bytecodes
        with pytest.raises(KeyboardInterrupt):  # before and during the search it is a Ctrl+C
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def test_a_log_gets_one_line_per_trial_and_the_summary_only_now_and_then_and_at_the_end(tmp_path, capsys):
    """Not on a terminal, every trial's line had the summary under it: 2 lines a trial,
    3,600 lines at 1,800 trials (audit 40)."""
    from types import SimpleNamespace

    from hpsearch.search.experiment import ExperimentDir
    from hpsearch.search.trials_table import TrialsTable
    from hpsearch.search.tune_callbacks import ProgressDisplay

    table = TrialsTable("val_acc", "max", [])
    display = ProgressDisplay(table, 5, ExperimentDir.create(str(tmp_path), "study"))
    display.setup()
    capsys.readouterr()
    for number in range(5):
        table.rows[number] = {"trial": number, "state": "PRUNED", "reason": "pruned", "best": 0.5, "epochs": 1}
        display.on_trial_complete(0, [], SimpleNamespace(config={"hps_trial_number": number}))
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0] for line in lines if line.startswith("trial")] == [f"trial {n}" for n in range(5)]
    summaries = [line for line in lines if " done · " in line]
    assert len(summaries) == 2 and "1/5 done" in summaries[0] and "5/5 done" in summaries[1], lines


def test_a_log_gets_the_summary_every_30_s_while_no_trial_ends(tmp_path, capsys):
    """In a log, the summary came only under an ended trial's line: with long trials,
    nothing was printed for minutes (audit 56). It now comes alone every 30 s as well."""
    from hpsearch.search.experiment import ExperimentDir
    from hpsearch.search.trials_table import TrialsTable
    from hpsearch.search.tune_callbacks import ProgressDisplay

    table = TrialsTable("val_acc", "max", [])
    display = ProgressDisplay(table, 4, ExperimentDir.create(str(tmp_path), "study"))
    display.setup()
    capsys.readouterr()
    display.on_step_end(1, [])
    assert capsys.readouterr().err == ""  # not at the start
    display.started -= ProgressDisplay.LOG_SUMMARY_EVERY_S
    table.rows[0] = {"trial": 0, "state": "RUNNING", "reason": "", "best": None, "epochs": 1}
    display.on_step_end(2, [])
    display.on_step_end(3, [])  # and not again until 30 s more have passed
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "0/4 done" in lines[0] and "1 running" in lines[0], lines


def test_a_note_a_trial_gets_at_a_later_epoch_is_said_too_and_each_note_once(tmp_path, capsys):
    """Every report carries all of a trial's notes; one that came at a later epoch (DDP
    ranks found to disagree) after one said at the start went unsaid (audit 82)."""
    from types import SimpleNamespace

    from hpsearch.search.experiment import ExperimentDir
    from hpsearch.search.outcome import TRIAL_NUMBER
    from hpsearch.search.trials_table import TrialsTable
    from hpsearch.search.tune_callbacks import ProgressDisplay

    display = ProgressDisplay(TrialsTable("val_acc", "max", []), 4, ExperimentDir.create(str(tmp_path), "study"))
    display.setup()
    capsys.readouterr()
    trial = SimpleNamespace(trial_id="a", config={TRIAL_NUMBER: 3})
    for notes in ("checkpoint set aside", "checkpoint set aside", "checkpoint set aside; ranks differ",
                  "checkpoint set aside; ranks differ"):
        display.on_trial_result(1, [], trial, {"hps_notes": notes})
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("trial 3")]
    assert said == ["trial 3: checkpoint set aside", "trial 3: ranks differ"], said


def test_the_summary_says_about_how_long_the_session_has_left(tmp_path, monkeypatch):
    """At the pace this session has ended trials (a resumed study's earlier ones not
    counted), once it has ended two; the time budget's rest when that ends first."""
    from hpsearch.search import tune_callbacks
    from hpsearch.search.experiment import ExperimentDir
    from hpsearch.search.trials_table import TrialsTable
    from hpsearch.search.tune_callbacks import ProgressDisplay

    def display_at(seconds: float, ended_before: int, ended_here: int, budget: float | None = None) -> str:
        table = TrialsTable("val_acc", "max", [])
        for number in range(ended_before):
            table.rows[number] = {"trial": number, "state": "PRUNED", "best": 0.5, "epochs": 1}
        monkeypatch.setattr(tune_callbacks.time, "monotonic", lambda: 1000.0)
        display = ProgressDisplay(table, 10, ExperimentDir.create(str(tmp_path), f"s{seconds}-{ended_before}"),
                                  budget)
        display.setup()
        for number in range(ended_before, ended_before + ended_here):
            table.rows[number] = {"trial": number, "state": "COMPLETE", "best": 0.6, "epochs": 3}
        monkeypatch.setattr(tune_callbacks.time, "monotonic", lambda: 1000.0 + seconds)
        return display.summary()

    assert "1/10 done ·" in display_at(50, 0, 1)  # too few to go by
    assert "2/10 done (about 6m 40s left) ·" in display_at(100, 0, 2)  # 8 trials at 50 s each
    assert "7/10 done (about 2m 30s left) ·" in display_at(100, 5, 2)  # 3 at 50 s: the resumed 5 took none of it
    assert "2/10 done (time budget ends in 20s) ·" in display_at(100, 0, 2, budget=120)
    assert "0/10 done (time budget ends in 1h 01m) ·" in display_at(100, 0, 0, budget=3760)
    assert "10/10 done ·" in display_at(100, 0, 10, budget=120)


def test_status_shows_the_top_trials_best_first_and_trials_in_the_states_asked(tmp_path):
    """At 1,800 trials the 10 best were only in trials.csv: status shows the latest 40 and
    the best one (audit 40)."""
    from rich.console import Console

    from hpsearch.search.experiment import ExperimentDir, write_config
    from hpsearch.search.status_view import print_status

    exp = ExperimentDir.make(tmp_path / "study")
    write_config(exp, shrunk_example(tmp_path))  # val_acc, max
    states = ["COMPLETE", "PRUNED", "FAILED"]
    lines = [f"{n},{states[n % 3]},,{'' if n % 3 == 2 else (n * 37) % 100 / 100},1" for n in range(90)]
    (exp.root / "trials.csv").write_text("trial,state,reason,best,epochs\n" + "\n".join(lines) + "\n")

    def shown(**options) -> list[int]:
        console = Console(width=200, record=True)
        print_status(exp, console, **options)
        cells = [line.split() for line in console.export_text().splitlines()]
        return [int(row[0]) for row in cells if len(row) > 1 and row[0].isdigit() and row[1] in states]

    values = {n: (n * 37) % 100 / 100 for n in range(90) if n % 3 != 2}
    assert shown(top=5) == sorted(values, key=lambda n: (-values[n], n))[:5]
    assert shown(states=("FAILED",)) == [n for n in range(90) if n % 3 == 2]  # 30: no cut at 40
    pruned_top = shown(states=("PRUNED",), top=3)
    assert pruned_top == sorted((n for n in values if n % 3 == 1), key=lambda n: (-values[n], n))[:3]
    assert len(shown()) == 41  # the latest 40 and the best, as before


def test_the_study_run_names_the_best_trial_once_per_change_across_sessions(tmp_path):
    """Each session named the best again as it began (steps 5, 6 and 10 named one trial;
    audit 43): a session starts knowing the best an earlier one named."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tensorboard.summary.writer import event_file_writer

    from hpsearch.search.tensorboard_layout import StudyRun

    # The two sessions' files get the writers' counter's 9 and 10 (or 99 and 100): in one
    # second, the second session's file sorted first, and TensorBoard dropped the first's points.
    counter = event_file_writer._global_uid
    while len(str(counter._value)) == len(str(counter._value + 1)):
        counter.get()
    first = {"trial": 2, "best": 0.5, "epochs": 1, "model.lr": 0.01}
    better = {"trial": 7, "best": 0.75, "epochs": 3, "model.lr": 0.02}
    for session in ([(1, first, {"model.lr": 0.01}), (2, first, {"model.lr": 0.01})],
                    [(3, first, {"model.lr": 0.01}), (4, better, {"model.lr": 0.02})]):
        run = StudyRun(tmp_path, "val_acc", None if session[0][0] == 1 else first)
        for ended, best, params in session:
            run.add(ended, best, params)
        run.close()
    accumulator = EventAccumulator(str(tmp_path / "study"), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    assert [(p.step, p.value) for p in accumulator.Scalars("study/best_val_acc")] == [(1, 0.5), (2, 0.5), (3, 0.5),
                                                                                    (4, 0.75)]
    said = [(t.step, t.tensor_proto.string_val[0].decode()) for t in accumulator.Tensors("study/best_trial")]
    assert said == [(1, "trial_0002-lr=0.01: val_acc = 0.5 after 1 epoch"),
                    (4, "trial_0007-lr=0.02: val_acc = 0.75 after 3 epochs")], said


@pytest.mark.parametrize("verbose", [False, True])
def test_a_search_commands_process_keeps_rays_unhandled_error_logs_off_unless_verbose(monkeypatch, verbose):
    """Ray logged a failed try's unfetched error, with its traceback, also as the command
    disconnected from Ray after the search (audit 58)."""
    import signal

    from hpsearch.search import cli

    seen = {}
    monkeypatch.delenv("RAY_IGNORE_UNHANDLED_ERRORS", raising=False)
    monkeypatch.setattr(cli, "_run_command", lambda args: seen.setdefault(
        "ignored", os.environ.get("RAY_IGNORE_UNHANDLED_ERRORS")) and 0)
    handlers = {name: signal.getsignal(name) for name in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        cli.main(["resume", "runs/x", *(["-v"] if verbose else [])])
    finally:
        for name, handler in handlers.items():
            signal.signal(name, handler)
    assert seen["ignored"] == (None if verbose else "1")
