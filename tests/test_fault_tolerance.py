"""Fault injection on real processes: the CLI is killed, interrupted, fed failing trials,
damaged checkpoints and a full disk; the study must lose nothing and finish on resume."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FIXTURES, tensorboard_run, tensorboard_scalars, tensorboard_steps, write_yaml
from hpsearch.search.api import GRACEFUL_STOP_MESSAGE
from hpsearch.search.errors import counted

pytestmark = pytest.mark.e2e
NUM_TRIALS = 8


def experiment(root: Path, name: str, num_trials: int = NUM_TRIALS, **model_args) -> Path:
    shutil.copytree(FIXTURES / "userpkg", root / "userpkg", dirs_exist_ok=True)
    (root / "markers").mkdir(exist_ok=True)
    config = {
        "name": name,
        "model": {"class_path": "userpkg.faulty:FaultyCNN",
                  "init_args": {"channels": 8, "marker_dir": str(root / "markers"), **model_args}},
        "data": {"class_path": "digits", "init_args": {"batch_size": 128}},
        "space": {"model.lr": {"type": "float", "low": 1e-3, "high": 0.05, "log": True},
                  "data.batch_size": {"type": "int", "low": 64, "high": 256, "log": True}},
        "metric": "val_acc", "mode": "max",
        "search": {"num_trials": num_trials, "max_concurrent": 2, "sampler": "random", "seed": 0},
        "scheduler": {"type": "none", "max_epochs": 3},
        "trainer": {"early_stopping_patience": None},
        "failure": {"max_retries": 2},
        "storage": "runs",
    }
    return write_yaml(root / f"{name}.yaml", config)


def start(*args: str, cwd: Path, sigint=signal.default_int_handler, own_group: bool = False) -> subprocess.Popen:
    """The CLI as a terminal starts it, with Ctrl+C at its default; ``sigint=signal.SIG_IGN``
    starts it as a job script's background ``hpsearch run ... &`` does, with SIGINT ignored.
    (A child inherits an ignored signal, and exec resets a handled one to its default; this
    test process itself may run as a background job.)"""
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, sigint)
    try:
        return subprocess.Popen([sys.executable, "-m", "hpsearch.search.cli", *args], cwd=cwd,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=own_group)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def finish(process: subprocess.Popen, timeout: float = 400) -> tuple[int, str]:
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()  # a hung CLI must not outlive its test
        raise
    return process.returncode, out + err


def rows(exp_dir: Path) -> list[dict]:
    path = exp_dir / "trials.csv"
    return list(csv.DictReader(path.open())) if path.is_file() else []


def wait_for(condition, timeout: float = 240, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def wait_until_quiet(folder: Path, quiet_s: float = 3.0, timeout: float = 60) -> None:
    """Until no file under ``folder`` has changed for ``quiet_s`` seconds."""
    def newest() -> float:
        return max((p.stat().st_mtime for p in folder.rglob("*") if p.is_file()), default=0.0)

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if time.time() - newest() >= quiet_s:
            return
        time.sleep(0.5)
    raise AssertionError(f"files under {folder} kept changing after the driver died")


def finished(exp_dir: Path) -> list[dict]:
    return [r for r in rows(exp_dir) if r["state"] in ("COMPLETE", "PRUNED", "FAILED")]


def stop_slowing_epochs(root: Path) -> None:
    """The epochs of ``experiment``'s model stop sleeping: for the part of a test after its
    interruption, which needs no time to act in."""
    (root / "markers" / "no-epoch-sleep").write_text("")


def study(exp_dir: Path, name: str):
    from hpsearch.search.searcher import open_study

    return open_study(exp_dir, name, "max")


def snapshot(exp_dir: Path, numbers) -> dict:
    """Files of the given trials, to prove they were not touched (not re-run) later. What the
    test evaluation writes of the study's best trial is left out (its logger's ``test/`` run
    and the TensorBoard run's test record): a trial finished early may be the best, and
    was, once in many runs, when the snapshot counted them as a re-run."""
    from hpsearch.search.tensorboard_layout import TEST_RECORD

    def trained(path: Path, folder: Path) -> bool:
        return path.relative_to(folder).parts[0] != "test" and not path.name.endswith(TEST_RECORD)

    return {n: sorted((p.name, p.stat().st_size) for folder in (exp_dir / "trials" / f"trial_{n:04d}",
                                                                tensorboard_run(exp_dir, n))
                      for p in folder.rglob("*") if trained(p, folder))
            for n in numbers}


def hparams_state(run: Path) -> str:
    """The ``state`` a trial's HParams record gives, read as TensorBoard reads it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    accumulator = EventAccumulator(str(run))
    accumulator.Reload()
    content = accumulator.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.SESSION_START_INFO_TAG]
    return metadata.parse_session_start_info_plugin_data(content).hparams["state"].string_value


def assert_complete_study(exp_dir: Path, name: str, num_trials: int = NUM_TRIALS) -> None:
    table = rows(exp_dir)
    assert len(table) == num_trials and all(r["state"] == "COMPLETE" for r in table), table
    trials = study(exp_dir, name).trials
    assert len(trials) == num_trials and all(t.state.name == "COMPLETE" for t in trials)
    params = [tuple(sorted(t.params.items())) for t in trials]
    assert len(set(params)) == len(params), "a parameter set was sampled twice"
    for number in range(num_trials):
        steps = tensorboard_steps(tensorboard_run(exp_dir, number))
        assert steps == [1, 2, 3], (number, steps)


def test_a_time_budget_ends_the_session_cleanly_and_pauses_the_running_trials(tmp_path):
    # Trials of 3 one-second epochs: at the end of a 10 s budget some are mid-way. (Resume
    # continues PAUSED trials as it does interrupted ones: the test of one study stopped every
    # way shows that.)
    path = experiment(tmp_path, "budget", epoch_sleep=1.0)
    exp_dir = tmp_path / "runs" / "budget"
    code, output = finish(start("run", path.name, "--set", "search.time_budget_s=10", cwd=tmp_path))
    assert code == 0, output  # the end the user asked for, not an interruption
    assert "time budget reached" in output and f"hpsearch resume {exp_dir}" in output, output
    assert json.loads((exp_dir / "sessions.json").read_text())[-1]["outcome"] == "time_budget"
    paused = [r for r in rows(exp_dir) if r not in finished(exp_dir)]
    assert paused and len(finished(exp_dir)) < NUM_TRIALS, rows(exp_dir)
    assert all((r["state"], r["reason"]) == ("PAUSED", "time budget reached") for r in paused), paused
    done = len(finished(exp_dir))
    assert f"{counted(done, 'trial')} finished in this session ({done} in the study) and {len(paused)} paused" \
        in output, output
    assert {t.state.name for t in study(exp_dir, "budget").trials if t.number in
            {int(r["trial"]) for r in paused}} == {"RUNNING"}  # what makes resume continue them


@pytest.mark.slow
def test_trial_faults_retry_fail_or_stop_as_each_deserves(tmp_path):
    faults = {"0": "killed", "1": "raise_once", "2": "raise_always", "3": "nan", "4": "oom", "5": "init_error",
              "6": "type_error", "7": "raise_same", "8": "segfault", "9": "hang"}
    path = experiment(tmp_path, "faults", num_trials=len(faults), faults=faults)
    exp_dir = tmp_path / "runs" / "faults"
    # Nine of the ten trials fail: failure.max_consecutive_failures would stop the search.
    code, output = finish(start("run", path.name, "--set", "failure.max_consecutive_failures=null",
                                "--set", "failure.hang_timeout_s=5", cwd=tmp_path))
    assert code == 0, output
    table = {int(r["trial"]): r for r in rows(exp_dir)}
    assert len(table) == len(faults)
    # Each retry is one line naming the error and where its traceback is; Ray Tune's own
    # traceback of every try stays off the console (without -v).
    assert "Trial task failed" not in output and "Traceback (most recent call last)" not in output, output
    retried = re.search(r"trial 1: retrying from its last checkpoint after RuntimeError: injected failure \(once\) "
                        r"\(traceback: (\S+)\)", output)
    assert retried and "injected failure (once)" in Path(retried.group(1)).read_text(), output
    # the copy beside the trial's checkpoints, not Ray's file under /tmp (gone at a reboot)
    assert Path(retried.group(1)) == exp_dir / "trials" / "trial_0001" / "error.txt", output
    assert output.count("trial 2: retrying") == 2

    once = table[1]  # raised once at epoch 2, retried from its epoch-1 checkpoint
    assert (once["state"], once["attempts"], once["resumed"]) == ("COMPLETE", "2", "True")
    assert "injected failure (once)" in once["error"]
    steps = tensorboard_steps(tensorboard_run(exp_dir, 1))
    assert steps == [1, 2, 3], steps  # epochs continued, none redone
    # Every curve has one point per epoch across the two attempts (the retry's purge step
    # hides what the first attempt wrote after its checkpoint), and hpsearch's own scalars
    # of an epoch sit on the epoch's step. (The best trial's test metrics, one point, too.)
    scalars = {tag: steps for tag, steps in tensorboard_scalars(tensorboard_run(exp_dir, 1)).items()
               if not tag.startswith("test_")}
    assert all(s == [1, 2, 3] for s in scalars.values()), {tag: s for tag, s in scalars.items() if s != [1, 2, 3]}

    always = table[2]  # a new message each try: it might have been a different fault
    assert (always["state"], always["attempts"]) == ("FAILED", "3")  # max_retries + 1
    assert "injected failure (always), try 3" in always["error"]
    assert always["reason"].endswith(f"(traceback: {exp_dir / 'trials' / 'trial_0002' / 'error.txt'})"), always
    same = table[7]  # the same error at the same point twice: a third try would fail the same way
    assert (same["state"], same["attempts"]) == ("FAILED", "2"), same
    # named at the user's line, as a fault that is not retried is (audit 23)
    assert re.match(r"failed 2 times the same way, at the same point: RuntimeError: injected failure \(same\) "
                    r"\(at \S*faulty\.py:\d+ in training_step\) \(traceback: ", same["reason"]), same["reason"]
    kept = Path(re.search(r"\(traceback: (\S+)\)", same["reason"]).group(1)).read_text()
    assert "ray::" in kept and "\x1b[" not in kept, kept[:300]  # Ray's account, without the terminal's colours
    assert output.count("trial 7: retrying") == 1, output
    nan, oom = table[3], table[4]
    assert nan["state"] == "FAILED" and "NaN/inf loss" in nan["reason"] and nan["attempts"] == "1"
    assert oom["state"] == "FAILED" and oom["attempts"] == "1" and oom["reason"].startswith("OOM")
    invalid = table[5]  # the sampled values themselves are at fault: a retry would raise again
    assert (invalid["state"], invalid["attempts"]) == ("FAILED", "1")
    assert "FaultyCNN" in invalid["reason"] and "ValueError: injected" in invalid["reason"]
    bug = table[6]  # a TypeError in the user's validation_step at epoch 2: a retry would raise it again
    assert (bug["state"], bug["attempts"], bug["epochs"]) == ("FAILED", "1", "1"), bug
    assert re.match(r"TypeError: injected bug: unsupported operand \(at \S*faulty\.py:\d+ in validation_step\); "
                    r"not retried", bug["reason"]), bug["reason"]
    saved = Path(re.search(r"\(traceback: (\S+)\)", bug["reason"]).group(1))
    assert saved.parent.name == "trial_0006" and "raise TypeError" in saved.read_text()
    assert "trial 6: retrying" not in output and "trial 6: FAILED (TypeError: injected bug" in output, output
    # status --trial: one trial in full, with the end of its traceback, and each epoch's value as the study has it
    code, shown = finish(start("status", str(exp_dir), "--trial", "6", cwd=tmp_path), timeout=60)
    assert code == 0 and shown.startswith("trial 6 of faults: FAILED, TypeError: injected bug"), shown
    assert f"{saved}, its last 15 lines:" in shown and "    raise TypeError(" in shown, shown
    code, shown = finish(start("status", str(exp_dir), "--trial", "1", cwd=tmp_path), timeout=60)
    values = study(exp_dir, "faults").trials[1].intermediate_values
    assert code == 0 and "by epoch: " + "  ".join(f"{epoch}: {value:.4g}" for epoch, value in sorted(values.items())) \
        in shown and sorted(values) == [1, 2, 3], shown
    assert "2 tries" in shown and "resumed from a checkpoint" in shown and "load it" in shown, shown
    modules = "('torch', 'ray', 'optuna', 'numpy')"
    heavy = subprocess.run([sys.executable, "-c", "import sys; from hpsearch.search.cli import main; "
                            f"main(sys.argv[1:]); print(*(m for m in {modules} if m in sys.modules))",
                            "status", str(exp_dir), "--trial", "1"], capture_output=True, text=True, cwd=tmp_path)
    assert heavy.stdout.splitlines()[-1] == "", heavy.stdout + heavy.stderr  # read without the heavy stack
    # A process killed at every try (as by the out-of-memory killer) on a node that stays
    # up is the trial's own fault: it was taken for a node loss and retried forever.
    # Each try uses one of max_retries: a kill at the same point need not happen again.
    killed = table[0]
    assert (killed["state"], killed["attempts"], killed["node_losses"] or "0") == ("FAILED", "3", "0"), killed
    assert killed["reason"].startswith(
        "failed 3 times: its process died without a Python error: killed (by the system's out-of-memory killer, "
        "most often)"), killed
    assert "trial 0: retrying from its last checkpoint after its process died" in output, output
    # A native crash, and a hang past failure.hang_timeout_s, are named by the process's own
    # account (Python's faulthandler), at the user's line: Ray's words were those of a
    # killed process, and a hung trial held its slot until the search was stopped (audit 27).
    # Each repeats at the same point, so it is tried twice, not three times.
    crashed, hung = table[8], table[9]
    assert (crashed["state"], crashed["attempts"]) == ("FAILED", "2"), crashed
    assert re.match(r"failed 2 times the same way, at the same point: its process crashed: Segmentation fault "
                    r"\(at \S*faulty\.py:\d+ in training_step\)", crashed["reason"]), crashed["reason"]
    assert (hung["state"], hung["attempts"]) == ("FAILED", "2"), hung
    assert re.match(r"failed 2 times the same way, at the same point: hung: no batch finished for 5 s "
                    r"\(failure.hang_timeout_s\) \(at \S*faulty\.py:\d+ in training_step\)", hung["reason"]), hung
    for number in (8, 9):
        kept = (exp_dir / "trials" / f"trial_{number:04d}" / "error.txt").read_text()
        assert kept.startswith("The trial's process's own account") and 'faulty.py", line' in kept, kept[:2000]

    states = {t.number: t.state.name for t in study(exp_dir, "faults").trials}
    assert [states[n] for n in range(len(faults))] == ["FAIL", "COMPLETE"] + ["FAIL"] * 8
    # Failed trials are rows of TensorBoard's HParams table too, with their state.
    assert [hparams_state(tensorboard_run(exp_dir, n)) for n in (1, 2, 3, 4)] == ["COMPLETE"] + ["FAILED"] * 3
    best = json.loads((exp_dir / "best.json").read_text())
    assert best["trial"] == 1 and 0 <= best["value"] <= 1
    status = subprocess.run([sys.executable, "-m", "hpsearch.search.cli", "status", str(exp_dir)],
                            capture_output=True, text=True)
    assert "injected failure (always)" in status.stdout and "OOM" in status.stdout


def test_trials_failing_in_a_row_stop_the_search_and_resume_goes_on_once_fixed(tmp_path):
    """A fault every trial meets (broken data, a bug at any setting) failed each trial of
    the study in turn, each after its own start-up, before the user heard of it."""
    path = experiment(tmp_path, "failing", num_trials=4, fault_epoch=1,
                      faults={str(number): "broken_data" for number in range(10)})
    exp_dir = tmp_path / "runs" / "failing"
    code, output = finish(start("run", path.name, "--set", "failure.max_consecutive_failures=2",
                                "--set", "search.max_concurrent=1", "--set", "scheduler.max_epochs=1", cwd=tmp_path))
    assert code == 1, output
    assert "search stopped: 2 trials in a row failed (failure.max_consecutive_failures)" in output, output
    assert re.search(r"This session's failures: TypeError: injected: a broken batch \(at \S*faulty\.py:\d+ in "
                     r"training_step\); not retried: the same code would raise it again \(2 trials; traceback: "
                     + re.escape(str(exp_dir / "trials" / "trial_0000" / "error.txt")) + r"\)\.", output), output
    assert f"continue the study with:\n  hpsearch resume {exp_dir}" in output, output
    assert [r["state"] for r in finished(exp_dir)] == ["FAILED", "FAILED"], rows(exp_dir)
    assert json.loads((exp_dir / "sessions.json").read_text())[-1]["outcome"] == "failures_in_a_row"
    status = subprocess.run([sys.executable, "-m", "hpsearch.search.cli", "status", str(exp_dir)],
                            capture_output=True, text=True)
    assert "its last session stopped because trials kept failing" in " ".join(status.stdout.split()), status.stdout

    # Once fixed, the failed trials' configurations run again too, as new trials beyond
    # num_trials: they were lost to the study, a grid's points among them (audit 27).
    (tmp_path / "markers" / "data-fixed").write_text("")
    code, output = finish(start("resume", str(exp_dir), "--retry-failed", cwd=tmp_path))
    assert code == 0, output
    # (the two failed trials were all the study had: one trial ran at a time)
    assert "running again the configurations of 2 failed trials (trial 0 as 2, 1 as 3)" in output, output
    table = {int(r["trial"]): r for r in rows(exp_dir)}
    assert [table[n]["state"] for n in range(6)] == ["FAILED"] * 2 + ["COMPLETE"] * 4, table
    assert [table[n]["model.lr"] for n in (2, 3)] == [table[n]["model.lr"] for n in (0, 1)], table
    assert [table[n]["retry_of"] for n in range(6)] == ["", "", "0", "1", "", ""], table  # said where it stays
    ran_again = {t.number: t.params for t in study(exp_dir, "failing").trials}
    assert (ran_again[2], ran_again[3]) == (ran_again[0], ran_again[1]) != (ran_again[4], ran_again[5])
    code, output = finish(start("resume", str(exp_dir), "--retry-failed", cwd=tmp_path), timeout=120)
    assert code == 0 and "not running again 2 failed trials whose configuration a later trial has (trial 0 as 2, " \
                         "1 as 3)" in output and "already complete (6 trials)" in output, output
    # num_trials counts the trials that are not configurations run again: 6 asks for two more,
    # where it said the study was complete; and a stop names the failures of its own session,
    # not the study's fixed ones (audit 29)
    (tmp_path / "markers" / "data-broken-again").write_text("")
    code, output = finish(start("resume", str(exp_dir), "--set", "search.num_trials=6",
                                "--set", "failure.max_consecutive_failures=1", cwd=tmp_path))
    assert code == 1 and "searching: 8 trials in all" in output and len(finished(exp_dir)) == 7, output
    assert "This session's failures: ValueError: injected: broken again" in output, output
    assert "TypeError" not in output.split("This session's failures:")[1], output


@pytest.mark.parametrize("where", ["training", "constructor"])
def test_a_trial_whose_disk_fills_is_paused_with_its_checkpoints_and_resume_continues_it(tmp_path, where):
    """A full disk failed the trial that met it, for good: its epoch checkpoints were
    deleted as an ended trial's, and a resume once there was space left it FAILED (audit
    55: the study's best run was lost, 3 times of 3). A full disk is no fault of the
    trial's values: the trial is paused, with its checkpoints, and the session stops. Met
    in its set-up, it was retried, then FAILED (audit 58)."""
    fault = {"training": "disk_full_once", "constructor": "disk_full_at_init_once"}[where]
    path = experiment(tmp_path, "disk", num_trials=4, faults={"1": fault})
    exp_dir = tmp_path / "runs" / "disk"
    code, output = finish(start("run", path.name, cwd=tmp_path))
    assert code == 1, output
    assert "trial 1: disk full: [Errno 28] No space left on device" in output, output
    assert "paused, with its checkpoints, not failed" in output, output
    assert f"once there is space, continue the study with: hpsearch resume {exp_dir}" in output, output
    row = next(r for r in rows(exp_dir) if r["trial"] == "1")
    assert row["state"] == "PAUSED" and row["reason"].startswith("disk full"), row
    if where == "training":  # at its second epoch
        assert list((exp_dir / "trials" / "trial_0001" / "checkpoints").glob("epoch-*.ckpt")), "its checkpoints kept"
    assert study(exp_dir, "disk").trials[1].state.name == "RUNNING"  # not FAIL: a resume continues it
    code, output = finish(start("status", str(exp_dir), cwd=tmp_path), timeout=60)
    assert code == 0 and "its last session stopped on a full disk; once there is space, " \
        f"`hpsearch resume {exp_dir}` continues the study" in output, output

    code, output = finish(start("resume", str(exp_dir), cwd=tmp_path))
    assert code == 0, output
    assert_complete_study(exp_dir, "disk", num_trials=4)  # trial 1 too, its epochs each once
    assert next(r for r in rows(exp_dir) if r["trial"] == "1")["resumed"] == str(where == "training")
    outcomes = [s["outcome"] for s in json.loads((exp_dir / "sessions.json").read_text())]
    assert outcomes == ["disk_full", "complete"], outcomes


FULL_DISK_DRIVER = """
import errno, os, sys
calls = {"n": 0}
real_fsync = os.fsync
def fsync(fd):
    # Only writes of trials.csv see the full disk, after FAIL_AFTER_WRITES good ones.
    if ".trials.csv." in os.readlink(f"/proc/self/fd/{fd}"):
        calls["n"] += 1
        if calls["n"] > int(os.environ["FAIL_AFTER_WRITES"]):
            raise OSError(errno.ENOSPC, "No space left on device")
    return real_fsync(fd)
os.fsync = fsync
from hpsearch.search.cli import main
sys.exit(main(sys.argv[1:]))
"""


CHAIN_TRIALS = 10


def stop_once_a_trial_finished(driver: subprocess.Popen, exp_dir: Path, trial: int | None = None,
                               stop_signal=signal.SIGINT, to_group: bool = False, press_again_once=None) -> str:
    """Send ``stop_signal`` once a trial (``trial``, else any) finished in this session (to
    the driver's whole process group with ``to_group``, as ``timeout`` or a job scheduler
    does; and Ctrl+C once ``press_again_once()`` holds), and check the session stopped with
    exit status 130, the resume command and every unfinished trial paused; returns its output."""
    done_before = {r["trial"] for r in finished(exp_dir)}
    wait_for(lambda: any(r["trial"] not in done_before and (trial is None or int(r["trial"]) == trial)
                         for r in finished(exp_dir)), what="a trial finished in this session")
    if to_group:
        os.killpg(driver.pid, stop_signal)
    else:
        driver.send_signal(stop_signal)
    if press_again_once is not None:
        wait_for(press_again_once, what="the moment for a second Ctrl+C")
        driver.send_signal(signal.SIGINT)
    code, output = finish(driver, timeout=120)
    assert code == 130 and f"hpsearch resume {exp_dir}" in output, output
    assert output.count(GRACEFUL_STOP_MESSAGE) == 1, output  # said once, at the first signal
    assert "hpsearch.resume(" not in output, output  # the Python caller's notice: the CLI says its own
    unfinished = [r for r in rows(exp_dir) if r not in finished(exp_dir)]
    assert all((r["state"], r["reason"]) == ("PAUSED", "search stopped") for r in unfinished), unfinished
    assert 1 <= len(finished(exp_dir)) < CHAIN_TRIALS
    return output


def test_an_interrupt_caught_inside_exec_d_code_leaves_the_exit_status_to_the_command(tmp_path):
    """In about 1 of 4 stops at start-up on a loaded machine, ``python -m hpsearch.search.cli``
    ended by SIGINT after main() had returned 130: the interrupt had passed out of code run
    by ``exec`` from a string (a dataclass being built, say), which sets CPython's
    process-wide flag that makes the interpreter re-raise SIGINT at exit, caught or not."""
    (tmp_path / "interrupted_in_exec.py").write_text(
        "import os, signal, sys\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)  # a shell's background job starts with it ignored\n"
        "from hpsearch.search import cli\n"
        "def stopped_at_start_up(args):\n"
        "    try:\n"
        "        exec('os.kill(os.getpid(), signal.SIGINT)\\nfor _ in range(10 ** 6): pass')\n"
        "    except KeyboardInterrupt:\n"
        "        return 130\n"
        "cli._run_command = stopped_at_start_up\n"
        "sys.exit(cli.main(['status', 'no-such-study']))\n")
    ended = subprocess.run([sys.executable, "-m", "interrupted_in_exec"], cwd=tmp_path, capture_output=True, text=True)
    assert ended.returncode == 130, (ended.returncode, ended.stderr)


@pytest.mark.slow
def test_one_study_survives_a_kill_a_double_ctrl_c_a_sigterm_and_a_full_disk_in_a_row(tmp_path):
    """Every bad end a session can have, one after the other, each session resuming the one
    before (one study rather than one each: every session pays Ray's and the imports' start).
    Nothing finished is lost or re-run, and the last resume completes the study."""
    name = "stopped"
    path = experiment(tmp_path, name, num_trials=CHAIN_TRIALS, epoch_sleep=1.5, hang_first_test=True)
    exp_dir = tmp_path / "runs" / name
    testing = tmp_path / "markers" / "testing"

    # 1. SIGKILL of the driver mid-search; then the newest checkpoint of the trial it cut is damaged.
    driver = start("run", path.name, cwd=tmp_path)
    wait_for(lambda: len(finished(exp_dir)) >= 2 and any(r["state"] == "RUNNING" and r.get("epochs") for r in rows(exp_dir)),
             what="two finished trials and one mid-way")
    driver.send_signal(signal.SIGKILL)
    driver.communicate(timeout=60)
    wait_until_quiet(exp_dir / "trials")  # Ray's reaper stops the orphaned trial workers
    done_before = [int(r["trial"]) for r in finished(exp_dir)]
    untouched = snapshot(exp_dir, done_before)
    running = next(int(r["trial"]) for r in rows(exp_dir) if r["state"] == "RUNNING" and r.get("epochs"))
    code, output = finish(start("status", str(exp_dir), cwd=tmp_path), timeout=60)
    assert code == 0 and "No search is running: its driver" in output, output
    named = re.search(r"trials? ([\d, ]+) (?:is|are) not running", output)
    assert named and str(running) in named.group(1).split(", "), output
    checkpoints = sorted((exp_dir / "trials" / f"trial_{running:04d}" / "checkpoints").glob("epoch-*.ckpt"))
    checkpoints[-1].write_bytes(b"")  # the newest checkpoint is damaged

    # 2. Ctrl+C twice, the second in the slowest step after the first: the best trial's test
    # evaluation in the driver, which here hangs (Lightning alone would exit with 1). The
    # search runs as a background job in a script would, with SIGINT ignored: Ray Tune
    # takes the first press regardless, and the second must not be lost.
    resumed = start("resume", str(exp_dir), cwd=tmp_path, sigint=signal.SIG_IGN)
    output = stop_once_a_trial_finished(resumed, exp_dir, trial=running, press_again_once=testing.exists)
    assert not (exp_dir / "best.json").exists()  # the evaluation was cut short
    # The damaged checkpoint was set aside, not loaded, and the console said what the trial resumed from instead.
    assert checkpoints[-1].with_suffix(".corrupt").exists()
    assert f"trial {running}: checkpoint {checkpoints[-1].name} is damaged (moved to " in output, output
    older = f"resuming from {checkpoints[-2].name}" if len(checkpoints) > 1 else "restarts from its first epoch"
    assert older in output, output
    resumed_row = next(r for r in rows(exp_dir) if int(r["trial"]) == running)
    assert resumed_row["resumed"] == "True" or len(checkpoints) == 1, resumed_row

    # 3. SIGTERM, a scheduler's or a pre-emption's stop, sent to the driver's whole process
    # group, as ``timeout`` and ``kill -- -PGID`` send it: there it also killed the local
    # Ray's GCS, which sat in that group, and the search hung 60 s, then died with its
    # session left "running". Meanwhile a second resume of the study is refused.
    resumed = start("resume", str(exp_dir), cwd=tmp_path, own_group=True)
    wait_for(lambda: json.loads((exp_dir / "driver.json").read_text()).get("pid") == resumed.pid,
             what="the resume to hold the study")
    code, output = finish(start("resume", str(exp_dir), cwd=tmp_path), timeout=120)
    assert code == 1 and f"pid {resumed.pid}" in output and "already being searched" in output, output
    stop_once_a_trial_finished(resumed, exp_dir, stop_signal=signal.SIGTERM, to_group=True)

    # 4. A full disk: trials.csv is written to a temporary file, fsynced, then renamed; the fsync fails.
    stop_slowing_epochs(tmp_path)
    (tmp_path / "full_disk_driver.py").write_text(FULL_DISK_DRIVER)
    result = subprocess.run([sys.executable, "full_disk_driver.py", "resume", str(exp_dir)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=400, env={**os.environ, "FAIL_AFTER_WRITES": "2"})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "disk full while writing" in result.stderr and "trials.csv" in result.stderr, result.stderr
    # and how to go on, which it did not say (audit 27)
    assert f"once there is space, continue the study with: hpsearch resume {exp_dir}" in result.stderr, result.stderr
    assert rows(exp_dir), "the last good trials.csv must still load"
    assert not list(exp_dir.glob(".*.tmp")), "no temporary file left behind"
    study(exp_dir, name)  # the Optuna journal loads

    # 5. The last resume completes the study, and evaluates its best trial.
    code, output = finish(start("resume", str(exp_dir), cwd=tmp_path))
    assert code == 0, output
    assert_complete_study(exp_dir, name, CHAIN_TRIALS)
    assert snapshot(exp_dir, done_before) == untouched  # finished trials were not re-run
    assert "test_acc" in json.loads((exp_dir / "best.json").read_text())["test_metrics"]
    sessions = json.loads((exp_dir / "sessions.json").read_text())
    outcomes = [s["outcome"] for s in sessions]
    assert outcomes == ["killed", "interrupted", "interrupted", "disk_full", "complete"], sessions
    assert 0 < sessions[0]["seconds"] < sessions[1]["started_at"] - sessions[0]["started_at"], sessions


def test_ctrl_c_during_start_up_stops_a_background_job_too(tmp_path):
    """A script's background ``hpsearch run ... &`` starts with SIGINT ignored; a Ctrl+C
    (or ``kill -INT``) while it validates and starts Ray must stop it as it stops a
    foreground one, not be lost while the whole search runs."""
    path = experiment(tmp_path, "early")
    process = start("run", str(path), cwd=tmp_path, sigint=signal.SIG_IGN)
    time.sleep(2)  # importing torch and Lightning for the preflight, before Ray starts
    process.send_signal(signal.SIGINT)
    code, output = finish(process, timeout=120)
    # 130 (a lost Ctrl+C runs the search); not ended by SIGINT (see the test after the next)
    assert code == 130 and "interrupted" in output, output
    # and says that nothing is left to resume (audit 55: "interrupted" alone)
    assert "interrupted before the search started; no study was made" in output, output
    assert not (tmp_path / "runs" / "early").exists()



def test_sigterm_during_start_up_is_a_ctrl_c_too(tmp_path):
    """It ended the command with 143 ("Terminated") during the preflight (audit 24)."""
    path = experiment(tmp_path, "early-term")
    process = start("run", str(path), cwd=tmp_path)
    time.sleep(2)  # importing torch and Lightning for the preflight, before Ray starts
    process.send_signal(signal.SIGTERM)
    code, output = finish(process, timeout=120)
    assert code == 130 and "interrupted" in output, output  # as after a Ctrl+C; not 143
    assert not any(r["state"] == "COMPLETE" for r in rows(tmp_path / "runs" / "early-term"))


@pytest.mark.slow
def test_a_hang_up_stops_the_search_gracefully(tmp_path):
    """The SSH connection or the terminal closes under a search: the kernel sends SIGHUP to
    the terminal's session, and the driver died outright, its trials left RUNNING and its
    session "running" (audit 24). It now stops as after Ctrl+C, with nowhere to print."""
    import fcntl
    import select
    import termios
    import threading

    path = experiment(tmp_path, "hung-up", num_trials=CHAIN_TRIALS, epoch_sleep=1.5)
    exp_dir = tmp_path / "runs" / "hung-up"
    terminal, its_side = os.openpty()

    def on_its_own_terminal():  # as a login shell's command: a session whose terminal is the pty
        os.setsid()
        fcntl.ioctl(its_side, termios.TIOCSCTTY, 0)

    driver = subprocess.Popen([sys.executable, "-m", "hpsearch.search.cli", "run", path.name], cwd=tmp_path,
                              stdin=its_side, stdout=its_side, stderr=its_side, preexec_fn=on_its_own_terminal,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    os.close(its_side)
    hang_up, shown = threading.Event(), []

    def read_the_terminal():  # as a terminal does; then it closes (the connection drops)
        while not hang_up.is_set():
            if select.select([terminal], [], [], 0.2)[0]:
                try:
                    shown.append(os.read(terminal, 65536))
                except OSError:
                    break
        os.close(terminal)

    reader = threading.Thread(target=read_the_terminal, daemon=True)
    reader.start()
    try:
        wait_for(lambda: len(finished(exp_dir)) >= 1, what="a finished trial")
        hang_up.set()
        reader.join(timeout=10)
        code = driver.wait(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert code == 130, (code, b"".join(shown).decode(errors="replace")[-2000:])
    unfinished = [r for r in rows(exp_dir) if r not in finished(exp_dir)]
    assert unfinished and all((r["state"], r["reason"]) == ("PAUSED", "search stopped") for r in unfinished), \
        unfinished
    assert json.loads((exp_dir / "sessions.json").read_text())[-1]["outcome"] == "interrupted"

@pytest.mark.slow
def test_an_evaluation_killed_interrupted_or_failing_keeps_the_result_and_resume_only_evaluates(tmp_path):
    # The first evaluation of the best trial hangs and its driver is killed; the resume's
    # hangs too and gets a Ctrl+C; the next one hits a test_step that breaks only on a
    # trained model, not in the preflight's test batch; the user fixes it and resumes.
    path = experiment(tmp_path, "broken-test", broken_test=True, hang_first_test=True)
    exp_dir = tmp_path / "runs" / "broken-test"
    testing = tmp_path / "markers" / "testing"
    driver = start("run", path.name, "--set", "search.num_trials=2", "--set", "scheduler.max_epochs=1", cwd=tmp_path)
    wait_for(testing.exists, what="the test evaluation")
    driver.send_signal(signal.SIGKILL)
    first_output = "".join(driver.communicate(timeout=60))
    # In a log (no terminal): where the results go is said at the start, metrics in short
    assert f"searching: 2 trials in all; results in {exp_dir}" in first_output, first_output
    assert re.search(r"trial \d: COMPLETE \(max_epochs\) val_acc=\d\.\d{1,4} after 1 epoch\b", first_output), \
        first_output

    # The resume's evaluation hangs too, and a Ctrl+C stops it as it stops a search.
    testing.unlink()
    resuming = start("resume", str(exp_dir), cwd=tmp_path)
    wait_for(testing.exists, what="the resume's test evaluation")
    resuming.send_signal(signal.SIGINT)
    code, output = finish(resuming, timeout=120)
    assert code == 130 and "search interrupted" in output and f"hpsearch resume {exp_dir}" in output, output
    assert not (exp_dir / "best.json").exists()
    # Tune had ended with every trial done: the sessions say so, and resume runs only the evaluation.
    assert [(s["outcome"], s["search_complete"]) for s in json.loads((exp_dir / "sessions.json").read_text())] == [
        ("killed", True), ("interrupted", True)]

    code, output = finish(start("resume", str(exp_dir), cwd=tmp_path))
    assert code == 1 and "Traceback" not in output, output
    # no Ray Tune session made by the resume (the first removed its own as its Tune run ended)
    assert "searching:" not in output and not list((exp_dir / "tune").glob("session-*")), output
    best = json.loads((exp_dir / "best.json").read_text())  # the search's result is kept
    assert best["test_metrics"] == {} and best["checkpoint"], best
    assert re.match(r"AttributeError: .*undefined_helper.* \(at \S*faulty\.py:\d+ in test_step\); traceback: ",
                    best["test_error"]), best["test_error"]
    assert "undefined_helper" in (exp_dir / "evaluation-error.txt").read_text()
    assert "test evaluation failed: AttributeError" in output and f"hpsearch resume {exp_dir}" in output, output
    status = subprocess.run([sys.executable, "-m", "hpsearch.search.cli", "status", str(exp_dir)],
                            capture_output=True, text=True)
    assert "The best trial's test evaluation failed: AttributeError" in status.stdout, status.stdout
    best_command = subprocess.run([sys.executable, "-m", "hpsearch.search.cli", "best", "--json", str(exp_dir)],
                                  capture_output=True, text=True)
    # The best trial is known (its JSON is printed), but the evaluation asked for failed: exit 1, as run does.
    assert best_command.returncode == 1 and json.loads(best_command.stdout)["test_error"], best_command
    assert f"hpsearch resume {exp_dir}" in best_command.stderr, best_command.stderr

    (tmp_path / "markers" / "test-fixed").write_text("fixed")  # the user fixes test_step
    code, output = finish(start("resume", str(exp_dir), cwd=tmp_path))
    assert code == 0, output
    # Only the evaluation ran: no Tune session, and the console says so.
    assert "only the best trial's test evaluation ran again" in output and "searching:" not in output, output
    assert not list((exp_dir / "tune").glob("session-*"))
    best = json.loads((exp_dir / "best.json").read_text())
    assert best["test_error"] is None and 0 <= best["test_metrics"]["test_acc"] <= 1, best
    assert not (exp_dir / "evaluation-error.txt").exists()  # out of date now
    assert len(rows(exp_dir)) == 2  # no trial ran again
    sessions = json.loads((exp_dir / "sessions.json").read_text())
    # each evaluation's own session counts in the study's time
    assert [s["outcome"] for s in sessions] == ["killed", "interrupted", "complete", "complete"], sessions
    assert all(s["search_complete"] and s["seconds"] > 0 for s in sessions), sessions


@pytest.mark.slow
def test_resume_runs_the_preflight_in_its_own_directory(tmp_path):
    # The data's root is relative to where the first session ran. Resumed from elsewhere
    # without a preflight, the new trials failed for good (resume reruns no failed trial).
    from conftest import make_image_folder

    first, elsewhere = tmp_path / "first", tmp_path / "elsewhere"
    make_image_folder(first / "images")
    elsewhere.mkdir()
    config = {
        "name": "relative", "model": {"class_path": "cnn", "init_args": {"channels": 4}},
        "data": {"class_path": "image-folder", "init_args": {"root": "images", "image_size": 8, "batch_size": 4}},
        "space": {"model.lr": {"type": "float", "low": 1e-3, "high": 0.05, "log": True}},
        "metric": "val_acc", "mode": "max", "search": {"num_trials": 1, "max_concurrent": 1, "seed": 0},
        "scheduler": {"type": "none", "max_epochs": 1}, "storage": str(tmp_path / "runs"),
    }
    path = write_yaml(first / "relative.yaml", config)
    code, output = finish(start("run", path.name, cwd=first))
    assert code == 0, output
    exp_dir = tmp_path / "runs" / "relative"
    code, output = finish(start("resume", str(exp_dir), "--set", "search.num_trials=2", cwd=elsewhere), timeout=120)
    assert code == 2 and "data.init_args" in output and "'images' is not a directory" in output, output
    assert len(rows(exp_dir)) == 1 and len(json.loads((exp_dir / "sessions.json").read_text())) == 1  # Ray never started
    code, output = finish(start("resume", str(exp_dir), "--set", "search.num_trials=2", cwd=first))
    assert code == 0 and [r["state"] for r in rows(exp_dir)] == ["COMPLETE", "COMPLETE"], output
