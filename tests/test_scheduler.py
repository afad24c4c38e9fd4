"""ASHA keyed by study trial number: decisions fed result by result, no Ray cluster."""

from __future__ import annotations

from dataclasses import dataclass, field

from ray.tune.schedulers import TrialScheduler

from hpsearch.search.config_loading import load_config
from hpsearch.search.outcome import PruneLog
from hpsearch.search.scheduler import StudyASHA, make_scheduler


@dataclass
class FakeTrial:
    trial_id: str
    number: int
    config: dict = field(init=False)

    def __post_init__(self):
        self.config = {"hps_trial_number": self.number, "params": {}}


def asha(example_config, **scheduler):
    example_config["scheduler"].update(max_epochs=9, grace_period=1, reduction_factor=3, **scheduler)
    prunes = PruneLog()
    return make_scheduler(load_config(example_config), prunes), prunes


def feed(scheduler, trial, epoch, value, finished=False):
    return scheduler.on_trial_result(None, trial, {"epoch": epoch, "val_acc": value, "hps_finished": finished})


def test_weak_trials_are_stopped_at_the_first_rung_and_logged(example_config):
    scheduler, prunes = asha(example_config)
    assert isinstance(scheduler, StudyASHA)
    trials = [FakeTrial(f"t{i}", i) for i in range(4)]
    for trial in trials:
        scheduler.on_trial_add(None, trial)
    decisions = [feed(scheduler, t, 1, v) for t, v in zip(trials, [0.5, 0.7, 0.9, 0.1])]
    assert decisions[:3] == [TrialScheduler.CONTINUE] * 3
    assert decisions[3] == TrialScheduler.STOP
    assert prunes.stopped_at_epoch == {"t3": 1}


def test_reaching_max_epochs_is_a_finish_not_a_prune(example_config):
    scheduler, prunes = asha(example_config)
    trial = FakeTrial("t0", 0)
    scheduler.on_trial_add(None, trial)
    assert feed(scheduler, trial, 9, 0.5, finished=True) == TrialScheduler.STOP
    assert prunes.stopped_at_epoch == {}


def test_seeded_rungs_judge_a_new_trial_like_the_live_ones(example_config):
    scheduler, _ = asha(example_config)
    entries = scheduler.seed_rungs({0: {1: 0.9, 2: 0.92, 3: 0.95}, 1: {1: 0.85}, 2: {1: 0.88}})
    assert entries == 4  # rung 1: three trials; rung 3: one
    newcomer = FakeTrial("fresh-id", 7)
    scheduler.on_trial_add(None, newcomer)
    assert feed(scheduler, newcomer, 1, 0.2) == TrialScheduler.STOP


def test_a_resumed_trial_is_not_judged_twice_at_a_rung_it_passed(example_config):
    scheduler, _ = asha(example_config)
    scheduler.seed_rungs({0: {1: 0.3}, 1: {1: 0.9}, 2: {1: 0.95}})
    resumed = FakeTrial("new-ray-id", 0)  # trial 0 in a new session has a new Ray id
    scheduler.on_trial_add(None, resumed)
    assert feed(scheduler, resumed, 1, 0.3) == TrialScheduler.CONTINUE


def test_scheduler_none_never_stops(example_config):
    example_config["scheduler"]["type"] = "none"
    scheduler = make_scheduler(load_config(example_config), PruneLog())
    assert not isinstance(scheduler, StudyASHA)
    trial = FakeTrial("t", 0)
    assert scheduler.on_trial_result(None, trial, {"epoch": 1, "val_acc": 0.0}) == TrialScheduler.CONTINUE
