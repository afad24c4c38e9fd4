"""Real searches through the CLI: Ray, Optuna, ASHA and Lightning on the digits data, on CPU."""

from __future__ import annotations

import csv
import json
import re
import shutil
import time
from pathlib import Path

import pytest

from conftest import FIXTURES, run_cli, write_yaml

pytestmark = pytest.mark.e2e


def study_of(exp_dir: Path, name: str):
    from hpsearch.search.searcher import open_study

    return open_study(exp_dir, name, "max")


def rows_of(exp_dir: Path) -> list[dict]:
    with (exp_dir / "trials.csv").open() as handle:
        return list(csv.DictReader(handle))


def test_every_trial_finished_and_asha_stopped_some_early(finished_search):
    exp_dir, config, _ = finished_search
    rows = rows_of(exp_dir)
    assert len(rows) == 6
    assert {r["state"] for r in rows} <= {"COMPLETE", "PRUNED"}
    pruned = [r for r in rows if r["state"] == "PRUNED"]
    assert pruned, rows
    assert all(int(r["epochs"]) < config["scheduler"]["max_epochs"] for r in pruned)
    assert all("pruned by ASHA" in r["reason"] for r in pruned)
    assert {(r["device"], r["precision"], r["world_size"], r["strategy"], r["pin_memory"], r["loader_sharing"],
             r["batch_slots"]) for r in rows} == {("cpu", "32-true", "1", "single", "False", "file_system", "False")}


def test_ended_trials_keep_only_their_best_checkpoint(finished_search):
    # Epoch checkpoints are for resume, and an ended trial is never resumed; and with
    # search.keep_checkpoints: 3, only the 3 best trials and the study's best keep theirs.
    exp_dir, _, _ = finished_search
    rows = rows_of(exp_dir)
    best = json.loads((exp_dir / "best.json").read_text())["trial"]
    top = {int(r["trial"]) for r in sorted(rows, key=lambda r: (-float(r["best"]), int(r["trial"])))[:3]} | {best}
    assert len(top) < len(rows)
    for row in rows:
        kept = sorted(p.name for p in (exp_dir / "trials" / f"trial_{int(row['trial']):04d}" / "checkpoints").iterdir())
        assert kept == (["best.ckpt"] if int(row["trial"]) in top else []), (row["trial"], row["state"], kept)


def test_a_session_that_ended_leaves_none_of_ray_tunes_own_files(finished_search):
    """Tune's experiment state, about 50 KB a trial that nothing reads, was the largest part
    of a large study (40 of 85 MB at 700 trials; audit 83)."""
    exp_dir, _, _ = finished_search
    assert not list((exp_dir / "tune").glob("session-*")), list((exp_dir / "tune").iterdir())


def test_a_search_prints_none_of_rays_own_warnings(finished_search):
    # Ray's notice that a new local Ray has token authentication on came at every run.
    _, _, result = finished_search
    output = result.stdout + result.stderr
    assert not re.search(r"WARNING \S+\.py:\d+ --", output), output


def test_the_optuna_study_holds_every_trial_with_the_right_state(finished_search):
    exp_dir, config, _ = finished_search
    study = study_of(exp_dir, config["name"])
    table = {int(r["trial"]): r for r in rows_of(exp_dir)}
    assert len(study.trials) == 6
    for trial in study.trials:
        expected = {"COMPLETE": "COMPLETE", "PRUNED": "PRUNED"}[table[trial.number]["state"]]
        assert trial.state.name == expected
        assert set(trial.params) == set(config["space"])
        assert trial.intermediate_values, trial.number
    completed = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert all(t.value == max(t.intermediate_values.values()) for t in completed)


def test_best_json_is_valid_and_its_checkpoint_loads(finished_search):
    from hpsearch.models.cnn import CNNClassifier

    exp_dir, config, result = finished_search
    best = json.loads((exp_dir / "best.json").read_text())
    study = study_of(exp_dir, config["name"])
    # The evaluation can take a while: the command says it runs.
    assert f"evaluating the best trial ({best['trial']}) on the test split" in result.stderr  # progress
    assert best["value"] == pytest.approx(study.best_value, rel=1e-5)
    assert best["trial"] == study.best_trial.number
    assert best["params"] == pytest.approx(study.best_trial.params)
    assert 0.0 <= best["test_metrics"]["test_acc"] <= 1.0
    model = CNNClassifier.load_from_checkpoint(best["checkpoint"])
    assert model.hparams.lr == pytest.approx(best["params"]["model.lr"])
    assert best["config"]["model"]["init_args"]["channels"] == best["params"]["model.channels"]


RETRAIN = """
import json, sys
import pytorch_lightning as pl
import torch
from hpsearch.search.components import resolve_class

best = json.load(open(sys.argv[1]))
config = best["config"]
pl.seed_everything(best["seed"], workers=True, verbose=False)
torch.set_num_threads(int(config["resources"]["cpus_per_trial"]))
data = resolve_class("data", config["data"]["class_path"])(**config["data"]["init_args"])
model = resolve_class("model", config["model"]["class_path"])(**config["model"]["init_args"])
trainer_settings = config["trainer"]
values = []

class Values(pl.Callback):
    def on_validation_end(self, trainer, module):
        values.append(float(trainer.callback_metrics[best["metric"]]))

trainer = pl.Trainer(max_epochs=best["best_epoch"], precision=best["precision"],  # what it ran with
                     gradient_clip_val=trainer_settings["gradient_clip_val"],
                     accumulate_grad_batches=trainer_settings["accumulate_grad_batches"],
                     deterministic=trainer_settings["deterministic"], num_sanity_val_steps=0, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     callbacks=[Values()])
trainer.fit(model, datamodule=data)
print(json.dumps(values))
"""


def test_the_best_trial_trains_again_to_its_values_from_best_json(finished_search, tmp_path):
    """The best trial could not be trained again outside the search: its seed (then the
    study's seed plus its number) was recorded nowhere, and the epoch of its best value
    was not said (audit 28). best.json now has both; plain Lightning, with its config and
    seed, reproduces each epoch's value up to the best."""
    import subprocess
    import sys

    exp_dir, config, _ = finished_search
    best = json.loads((exp_dir / "best.json").read_text())
    from hpsearch.search.seeding import training_seed

    row = {int(r["trial"]): r for r in rows_of(exp_dir)}[best["trial"]]
    assert best["seed"] == int(row["seed"]) == training_seed(config["search"].get("seed", 0), best["trial"])
    reported = study_of(exp_dir, config["name"]).trials[best["trial"]].intermediate_values
    assert best["best_epoch"] == min(epoch for epoch, value in reported.items()
                                     if value == pytest.approx(best["value"], rel=1e-5)), (best, reported)
    (tmp_path / "retrain.py").write_text(RETRAIN)
    done = subprocess.run([sys.executable, "retrain.py", str(exp_dir / "best.json")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    values = json.loads(done.stdout.strip().splitlines()[-1])
    assert values == [reported[epoch] for epoch in range(1, best["best_epoch"] + 1)], (values, reported)
    shown = run_cli("best", str(exp_dir), cwd=exp_dir, timeout=60).stdout
    assert f"at epoch {best['best_epoch']} (" in shown and f"seed {best['seed']})" in shown, shown


def test_status_and_best_commands_read_the_experiment(finished_search):
    exp_dir, config, _ = finished_search
    status = run_cli("status", str(exp_dir), cwd=exp_dir, timeout=60)
    assert status.returncode == 0, status.stderr
    for row in rows_of(exp_dir):
        assert row["state"] in status.stdout
    best = run_cli("best", str(exp_dir), "--json", cwd=exp_dir, timeout=60)
    assert json.loads(best.stdout) == json.loads((exp_dir / "best.json").read_text())


def test_resume_extends_a_finished_study_without_rerunning_its_trials(finished_search, tmp_path):
    exp_dir, config, _ = finished_search
    copy = tmp_path / "copy"
    shutil.copytree(exp_dir, copy)
    before = {p.name: sorted(f.name for f in p.iterdir()) for p in (copy / "trials").iterdir()}
    result = run_cli("resume", str(copy), "--set", "search.num_trials=7", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = rows_of(copy)
    assert len(rows) == 7 and [int(r["trial"]) for r in rows] == list(range(7))
    after = {p.name: sorted(f.name for f in p.iterdir()) for p in (copy / "trials").iterdir()}
    assert {k: after[k] for k in before} == before  # earlier trials untouched: not re-run
    assert len(study_of(copy, config["name"]).trials) == 7
    # TensorBoard's study run goes on from the first session's steps (a lower step would
    # make TensorBoard drop the points after it)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    study_run = EventAccumulator(str(copy / "tensorboard" / "study"), size_guidance={"scalars": 0})
    study_run.Reload()
    points = study_run.Scalars("study/best_val_acc")
    assert [point.step for point in points] == list(range(1, 8)), points
    assert points[-1].value == pytest.approx(json.loads((copy / "best.json").read_text())["value"], rel=1e-6)


def test_the_best_trial_is_evaluated_and_described_as_it_was_trained_after_a_resume_changed_a_setting(
        finished_search, tmp_path, monkeypatch):
    """A resume may change the precision: best.json's config and the test evaluation of
    the best trial still follow what that trial trained with. (No warning that trials
    from now on use it: the search is complete, and no trial runs.)"""
    from hpsearch.search import api, results

    exp_dir, _, _ = finished_search
    copy = tmp_path / "copy"
    shutil.copytree(exp_dir, copy)
    assert all((trial / "experiment.json").is_file() for trial in (copy / "trials").iterdir())
    (copy / "best.json").unlink()  # the search is complete: resume runs only the evaluation
    earlier_best = copy / "trials" / "trial_0099" / "test"  # a trial that was the best at an earlier evaluation
    earlier_best.mkdir(parents=True)
    (earlier_best / "events.out.tfevents.1.host").write_bytes(b"")
    evaluated = []
    monkeypatch.setattr(results, "evaluate_on_cluster", lambda config, params, checkpoint, mirror=None, seed=None:
                        evaluated.append(config.trainer.precision) or {"test_acc": 0.5})
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = api.resume(copy, ["trainer.precision=bf16-mixed"])
    assert not [w for w in caught if "resume changes" in str(w.message)], [str(w.message) for w in caught]
    assert result.evaluated_again and evaluated == ["auto"]  # as it trained (on CPU: 32-true), not bf16-mixed
    assert result.best["config"]["trainer"]["precision"] == "auto"
    # TensorBoard has this evaluation's test metrics, once: the first search's are gone.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    [test_record] = (copy / "tensorboard").glob("*/events.out.tfevents.*.test")
    accumulator = EventAccumulator(str(test_record.parent))
    accumulator.Reload()
    assert [event.value for event in accumulator.Scalars("test_acc")] == [0.5]
    assert not earlier_best.exists()  # only the best trial's own evaluation is left



def test_a_ctrl_c_that_lightnings_teardown_failed_on_is_an_interrupt_not_a_failed_evaluation(finished_search, tmp_path,
                                                                                               monkeypatch):
    """A Ctrl+C landing in the evaluation's teardown: Lightning handled it by closing its
    logger as failed, whose flush raised OSError ('Writer is closed'), which replaced it,
    and the evaluation was recorded as failed by the test code (audit 32)."""
    from hpsearch.search import results
    from hpsearch.search.config_loading import load_config
    from hpsearch.search.experiment import ExperimentDir

    exp_dir, config, _ = finished_search
    copy = tmp_path / "copy"
    shutil.copytree(exp_dir, copy)
    (copy / "best.json").unlink()

    def interrupted_in_teardown(config, params, checkpoint, mirror=None, seed=None):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise OSError("Writer is closed")  # raised while handling it, as in Lightning's teardown

    monkeypatch.setattr(results, "evaluate_on_cluster", interrupted_in_teardown)
    with pytest.raises(KeyboardInterrupt):
        results.finalize(load_config(config), ExperimentDir(copy))
    assert not (copy / "best.json").exists() and not (copy / results.EVALUATION_ERROR).exists()


def test_a_resume_evaluates_a_best_trial_that_best_json_does_not_name(finished_search, tmp_path, monkeypatch):
    """A session that found a new best trial and was stopped or killed during its test
    evaluation left the earlier best's best.json; every resume after it said "already
    complete" and kept it (audit 24). Played here by a best.json of another trial."""
    from hpsearch.search import api, results

    exp_dir, _, _ = finished_search
    copy = tmp_path / "copy"
    shutil.copytree(exp_dir, copy)
    best = json.loads((copy / "best.json").read_text())
    other = next(r for r in rows_of(copy) if int(r["trial"]) != best["trial"] and r["best"])
    (copy / "best.json").write_text(json.dumps({**best, "trial": int(other["trial"]), "value": float(other["best"])}))
    evaluated = []
    monkeypatch.setattr(results, "evaluate_on_cluster", lambda config, params, checkpoint, mirror=None, seed=None:
                        evaluated.append(checkpoint) or {"test_acc": 0.5})
    result = api.resume(copy)
    assert result.evaluated_again and not result.already_complete and result.finished_before == len(rows_of(copy))
    assert [Path(c).parts[-3] for c in evaluated] == [f"trial_{best['trial']:04d}"]
    assert json.loads((copy / "best.json").read_text())["trial"] == best["trial"]

def test_resuming_a_complete_study_starts_nothing_and_changes_nothing(finished_search, tmp_path, monkeypatch):
    from hpsearch.search import api, tuner

    exp_dir, config, _ = finished_search
    copy = tmp_path / "copy"
    shutil.copytree(exp_dir, copy)
    before = {name: (copy / name).read_bytes() for name in ("trials.csv", "sessions.json", "best.json")}

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray was started for a study with nothing left to run")

    monkeypatch.setattr(tuner, "start_ray", no_ray)
    called = time.monotonic()
    result = api.resume(copy)
    waited = time.monotonic() - called
    assert result.already_complete and result.complete
    assert 0 < result.elapsed_s <= waited  # the call's own time (its checks), which printed as 0.0s
    assert result.finished_before == 6  # it was 0, and "trials this session" came out as -6 (audit 25)
    # best.json as written, its paths read as the copy's own
    written = json.loads(before["best.json"])
    moved = {"experiment_dir": str(copy), "checkpoint": str(copy / Path(written["checkpoint"]).relative_to(exp_dir))}
    assert result.best == {**written, **moved} and Path(result.best["checkpoint"]).is_file()
    assert len(result.trials) == 6
    assert {name: (copy / name).read_bytes() for name in before} == before

    printed = run_cli("resume", str(copy), cwd=tmp_path, timeout=120)
    assert printed.returncode == 0, printed.stdout + printed.stderr
    assert "already complete (6 trials)" in printed.stdout and "search.num_trials=N" in printed.stdout

    # keep_checkpoints given to it still applies: the only way to trim a finished study was
    # to add a trial, and the setting was dropped without a word (audit 40)
    assert len(list(copy.glob("trials/*/checkpoints/best.ckpt"))) == 3  # the study's keep_checkpoints
    result = api.resume(copy, {"search.keep_checkpoints": 1})
    assert result.already_complete and [p.parent.parent.name for p in copy.glob("trials/*/checkpoints/best.ckpt")] \
        == [f"trial_{result.best['trial']:04d}"]
    assert "keep_checkpoints: 1" in (copy / "experiment.yaml").read_text()


def test_a_users_own_module_by_import_path(tmp_path):
    """A package beside the experiment, not installed, reaches Ray's workers; its data,
    asked for through ``hpsearch.once_per_worker``, is built once per trial worker."""
    shutil.copytree(FIXTURES / "userpkg", tmp_path / "userpkg")
    setups = tmp_path / "setups.log"
    config = {
        "name": "user-regression",
        "model": {"class_path": "userpkg.regression:LinearRegressor", "init_args": {"in_features": 4}},
        "data": {"class_path": "userpkg.regression:NoisyLinearData",
                 "init_args": {"in_features": 4, "log_to": str(setups)}},
        "space": {"model.lr": {"type": "float", "low": 0.001, "high": 0.05, "log": True},
                  "model.hidden": {"type": "categorical", "choices": [4, 16]}},
        "metric": "val_mse", "mode": "min",
        "search": {"num_trials": 3, "max_concurrent": 2, "sampler": "random", "seed": 1},
        "scheduler": {"type": "none", "max_epochs": 2},
        # NoisyLinearData takes no num_workers: its own DataLoaders run without workers
        "loader": {"num_workers": 1},
        "storage": "runs",
    }
    write_yaml(tmp_path / "exp.yaml", config)
    result = run_cli("run", "exp.yaml", "-v", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "loader.num_workers is not passed on: NoisyLinearData takes no argument 'num_workers'" in result.stderr
    # -v shows what the trials print; not Ray Tune's claim that their results are missing (audit 30)
    assert "NoisyLinearData set up in trial 2" in result.stdout + result.stderr, result.stdout + result.stderr
    assert "Failed to fetch metrics" not in result.stdout + result.stderr, result.stdout + result.stderr
    best = json.loads((tmp_path / "runs" / "user-regression" / "best.json").read_text())
    assert best["metric"] == "val_mse" and best["value"] >= 0 and best["test_metrics"] == {}
    rows = rows_of(tmp_path / "runs" / "user-regression")
    assert [r["state"] for r in rows] == ["COMPLETE"] * 3
    assert [(r["num_workers"], r["pin_memory"]) for r in rows] == [("0", "False")] * 3  # what ran, not the option
    # Each trial set its data up once; each worker process built it for its first trial only.
    lines = [line.split() for line in setups.read_text().splitlines()]
    assert [how for _, how, trial in lines if trial == "driver"] == ["built"]  # the preflight
    lines = [(pid, how) for pid, how, trial in lines if trial != "driver"]
    assert len(lines) == 3
    for pid in {pid for pid, _ in lines}:
        assert [how for p, how in lines if p == pid] == ["built"] + ["reused"] * (sum(p == pid for p, _ in lines) - 1)
    assert sum(how == "reused" for _, how in lines) >= 1  # two workers, three trials
    assert sorted(r["data_reused"] for r in rows) == sorted(str(how == "reused") for _, how in lines)
    # What each trial printed is kept beside its checkpoints, not only in Ray's worker logs (audit 30).
    for number in range(3):
        printed = (tmp_path / "runs" / "user-regression" / "trials" / f"trial_{number:04d}" / "output.log").read_text()
        assert printed.splitlines()[0] == f"NoisyLinearData set up in trial {number}", printed
        assert "NoisyLinearData wrote below Python" in printed.splitlines(), printed  # a C library's, too


def test_a_trial_tune_stops_ends_its_fit_as_finished_not_as_a_crash(tmp_path):
    """Tune stops a trial at a report (ASHA's prune, its last epoch) by raising SystemExit
    from the report, inside Lightning's fit: a user's on_exception hooks ran for every
    pruned trial and every trial that reached max_epochs, their loggers closed as failed,
    and a finished trial's on_train_end hooks after hpsearch's were cut off."""
    shutil.copytree(FIXTURES / "userpkg", tmp_path / "userpkg")
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    config = {
        "name": "hooks",
        "model": {"class_path": "userpkg.hook_probe:HookProbeCNN", "init_args": {"log_dir": str(hooks)}},
        "data": {"class_path": "digits", "init_args": {"batch_size": 64}},
        # one learning rate far too small to learn: ASHA prunes its trials at a rung
        "space": {"model.lr": {"type": "categorical", "choices": [0.02, 1.0e-6]},
                  "model.channels": {"type": "categorical", "choices": [4, 6, 8]}},
        "metric": "val_acc", "mode": "max",
        "search": {"num_trials": 6, "max_concurrent": 1, "sampler": "grid", "seed": 0},
        "scheduler": {"type": "asha", "max_epochs": 3, "grace_period": 1, "reduction_factor": 2},
        "storage": "runs",
    }
    write_yaml(tmp_path / "exp.yaml", config)
    result = run_cli("run", "exp.yaml", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = rows_of(tmp_path / "runs" / "hooks")
    states = {int(r["trial"]): r["state"] for r in rows}
    assert {"COMPLETE", "PRUNED"} <= set(states.values()), states
    for number, state in states.items():
        ran = [json.loads(line) for line in (hooks / f"trial-{number}.jsonl").read_text().splitlines()]
        assert not [r for r in ran if r["hook"] == "on_exception"], (state, ran)
        # (Lightning marks a fit finished after its teardown hooks, interrupted before them)
        assert [r["status"] for r in ran if r["hook"] == "teardown"] == ["running"], (state, ran)
        assert (state == "COMPLETE") == ({"hook": "on_train_end"} in ran), (state, ran)


def _get_json(url: str, body: dict | None = None):
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_tensorboard_shows_every_trial_with_its_curve_params_state_and_metric(finished_search):
    """A real TensorBoard over the finished study, read through its HTTP data API."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.parse

    exp_dir, config, _ = finished_search
    table = {int(r["trial"]): r for r in rows_of(exp_dir)}
    trials = {t.number: t for t in study_of(exp_dir, config["name"]).trials}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = f"http://127.0.0.1:{port}/data"
    process = subprocess.Popen([sys.executable, "-m", "hpsearch.search.cli", "tensorboard", str(exp_dir),
                                "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    statuses = ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]
    groups_request = {"experimentName": "", "allowedStatuses": statuses, "colParams": [],
                      "startIndex": 0, "sliceSize": 100}
    try:
        groups, deadline = [], time.monotonic() + 120
        while time.monotonic() < deadline and len(groups) < 6:
            try:
                groups = _get_json(f"{base}/plugin/hparams/session_groups", groups_request).get("sessionGroups", [])
            except OSError:
                pass
            time.sleep(1)
        runs = [r for r in _get_json(f"{base}/runs") if r.startswith("trial_")]
        experiment = _get_json(f"{base}/plugin/hparams/experiment", {"experimentName": ""})
        curves = {run: _get_json(f"{base}/plugin/scalars/scalars?" + urllib.parse.urlencode(
            {"run": run, "tag": "val_acc"})) for run in runs}
        best_json = json.loads((exp_dir / "best.json").read_text())
        [best_run] = [run for run in runs if int(run[6:10]) == best_json["trial"]]
        test_curve = _get_json(f"{base}/plugin/scalars/scalars?" + urllib.parse.urlencode(
            {"run": best_run, "tag": "test_acc"}))
        scalar_tags = _get_json(f"{base}/plugin/scalars/tags")
        best_so_far = _get_json(f"{base}/plugin/scalars/scalars?" + urllib.parse.urlencode(
            {"run": "study", "tag": "study/best_val_acc"}))
        best_trial_said = _get_json(f"{base}/plugin/text/text?" + urllib.parse.urlencode(
            {"run": "study", "tag": "study/best_trial"}))
    finally:
        process.terminate()
        process.wait(timeout=30)

    # One run per trial, named by its number and sampled values.
    assert sorted(int(run[6:10]) for run in runs) == list(range(6))
    for run in runs:
        params = trials[int(run[6:10])].params
        assert f"channels={params['model.channels']}" in run and "-lr=" in run, run
    # The metric's curve: one point per epoch the trial ran, at the epoch (trials of
    # different batch sizes line up).
    for run, points in curves.items():
        steps = [step for _, step, _ in points]
        assert steps == list(range(1, int(table[int(run[6:10])]["epochs"]) + 1)), (run, steps)
    # Every run has the learning rate and speed series beside the model's own metrics.
    for run in runs:
        assert {"val_loss", "train_loss", "hp/val_acc", "speed/samples_per_s", "speed/epoch_time_s"} \
            <= set(scalar_tags[run]) and any(tag.startswith("lr-") for tag in scalar_tags[run]), scalar_tags[run]
    # The HParams columns: typed, with the searched ranges, plus state and epochs.
    infos = {info["name"]: info for info in experiment["hparamInfos"]}
    assert set(infos) == set(config["space"]) | {"state", "epochs"}
    lr = config["space"]["model.lr"]
    assert infos["model.lr"]["type"] == "DATA_TYPE_FLOAT64"
    assert infos["model.lr"]["domainInterval"] == {"minValue": lr["low"], "maxValue": lr["high"]}
    assert sorted(infos["state"]["domainDiscrete"]) == ["COMPLETE", "FAILED", "PRUNED"]
    metric_tags = {m["name"]["tag"] for m in experiment["metricInfos"]}
    assert {"hp/val_acc", "val_acc", "val_loss"} <= metric_tags
    # Every trial is a row, pruned ones included, with its values, state and best metric.
    assert len(groups) == 6
    for group in groups:
        number = int(group["name"][6:10])
        row, hparams = table[number], group["hparams"]
        assert hparams["state"] == row["state"] and int(hparams["epochs"]) == int(row["epochs"])
        assert hparams["model.lr"] == pytest.approx(trials[number].params["model.lr"])
        assert hparams["model.channels"] == trials[number].params["model.channels"]
        best = {m["name"]["tag"]: m["value"] for m in group["metricValues"]}["hp/val_acc"]
        assert best == pytest.approx(float(row["best"]), rel=1e-5)
    assert {g["hparams"]["state"] for g in groups} == {r["state"] for r in table.values()} >= {"PRUNED"}
    # The best trial's test metrics: in its run, at the epoch of the checkpoint evaluated,
    # and in its HParams row.
    import torch

    evaluated = torch.load(best_json["checkpoint"], map_location="cpu", weights_only=False)["epoch"] + 1
    [(_, step, value)] = test_curve
    assert step == evaluated and value == pytest.approx(best_json["test_metrics"]["test_acc"], rel=1e-5), test_curve
    assert "test_acc" in metric_tags
    [best_group] = [g for g in groups if int(g["name"][6:10]) == best_json["trial"]]
    test_value = {m["name"]["tag"]: m["value"] for m in best_group["metricValues"]}["test_acc"]
    assert test_value == pytest.approx(best_json["test_metrics"]["test_acc"], rel=1e-5)
    # The study's own run: the best value so far after each trial ended, and the best
    # trial's run named in the Text tab whenever the best changed.
    assert [step for _, step, _ in best_so_far] == list(range(1, 7)), best_so_far
    values = [value for _, _, value in best_so_far]  # each a trial's best (complete ones rank first)
    assert all(any(value == pytest.approx(float(row["best"]), rel=1e-6) for row in table.values()) for value in values)
    assert values[-1] == pytest.approx(best_json["value"], rel=1e-6), values
    assert best_trial_said[-1]["text"].startswith(f"<p>{best_run}: val_acc = "), best_trial_said
    with pytest.raises(OSError):  # stopping the command stopped TensorBoard too
        _get_json(f"{base}/runs")


def test_tensorboard_over_two_studies_shows_both_studies_runs_and_columns(finished_search, tmp_path):
    """TensorBoard itself reads one study's HParams columns only; hpsearch gives it one set
    covering both (here a copy of the study that also searched dropout, by val_loss)."""
    import socket
    import subprocess
    import sys
    import time

    from hpsearch.search.config_loading import load_config
    from hpsearch.search.tensorboard_layout import write_hparams_columns

    exp_dir, config, _ = finished_search
    other = tmp_path / "other"
    shutil.copytree(exp_dir, other)
    for columns in (other / "tensorboard").glob("events.out.tfevents.*"):
        columns.unlink()
    changed = {**config, "metric": "val_loss", "mode": "min",
               "space": {**config["space"], "model.dropout": {"type": "float", "low": 0.0, "high": 0.5}}}
    write_hparams_columns(other / "tensorboard", load_config(changed), ["val_acc"])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = f"http://127.0.0.1:{port}/data"
    process = subprocess.Popen([sys.executable, "-m", "hpsearch.search.cli", "tensorboard", str(exp_dir), str(other),
                                "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    groups_request = {"experimentName": "", "colParams": [], "startIndex": 0, "sliceSize": 100,
                      "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"]}
    try:
        runs, experiment, groups, deadline = [], {}, [], time.monotonic() + 120
        while time.monotonic() < deadline and (len(runs) < 12 or len(groups) < 12):
            try:
                runs = [run for run in _get_json(f"{base}/runs") if "/trial_" in run]
                experiment = _get_json(f"{base}/plugin/hparams/experiment", {"experimentName": ""})
                groups = _get_json(f"{base}/plugin/hparams/session_groups", groups_request).get("sessionGroups", [])
            except OSError:
                pass
            time.sleep(1)
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert sorted({run.split("/")[0] for run in runs}) == sorted([exp_dir.name, "other"]) and len(runs) == 12, runs
    assert {info["name"] for info in experiment["hparamInfos"]} == {*changed["space"], "state", "epochs", "study"}
    # in TensorBoard's order, among the five its views show at first: beside the state (audit 52: sixth)
    assert [info["name"] for info in experiment["hparamInfos"]][:2] == ["state", "study"], experiment["hparamInfos"]
    assert {"hp/val_acc", "hp/val_loss"} <= {m["name"]["tag"] for m in experiment["metricInfos"]}
    # The copy's trials have the same numbers and values: still one row each, not merged.
    assert len(groups) == 12 and all(len(group["sessions"]) == 1 for group in groups), groups
    # each row's study, which the HParams views can be filtered by
    assert all(group["hparams"]["study"] == group["sessions"][0]["name"].split("/")[0] for group in groups), groups


@pytest.fixture
def ray_shut_down_after():
    """A search run in this process leaves its Ray up for the next (``ray_for_search``): the
    later tests of the process expect none."""
    yield
    from hpsearch.search.tuner import shutdown_ray

    shutdown_ray()


def test_a_study_whose_data_classes_changed_is_neither_resumed_nor_loaded(tmp_path, ray_shut_down_after):
    """A class folder renamed between sessions shifted every label with no word: the resumed
    study trained new trials on other labels and re-scored its best trial at 0 (audit 71)."""
    import hpsearch
    from conftest import make_image_folder, shrunk_example
    from hpsearch.search.errors import ConfigError, HpsearchError

    images = make_image_folder(tmp_path / "images")
    config = shrunk_example(tmp_path / "runs", **{"search/num_trials": 1, "scheduler/max_epochs": 1,
                                                  "search/preflight": False})  # (it was skipped then: audit 72)
    config["data"] = {"class_path": "image-folder", "init_args": {"root": str(images), "image_size": 10}}
    del config["space"]["data.batch_size"]
    result = hpsearch.run(config)
    assert json.loads((result.experiment_dir / "data.json").read_text()) == {"classes": ["cat", "dog", "eel"]}
    (images / "cat").rename(images / "yak")
    for preflight in ("false", "true"):
        with pytest.raises(ConfigError) as caught:
            hpsearch.resume(result.experiment_dir, ["search.num_trials=2", f"search.preflight={preflight}"])
        [problem] = caught.value.problems
        assert problem.field == "data" and "the data's classes changed since the study began (gone: 'cat'; new: " \
            "'yak')" in problem.message, problem
    assert len(rows_of(result.experiment_dir)) == 1  # no trial ran on the shifted labels
    with pytest.raises(HpsearchError, match=r"the data's classes changed since the study began"):
        hpsearch.load_trial(result.experiment_dir)
    (images / "yak").rename(images / "cat")
    assert hpsearch.load_trial(result.experiment_dir).trial == 0


def test_a_study_searching_its_data_root_loads_each_trial_on_its_own_classes(tmp_path, ray_shut_down_after):
    """The study keeps its preflight's class names; load_trial refused a trial whose searched
    root held other classes, though nothing had changed (audit 72)."""
    import hpsearch
    from conftest import make_image_folder, shrunk_example

    first, second = make_image_folder(tmp_path / "first"), make_image_folder(tmp_path / "second")
    (second / "cat").rename(second / "ant")
    config = shrunk_example(tmp_path / "runs", **{"search/num_trials": 2, "search/max_concurrent": 1,
                                                  "search/sampler": "grid", "scheduler/max_epochs": 1})
    config["data"] = {"class_path": "image-folder", "init_args": {"root": str(first), "image_size": 10}}
    config["space"] = {"data.root": {"type": "categorical", "choices": [str(first), str(second)]}}
    result = hpsearch.run(config)
    for trial in (0, 1):
        loaded = hpsearch.load_trial(result.experiment_dir, trial)
        assert loaded.datamodule.classes == (["cat", "dog", "eel"] if loaded.params["data.root"] == str(first)
                                             else ["ant", "dog", "eel"])
