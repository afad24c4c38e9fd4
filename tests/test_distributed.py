"""Trials of several processes: DDP with gloo on CPU through Ray Train, and what each rank did."""

from __future__ import annotations

import csv
import json
import shutil

import pytest

from conftest import FIXTURES, run_cli, shrunk_example, tensorboard_run, tensorboard_steps, write_yaml

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def ddp_search(tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp")
    shutil.copytree(FIXTURES / "userpkg", root / "userpkg")
    probe = root / "probe"
    probe.mkdir()
    config = {
        "name": "ddp",
        "model": {"class_path": "userpkg.ddp_probe:RankProbe", "init_args": {"probe_dir": str(probe)}},
        "data": {"class_path": "userpkg.ddp_probe:IndexedData"},
        "space": {"model.lr": {"type": "float", "low": 0.01, "high": 0.1, "log": True}},
        "metric": "val_loss", "mode": "min",
        # ASHA prunes trials 1 and 2 (seed 25 samples lr 0.074, 0.038, 0.019, in order) after their
        # first epoch: the ranks of a pruned trial must give their CPUs back, or the next
        # trial never starts.
        "search": {"num_trials": 3, "max_concurrent": 2, "sampler": "random", "seed": 25},
        "scheduler": {"type": "asha", "max_epochs": 2, "grace_period": 1, "reduction_factor": 2},
        "trainer": {"precision": "bf16-mixed"},
        "resources": {"workers_per_trial": 2, "cpus_per_worker": 1},
        "storage": "runs",
    }
    write_yaml(root / "exp.yaml", config)
    result = run_cli("run", "exp.yaml", cwd=root, timeout=500)
    assert result.returncode == 0, result.stdout + result.stderr
    return root / "runs" / "ddp", probe, result


@pytest.mark.slow  # the first to use ddp_search, which runs it
def test_each_trial_ran_two_ddp_ranks_in_bf16(ddp_search):
    exp_dir, _, result = ddp_search
    rows = list(csv.DictReader((exp_dir / "trials.csv").open()))
    assert {(r["world_size"], r["strategy"], r["precision"], r["device"]) for r in rows} == {
        ("2", "ddp", "bf16-mixed", "cpu")}
    # every rank's node, gathered at the training's start: here the one node (rank 0's)
    assert all(r["rank_nodes"] == r["node_id"] != "" for r in rows), rows
    assert float(rows[0]["samples_per_s"]) > 0
    # The model logs val_loss with sync_dist=True: its ranks agree, and no trial has a note saying otherwise.
    assert [r["notes"] for r in rows] == [""] * 3
    # The trial's start-up counts Ray Train's start of its worker group (new processes):
    # without it a DDP trial's start-up looked like a single process's.
    assert all(float(r["startup_s"]) >= float(r["workers_start_s"]) > 0 for r in rows), rows
    # Two trials of 2 workers do not fit 2 CPUs at once: the search said so and ran them in turn.
    assert "holds 1 trial of this size at once" in result.stderr


def test_a_pruned_trials_ranks_free_their_cpus_for_the_next_trial(ddp_search):
    exp_dir, _, _ = ddp_search
    rows = list(csv.DictReader((exp_dir / "trials.csv").open()))
    assert [(r["state"], r["epochs"]) for r in rows] == [("COMPLETE", "2"), ("PRUNED", "1"), ("PRUNED", "1")]


def test_ranks_trained_on_disjoint_shards_and_agree_on_metrics(ddp_search):
    exp_dir, probe, _ = ddp_search
    # The driver's one-batch preflight validates at the middle of the lr range, alone.
    preflight = f"lr{(0.01 * 0.1) ** 0.5:.10f}_"
    files = [p for p in probe.glob("*.json") if not p.name.startswith(preflight)]
    records = [json.loads(p.read_text()) for p in files]
    assert all(r["world_size"] == 2 and r["precision"] == "bf16-mixed" for r in records)
    # Both ranks ran every epoch a trial reported, and no other: the ranks of a trial that
    # ASHA stopped at its first epoch waited for that decision and left together, before
    # a second epoch (they used to train on until Ray removed them).
    epochs = {p.stem.replace("_rank0", "").replace("_rank1", "") for p in files}
    assert len({e for e in epochs if e.endswith("_epoch0")}) == 3 and len([e for e in epochs if e.endswith("_epoch1")]) == 1
    reported = sum(int(r["epochs"]) for r in csv.DictReader((exp_dir / "trials.csv").open()))
    assert len(records) == 2 * reported == 2 * len(epochs)
    for prefix in epochs:
        trial, epoch = prefix.split("_epoch")
        rank0 = json.loads((probe / f"{trial}_rank0_epoch{epoch}.json").read_text())
        rank1 = json.loads((probe / f"{trial}_rank1_epoch{epoch}.json").read_text())
        assert not set(rank0["seen"]) & set(rank1["seen"])
        assert sorted(rank0["seen"] + rank1["seen"]) == list(range(64))
        assert rank0["val_loss"] == pytest.approx(rank1["val_loss"], abs=1e-6)


def test_only_rank_zero_wrote_logs_and_checkpoints(ddp_search):
    exp_dir, _, _ = ddp_search
    for trial_dir in sorted((exp_dir / "trials").iterdir()):
        number = int(trial_dir.name.split("_")[1])
        run = tensorboard_run(exp_dir, number)
        written_by_trial = [p for p in run.glob("events.out.tfevents.*") if not p.name.endswith(".hparams")]
        assert len(written_by_trial) == 1, run
        # Ended trials keep only their best checkpoint; a pruned trial's ranks saved no
        # epoch past the one it was stopped at.
        assert {p.name for p in (trial_dir / "checkpoints").iterdir()} == {"best.ckpt"}
        # TensorBoard has the epochs the study has: one validation per reported epoch.
        row = next(r for r in csv.DictReader((exp_dir / "trials.csv").open()) if int(r["trial"]) == number)
        assert tensorboard_steps(run, "val_loss") == list(range(1, int(row["epochs"]) + 1)), (number, row["state"])
        # what the ranks printed, not Ray Train's log of every report (audit 31)
        printed = (trial_dir / "output.log").read_text() if (trial_dir / "output.log").exists() else ""
        assert "Reporting training result" not in printed, printed[:2000]
    best = json.loads((exp_dir / "best.json").read_text())
    assert best["state"] == "COMPLETE" and best["checkpoint"].endswith("best.ckpt")


@pytest.mark.slow
def test_a_fault_in_one_rank_ends_its_whole_trial(tmp_path):
    """A rank that met a fault not worth a retry reported its trial's end alone: its report
    waited for the other ranks', and they for it in their next collective, and the search
    hung for good (audit 61). A full disk met by one rank pauses the trial, as it does a
    one-process trial, and the resume continues it. A rank that crashed outright just after
    reporting an epoch took its report with it, and Ray Train passed that epoch on to Tune
    only with every rank's: the trial failed with no value (audit 62)."""
    import subprocess

    shutil.copytree(FIXTURES / "userpkg", tmp_path / "userpkg")
    probe = tmp_path / "probe"
    probe.mkdir()
    faults = {"0": "type_error_on_rank1", "1": "disk_full_on_rank0_once", "2": "exit_on_rank1"}
    write_yaml(tmp_path / "exp.yaml", {
        "name": "onerank",
        "model": {"class_path": "userpkg.ddp_probe:OneRankFaults",
                  "init_args": {"probe_dir": str(probe), "faults": faults}},
        "data": {"class_path": "userpkg.ddp_probe:IndexedData"},
        "space": {"model.lr": {"type": "float", "low": 0.01, "high": 0.1, "log": True}},
        "metric": "val_loss", "mode": "min",
        "search": {"num_trials": 3, "max_concurrent": 1, "sampler": "random", "seed": 3},
        "scheduler": {"type": "none", "max_epochs": 2},
        "resources": {"workers_per_trial": 2, "cpus_per_worker": 1},
        "failure": {"max_retries": 0},  # trial 2's crash repeats at every try
        "storage": "runs",
    })
    exp_dir = tmp_path / "runs" / "onerank"
    try:
        first = run_cli("run", "exp.yaml", cwd=tmp_path, timeout=240)
    except subprocess.TimeoutExpired:
        pytest.fail("the search hung on a fault in one rank")
    rows = {r["trial"]: r for r in csv.DictReader((exp_dir / "trials.csv").open())}
    assert first.returncode == 1, first.stdout + first.stderr
    assert rows["0"]["state"] == "FAILED", rows["0"]
    assert rows["0"]["reason"].startswith("TypeError: rank 1's batch has no labels"), rows["0"]["reason"]
    assert "error-rank1.txt" in rows["0"]["reason"] and (exp_dir / "trials/trial_0000/error-rank1.txt").exists()
    assert rows["1"]["state"] == "PAUSED" and rows["1"]["reason"].startswith("disk full: "), rows["1"]
    assert "hpsearch resume" in first.stderr, first.stderr

    resumed = run_cli("resume", str(exp_dir), cwd=tmp_path, timeout=240)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    rows = {r["trial"]: r for r in csv.DictReader((exp_dir / "trials.csv").open())}
    assert [(rows[n]["state"], rows[n]["epochs"]) for n in "012"] == [
        ("FAILED", "1"), ("COMPLETE", "2"), ("FAILED", "1")], rows
    assert rows["1"]["resumed"] == "True", rows["1"]
    from hpsearch.search.searcher import open_study

    crashed = open_study(exp_dir, "onerank", "min").trials[2]
    assert list(crashed.intermediate_values) == [1] and rows["2"]["best"] == rows["2"]["last"] != "", rows["2"]
    assert float(rows["2"]["best"]) == pytest.approx(crashed.intermediate_values[1], rel=1e-4)


def test_a_distributed_trial_starts_no_helper_actors_it_does_not_use():
    """Ray Train starts a Ray Data shard manager and a placement-group cleaner for every
    run, each a new process that competed with the ranks' start on a small machine; the
    trials use neither (no Ray Datasets; the driver frees each trial's placement group)."""
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks.backend_setup import BackendSetupCallback
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    from hpsearch.search.distributed import lean_torch_trainer

    def callbacks(trainer_class) -> set[type]:
        trainer = trainer_class(lambda config: None, scaling_config=ScalingConfig(num_workers=2))
        return {type(callback) for callback in trainer._create_default_callbacks()}

    unused = {DatasetsCallback, PlacementGroupCleanerCallback}
    assert unused <= callbacks(TorchTrainer)  # what Ray Train starts: still the two this drops
    lean = callbacks(lean_torch_trainer())
    assert not unused & lean and BackendSetupCallback in lean  # the process group is still set up


def test_a_distributed_trial_out_of_retries_ends_before_importing_the_classes_its_tries_failed_on(monkeypatch):
    """The retry policy ends a trial that keeps failing the same way by marking its config;
    a rank imported the user's classes before looking, so a trial whose tries failed in that
    import failed again there, twice more than the rule allows, with no reason shown."""
    import types

    import ray.train

    from hpsearch.search import distributed
    from hpsearch.search.outcome import FAILURE, FINISHED, GIVE_UP, TRIAL_NUMBER

    def import_fails(config):
        raise ImportError("cannot import name 'Model' from 'apkg.models'")

    reports = []
    monkeypatch.setattr(distributed, "load_training_stack", import_fails)
    monkeypatch.setattr(distributed, "make_strategy", lambda config: "ddp")
    monkeypatch.setattr(ray.train, "get_context", lambda: types.SimpleNamespace(get_world_size=lambda: 2,
                                                                                 get_world_rank=lambda: 1))
    monkeypatch.setattr(ray.train, "report", reports.append)
    monkeypatch.setattr(ray.util, "get_current_placement_group", lambda: None)
    experiment = shrunk_example(FIXTURES, **{"resources/workers_per_trial": 2})
    reason = "failed 2 times the same way, at the same point: ImportError: cannot import name 'Model'"
    trial_config = {TRIAL_NUMBER: 3, "params": {}, GIVE_UP: reason}
    with pytest.raises(distributed.RankEndedTrial) as ended:  # the trial's end, which ends every rank
        distributed._train_rank({"trial_config": trial_config, "experiment": experiment,
                                 "experiment_dir": "unused", "trial_started_at": 0.0, "decisions": None})
    assert ended.value.final_report == {TRIAL_NUMBER: 3, FAILURE: reason, FINISHED: True} and reports == []
    with pytest.raises(ImportError):  # a trial with retries left still imports them first
        distributed._train_rank({"trial_config": {TRIAL_NUMBER: 3, "params": {}}, "experiment": experiment,
                                 "experiment_dir": "unused", "trial_started_at": 0.0, "decisions": None})


def test_the_tune_trial_reports_the_ending_a_rank_raised_and_retries_any_other_fault(monkeypatch, tmp_path):
    """A rank's ending crosses Ray Train as its error (pickled, in ``worker_failures``); the
    Tune trial reports it as a one-process trial would, the lowest rank's where several
    ranks raised one. Any other worker error stays an error, which Tune retries. Either way
    the crash accounts left empty by ranks that Ray Train ended go (audit 61: 23 were left)."""
    import pickle

    from ray import tune
    from ray.train import WorkerGroupError
    from ray.train.v2.api.callback import UserCallback
    from ray.tune.integration import ray_train

    from hpsearch.search import distributed
    from hpsearch.search.outcome import DISK_FULL, FAILURE, FINISHED, TRIAL_NUMBER

    def ending(rank: int, **what) -> distributed.RankEndedTrial:
        ended = distributed.RankEndedTrial({TRIAL_NUMBER: 4, FINISHED: True, "rank": rank, **what})
        return pickle.loads(pickle.dumps(ended))  # as Ray hands it over

    raised: list[Exception] = []

    class FailingTrainer:
        def __init__(self, *args, **kwargs) -> None:
            pass

        def fit(self):
            raise raised[-1]

    reports = []
    monkeypatch.setattr(distributed, "lean_torch_trainer", lambda: FailingTrainer)
    monkeypatch.setattr(tune, "report", reports.append)
    monkeypatch.setattr(ray_train, "TuneReportCallback", UserCallback)  # the real one asks for a Tune session
    experiment = shrunk_example(FIXTURES, **{"resources/workers_per_trial": 2})

    trial_dir = tmp_path / "study" / "trials" / "trial_0004"

    def run_trial() -> None:
        trial_dir.mkdir(parents=True, exist_ok=True)
        (trial_dir / "crash.txt").write_text("")  # rank 0's, ended by its worker group's end
        (trial_dir / "crash-rank1.txt").write_text("Fatal Python error: Segmentation fault")
        try:
            distributed.train_distributed_trial({TRIAL_NUMBER: 4, "params": {}}, experiment=experiment,
                                                experiment_dir=str(tmp_path / "study"))
        finally:
            assert sorted(path.name for path in trial_dir.iterdir()) == ["crash-rank1.txt"]

    raised.append(WorkerGroupError("two ranks", {3: ending(3, **{FAILURE: "NaN"}),
                                                 1: ending(1, **{DISK_FULL: "disk full: ..."})}))
    run_trial()
    assert reports == [{TRIAL_NUMBER: 4, FINISHED: True, "rank": 1, DISK_FULL: "disk full: ..."}]
    assert str(ending(2, **{FAILURE: "NaN/inf loss"})) == "NaN/inf loss"
    raised.append(WorkerGroupError("a lost peer", {0: RuntimeError("Connection closed by peer")}))
    with pytest.raises(WorkerGroupError):
        run_trial()
    assert len(reports) == 1


def test_a_ranks_ending_carries_its_last_epoch_which_ray_train_may_not_have_passed_on(monkeypatch):
    """Ray Train's error ends the worker group, and Tune heard nothing more: the epoch that
    rank 0 reported just before another rank's fault was lost in 9 of 23 trials (audit 61),
    the trial FAILED "after 1 epoch" with no value. The ending sends it again, as a resumed
    trial does its checkpoint's epoch (``RESTORED``: a study that has it keeps its record)."""
    import types

    import ray.train

    from hpsearch.search import distributed
    from hpsearch.search.outcome import EPOCH, FAILURE, FINISHED, RESTORED, TRIAL_NUMBER

    sent = []
    epoch_one = {TRIAL_NUMBER: 3, EPOCH: 1, "val_loss": 0.61, "hps_best": 0.61, "hps_epoch_time_s": 0.2}
    ending = {TRIAL_NUMBER: 3, EPOCH: 1, FAILURE: "TypeError: ...", FINISHED: True}

    def trains(*args, report, **kwargs):
        for metrics in sent:
            report(dict(metrics))

    monkeypatch.setattr(distributed, "fit_trial", trains)
    monkeypatch.setattr(distributed, "load_training_stack", lambda config: None)
    monkeypatch.setattr(distributed, "make_strategy", lambda config: "ddp")
    monkeypatch.setattr(ray.train, "get_context", lambda: types.SimpleNamespace(get_world_size=lambda: 2,
                                                                                 get_world_rank=lambda: 1))
    reported = []
    monkeypatch.setattr(ray.train, "report", reported.append)
    monkeypatch.setattr(ray.util, "get_current_placement_group", lambda: None)
    experiment = shrunk_example(FIXTURES, **{"resources/workers_per_trial": 2})
    loop_config = {"trial_config": {TRIAL_NUMBER: 3, "params": {}}, "experiment": experiment,
                   "experiment_dir": "unused", "trial_started_at": 0.0, "decisions": None}

    sent[:] = [epoch_one, ending]
    with pytest.raises(distributed.RankEndedTrial) as ended:
        distributed._train_rank(loop_config)
    assert reported == [epoch_one]
    assert ended.value.final_report == {**epoch_one, RESTORED: True, **ending}
    sent[:] = [ending]  # no epoch before it: nothing to send again
    with pytest.raises(distributed.RankEndedTrial) as ended:
        distributed._train_rank(loop_config)
    assert ended.value.final_report == ending


def test_the_ending_waits_until_the_tune_session_has_taken_the_reports_forwarded_before_it(monkeypatch):
    """Reported while the session's main thread had a forwarded epoch still to take, or was
    passing one on, the ending overtook that epoch (lost) or filled the one-report queue the
    main thread then waited to put the epoch on (a trial hung; audit 62)."""
    import threading
    import time
    import types

    from ray.train._internal import session as train_session

    from hpsearch.search import distributed

    polls = {"left": 3}

    class Forwarded:  # the queue between actors: a report is still there for three looks
        def empty(self) -> bool:
            polls["left"] -= 1
            return polls["left"] < 0

    monkeypatch.setattr(train_session, "get_session", lambda: types.SimpleNamespace(_inter_actor_queue=Forwarded()))
    distributed.forwarded_reports_taken(limit_s=5)
    assert polls["left"] < 0

    # the main thread passing a taken report on: inside the session's ``report``
    polls["left"] = 0
    scope: dict = {}
    exec(compile("import time\ndef report(seconds):\n    time.sleep(seconds)\n    return time.monotonic()\n",
                 "ray/train/_internal/session.py", "exec"), scope)
    waited = {}

    def ending() -> None:
        time.sleep(0.1)  # the main thread is in ``report`` by now
        distributed.forwarded_reports_taken(limit_s=5)
        waited["until"] = time.monotonic()

    thread = threading.Thread(target=ending)
    thread.start()
    left_report = scope["report"](0.6)
    thread.join()
    assert waited["until"] >= left_report


def test_rank_zeros_kept_reports_are_dropped_when_their_trial_ends_and_with_the_session(monkeypatch):
    """Tune ends a trial at its last report, or ASHA's stop, by ending the Tune trial's
    process, whose own clean-up then never ran: every distributed trial's kept report stayed
    in the cluster's key-value store (audit 65), which outlives the search."""
    from types import SimpleNamespace

    from ray.experimental import internal_kv

    from hpsearch.search.distributed import RankZeroLastReports
    from hpsearch.search.tune_callbacks import FreeRankReservations

    store: dict[tuple[str, bytes], bytes] = {}

    def delete(key, del_by_prefix=False, namespace=None):
        for name, stored in list(store):
            if name == namespace and (stored.startswith(key) if del_by_prefix else stored == key):
                del store[(name, stored)]

    monkeypatch.setattr(internal_kv, "_internal_kv_initialized", lambda: True)
    monkeypatch.setattr(internal_kv, "_internal_kv_put", lambda key, value, namespace=None: store.__setitem__(
        (namespace, key), value))
    monkeypatch.setattr(internal_kv, "_internal_kv_get", lambda key, namespace=None: store.get((namespace, key)))
    monkeypatch.setattr(internal_kv, "_internal_kv_del", delete)

    session, other_session = RankZeroLastReports(), RankZeroLastReports()
    for number in (0, 1, 2):
        session.keep(number, {"epoch": 1, "trial": number})
    other_session.keep(0, {"epoch": 3})
    dropping = FreeRankReservations(session)
    dropping.on_trial_complete(0, [], SimpleNamespace(trial_id="a", config={"hps_trial_number": 0}))
    dropping.on_trial_error(0, [], SimpleNamespace(trial_id="b", config={"hps_trial_number": 1}))
    assert session.take(0) is None and session.take(1) is None
    session.clear()
    assert session.take(2) is None
    assert other_session.take(0) == {"epoch": 3}  # another search's, on the same cluster
