"""``hpsearch report`` rendered in a real headless Chromium, and ``hpsearch compare``."""

from __future__ import annotations

import csv
import re
import json
import shutil
from pathlib import Path

import pytest

from conftest import run_cli, shrunk_example, write_yaml
from hpsearch.search.report import _html, _learning_curves
from hpsearch.search.study_summary import StudySummary

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PLOTS = {"history", "learning_curves", "parallel_coordinates", "param_importances", "rungs", "compute"}


def trials_csv(exp_dir: Path) -> dict[int, dict]:
    with (exp_dir / "trials.csv").open() as handle:
        return {int(r["trial"]): r for r in csv.DictReader(handle)}


def table_values(page, table_id: str) -> list[list[str]]:
    """The raw values (``data-value``) of a report table, row by row."""
    return page.eval_on_selector_all(
        f"#{table_id} tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.dataset.value))")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)")
def test_report_renders_in_headless_chromium_and_agrees_with_trials_csv(finished_search, tmp_path):
    from playwright.sync_api import sync_playwright

    exp_dir, config, _ = finished_search
    result = run_cli("report", str(exp_dir), "--out", str(tmp_path / "report"), cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    page_path = tmp_path / "report" / "report.html"
    assert {p.stem for p in (tmp_path / "report").glob("*.png")} == PLOTS  # the PNGs beside the page

    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        try:
            page = browser.new_page()
            page.on("console", lambda message: message.type == "error" and problems.append(message.text))
            page.on("pageerror", lambda error: problems.append(str(error)))
            page.goto(page_path.as_uri())
            page.wait_for_load_state("load")
            images = page.eval_on_selector_all(
                "img", "imgs => imgs.map(i => [i.id, i.complete, i.naturalWidth, i.naturalHeight])")
            speed, counts = table_values(page, "speed"), dict(table_values(page, "counts"))
            best, rungs = dict(table_values(page, "best")), table_values(page, "rungs")
            compute = dict(table_values(page, "compute"))
        finally:
            browser.close()

    assert problems == []
    assert {name for name, *_ in images} == PLOTS
    assert all(complete and width > 100 and height > 100 for _, complete, width, height in images), images

    table = trials_csv(exp_dir)
    # Per-trial speed rows are trials.csv's numbers.
    assert sorted(int(row[0]) for row in speed) == sorted(table)
    for trial, state, epochs, samples_per_s, *_ in speed:
        row = table[int(trial)]
        assert (state, epochs) == (row["state"], row["epochs"])
        assert float(samples_per_s) == pytest.approx(float(row["samples_per_s"]))
    for state in ("COMPLETE", "PRUNED", "FAILED"):
        assert int(counts[state]) == sum(r["state"] == state for r in table.values())
    assert float(compute["spent"]) == pytest.approx(sum(float(r["compute_s"]) for r in table.values()), abs=1e-3)
    assert float(compute["saved by pruning"]) > 0  # ASHA pruned some trials in this study
    # ASHA's rungs (grace 1, factor 2, 4 epochs: 1 and 2): trials that reached each, and those it
    # kept there: a trial early-stopped at a rung was counted as cut (audit 78)
    ended = [(int(r["epochs"]), r["state"]) for r in table.values()]
    assert [[int(v) for v in row] for row in rungs] == [
        [rung, sum(e >= rung for e, _ in ended), sum(e > rung or (e == rung and s != "PRUNED") for e, s in ended)]
        for rung in (1, 2)]
    stored_best = json.loads((exp_dir / "best.json").read_text())
    assert float(best["value"]) == pytest.approx(stored_best["value"])
    assert int(best["trial"]) == stored_best["trial"]
    assert (int(best["best at epoch"]), int(best["seed"])) == (stored_best["best_epoch"], stored_best["seed"])
    assert float(best["test test_acc"]) == pytest.approx(stored_best["test_metrics"]["test_acc"])


def test_the_report_reads_the_study_without_writing_to_it(finished_search, tmp_path):
    """A report may run while the search writes its journal: it appended a record of its
    own, and cut what looked like a torn last record, which may be the driver's, being
    written."""
    from hpsearch.search.experiment import ExperimentDir
    from hpsearch.search.report import write_report

    exp_dir, _, _ = finished_search
    copy = tmp_path / "study"
    shutil.copytree(exp_dir, copy)
    journal = copy / "optuna.journal"
    with journal.open("ab") as handle:
        handle.write(b'{"op_code": 6, "worker_id": "a-driver-mid-write", "tri')
    before = journal.read_bytes()
    write_report(ExperimentDir(copy), tmp_path / "report")
    assert journal.read_bytes() == before


def test_compare_puts_two_studies_side_by_side(finished_search, tmp_path):
    exp_dir, _, _ = finished_search
    other = shrunk_example(tmp_path / "runs", **{"name": "random-2", "search/num_trials": 2,
                                                 "search/sampler": "random", "scheduler/type": "none",
                                                 "scheduler/max_epochs": 1})
    path = write_yaml(tmp_path / "other.yaml", other)
    result = run_cli("run", str(path), cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    other_dir = tmp_path / "runs" / "random-2"

    result = run_cli("compare", str(exp_dir), str(other_dir), f"{other_dir}/", "--json", cwd=tmp_path, timeout=60)
    assert result.returncode == 0, result.stderr
    records = json.loads(result.stdout)  # a study given twice is one record
    assert [r["experiment_dir"] for r in records] == [str(exp_dir), str(other_dir)]
    for record, directory in zip(records, (exp_dir, other_dir)):
        best = json.loads((directory / "best.json").read_text())
        table = trials_csv(directory)
        assert record["best_value"] == pytest.approx(best["value"]) and record["best_trial"] == best["trial"]
        assert record["test_metrics"] == pytest.approx(best["test_metrics"])
        assert record["trials"] == len(table)
        assert record["COMPLETE"] + record["PRUNED"] + record["FAILED"] == len(table)
        assert record["compute_s"] == pytest.approx(sum(float(r["compute_s"]) for r in table.values()), abs=1e-3)
        sessions = json.loads((directory / "sessions.json").read_text())
        assert record["wall_s"] == pytest.approx(sum(s["seconds"] for s in sessions), abs=1e-3)
        assert 0 < record["compute_s"] < record["wall_s"] * 2  # two trial slots at most
    assert records[1]["PRUNED"] == 0 and records[1]["saved_by_pruning_s"] == 0  # no scheduler there
    # what tells the two apart, from their experiment.yaml
    differs = [record["differs_in"] for record in records]
    assert (differs[0]["search.sampler"], differs[1]["search.sampler"]) == ("tpe", "random"), differs
    assert differs[1]["scheduler.type"] == "none" and "name" not in differs[1], differs

    table_view = run_cli("compare", str(exp_dir), str(other_dir), cwd=tmp_path, timeout=60)
    assert table_view.returncode == 0 and "random-2" in table_view.stdout and "digits-cnn" in table_view.stdout


def test_compare_leaves_out_the_settings_of_a_scheduler_a_study_does_not_have():
    """A study without ASHA was said to differ in ASHA's grace period and reduction factor (audit 49)."""
    from hpsearch.search.study_summary import compared_settings, settings_that_differ

    asha = {"name": "a", "scheduler": {"type": "asha", "grace_period": 1, "reduction_factor": 2.0, "max_epochs": 5}}
    none = {"name": "c", "scheduler": {"type": "none", "grace_period": 1, "reduction_factor": 3.0, "max_epochs": 5}}
    first, second = summary_of([]), summary_of([])
    first.settings, second.settings = compared_settings(asha), compared_settings(none)
    assert settings_that_differ([first, second]) == [
        {"scheduler.grace_period": 1, "scheduler.reduction_factor": 2.0, "scheduler.type": "asha"},
        {"scheduler.type": "none"}]  # ASHA's settings are the first study's own
    assert compared_settings({**asha, "space": {"model.lr": {"type": "float"}}})["space.model.lr"] == {"type": "float"}


def test_compare_names_each_study_by_its_directory_and_shows_what_differs(capsys):
    """A study run again from the same file (a dated directory) had the same name in every
    row, and nothing said how the studies differed."""
    from hpsearch.search.status_view import print_comparison

    first, again = summary_of([]), summary_of([])
    first.counts = again.counts = {"COMPLETE": 0, "PRUNED": 0, "FAILED": 0}
    first.experiment_dir, again.experiment_dir = "/runs/digits-cnn", "/runs/digits-cnn-20261205-061530"
    first.settings = {"name": "digits-cnn", "storage": "runs", "search.sampler": "tpe", "search.seed": 0}
    again.settings = {**first.settings, "storage": "elsewhere", "search.seed": 1}
    # the same file run into another storage: its directory has the first one's name
    elsewhere = summary_of([])
    elsewhere.counts, elsewhere.experiment_dir = first.counts, "/scratch/digits-cnn"
    elsewhere.settings = {**first.settings, "space.model.dropout": {"type": "float", "low": 0.0, "high": 0.5},
                          "space.model.channels": {"type": "categorical", "choices": [8, 16, None]},
                          "space.model.lr": {"type": "float", "low": 1e-4, "high": 0.1, "log": True,
                                             "when": {"model.optimizer": ["sgd", "adamw"]}},
                          "trainer.deterministic": True}
    print_comparison([first, again, elsewhere])
    out = capsys.readouterr().out
    # as the experiment file has them, not Python's dicts (audit 26)
    folded = " ".join(out.split())
    for shown in ("space.model.dropout=float 0..0.5", "space.model.channels=[8, 16, null]",
                  "space.model.lr=float 0.0001..0.1 log if model.optimizer=sgd|adamw", "trainer.deterministic=true"):
        assert shown in folded, (shown, out)
    assert "digits-cnn-20261205-061530" in out and "search.seed=0" in out and "search.seed=1" in out, out
    assert "sampler" not in out and "storage" not in out, out  # the same, or where a study is kept
    assert "runs/digits-cnn " in out and "scratch/digits-cnn " in out, out
    # a parameter only one study searches: in that study's row, whole, and "not searched" in the
    # others, which read as the same before (audit 39), not "=None"
    assert out.count("space.model.dropout") == 3 and folded.count("space.model.dropout=not searched") == 2, out
    assert "None" not in out, out


def test_compare_counts_the_long_choices_every_study_has_and_lists_those_one_added(capsys):
    """Whole lists of 50-character choices, folded, hid the one choice a study added (audit 83)."""
    from hpsearch.search.status_view import print_comparison

    policies = [f"augmentation_policy_name_that_is_quite_long_number_{n}" for n in range(4)]
    first, second = summary_of([]), summary_of([])
    first.counts = second.counts = {"COMPLETE": 0, "PRUNED": 0, "FAILED": 0}
    first.experiment_dir, second.experiment_dir = "/runs/a", "/runs/b"
    first.settings = {"space.data.policy": {"type": "categorical", "choices": policies[:3]},
                      "space.model.act": {"type": "categorical", "choices": ["relu", "gelu"]}}
    second.settings = {"space.data.policy": {"type": "categorical", "choices": policies},
                       "space.model.act": {"type": "categorical", "choices": ["relu"]}}
    print_comparison([first, second])
    folded = "".join(capsys.readouterr().out.split())
    assert "space.data.policy=[3ineverystudy]" in folded, folded
    assert f"space.data.policy=[3ineverystudy,+{policies[3]}]" in folded, folded
    assert "space.model.act=[relu,gelu]" in folded and "space.model.act=[relu]" in folded, folded  # short: listed


def test_compare_at_80_columns_shows_a_block_per_study_with_every_figure_whole():
    """Its 13 columns were cut to 3 characters each at 80 columns, every figure and header
    folded over several lines ("0.9" / "741")."""
    from rich.console import Console

    from hpsearch.search.status_view import print_comparison

    studies = []
    for name, seed, value in (("digits-cnn", 0, 0.97412), ("digits-cnn-20261205-061530", 1, 0.98153)):
        study = summary_of([{}] * 5)
        study.experiment_dir, study.settings = f"/runs/{name}", {"search.seed": seed}
        study.counts = {"COMPLETE": 3, "PRUNED": 1, "FAILED": 0}
        study.best = {"value": value, "trial": 2, "test_metrics": {"test_acc": 0.9815}}
        study.wall_s, study.compute_s = 123.4, 56.7
        studies.append(study)
    console = Console(width=80, record=True)
    print_comparison(studies, console)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80, text
    for name, seed, value in (("digits-cnn", 0, "0.9741"), ("digits-cnn-20261205-061530", 1, "0.9815")):
        assert f"\n{name}" in text and f"{value} (trial 2)" in text and f"search.seed={seed}" in text, text
    assert text.count("5: 3 complete, 1 pruned, 0 failed, 1 not finished") == 2, text
    assert text.count("123.4 s wall, 56.7 s compute") == 2 and "test_acc=0.9815" in text, text

    console = Console(width=220, record=True)  # room for a row each
    print_comparison(studies, console)
    lines = console.export_text().splitlines()
    header = next(line for line in lines if "best trial" in line)
    assert header.split()[:3] == ["experiment", "metric", "best"], header
    # the trial paused or running in each, which the table left out: a study stopped half-way read as done (audit 39)
    columns = header.split()
    assert "unfinished" in columns, header
    row = next(line for line in lines if line.startswith("digits-cnn ")).split()
    assert row[row.index("5") + 1:row.index("5") + 5] == ["3", "1", "0", "1"], (header, row)


def summary_of(rows: list[dict]) -> StudySummary:
    return StudySummary(name="s", experiment_dir="/x", metric="val_acc", mode="max", max_epochs=4, best=None,
                        rows=rows, counts={}, wall_s=1.0, compute_s=1.0, saved_by_pruning_s=0.0,
                        saved_by_early_stopping_s=0.0)


def test_the_report_says_why_each_failed_trial_failed():
    rows = [{"trial": "0", "state": "COMPLETE", "epochs": "4", "reason": "max_epochs"},
            {"trial": "1", "state": "FAILED", "epochs": "2",
             "reason": "NaN/inf loss at a step in 9..16, epoch 2 (traceback: /x/trials/trial_0001/error.txt)"}]
    page = _html(summary_of(rows), {})
    failed = page[page.index('<table id="failed">'):]
    failed = failed[:failed.index("</table>")]
    assert "NaN/inf loss at a step in 9..16" in failed and "trial_0001/error.txt" in failed
    assert "max_epochs" not in failed  # only failed trials are listed
    assert '<table id="failed">' not in _html(summary_of(rows[:1]), {})


def test_learning_curves_name_each_trial_and_count_whole_epochs():
    import matplotlib
    import optuna

    matplotlib.use("Agg")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    for number, curve in enumerate([[0.5, 0.6, 0.7], [0.4], [0.3, 0.35]]):
        trial = study.ask()
        for epoch, value in enumerate(curve, start=1):
            trial.report(value, epoch)
        study.tell(trial, curve[-1])
    rows = [{"trial": "0", "state": "COMPLETE"}, {"trial": "1", "state": "PRUNED"}, {"trial": "2", "state": "PRUNED"}]
    axes = _learning_curves(study, summary_of(rows)).axes[0]
    labels = {text.get_text(): text.xy for text in axes.texts}
    assert labels == {"0": (3, 0.7), "1": (1, 0.4), "2": (2, 0.35)}
    ticks = [tick for tick in axes.get_xticks() if 1 <= tick <= 3]
    assert ticks and all(float(tick).is_integer() for tick in ticks), ticks


def test_curves_ending_at_one_point_share_one_label():
    from hpsearch.search.report import _end_labels

    ends = [(3, 0.700, 4, "tab:blue"), (1, 0.40, 1, "tab:gray"), (3, 0.701, 2, "tab:gray"),
            (1, 0.50, 3, "tab:gray"), (1, 0.401, 0, "tab:gray"), (3, 0.9, 5, "tab:blue")]
    assert _end_labels(ends, closer_than=0.01) == [
        ((1, 0.40), "0, 1", "tab:gray"),    # one epoch, nearly one value: one label
        ((1, 0.50), "3", "tab:gray"),       # same epoch, apart
        ((3, 0.700), "2, 4", "black"),      # a COMPLETE and a PRUNED trial: neither colour
        ((3, 0.9), "5", "tab:blue")]
    assert _end_labels([], closer_than=0.01) == []
    many = [(3, 0.9 + i * 1e-4, number, "tab:blue") for i, number in enumerate([8, 3, 12, 5, 1, 9, 30, 2])]
    assert _end_labels(many, closer_than=0.01) == [((3, 0.9), "1, 2, 3, 5, 8 +3", "tab:blue")]


def test_a_shared_label_names_its_trials_best_first_and_marks_the_studys_best():
    """At 1,800 trials the best trial (1734) ended near eight others, and the label named
    the first five by number: "636, 993, 1411, 1425, 1448 +3", never the best (audit 40)."""
    import matplotlib
    import optuna

    matplotlib.use("Agg")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study, rows = optuna.create_study(direction="maximize"), []
    for number in range(40):
        trial = study.ask()
        value = 0.97 + 1e-4 * ((number * 7) % 40)  # 9 of the best 10 end within a label's height
        for epoch in (1, 2, 3):
            trial.report(value - 0.1 * (3 - epoch), epoch)
        study.tell(trial, value)
        rows.append({"trial": str(number), "state": "COMPLETE"})
    summary = summary_of(rows)
    ranked = sorted(range(40), key=lambda n: -((n * 7) % 40))
    summary.best = {"trial": ranked[0]}
    axes = _learning_curves(study, summary).axes[0]
    [label] = [text.get_text() for text in axes.texts]
    assert label == ", ".join([f"{ranked[0]} (best)", *map(str, ranked[1:5])]) + " +5", label
    assert max(line.get_linewidth() for line in axes.lines) == 2.4  # the best curve, drawn thicker


def test_learning_curves_of_a_large_study_name_its_best_trials_and_keep_their_size(tmp_path):
    """Every COMPLETE trial was named: at 500 trials one label listed hundreds of numbers,
    and the figure, saved tight around it, was 6,762 px wide (audit 20, D2)."""
    import matplotlib
    import optuna
    from PIL import Image

    matplotlib.use("Agg")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study, rows = optuna.create_study(direction="maximize"), []
    for number in range(300):  # converged: many curves end at nearly one value
        trial = study.ask()
        complete = number % 3 == 0
        for epoch in range(1, 4 if complete else 2):
            trial.report(0.9 + 1e-5 * number * epoch, epoch)
        study.tell(trial, 0.9)
        rows.append({"trial": str(number), "state": "COMPLETE" if complete else "PRUNED"})
    figure = _learning_curves(study, summary_of(rows))
    named = sorted(int(n) for text in figure.axes[0].texts for n in text.get_text().split(" +")[0].split(", "))
    best = sorted(range(0, 300, 3), key=lambda n: -n)[:10]  # the highest values: the latest here
    assert named[:1] and set(named) <= set(best), named
    assert "the 10 best named" in figure.axes[0].get_title()
    figure.savefig(tmp_path / "curves.png", dpi=110, bbox_inches="tight")
    width, height = Image.open(tmp_path / "curves.png").size
    assert width < 1200 and height < 700, (width, height)


def test_a_study_run_again_from_the_same_file_is_titled_by_its_dated_directory(tmp_path):
    """Its directory is the file's name and a date; status and the report's title said the
    file's name alone, so two mailed reports of the two runs had one title (audit 39)."""
    from rich.console import Console

    from hpsearch.search.experiment import ExperimentDir, write_config
    from hpsearch.search.status_view import print_status

    summary = summary_of([{"trial": "0", "state": "COMPLETE", "epochs": "4", "reason": "max_epochs"}])
    summary.name, summary.experiment_dir = "digits-cnn", "/runs/digits-cnn-20261206-222615"
    page = _html(summary, {})
    assert "<title>hpsearch report: digits-cnn-20261206-222615</title>" in page
    assert "<h1>hpsearch report: digits-cnn-20261206-222615</h1>" in page
    exp = ExperimentDir.make(tmp_path / "digits-cnn-20261206-222615")
    write_config(exp, shrunk_example(tmp_path))
    (exp.root / "trials.csv").write_text("trial,state,reason,best,last,epochs\n0,COMPLETE,max_epochs,0.9,0.9,3\n")
    console = Console(width=200, record=True)
    print_status(exp, console)
    assert "digits-cnn-20261206-222615 — 1 trial, val_acc" in console.export_text()


def test_the_learning_curves_say_what_their_ends_mean_for_the_states_the_study_has():
    """A study of failed trials without ASHA was told "pruned trials (dashed) end in x at
    their rung", and its one epoch was ticked 0.95..1.05 (audit 39)."""
    import optuna

    from hpsearch.search.report import _learning_curves, _learning_curves_caption

    failed = summary_of([{"trial": "0", "state": "FAILED", "epochs": "1"}])
    assert _learning_curves_caption(failed) == "val_acc per epoch; failed trials (dotted) end in x at their last " \
                                               "reported epoch"
    pruned = summary_of([{"trial": "0", "state": "PRUNED"}, {"trial": "1", "state": "COMPLETE"}])
    assert _learning_curves_caption(pruned) == "val_acc per epoch; pruned trials (dashed) end in x at the rung " \
                                               "where ASHA cut them"
    study = optuna.create_study()
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, intermediate_values={1: 0.5}))
    figure = _learning_curves(study, failed)
    ticks = [tick for tick in figure.axes[0].get_xticks() if 0.5 <= tick <= 1.5]
    assert ticks == [1.0], figure.axes[0].get_xticks()


def test_studies_shown_together_are_named_alike_in_compare_and_tensorboard():
    """TensorBoard named a second study called digits-cnn "digits-cnn-2", beside a study
    really named digits-cnn-2, which became "digits-cnn-2-2"; compare named them by the
    folders above them (audit 39). One rule for both now."""
    from pathlib import Path

    from hpsearch.search.experiment import distinct_labels

    roots = [Path("/a/digits-cnn"), Path("/b/digits-cnn"), Path("/c/digits-cnn-2")]
    assert distinct_labels(roots) == ["a/digits-cnn", "b/digits-cnn", "digits-cnn-2"]
    # as many folders above as tell them apart: "runs/s-2" read as another study's name (audit 56)
    assert distinct_labels([Path("/x/runs/s"), Path("/y/runs/s"), Path("/z/s")]) == ["x/runs/s", "y/runs/s", "z/s"]
    assert distinct_labels([Path("/a/s"), Path("/a/s")]) == ["a/s", "a/s-2"]  # one study twice: numbered
    assert distinct_labels([Path("/a/s"), Path("/b/a/s")]) == ["a/s", "b/a/s"]  # relative: a folder in TensorBoard's


def test_a_large_studys_speed_table_lists_its_slowest_its_data_starved_and_its_best_under_the_medians():
    """It listed every trial: 1,800 rows, a page of 1.9 MB (audit 40)."""
    rows = [{"trial": str(n), "state": "PRUNED", "epochs": "1", "samples_per_s": str(1000 + n),
             "epoch_time_s": str(0.1 + (n * 37 % 300) / 1000), "startup_s": "0.5", "data_wait_s": "0.01",
             "data_starved": "True" if n in (5, 250) else "False"} for n in range(300)]
    summary = summary_of(rows)
    summary.best = {"trial": 7}
    def speed_trials(page: str) -> list[int]:
        table = page[page.index('<table id="speed">'):]
        table = table[:table.index("</table>")]
        return sorted(int(first) for first in re.findall(r'<tr><td data-value="(\d+)">', table))

    page = _html(summary, {})
    slowest = sorted(range(300), key=lambda n: -(n * 37 % 300))[:20]
    assert speed_trials(page) == sorted({*slowest, 5, 250, 7}), speed_trials(page)
    assert "300 trials; medians: samples/s 1150, epoch s 0.25, start-up s 0.5, data wait s 0.01." in page
    assert speed_trials(_html(summary_of(rows[:100]), {})) == list(range(100))  # every trial, up to 100


def test_the_search_progress_follows_the_best_complete_trial_in_the_order_sampled():
    """Pruned trials' values (an early rung's) are drawn, and are no candidates; the line
    steps at each complete trial that beat those before it, for a loss downwards."""
    import matplotlib

    from hpsearch.search.report import _history_plot, best_so_far

    matplotlib.use("Agg")
    rows = [{"trial": 0, "state": "PRUNED", "best": 0.2}, {"trial": 1, "state": "COMPLETE", "best": 0.5},
            {"trial": 2, "state": "FAILED", "best": None}, {"trial": 3, "state": "COMPLETE", "best": 0.4},
            {"trial": 4, "state": "COMPLETE", "best": 0.3}, {"trial": 5, "state": "PRUNED", "best": 0.1},
            {"trial": 6, "state": "COMPLETE", "best": 0.45}]
    assert best_so_far(rows, "min") == [(1, 0.5), (3, 0.4), (4, 0.3), (6, 0.3)]
    assert best_so_far(rows, "max") == [(1, 0.5), (3, 0.5), (4, 0.5), (6, 0.5)]
    summary = summary_of(rows)
    summary.mode, summary.best = "min", {"trial": 4, "value": 0.3}
    axes = _history_plot(summary).axes[0]
    [line] = axes.lines
    assert list(line.get_xdata()) == [1, 3, 4, 6, 6] and list(line.get_ydata()) == [0.5, 0.4, 0.3, 0.3, 0.3]
    drawn = {collection.get_label(): [tuple(point) for point in collection.get_offsets()]
             for collection in axes.collections}
    assert drawn == {"pruned trial": [(0, 0.2), (5, 0.1)], "complete trial": [(1, 0.5), (3, 0.4), (4, 0.3), (6, 0.45)],
                     "best (trial 4)": [(4, 0.3)]}


def test_the_parameter_plots_of_many_parameters_draw_the_most_important_and_give_each_bar_room():
    """32 parameters: the parallel coordinates' axes and labels ran into one another, and
    the importances squeezed 32 bar labels into 4.5 inches (audit 83)."""
    import matplotlib
    import optuna

    from hpsearch.search.report import PARALLEL_AXES, _optuna_plot, _ranked_parameters, _scored_copy

    matplotlib.use("Agg")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study, rows = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0)), []
    for number in range(40):
        trial = study.ask()
        values = [trial.suggest_float(f"p{index:02d}", 0.0, 1.0) for index in range(32)]
        trial.report(values[7] + 0.1 * values[3], 1)  # two parameters decide the metric
        study.tell(trial, values[7])
        rows.append({"trial": str(number), "state": "COMPLETE"})
    summary = summary_of(rows)
    scored = _scored_copy(study, summary)
    ranked = _ranked_parameters(scored)
    assert len(ranked) == 32 and ranked[0] == "p07", ranked
    parallel = _optuna_plot("plot_parallel_coordinate", scored, summary, params=ranked[:PARALLEL_AXES])
    labels = [label.get_text() for label in parallel.axes[0].get_xticklabels()]
    assert "p07" in labels and len([label for label in labels if label.startswith("p")]) == PARALLEL_AXES, labels
    bars = _optuna_plot("plot_param_importances", scored, summary, importances=True, height=1.2 + 0.3 * 32)
    assert bars.get_size_inches()[1] > 10 and len(bars.axes[0].patches) == 32
