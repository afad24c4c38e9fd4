"""``hpsearch status EXP --trial N``'s reading of the study's journal (``one_trial``);
the view of a real search's trials is checked in test_fault_tolerance."""

from __future__ import annotations

import io

from hpsearch.search.config_loading import load_config
from hpsearch.search.experiment import STUDY_FILE
from hpsearch.search.outcome import PruneLog
from hpsearch.search.searcher import OptunaSearcher, open_study, queue_first_trials
from hpsearch.search.journal_reader import one_trial
from hpsearch.search.outcome import FIRST_TRIAL


def test_the_journal_gives_each_epochs_value_and_whether_a_trial_is_queued_or_a_first_trial(example_config, tmp_path):
    example_config["search"]["first_trials"] = [{"model.lr": 0.002}]
    config = load_config(example_config)
    queue_first_trials(open_study(tmp_path, config.name, config.mode), config)
    journal = tmp_path / STUDY_FILE
    assert one_trial(journal, 0, FIRST_TRIAL) == {"values": {}, "state": "WAITING", FIRST_TRIAL: {"model.lr": 0.002}}

    searcher = OptunaSearcher(config, tmp_path, PruneLog())
    searcher.suggest("a")
    searcher.suggest("b")
    for epoch, value in enumerate([0.5, 0.75], start=1):
        searcher.on_trial_result("b", {"val_acc": value, "epoch": epoch})
    searcher.on_trial_result("b", {"val_acc": 0.7, "epoch": 2})  # a resumed trial reports its epoch again
    with journal.open("a") as cut:
        cut.write('{"op_code":7,"worker_id":"w","trial_id":1,"step":3,"intermed')  # a kill mid-write
    assert one_trial(journal, 0, FIRST_TRIAL) == {"values": {}, "state": "RUNNING", FIRST_TRIAL: {"model.lr": 0.002}}
    assert one_trial(journal, 1, FIRST_TRIAL) == {"values": {1: 0.5, 2: 0.7}, "state": "RUNNING", FIRST_TRIAL: None}
    assert one_trial(journal, 2, FIRST_TRIAL) == {"values": {}}  # no such trial
    assert one_trial(tmp_path / "none.journal", 0, FIRST_TRIAL) == {"values": {}}


def test_a_trial_handed_out_or_queued_without_a_row_is_said_so_and_who_runs_it(example_config, tmp_path):
    """Before its row is written, a handed-out trial was "no trial 0 (it has no trial yet)",
    and a queued one was told to be run by a resume while a search ran on the study
    (audit 46)."""
    import time

    import pytest
    from rich.console import Console

    from hpsearch.search.errors import ExperimentError
    from hpsearch.search.experiment import ExperimentDir, record_session, write_config
    from hpsearch.search.study_lock import study_lock
    from hpsearch.search.trial_view import print_trial

    example_config["search"]["first_trials"] = [{"model.lr": 0.002}, {"model.lr": 0.003}]
    config = load_config(example_config)
    exp = ExperimentDir.create(str(tmp_path), config.name)
    write_config(exp, config.model_dump(mode="json"))
    queue_first_trials(open_study(exp.root, config.name, config.mode), config)
    OptunaSearcher(config, exp.root, PruneLog()).suggest("a")  # trial 0 handed out; 1 still queued

    def said(number: int) -> str:
        with pytest.raises(ExperimentError) as caught:
            print_trial(exp, number, Console())
        return str(caught.value)

    assert said(0) == ("trial 0 is starting: the study has it, trials.csv not yet; no search runs on the study: "
                       f"`hpsearch resume {exp.root}` runs it")
    assert said(1) == f"trial 1 is queued in the study and has not started; `hpsearch resume {exp.root}` runs it"
    with study_lock(exp):  # as a search holds it, with its session running
        record_session(exp, time.time(), None, "running")
        assert said(0) == "trial 0 is starting: the study has it, trials.csv not yet; ask again in a moment"
        assert said(1) == "trial 1 is queued in the study and has not started; the search running on it runs it"
    assert said(2) == f"{exp.root} has no trial 2 (it has no trial yet)"
    # Running, its row written before its reports reached trials.csv: the journal's values are its best and last
    from hpsearch.search.trials_table import TrialsTable

    searcher = OptunaSearcher(config, exp.root, PruneLog())
    assert searcher.suggest("b")["hps_trial_number"] == 0  # trial 0 again, which its session left running
    for epoch, value in enumerate([0.5, 0.75, 0.7], start=1):
        searcher.on_trial_result("b", {"val_acc": value, "epoch": epoch})
    table = TrialsTable(config.metric, config.mode, list(config.space))
    table.row(0).update(state="RUNNING", reason="")
    table.save(exp.trials_csv)
    console = Console(file=io.StringIO(), width=300)
    print_trial(exp, 0, console)
    shown = console.file.getvalue()
    assert "best 0.75 at epoch 2 (max), last 0.7, after 3 epochs; by epoch: 1: 0.5  2: 0.75  3: 0.7" in shown, shown
    assert "given by search.first_trials" in shown, shown
    values_line = next(line for line in shown.splitlines() if line.startswith("values"))
    assert values_line.split(None, 1)[1].startswith("model.lr = , model.channels = , data.batch_size ="), values_line
    # too many for a line: one to a line, under the label (32 made 2,300 characters; audit 83)
    narrow = Console(file=io.StringIO(), width=30)
    print_trial(exp, 0, narrow)
    lines = narrow.file.getvalue().splitlines()
    at = next(number for number, line in enumerate(lines) if line.startswith("values"))
    assert [line.split() for line in lines[at:at + 3]] == [["values", "model.lr", "="], ["model.channels", "="],
                                                             ["data.batch_size", "="]], lines
    # ended in the study, its row lost with trials.csv: a resume writes it again (audit 47: "starting")
    searcher.on_trial_complete("b", {"val_acc": 0.7, "epoch": 3, "hps_finished": True})
    exp.trials_csv.unlink()
    assert said(0) == ("trial 0 ended (COMPLETE in the study's journal), but trials.csv has no row for it; "
                       f"`hpsearch resume {exp.root}` writes trials.csv again from the journal")


def test_a_trials_last_epoch_is_split_into_its_parts_and_its_folder_names_the_checkpoints_a_resume_takes(tmp_path):
    """The report before the epoch was listed as a part of it, and the parts added up to
    more than the epoch; a paused trial's epoch checkpoints went unnamed (audit 49)."""
    from hpsearch.search.trial_view import _files, _times

    row = {"epoch_time_s": 0.193, "train_s": 0.175, "val_s": 0.0076, "data_wait_s": 0.0021, "checkpoint_s": 0.0038,
           "report_s": 0.0439, "epochs": 3}
    assert _times(row) == ("its last epoch 0.193 s (training 0.175 s, validation 0.0076 s, waiting for data "
                           "0.0021 s, checkpoints 0.0038 s); the report of the epoch before it 0.0439 s")
    assert "report" not in _times({**row, "epochs": 1, "report_s": 0.0})  # its one report is not timed
    (tmp_path / "checkpoints").mkdir()
    for name in ("epoch-0013.ckpt", "epoch-0014.ckpt", "best.ckpt"):
        (tmp_path / "checkpoints" / name).write_bytes(b"")
    (tmp_path / "output.log").write_text("")
    assert _files(tmp_path, checkpoint_kept=True) == (
        " (output.log, checkpoints/best.ckpt, checkpoints/epoch-0013.ckpt, checkpoints/epoch-0014.ckpt)")
    # a distributed trial's ranks: rank 0, ended with its worker group, left its crash account empty
    (tmp_path / "checkpoints" / "epoch-0013.ckpt").unlink()
    (tmp_path / "crash.txt").write_text("")
    (tmp_path / "error-rank1.txt").write_text("Traceback ...")
    (tmp_path / "crash-rank1.txt").write_text("Fatal Python error: Segmentation fault")
    assert _files(tmp_path, checkpoint_kept=False) == (
        " (output.log, checkpoints/epoch-0014.ckpt, error-rank1.txt, crash-rank1.txt)")


def test_the_journal_readers_copies_of_optunas_codes_are_optunas():
    """``status`` reads the journal without importing Optuna, by its own copies of Optuna's
    operation codes and trial states: a release that renumbered them would make it misread
    every study, with nothing to say so."""
    from optuna.storages.journal._storage import JournalOperation
    from optuna.trial import TrialState

    from hpsearch.search import journal_reader

    assert [journal_reader.CREATE_TRIAL, journal_reader.SET_TRIAL_STATE_VALUES,
            journal_reader.SET_TRIAL_INTERMEDIATE_VALUE, journal_reader.SET_TRIAL_USER_ATTR] == [
        JournalOperation.CREATE_TRIAL, JournalOperation.SET_TRIAL_STATE_VALUES,
        JournalOperation.SET_TRIAL_INTERMEDIATE_VALUE, JournalOperation.SET_TRIAL_USER_ATTR]
    assert journal_reader.TRIAL_STATES == {state.value: state.name for state in TrialState}
    assert journal_reader.WAITING == TrialState.WAITING.value


def test_a_data_starved_trial_is_told_what_would_feed_it_here_and_at_the_sessions_end():
    """The flag said only that the DataLoader could not keep up, and only in ``status``;
    the default of one CPU a trial gives it no loader worker at all (audit 68)."""
    from rich.console import Console

    from hpsearch.search.status_view import print_data_starved
    from hpsearch.search.trial_view import _times

    row = {"epoch_time_s": 2.7, "train_s": 0.4, "data_wait_s": 2.3, "data_starved": True, "num_workers": 0}
    said = _times(row)
    assert "data-starved (its DataLoader could not keep up with 0 loader workers" in said, said
    assert "loader.num_workers" in said and "resources.cpus_per_trial" in said, said
    out = io.StringIO()
    print_data_starved([{"trial": 0, "data_starved": True}, {"trial": 1, "data_starved": False},
                        {"trial": 2, "data_starved": True}], Console(file=out, width=300))
    assert out.getvalue().startswith("data-starved: trials 0, 2 waited on the DataLoader") \
        and "loader.num_workers" in out.getvalue()
    out = io.StringIO()
    print_data_starved([{"trial": 1, "data_starved": False}], Console(file=out))
    assert out.getvalue() == ""


def test_a_data_starved_trial_whose_file_sets_its_loader_workers_is_told_to_raise_that_count():
    """``resources.cpus_per_trial`` sizes the workers only while ``loader.num_workers`` is
    "auto": a file that sets the count was told of both."""
    from rich.console import Console

    from hpsearch.search.status_view import num_workers_setting, print_data_starved
    from hpsearch.search.trial_view import _times

    row = {"epoch_time_s": 2.7, "train_s": 0.4, "data_wait_s": 2.3, "data_starved": True, "num_workers": 1}
    said = _times(row, num_workers_setting({"loader": {"num_workers": 1}}))
    assert "loader.num_workers (the file sets 1)" in said and "which sizes them" not in said, said
    assert "which sizes them" in _times(row, num_workers_setting({"loader": {"num_workers": "auto"}}))
    out = io.StringIO()
    print_data_starved([{"trial": 0, "data_starved": True}], Console(file=out, width=300), num_workers_setting=3)
    assert "loader.num_workers (the file sets 3)" in out.getvalue() and "which sizes" not in out.getvalue()
