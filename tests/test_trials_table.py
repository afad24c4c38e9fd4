"""The trials table: best-row rules and a CSV round trip."""

from __future__ import annotations

from hpsearch.search.trials_table import TrialsTable, read_rows


def table(mode="max"):
    t = TrialsTable("val_acc", mode, ["model.lr"])
    for number, state, best in [(0, "COMPLETE", 0.8), (1, "PRUNED", 0.95), (2, "COMPLETE", 0.9), (3, "FAILED", None)]:
        row = t.row(number)
        row.update(state=state, **({"best": best} if best is not None else {}), **{"model.lr": 0.01 * (number + 1)})
    return t


def test_best_prefers_completed_trials():
    assert table().best_row()["trial"] == 2
    assert table("min").best_row()["trial"] == 0


def test_sampled_values_and_the_metric_read_back_whole_and_timings_at_six_digits(tmp_path):
    # result.trials' model.lr, at 6 digits, matched no value of best.json's params.
    t = TrialsTable("val_acc", "max", ["model.lr"])
    t.row(0).update(state="COMPLETE", best=0.9876543210123, **{"model.lr": 0.008663279761354562},
                    epoch_time_s=0.07648291299999999)
    t.save(tmp_path / "trials.csv")
    [row] = read_rows(tmp_path / "trials.csv")
    assert (row["model.lr"], row["best"]) == (0.008663279761354562, 0.9876543210123)
    assert row["epoch_time_s"] == 0.0764829


def test_text_that_only_reads_as_a_number_reads_back_as_text(tmp_path):
    """Categorical choices "1e3" and "1_000" both came back as 1000 (and "007" as 7), in
    status and in the Python API's result.trials (audit 21)."""
    t = TrialsTable("val_acc", "max", ["model.act"])
    choices = ["007", "1_000", "1e3", "5e-4", " 8", "0x10", "1.50", 8, 0.25, 1e-05, 1e+20, -3, float("inf")]
    for number, choice in enumerate(choices):
        t.row(number).update(state="COMPLETE", best=0.5, **{"model.act": choice})
    t.save(tmp_path / "trials.csv")
    assert [row["model.act"] for row in read_rows(tmp_path / "trials.csv")] == choices
    loaded = TrialsTable.load(tmp_path / "trials.csv", "val_acc", "max", ["model.act"])
    assert [loaded.rows[number]["model.act"] for number in range(len(choices))] == choices


def test_of_tied_trials_the_lowest_numbered_is_best_in_whatever_order_they_started():
    # While a search runs, rows are in the order trials started: the live summary said
    # "best val_acc=1 (trial 1)" and the result "best trial 0".
    t = TrialsTable("val_acc", "max", [])
    for number in (1, 0):
        t.row(number).update(state="COMPLETE", best=1.0)
    assert t.best_row()["trial"] == 0


def test_a_pruned_trial_that_scored_better_than_the_best_is_named_beside_it():
    """The result named trial 7 at 10.03 while status listed a pruned trial at 10.71,
    and nothing said why that one was not the best (audit 33)."""
    def ahead(t: TrialsTable):
        return t.ahead_of_best(t.best_row())

    assert ahead(table())["trial"] == 1  # 0.95, pruned, against the best complete trial's 0.9
    assert ahead(table("min")) is None  # the best, 0.8, is ahead of it
    tied = table()
    tied.rows[1]["best"] = 0.9
    assert ahead(tied) is None
    none_completed = table()
    for number in (0, 2):
        none_completed.rows[number]["state"] = "FAILED"
    assert ahead(none_completed) is None  # the pruned trial is the best itself



def test_a_trial_that_failed_after_scoring_better_than_the_best_is_named_beside_it():
    """A trial that diverged after its best epoch failed: ``status --top`` ranked it first
    and the best named another, with no word why (audit 74)."""
    t = table()
    t.rows[3]["best"] = 0.99
    ahead = t.ahead_of_best(t.best_row())
    assert (t.best_row()["trial"], ahead["trial"], ahead["state"]) == (2, 3, "FAILED")
    t.rows[3]["best"] = 0.5
    assert t.ahead_of_best(t.best_row())["trial"] == 1  # the pruned one, then


def test_pruned_trials_count_when_none_completed():
    t = table()
    for number in (0, 2):
        t.rows[number]["state"] = "FAILED"
    assert t.best_row()["trial"] == 1


def test_csv_round_trip_keeps_types(tmp_path):
    t = table()
    path = tmp_path / "trials.csv"
    t.save(path)
    rows = read_rows(path)
    assert [r["trial"] for r in rows] == [0, 1, 2, 3]
    assert rows[0]["model.lr"] == 0.01 and rows[0]["state"] == "COMPLETE"
    loaded = TrialsTable.load(path, "val_acc", "max", ["model.lr"])
    assert loaded.best_row()["trial"] == 2
    assert loaded.counts() == {"COMPLETE": 2, "PRUNED": 1, "FAILED": 1}
    assert not list(tmp_path.glob(".trials.csv.*"))  # no temp file left behind


def test_a_trial_that_lost_no_node_reads_back_zero_node_losses(tmp_path):
    """The column stays empty until a node is lost; ``result.trials`` gave '' next to int
    ``attempts``, and summing it raised TypeError."""
    t = table()
    t.rows[1]["node_losses"] = 1
    path = tmp_path / "trials.csv"
    t.save(path)
    assert [r["node_losses"] for r in read_rows(path)] == [0, 1, 0, 0]


def test_every_change_to_a_row_reaches_the_next_save(tmp_path):
    # Rows are rendered once and reused while unchanged; any change, however made, shows.
    t = table()
    path = tmp_path / "trials.csv"
    t.save(path)
    t.row(0)["state"] = "RUNNING"
    t.rows[2]["best"] = 0.5
    t.row(4)["state"] = "PENDING"
    t.save(path)
    rows = {r["trial"]: r for r in read_rows(path)}
    assert rows[0]["state"] == "RUNNING" and rows[2]["best"] == 0.5 and rows[1]["best"] == 0.95
    assert sorted(rows) == [0, 1, 2, 3, 4]
    assert t.to_csv() == TrialsTable.load(path, "val_acc", "max", ["model.lr"]).to_csv()
    # every other way a dict changes, and a row set whole
    t.rows[0].update(reason="early_stopping")
    t.rows[1].pop("best")
    t.rows[2].setdefault("last", 0.25)
    del t.rows[3]["state"]
    t.rows[4] |= {"epochs": 7}
    t.rows[5] = {"trial": 5, "state": "COMPLETE"}
    t.save(path)
    rows = {r["trial"]: r for r in read_rows(path)}
    assert (rows[0]["reason"], rows[1]["best"], rows[2]["last"], rows[3]["state"], rows[4]["epochs"],
            rows[5]["state"]) == ("early_stopping", "", 0.25, "", 7, "COMPLETE"), rows
    t.rows[5]["state"] = "PRUNED"  # the row set whole is followed too
    t.save(path)
    assert {r["trial"]: r for r in read_rows(path)}[5]["state"] == "PRUNED"


def test_a_resumed_trials_checkpointed_epoch_counts_its_compute_once(tmp_path):
    """A resumed trial first sends its checkpoint's epoch again, with that epoch's time.
    Interrupted between that epoch's checkpoint and its report, the study never heard of
    it, and the epoch's compute was missing from compute_s (and so from the report's
    compute and saved figures); heard of already, it must not count twice."""
    from types import SimpleNamespace

    from hpsearch.search.outcome import PruneLog
    from hpsearch.search.tune_callbacks import TrialsTableRecorder

    recorder = TrialsTableRecorder(TrialsTable("val_acc", "max", []), tmp_path / "trials.csv", PruneLog())
    trial = SimpleNamespace(trial_id="t0", config={"hps_trial_number": 0})
    epoch = {"val_acc": 0.5, "hps_epoch_time_s": 2.0, "hps_world_size": 2}
    recorder.on_trial_result(0, [], trial, {**epoch, "epoch": 1})
    # resumed from epoch 1's checkpoint: the study had it
    recorder.on_trial_result(0, [], trial, {**epoch, "epoch": 1, "hps_restored": True, "hps_epoch_time_s": 1.5,
                                            "hps_checkpoint_s": 0.0001, "hps_startup_s": 3.0})
    assert recorder.table.row(0)["compute_s"] == 4.0
    # ...and its figures as measured then, with the checkpoint's write, as TensorBoard has
    # them; the checkpoint's copy was measured before its write (audit 39). The new
    # attempt's own start-up is new.
    row = recorder.table.row(0)
    assert (row["epoch_time_s"], row.get("checkpoint_s"), row["startup_s"]) == (2.0, None, 3.0), row
    # resumed from epoch 2's checkpoint, whose report the interruption lost
    recorder.on_trial_result(0, [], trial, {**epoch, "epoch": 2, "hps_restored": True})
    assert recorder.table.row(0)["compute_s"] == 8.0 and recorder.table.row(0)["epochs"] == 2


def test_a_result_held_back_by_the_write_interval_is_written_once_it_has_passed(tmp_path):
    """A report within the interval of the last write waited for the next report or a
    trial's end: ``status`` was an epoch behind the journal (audit 75)."""
    import time
    from types import SimpleNamespace

    from hpsearch.search.outcome import PruneLog
    from hpsearch.search.tune_callbacks import TrialsTableRecorder

    recorder = TrialsTableRecorder(TrialsTable("val_acc", "max", []), tmp_path / "trials.csv", PruneLog(),
                                   min_interval_s=60)
    trial = SimpleNamespace(trial_id="t0", config={"hps_trial_number": 0})
    recorder.on_trial_result(0, [], trial, {"val_acc": 0.5, "epoch": 1})
    recorder.on_trial_result(0, [], trial, {"val_acc": 0.6, "epoch": 2})  # within the interval: held
    recorder.on_step_end(1, [])
    assert [r["epochs"] for r in read_rows(tmp_path / "trials.csv")] == [1]
    recorder._last_write = time.monotonic() - 61  # the interval has passed, with no other report
    recorder.on_step_end(2, [])
    assert [r["epochs"] for r in read_rows(tmp_path / "trials.csv")] == [2]


def test_trial_starts_are_held_back_by_the_write_interval_and_trial_ends_are_not(tmp_path):
    """Each write is the whole file: one at every start and end made the driver write 36 MB
    for a 180 KB trials.csv at 200 trials (audit 83). A trial's end is written at once."""
    from types import SimpleNamespace

    from hpsearch.search.outcome import PruneLog
    from hpsearch.search.tune_callbacks import TrialsTableRecorder

    recorder = TrialsTableRecorder(TrialsTable("val_acc", "max", []), tmp_path / "trials.csv", PruneLog(),
                                   min_interval_s=60)
    writes = []
    save = recorder.table.save
    recorder.table.save = lambda path: (writes.append(len(recorder.table.rows)), save(path))
    trials = [SimpleNamespace(trial_id=f"t{number}", config={"hps_trial_number": number}, last_result={})
              for number in range(3)]
    for trial in trials:
        recorder.on_trial_start(0, [], trial)
    assert writes == [1]  # the first; the others within the interval
    recorder.on_trial_result(0, [], trials[0], {"val_acc": 0.5, "epoch": 1, "hps_finished": True})
    recorder.on_trial_complete(0, [], trials[0])
    assert writes == [1, 3] and [r["trial"] for r in read_rows(tmp_path / "trials.csv")] == [0, 1, 2]


def test_a_trials_planned_techniques_are_in_its_row_from_its_start(tmp_path, example_config):
    """A trial that failed before its first report (on its precision or strategy, say)
    had empty precision, strategy and world_size columns."""
    from types import SimpleNamespace

    from hpsearch.search.config_loading import load_config
    from hpsearch.search.outcome import PruneLog
    from hpsearch.search.tune_callbacks import TrialsTableRecorder
    from hpsearch.search.seeding import training_seed
    from hpsearch.search.tuner import planned_columns

    example_config["trainer"] = {"precision": "16-mixed"}
    example_config["space"]["trainer.precision"] = {"type": "categorical", "choices": ["16-mixed", "64-true"]}
    config = load_config(example_config)
    recorder = TrialsTableRecorder(TrialsTable("val_acc", "max", []), tmp_path / "trials.csv", PruneLog(),
                                   min_interval_s=0, planned=planned_columns(config))
    for number, precision in enumerate(["16-mixed", "64-true"]):
        trial = SimpleNamespace(trial_id=f"t{number}", config={"hps_trial_number": number,
                                                              "params": {"trainer.precision": precision}})
        recorder.on_trial_start(0, [], trial)
    rows = read_rows(tmp_path / "trials.csv")
    # the seed each trained with, drawn from the study's seed and its number (not the seed plus
    # its number: another seed's trial), which a resumed trial keeps (audit 28)
    assert [r["seed"] for r in rows] == [training_seed(0, 0), training_seed(0, 1)]
    assert len({training_seed(0, 1), training_seed(1, 0), 1}) == 3
    config.search.seed = 5  # a resume that changed search.seed
    recorder.on_trial_start(0, [], trial)
    assert recorder.table.row(1)["seed"] == training_seed(0, 1)
    # a trial the study handed out before the change, paused before it started (its row has no
    # seed): the seed the study gave it, which it trains with, not one drawn from the new seed
    recorder.table.row(2).update(state="PAUSED")
    handed_out = SimpleNamespace(trial_id="t2", config={"hps_trial_number": 2, "params": {}, "hps_training_seed": 77})
    recorder.on_trial_start(0, [], handed_out)
    assert recorder.table.row(2)["seed"] == 77
    assert [(r["device"], r["precision"], r["world_size"], r["strategy"]) for r in rows] == [
        ("cpu", "bf16-mixed", 1, "single"), ("cpu", "64-true", 1, "single")]  # as a CPU trial runs them
    recorder.on_trial_result(0, [], trial, {"val_acc": 0.5, "epoch": 1, "hps_precision": "32-true"})
    assert recorder.table.row(1)["precision"] == "32-true"  # what it reports it used wins


def test_a_moved_studys_rows_name_its_files_where_it_is_now(tmp_path):
    """After ``mv runs/a elsewhere/`` and a resume, best.json's paths were the new ones and
    trials.csv's trial_dir and traceback paths still the old ones (audit 24). Before a resume,
    what reads the rows (``status``, ``status --trial``, ``SearchResult.trials``) named the
    old ones, though ``load_trial`` and the evaluation took the new (audit 64)."""
    from hpsearch.search.trials_table import TrialsTable

    root = tmp_path / "moved here"
    root.mkdir()
    old = "/data/runs/study"
    (root / "trials.csv").write_text(
        "trial,state,reason,best,trial_dir\n"
        f"0,FAILED,ValueError: x (traceback: {old}/trials/trial_0000/error.txt),0.5,{old}/trials/trial_0000\n"
        f"1,COMPLETE,,0.7,{root}/trials/trial_0001\n")
    table = TrialsTable.load(root / "trials.csv", "val_acc", "max", [])
    assert table.rows[0]["trial_dir"] == str(root / "trials" / "trial_0000")
    assert table.rows[0]["reason"] == f"ValueError: x (traceback: {root / 'trials' / 'trial_0000' / 'error.txt'})"
    assert table.rows[1]["trial_dir"] == str(root / "trials" / "trial_0001")
    read = read_rows(root / "trials.csv")
    assert [row["trial_dir"] for row in read] == [str(root / "trials" / name) for name in ("trial_0000", "trial_0001")]
    assert read[0]["reason"] == table.rows[0]["reason"]


def test_only_failures_in_an_unbroken_row_stop_the_session():
    """failure.max_consecutive_failures counts trials in the order they end: one that
    finishes between failures, completed or pruned, starts the count again."""
    from types import SimpleNamespace

    from hpsearch.search.tune_callbacks import FailuresInARow

    table = TrialsTable("val_acc", "max", [])
    failing = FailuresInARow(table, 3)
    ends = ["FAILED", "FAILED", "PRUNED", "FAILED", "FAILED", "COMPLETE", "FAILED", "FAILED"]
    for number, state in enumerate(ends):
        table.row(number)["state"] = state  # as TrialsTableRecorder, which runs first, leaves it
        trial = SimpleNamespace(trial_id=f"t{number}", config={"hps_trial_number": number})
        (failing.on_trial_error if number % 2 else failing.on_trial_complete)(0, [], trial)
        assert not failing.stop_all(), number
    table.row(8)["state"] = "FAILED"
    failing.on_trial_complete(0, [], SimpleNamespace(trial_id="t8", config={"hps_trial_number": 8}))
    assert failing.stop_all() and not failing("t9", {})  # it stops the session, never one trial
    table.row(9)["state"] = "COMPLETE"  # a trial ending as the session stops
    failing.on_trial_complete(0, [], SimpleNamespace(trial_id="t9", config={"hps_trial_number": 9}))
    assert failing.stop_all()


def test_a_stop_for_failures_names_the_commonest_errors_once_each():
    from hpsearch.search.api import failures_stop_reason

    trials = [{"state": "FAILED", "error": f"OSError: disk (traceback: /s/trial_000{n}/error.txt)"} for n in range(3)]
    trials += [{"state": "FAILED", "error": "MemoryError"}, {"state": "COMPLETE", "error": "ValueError: once"},
               {"state": "FAILED", "reason": "val_acc is not finite (nan)"}]
    assert failures_stop_reason(5, trials) == (
        "search stopped: 5 trials in a row failed (failure.max_consecutive_failures), as a fault every trial meets "
        "makes them, or one of much of the space. This session's failures: OSError: disk (3 trials; traceback: "
        "/s/trial_0000/error.txt); MemoryError (1 trial); and 1 other error")


def test_the_python_apis_trials_hold_none_where_a_cell_is_empty(tmp_path):
    """A conditional parameter a trial did not sample was '' in ``result.trials``, and
    ``trial["model.dropout"] > 0.1`` raised TypeError (audit 45)."""
    from hpsearch.search.api import SearchResult

    t = table()
    del t.rows[2]["model.lr"]  # not sampled in trial 2
    t.save(tmp_path / "trials.csv")
    rows = read_rows(tmp_path / "trials.csv")
    assert rows[2]["model.lr"] == "" and rows[3]["best"] == ""  # the file's empty cells
    trials = SearchResult(tmp_path, "complete", None, rows).trials
    assert (trials[2]["model.lr"], trials[3]["best"], trials[0]["model.lr"]) == (None, None, 0.01)
    assert not [key for trial in trials for key, value in trial.items() if value == ""]
