"""``hpsearch status EXP --trial N``'s reading of the study's journal (``one_trial``);
the view of a real search's trials is checked in test_fault_tolerance."""

from __future__ import annotations

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
    assert one_trial(journal, 0, FIRST_TRIAL) == {"values": {}, "queued": True, FIRST_TRIAL: {"model.lr": 0.002}}

    searcher = OptunaSearcher(config, tmp_path, PruneLog())
    searcher.suggest("a")
    searcher.suggest("b")
    for epoch, value in enumerate([0.5, 0.75], start=1):
        searcher.on_trial_result("b", {"val_acc": value, "epoch": epoch})
    searcher.on_trial_result("b", {"val_acc": 0.7, "epoch": 2})  # a resumed trial reports its epoch again
    with journal.open("a") as cut:
        cut.write('{"op_code":7,"worker_id":"w","trial_id":1,"step":3,"intermed')  # a kill mid-write
    assert one_trial(journal, 0, FIRST_TRIAL) == {"values": {}, "queued": False, FIRST_TRIAL: {"model.lr": 0.002}}
    assert one_trial(journal, 1, FIRST_TRIAL) == {"values": {1: 0.5, 2: 0.7}, "queued": False, FIRST_TRIAL: None}
    assert one_trial(journal, 2, FIRST_TRIAL) == {"values": {}}  # no such trial
    assert one_trial(tmp_path / "none.journal", 0, FIRST_TRIAL) == {"values": {}}
