"""Durability pieces without Ray: atomic writes, the study lock, journal repair, checkpoint fallback."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hpsearch.search.checkpoints import latest_good_checkpoint
from hpsearch.search.errors import ExperimentError, HpsearchError
from hpsearch.search.experiment import ExperimentDir, atomic_write_text
from hpsearch.search.searcher import repair_journal
from hpsearch.search.study_lock import dead_holder, study_lock


def test_atomic_write_keeps_the_old_file_when_the_disk_is_full(tmp_path, monkeypatch):
    target = tmp_path / "best.json"
    atomic_write_text(target, "old")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(HpsearchError, match="disk full while writing .*best.json"):
        atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["best.json"]


def test_a_second_driver_is_refused_naming_the_holder(tmp_path):
    exp = ExperimentDir.create(str(tmp_path), "study")
    with study_lock(exp):
        holder = json.loads((exp.root / "driver.json").read_text())
        assert holder["pid"] == os.getpid()
        with pytest.raises(ExperimentError, match=f"already being searched by pid {os.getpid()}"):
            with study_lock(exp):
                pass
    with study_lock(exp):  # released on exit: the next driver gets it
        pass


def test_a_dead_driver_is_told_from_a_live_one_or_one_elsewhere(tmp_path):
    import socket

    exp = ExperimentDir(tmp_path)
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    here = socket.gethostname()
    for pid, host, dead in ((int(finished.stdout), here, True), (os.getpid(), here, False),
                            (int(finished.stdout), "another-machine", False)):
        (tmp_path / "driver.json").write_text(json.dumps({"pid": pid, "host": host, "since": "then", "command": "x"}))
        assert (dead_holder(exp) is not None) is dead, (pid, host)
    (tmp_path / "driver.json").unlink()
    assert dead_holder(exp) is None  # never held: nothing to say


def test_a_lock_left_by_a_killed_process_is_reclaimed(tmp_path):
    exp = ExperimentDir.create(str(tmp_path), "study")
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from pathlib import Path\n"
        "from hpsearch.search.experiment import ExperimentDir\n"
        "from hpsearch.search.study_lock import study_lock\n"
        f"exp = ExperimentDir(Path({str(exp.root)!r}))\n"
        "with study_lock(exp):\n    print('held', flush=True); time.sleep(60)\n")],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(ExperimentError):
        with study_lock(exp):
            pass
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    with study_lock(exp):
        assert json.loads((exp.root / "driver.json").read_text())["pid"] == os.getpid()


def test_a_refusal_names_the_new_holder_not_the_ended_driver_before_it(tmp_path):
    """Resumes started together: the winner takes the lock, then writes driver.json; a
    loser that read the file between named the ended driver before it (audit 37)."""
    exp = ExperimentDir.create(str(tmp_path), "study")
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (exp.root / "driver.json").write_text(json.dumps({"pid": int(ended.stdout), "host": socket.gethostname(),
                                                      "since": "then", "command": "hpsearch run old"}))
    holder = subprocess.Popen([sys.executable, "-c", (
        "import json, os, socket, sys, time; from filelock import FileLock\n"
        f"lock = FileLock({str(exp.root / '.driver.lock')!r}, timeout=0); lock.acquire()\n"
        "print('locked', flush=True); sys.stdin.readline()\n"  # driver.json not written yet
        f"open({str(exp.root / 'driver.json')!r}, 'w').write(json.dumps({{'pid': os.getpid(), "
        "'host': socket.gethostname(), 'since': 'now', 'command': 'hpsearch resume new'}))\n"
        "print('written', flush=True); time.sleep(60)\n")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        threading.Timer(0.3, lambda: (holder.stdin.write("go\n"), holder.stdin.flush())).start()
        with pytest.raises(ExperimentError, match=rf"already being searched by pid {holder.pid} on .*hpsearch "
                                                  rf"resume new"):
            with study_lock(exp):
                pass
    finally:
        holder.kill()
        holder.wait(timeout=30)


def test_a_torn_journal_record_is_cut_and_the_study_still_opens(tmp_path):
    from hpsearch.search.searcher import STUDY_FILE, open_study

    study = open_study(tmp_path, "s", "max")
    study.add_trial(__import__("optuna").trial.create_trial(value=1.0, params={}, distributions={}))
    journal = tmp_path / STUDY_FILE
    whole = journal.read_bytes()
    journal.write_bytes(whole + b'{"op_code": 4, "worker_id": "x", "trial_i')  # cut mid-append
    with pytest.warns(UserWarning, match="torn last record"):
        assert repair_journal(journal) > 0
    assert journal.read_bytes() == whole
    reopened = open_study(tmp_path, "s", "max")
    reopened.add_trial(__import__("optuna").trial.create_trial(value=2.0, params={}, distributions={}))
    assert [t.value for t in open_study(tmp_path, "s", "max").trials] == [1.0, 2.0]


def test_a_study_whose_lock_cannot_be_taken_is_refused_in_one_line(tmp_path, monkeypatch):
    """A read-only study: resume ended in filelock's 43-line traceback (audit 81)."""
    import errno

    import filelock

    exp = ExperimentDir.create(str(tmp_path), "study")

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(exp.root / ".driver.lock"))

    monkeypatch.setattr(filelock.FileLock, "acquire", read_only)
    with pytest.raises(ExperimentError, match=r"cannot take the study's lock .*\.driver\.lock: Read-only file "
                                              r"system; a search writes into its study"):
        with study_lock(exp):
            pass


def test_a_journal_lock_left_by_a_killed_driver_does_not_hold_up_the_next_one(tmp_path):
    """A driver killed while it appended leaves Optuna's lock file (a symlink to the
    journal): the next session waited 30 s for it, with four warnings (audit 37). The
    study's holder opens the study without it."""
    from hpsearch.search.searcher import STUDY_FILE, open_study

    open_study(tmp_path, "s", "max")
    journal = tmp_path / STUDY_FILE
    (tmp_path / f"{STUDY_FILE}.lock").symlink_to(journal)  # as JournalFileSymlinkLock leaves it
    (tmp_path / f"{STUDY_FILE}.lock1234.rename").symlink_to(journal)  # a release cut short
    study = open_study(tmp_path, "s", "max")
    assert sorted(path.name for path in tmp_path.iterdir()) == [STUDY_FILE]
    study.add_trial(__import__("optuna").trial.create_trial(value=1.0, params={}, distributions={}))
    assert [t.value for t in open_study(tmp_path, "s", "max").trials] == [1.0]


def test_resume_takes_the_newest_readable_checkpoint(tmp_path):
    import torch

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    for epoch in (0, 1):
        torch.save({"epoch": epoch}, folder / f"epoch-{epoch:04d}.ckpt")
    assert latest_good_checkpoint(tmp_path) == (folder / "epoch-0001.ckpt", [])
    data = (folder / "epoch-0001.ckpt").read_bytes()
    (folder / "epoch-0001.ckpt").write_bytes(data[: len(data) // 2])  # cut short
    with pytest.warns(UserWarning, match="damaged"):
        path, notes = latest_good_checkpoint(tmp_path)
    assert path == folder / "epoch-0000.ckpt"
    assert notes == ["checkpoint epoch-0001.ckpt is damaged (moved to epoch-0001.corrupt)", "resuming from epoch-0000.ckpt"]
    assert (folder / "epoch-0001.corrupt").exists()
    (folder / "epoch-0000.ckpt").write_bytes(b"")
    with pytest.warns(UserWarning):
        path, notes = latest_good_checkpoint(tmp_path)
    assert path is None and "restarts from its first epoch" in notes[-1]
    assert not any("resuming from" in note for note in notes)  # it does not resume: say only what happens


def test_an_ended_trials_checkpoints_that_storage_will_not_delete_warn_and_the_search_goes_on(tmp_path):
    from types import SimpleNamespace

    from hpsearch.search.storage import StorageError
    from hpsearch.search.outcome import TRIAL_NUMBER
    from hpsearch.search.checkpoint_retention import DropResumeCheckpoints

    class UnwritableStorage:
        def delete_matching(self, folder, pattern):
            raise StorageError(f"cannot delete {folder}/{pattern} in 's3://bucket/study': access denied")

    exp = ExperimentDir(tmp_path)
    folder = exp.trial_dir("trial_0007") / "checkpoints"
    folder.mkdir(parents=True)
    for name in ("best.ckpt", "epoch-0002.ckpt", "epoch-0003.ckpt"):
        (folder / name).write_bytes(b"x")
    with pytest.warns(UserWarning, match="trial_0007 not deleted: cannot delete trials/trial_0007/checkpoints"):
        DropResumeCheckpoints(exp, UnwritableStorage()).on_trial_complete(
            0, [], SimpleNamespace(config={TRIAL_NUMBER: 7}))
    assert sorted(p.name for p in folder.iterdir()) == ["best.ckpt"]  # the local copies went all the same


def test_local_storage_that_cannot_hold_a_study_is_an_error_before_anything_is_made(tmp_path):
    from hpsearch.search.storage import StorageError, StudyHome

    a_file = tmp_path / "exp.yaml"
    a_file.write_text("name: x\n")
    for storage in (a_file, a_file / "runs", Path("/proc/hpsearch-runs")):
        with pytest.raises(StorageError, match="cannot write to storage") as caught:
            StudyHome.new(str(storage), "study")
        assert ".hpsearch-probe" not in str(caught.value)  # the probe's name means nothing to the user
    home = StudyHome.new(str(tmp_path / "new" / "runs"), "study")
    assert home.root == tmp_path / "new" / "runs" / "study"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp.yaml"]  # the probe left nothing


def test_storage_inside_a_ray_jobs_working_directory_is_refused(tmp_path, monkeypatch, example_config):
    """``ray job submit --working-dir`` runs the command in Ray's unpacked copy of the
    upload, which Ray deletes: the example's ``storage: ./runs`` put the study there, with
    no word (audit 34)."""
    import json

    import hpsearch
    from hpsearch.search.storage import RAY_JOB_CONFIG, StorageError, StudyHome

    copy = tmp_path / "runtime_resources" / "working_dir_files" / "_ray_pkg_0123"
    copy.mkdir(parents=True)
    monkeypatch.chdir(copy)
    assert StudyHome.new("runs", "study").root == copy / "runs" / "study"  # not a job: as always
    monkeypatch.setenv(RAY_JOB_CONFIG, json.dumps({"runtime_env": {"working_dir": "gcs://_ray_pkg_0123.zip"}}))
    for inside in ("runs", ".", str(copy / "deep" / "runs")):
        with pytest.raises(StorageError, match="inside this Ray job's working directory"):
            StudyHome.new(inside, "study")
    assert StudyHome.new(str(tmp_path / "shared"), "study").root == tmp_path / "shared" / "study"
    with pytest.raises(hpsearch.ConfigError, match=r"storage.*inside this Ray job's working directory"):
        hpsearch.check(example_config, {"storage": "runs", "search.preflight": False})
    monkeypatch.setenv(RAY_JOB_CONFIG, json.dumps({"runtime_env": {}}))  # a job without --working-dir
    assert StudyHome.new("runs", "study").root == copy / "runs" / "study"


def test_two_runs_that_chose_the_same_name_get_two_studies(tmp_path):
    from hpsearch.search.storage import StudyHome

    first, second = StudyHome.new(str(tmp_path), "race"), StudyHome.new(str(tmp_path), "race")
    assert first.root == second.root
    made = [first.create().root, second.create().root]
    assert made[0] == tmp_path / "race" and made[1].name.startswith("race-") and made[1].is_dir()


def test_a_killed_session_is_closed_by_the_next_as_of_its_last_write(tmp_path):
    """SIGKILL leaves a session 'running' with no end; the next session closes it, and the
    study's wall time counts it until trials.csv's last write, not until today."""
    from hpsearch.search.experiment import ExperimentDir, close_killed_sessions, read_sessions, record_session
    from hpsearch.search.study_summary import _wall_seconds

    exp = ExperimentDir.create(str(tmp_path), "study")
    record_session(exp, 1000.0, 1010.0, "interrupted")
    record_session(exp, 2000.0, None, "running")  # killed
    exp.trials_csv.write_text("trial,state\n")
    os.utime(exp.trials_csv, (2013.0, 2013.0))
    assert close_killed_sessions(exp) == 1
    killed = read_sessions(exp)[-1]
    assert (killed["outcome"], killed["ended_at"], killed["seconds"]) == ("killed", 2013.0, 13.0)
    record_session(exp, 5000.0, 5012.5, "complete")
    os.utime(exp.trials_csv, (5012.0, 5012.0))  # the resumed session wrote it later
    assert _wall_seconds(exp) == 10.0 + 13.0 + 12.5
    assert close_killed_sessions(exp) == 0



def test_each_session_records_the_versions_its_results_depend_on(tmp_path):
    """The same file and seed can give other values under another torch: nothing in a study
    said what it ran with (audit 28)."""
    import platform

    import pytorch_lightning
    import torch

    from hpsearch.search.experiment import ExperimentDir, read_sessions, record_session

    exp = ExperimentDir.create(str(tmp_path), "study")
    record_session(exp, 1000.0, None, "running")
    record_session(exp, 1000.0, 1010.0, "complete")  # the same session's end keeps them
    [session] = read_sessions(exp)
    versions = session["versions"]
    assert (versions["python"], versions["torch"], versions["pytorch-lightning"]) == (
        platform.python_version(), torch.__version__, pytorch_lightning.__version__), versions
    assert {"hpsearch", "ray", "optuna", "numpy"} <= set(versions), versions


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_study_files_get_the_permissions_the_umask_gives(tmp_path, umask, mode):
    """They were always 0600 (``tempfile.mkstemp``'s): on a study shared over NFS, others
    could read its journal and events but not trials.csv or best.json (audit 20, D4)."""
    from hpsearch.search.experiment import atomic_write_text, write_json

    before = os.umask(umask)
    try:
        atomic_write_text(tmp_path / "trials.csv", "trial\n0\n")
        write_json(tmp_path / "best.json", {"trial": 0})
        atomic_write_text(tmp_path / "trials.csv", "trial\n0\n1\n")  # replaced: the new file's mode
    finally:
        os.umask(before)
    assert {path.name: path.stat().st_mode & 0o777 for path in tmp_path.iterdir()} == {
        "trials.csv": mode, "best.json": mode}


def test_only_the_last_sessions_ray_tune_files_are_kept(tmp_path):
    """Each session's Ray Tune folder, which nothing reads, was kept for ever: half of a
    large study's directory (audit 20, D5)."""
    from hpsearch.search.tuner import _new_tune_session

    tune_dir = tmp_path / "tune"
    names = []
    for _ in range(3):
        names.append(_new_tune_session(tune_dir))
        (tune_dir / names[-1] / "experiment_state.json").parent.mkdir(parents=True)
        (tune_dir / names[-1] / "experiment_state.json").write_text("{}")
    (tune_dir / "train").mkdir()  # a distributed trial's Ray Train folder stays
    assert names == ["session-1", "session-2", "session-3"]
    assert _new_tune_session(tune_dir) == "session-4"
    assert sorted(path.name for path in tune_dir.iterdir()) == ["session-3", "train"]


@pytest.mark.parametrize("mode", ["max", "min"])
def test_keep_checkpoints_leaves_the_best_ended_trials_theirs(tmp_path, mode):
    """ASHA prunes most trials, and each kept its best.ckpt: 3,197 files at 3,300 trials
    (audit 20), some 300 GB for a model of 100 MB."""
    from types import SimpleNamespace

    from hpsearch.search.outcome import TRIAL_NUMBER
    from hpsearch.search.trials_table import TrialsTable
    from hpsearch.search.checkpoint_retention import KeepBestCheckpoints

    class Storage:  # a study's URI storage: its copies go too
        deleted: list[str] = []

        def delete_matching(self, folder, pattern):
            self.deleted.append(f"{folder}/{pattern}")

    exp = ExperimentDir(tmp_path)
    table = TrialsTable("val_acc", mode, [])
    ended = {0: ("COMPLETE", 0.5), 1: ("PRUNED", 0.9), 2: ("FAILED", None), 3: ("PAUSED", 0.1)}

    def checkpoint(number: int):
        return exp.trial_dir(f"trial_{number:04d}") / "checkpoints" / "best.ckpt"

    for number, (state, best) in ended.items():
        table.row(number).update(state=state, **({"best": best} if best is not None else {}))
        checkpoint(number).parent.mkdir(parents=True)
        checkpoint(number).write_bytes(b"x")
    storage = Storage()
    keeper = KeepBestCheckpoints(1, table, exp, storage)
    keeper.setup()  # lowered on resume: the trials already ended
    # the best by value (max: pruned 1; min: complete 0) and the study's best (complete 0)
    assert {n for n in ended if checkpoint(n).exists()} == ({0, 1, 3} if mode == "max" else {0, 3})
    assert "trials/trial_0002/checkpoints/best.ckpt" in storage.deleted
    # a new trial, better than all: it keeps its own, and the others' go but the study's best
    checkpoint(4).parent.mkdir(parents=True)
    checkpoint(4).write_bytes(b"x")
    table.row(4).update(state="COMPLETE", best=0.95 if mode == "max" else 0.05)
    keeper.on_trial_complete(0, [], SimpleNamespace(config={TRIAL_NUMBER: 4}))
    assert {n for n in ended.keys() | {4} if checkpoint(n).exists()} == {3, 4}  # the paused trial's is untouched
    # a trial paused by a full disk comes through Tune's end of a trial: it keeps its own (audit 58)
    keeper.on_trial_complete(0, [], SimpleNamespace(config={TRIAL_NUMBER: 3}))
    assert checkpoint(3).exists()


def test_keep_checkpoints_keeps_a_failed_trials_best_epoch_that_scored_best(tmp_path):
    """A trial that diverged after its best epoch ends FAILED with that epoch's best.ckpt:
    the study's best model, deleted by ``keep_checkpoints: 1`` (audit 74)."""
    from hpsearch.search.checkpoint_retention import KeepBestCheckpoints
    from hpsearch.search.trials_table import TrialsTable

    exp, table = ExperimentDir(tmp_path), TrialsTable("val_mse", "min", [])
    for number, (state, best) in enumerate([("COMPLETE", 0.38), ("FAILED", 0.28), ("PRUNED", 0.5)]):
        table.row(number).update(state=state, best=best)
        (exp.trial_dir(f"trial_{number:04d}") / "checkpoints").mkdir(parents=True)
        (exp.trial_dir(f"trial_{number:04d}") / "checkpoints" / "best.ckpt").write_bytes(b"x")
    KeepBestCheckpoints(1, table, exp).setup()
    kept = {n for n in range(3) if (exp.trial_dir(f"trial_{n:04d}") / "checkpoints" / "best.ckpt").exists()}
    assert kept == {0, 1}, kept  # the best value's, and the study's best (a complete trial's)


def test_a_best_checkpoint_that_storage_will_not_delete_warns_and_the_search_goes_on(tmp_path):
    from types import SimpleNamespace

    from hpsearch.search.outcome import TRIAL_NUMBER
    from hpsearch.search.storage import StorageError
    from hpsearch.search.trials_table import TrialsTable
    from hpsearch.search.checkpoint_retention import KeepBestCheckpoints

    class UnwritableStorage:
        def delete_matching(self, folder, pattern):
            raise StorageError(f"cannot delete {folder}/{pattern} in 's3://bucket/study': access denied")

    exp, table = ExperimentDir(tmp_path), TrialsTable("val_acc", "max", [])
    for number, best in ((0, 0.9), (1, 0.5)):
        table.row(number).update(state="COMPLETE", best=best)
        (exp.trial_dir(f"trial_{number:04d}") / "checkpoints").mkdir(parents=True)
        (exp.trial_dir(f"trial_{number:04d}") / "checkpoints" / "best.ckpt").write_bytes(b"x")
    with pytest.warns(UserWarning, match="best checkpoint of trial 1 not deleted: cannot delete"):
        KeepBestCheckpoints(1, table, exp, UnwritableStorage()).on_trial_complete(
            0, [], SimpleNamespace(config={TRIAL_NUMBER: 1}))
    assert not (exp.trial_dir("trial_0001") / "checkpoints" / "best.ckpt").exists()  # the local copy went
    assert (exp.trial_dir("trial_0000") / "checkpoints" / "best.ckpt").exists()


def test_a_full_disk_tune_raised_as_another_error_still_stops_the_search_as_a_full_disk(example_config, tmp_path,
                                                                                         monkeypatch):
    """Ray Tune met the trials table's full disk in a callback as it ended a trial, and
    raised it on as that trial's failure: the session ended "crashed", and the message
    lacked the resume command (audit 58)."""
    from contextlib import nullcontext

    import hpsearch
    from hpsearch.search import api, tuner
    from hpsearch.search.errors import DiskFullError

    def tune_raised_it_on(*args, **kwargs):
        try:
            raise DiskFullError("disk full while writing trials.csv; the previous version is intact")
        except DiskFullError as full:
            raise RuntimeError("Trial train_trial_1: Error stopping trial.") from full

    monkeypatch.setattr(api, "prepare", lambda config, preflight=None, new_study=False: None)
    monkeypatch.setattr(api, "_plan", lambda config, local: 1)
    monkeypatch.setattr(tuner, "ray_for_search", lambda config, address, verbose: nullcontext(tuner.SearchRay(False)))
    monkeypatch.setattr(tuner, "run_session", tune_raised_it_on)
    example_config["storage"] = str(tmp_path / "runs")
    exp_dir = tmp_path / "runs" / example_config["name"]
    with pytest.raises(DiskFullError) as raised:
        hpsearch.run(example_config)
    assert str(raised.value).startswith("disk full while writing trials.csv"), str(raised.value)
    assert str(raised.value).endswith(f"once there is space, continue the study with: hpsearch resume {exp_dir}")
    assert json.loads((exp_dir / "sessions.json").read_text())[-1]["outcome"] == "disk_full"
