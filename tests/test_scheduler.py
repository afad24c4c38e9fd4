"""ASHA keyed by study trial number, and its decisions passed to distributed trials' ranks:
fed result by result, no Ray cluster."""

from __future__ import annotations

from dataclasses import dataclass, field

from types import SimpleNamespace

import pytest
from ray.tune.schedulers import TrialScheduler

from hpsearch.search.config_loading import load_config
from hpsearch.search.distributed import stopped_at_rung
from hpsearch.search.outcome import PruneLog
from hpsearch.search.rung_decisions import RungDecisions
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


def test_distributed_trials_get_each_decision_published_for_their_ranks(example_config, monkeypatch):
    published = []
    monkeypatch.setattr(RungDecisions, "publish", lambda self, number, epoch, stop: published.append((number, epoch, stop)))
    example_config["resources"].update(workers_per_trial=2, cpus_per_worker=1)
    scheduler, _ = asha(example_config)
    # Rungs at 1 and 3 (9 is max_epochs, where a trial ends anyway): only there do ranks wait.
    assert scheduler.decisions.rung_epochs == {1, 3}
    trials = [FakeTrial(f"t{i}", i) for i in range(3)]
    for trial in trials:
        scheduler.on_trial_add(None, trial)
    for trial, value in zip(trials, [0.5, 0.9, 0.1]):
        feed(scheduler, trial, 1, value)
    feed(scheduler, trials[1], 2, 0.95)
    feed(scheduler, trials[1], 9, 0.97, finished=True)  # an ending report waits for nothing
    assert published == [(0, 1, False), (1, 1, False), (2, 1, True), (1, 2, False)]


def test_single_process_trials_publish_no_decisions(example_config):
    scheduler, _ = asha(example_config)
    assert scheduler.decisions is None  # their report itself waits for Tune's decision


class FakeStrategy:
    def __init__(self):
        self.broadcasts = []

    def broadcast(self, value, src=0):
        self.broadcasts.append(value)
        return value


@dataclass
class FakeTrainer:
    global_rank: int = 0
    strategy: FakeStrategy = field(default_factory=FakeStrategy)


class FixedDecisions(RungDecisions):
    """Decisions already made, by (trial, epoch); None where none arrives."""

    def __init__(self, rung_epochs, made):
        super().__init__(frozenset(rung_epochs))
        object.__setattr__(self, "made", made)

    def wait_for(self, trial_number, epoch, limit_s=0.0):
        return self.made.get((trial_number, epoch))


def test_ranks_wait_only_at_rungs_and_learn_a_stop_from_rank_zero():
    decisions = FixedDecisions({1, 3}, {(4, 1): False, (4, 3): True, (4, 2): True})
    trainer = FakeTrainer()
    assert not stopped_at_rung(decisions, 4, trainer, {"epoch": 1})
    assert not stopped_at_rung(decisions, 4, trainer, {"epoch": 2})  # no rung: nothing asked
    assert not stopped_at_rung(decisions, 4, trainer, {"epoch": 3, "hps_finished": True})
    assert stopped_at_rung(decisions, 4, trainer, {"epoch": 3})
    # A resumed trial's first report may be past a rung it never reported at: it waits.
    assert stopped_at_rung(decisions, 4, trainer, {"epoch": 2, "hps_restored": True})
    assert trainer.strategy.broadcasts == [False, True, True]
    # Other ranks take rank 0's word: they ask nobody and broadcast nothing of their own.
    follower = FakeTrainer(global_rank=1)
    follower.strategy.broadcast = lambda value, src=0: True
    assert stopped_at_rung(FixedDecisions({1}, {}), 4, follower, {"epoch": 1})


def test_rank_zero_trains_on_and_says_so_when_no_decision_arrives():
    trainer = FakeTrainer()
    with pytest.warns(UserWarning, match="no scheduler decision on epoch 1"):
        assert not stopped_at_rung(FixedDecisions({1}, {}), 4, trainer, {"epoch": 1})


@pytest.mark.parametrize("max_epochs,grace_period,reduction_factor",
                         [(10, 1, 3), (9, 1, 3), (2, 1, 2), (20, 2, 3), (100, 1, 4), (27, 3, 3), (5, 5, 2),
                          (16, 1, 2.5), (10, 1, 2.5), (20, 1, 1.5), (4, 1, 2.5)])
def test_the_rung_epochs_are_those_of_rays_asha(example_config, max_epochs, grace_period, reduction_factor):
    """The report's rung counts and the ranks' waits use SchedulerConfig.rung_epochs: they
    must be the epochs at which Ray's ASHA, fed one report an epoch, enters a trial into a
    rung, short of max_epochs (where every trial ends). A milestone that is not a whole
    epoch (reduction factor 2.5: 6.25) is decided at the epoch after it; rung_epochs had
    rounded it down, so a distributed trial's ranks waited at epoch 6, trained epoch 7
    and were stopped there, one epoch late (audit 21)."""
    example_config["scheduler"].update(max_epochs=max_epochs, grace_period=grace_period,
                                       reduction_factor=reduction_factor)
    config = load_config(example_config)
    scheduler = make_scheduler(config, PruneLog())
    decided_at = set()
    for bracket in scheduler._brackets:
        trial = SimpleNamespace(trial_id="t")
        for epoch in range(1, max_epochs):
            entered = sum(trial.trial_id in recorded for _, recorded in bracket._rungs)
            bracket.on_result(trial, epoch, 1.0)
            if sum(trial.trial_id in recorded for _, recorded in bracket._rungs) > entered:
                decided_at.add(epoch)
    assert config.scheduler.rung_epochs == sorted(decided_at)


def test_a_trial_is_stopped_at_the_report_that_says_it_finished():
    """Tune otherwise asked a finished trial for one more result, which its function gives
    only by returning: one more round trip through the driver per trial."""
    from hpsearch.search.outcome import EPOCH, FINISHED
    from hpsearch.search.tune_callbacks import FinishedTrials

    stopper = FinishedTrials()
    assert stopper("t1", {EPOCH: 3, FINISHED: True})
    assert not stopper("t1", {EPOCH: 2, FINISHED: False}) and not stopper("t1", {EPOCH: 2})
    assert not stopper.stop_all()  # the other trials go on
