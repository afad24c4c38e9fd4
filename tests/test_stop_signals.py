"""What the first and second stop signal do in the driver, with Ray Tune's own handler and
no Ray started (the end-to-end tests in test_fault_tolerance.py send them to the CLI)."""

from __future__ import annotations

import logging
import os
import signal
import time

import pytest

from hpsearch.search.api import GRACEFUL_STOP_MESSAGE, _stop_signals_interrupt


def wait_for_signal_handler():
    # A signal's Python handler runs between bytecodes of the main thread.
    for _ in range(100):
        time.sleep(0.01)


@pytest.fixture
def quiet_tune():
    """Ray Tune's loggers as hpsearch leaves them without ``--verbose``; the SIGUSR1
    handler that Tune's signal catching also installs is put back afterwards."""
    tune_logger = logging.getLogger("ray.tune")
    previous, sigusr1 = tune_logger.level, signal.getsignal(signal.SIGUSR1)
    tune_logger.setLevel(logging.ERROR)
    yield
    tune_logger.setLevel(previous)
    signal.signal(signal.SIGUSR1, sigusr1)


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_first_stop_signal_is_announced_at_once_and_the_second_interrupts(stop_signal, quiet_tune, capsys):
    from ray.tune.tune import _setup_signal_catching  # what Tuner.fit installs

    logger = logging.getLogger("ray.tune.tune")
    level_before, filters_before = logger.level, list(logger.filters)
    sigint_before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with _stop_signals_interrupt():
            stop_requested = _setup_signal_catching()
            os.kill(os.getpid(), stop_signal)
            wait_for_signal_handler()
            assert stop_requested.is_set()  # Tune stops gracefully
            assert capsys.readouterr().err.count(GRACEFUL_STOP_MESSAGE) == 1
            logger.warning("another of Tune's warnings")  # still kept quiet
            assert capsys.readouterr().err == ""
            os.kill(os.getpid(), stop_signal)  # the second stops at once
            wait_for_signal_handler()
    assert GRACEFUL_STOP_MESSAGE not in capsys.readouterr().err  # said once only
    assert (logger.level, logger.filters) == (level_before, filters_before)
    assert signal.getsignal(signal.SIGINT) is sigint_before


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_once_tune_has_ended_the_first_stop_signal_interrupts_at_once(stop_signal, quiet_tune, capsys):
    """During the best trial's test evaluation no trial is left to stop gracefully; Ray
    Tune's handler, still installed after its run, would only announce a stop that never
    comes and leave the evaluation running until a second signal."""
    from ray.tune.tune import _setup_signal_catching

    with pytest.raises(KeyboardInterrupt):
        with _stop_signals_interrupt() as tune_ended:
            stop_requested = _setup_signal_catching()
            tune_ended()
            os.kill(os.getpid(), stop_signal)
            wait_for_signal_handler()
    assert not stop_requested.is_set()
    assert GRACEFUL_STOP_MESSAGE not in capsys.readouterr().err


def test_a_ctrl_c_swallowed_during_start_up_still_stops_the_search_before_ray_starts(example_config, tmp_path,
                                                                                     monkeypatch):
    """Python swallows a KeyboardInterrupt raised in an at-fork hook ("Exception ignored in:
    _releaseLock"), which a Ctrl+C hits when it lands as a subprocess is spawned; the
    start-up must still stop, and put the previous handler back."""
    import hpsearch
    from hpsearch.search import api, tuner

    def preflight_hit_by_a_swallowed_ctrl_c(config, preflight=None, new_study=False):
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass  # as an at-fork hook does

    def ray_must_not_start(*args, **kwargs):
        raise AssertionError("Ray started after a Ctrl+C")

    monkeypatch.setattr(api, "prepare", preflight_hit_by_a_swallowed_ctrl_c)
    monkeypatch.setattr(tuner, "ray_for_search", ray_must_not_start)
    example_config["storage"] = str(tmp_path / "runs")
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        hpsearch.run(example_config)
    assert signal.getsignal(signal.SIGINT) is before
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("lands", ["during_rays_start", "as_the_study_is_written"])
def test_a_ctrl_c_before_the_session_leaves_no_study_or_names_its_resume(example_config, tmp_path, monkeypatch, lands):
    """A Ctrl+C during Ray's start, held until Ray had started, stopped the search only
    after its study directory was made: the command printed "interrupted" alone, and a
    run of the file again went to a new dated directory (audit 56). It now stops before
    the directory is made; one that lands once it is made names the resume command."""
    from contextlib import contextmanager

    import hpsearch
    from hpsearch.search import api, tuner
    from hpsearch.search.errors import Interrupted

    @contextmanager
    def ray_heard_a_ctrl_c_as_it_started(config, address, verbose):
        if lands == "during_rays_start":
            try:
                signal.raise_signal(signal.SIGINT)
            except KeyboardInterrupt:
                pass  # held, or swallowed where it landed, as during Ray's start
        yield tuner.SearchRay(False)

    def written_then_interrupted(exp, config):
        (exp.root / "experiment.yaml").write_text("name: x\n")
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "prepare", lambda config, preflight=None, new_study=False: None)
    monkeypatch.setattr(api, "_plan", lambda config, local: 1)
    monkeypatch.setattr(tuner, "ray_for_search", ray_heard_a_ctrl_c_as_it_started)
    monkeypatch.setattr(tuner, "run_session", lambda *args, **kwargs: pytest.fail("the session began"))
    if lands == "as_the_study_is_written":
        monkeypatch.setattr(api, "write_config", written_then_interrupted)
    example_config["storage"] = str(tmp_path / "runs")
    exp_dir = tmp_path / "runs" / example_config["name"]
    if lands == "during_rays_start":
        with pytest.raises(KeyboardInterrupt):
            hpsearch.run(example_config)
        assert not exp_dir.exists()
    else:
        try:
            with pytest.raises(Interrupted) as caught:
                hpsearch.run(example_config)
        except KeyboardInterrupt:  # as it was, it would end the test session
            pytest.fail("the Ctrl+C passed out of run as it was, not as Interrupted")
        assert exp_dir.is_dir() and str(caught.value).endswith(f"hpsearch resume {exp_dir}"), str(caught.value)


@pytest.mark.parametrize("how", ["graceful", "second_ctrl_c"])
def test_the_resume_command_of_a_cluster_search_names_its_cluster(example_config, tmp_path, monkeypatch, how):
    """Copied as printed, a resume without --address would start a Ray of its own on this
    machine (a cluster's head, meant to run no trials) instead of joining the cluster."""
    from contextlib import nullcontext

    import hpsearch
    from hpsearch.search import api, tuner
    from hpsearch.search.errors import Interrupted
    from hpsearch.search.outcome import SESSION_INTERRUPTED

    def stopped_session(*args, **kwargs):
        if how == "second_ctrl_c":
            raise KeyboardInterrupt
        return SESSION_INTERRUPTED

    monkeypatch.setattr(api, "prepare", lambda config, preflight=None, new_study=False: None)
    monkeypatch.setattr(api, "_plan", lambda config, local: 1)
    monkeypatch.setattr(tuner, "ray_for_search",
                        lambda config, address, verbose: nullcontext(tuner.SearchRay(False)))
    monkeypatch.setattr(tuner, "run_session", stopped_session)
    example_config["storage"] = str(tmp_path / "runs")
    exp_dir = tmp_path / "runs" / example_config["name"]
    expected = f"hpsearch resume {exp_dir} --address 10.1.2.3:6379"
    if how == "graceful":
        assert hpsearch.run(example_config, address="10.1.2.3:6379").resume_command == expected
        assert hpsearch.run(example_config, name="local").resume_command == f"hpsearch resume {tmp_path / 'runs' / 'local'}"
    else:
        with pytest.raises(Interrupted) as caught:
            hpsearch.run(example_config, address="10.1.2.3:6379")
        assert str(caught.value).endswith(expected)
        # from Python, the call too: the message named the command only (audit 51)
        assert f"Continue it with hpsearch.resume({str(exp_dir)!r}, " \
               "address='10.1.2.3:6379'), or:" in str(caught.value), str(caught.value)
    import ray

    # No Ray was started: the search's watch of its Ray (ray_watch.py) asked this one for
    # its GCS, and Ray's auto-init started one for it, which later tests of the process met.
    assert not ray.is_initialized()


@pytest.mark.parametrize("stop_signal", ["SIGINT", "SIGTERM"])
def test_a_stop_signal_during_rays_start_stops_the_command_as_ctrl_c_and_leaves_no_ray_process(tmp_path, stop_signal):
    """A SIGTERM inside ``ray.init`` met Ray's own handler, set at its start: the command
    exited with 15, printing nothing, and Ray's agents outlived it (audit 37, 11 of 11 tries
    in that second). The signal is sent where the GCS already runs, as the raylet starts."""
    import shutil
    import subprocess
    import sys
    import tempfile
    import textwrap

    from conftest import shrunk_example, write_yaml

    path = write_yaml(tmp_path / "exp.yaml", shrunk_example(tmp_path / "runs", **{"search/preflight": False}))
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        from pathlib import Path
        import ray._private.services as services
        from hpsearch.search.cli import main

        real_start_raylet = services.start_raylet

        def start_raylet(*args, **kwargs):
            os.kill(os.getpid(), signal.{stop_signal})
            time.sleep(0.2)
            return real_start_raylet(*args, **kwargs)

        services.start_raylet = start_raylet
        print("EXIT", main(["run", {str(path)!r}]), flush=True)
    """)
    ray_dir = tempfile.mkdtemp(prefix="hps-ray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    try:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                             cwd=tmp_path, env={**os.environ, "RAY_TMPDIR": ray_dir})
        time.sleep(3)
        # Ray's agents are the raylet's children, in a session of their own, named ray::DashboardAgent and
        # the like (their command line and environment rewritten): found by the log files they hold open
        outliving = [pid for pid, files in _open_files_by_process().items() if any(ray_dir in f for f in files)]
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    assert outliving == [], outliving
    assert "EXIT 130" in out.stdout, (out.returncode, out.stdout, out.stderr[-3000:])
    assert "interrupted" in out.stderr, out.stderr[-3000:]
    assert not (tmp_path / "runs").exists()  # stopped before the study was made


def _open_files_by_process() -> dict[str, list[str]]:
    from pathlib import Path

    files = {}
    for process in Path("/proc").glob("[0-9]*"):
        try:
            files[process.name] = [os.readlink(fd) for fd in (process / "fd").iterdir()]
        except OSError:  # ended meanwhile, or another user's
            continue
    return files


def test_a_sigterm_handler_still_runs_after_hpsearch_shuts_ray_down(tmp_path):
    """Ray's shutdown leaves its own failure handler below Python's: a SIGTERM then ended
    the process with a stack dump, and the handler Python reported (the command line's, a
    user's) never ran."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import signal, ray
        from hpsearch.search.tuner import shutdown_ray
        got = []
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
        signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
        shutdown_ray()
        signal.raise_signal(signal.SIGTERM)
        print("HANDLED", got, flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert "HANDLED [15]" in out.stdout, (out.returncode, out.stdout, out.stderr[-2000:])


def test_a_sigterm_during_rays_start_that_a_users_handler_only_notes_leaves_the_search_going(tmp_path):
    """The handler ran once Ray had started, but Ray had been shut down first, and the
    search went on without it: RaySystemError "Ray has not been started yet" (audit 38)."""
    import subprocess
    import sys
    import textwrap

    from conftest import shrunk_example

    config = shrunk_example(tmp_path / "runs", **{"search/preflight": False, "search/num_trials": 1,
                                                  "scheduler/max_epochs": 1})
    script = textwrap.dedent(f"""
        import os, signal, time
        import ray._private.services as services
        import hpsearch

        noted = []
        signal.signal(signal.SIGTERM, lambda signum, frame: noted.append(signum))
        real_start_raylet = services.start_raylet

        def start_raylet(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            return real_start_raylet(*args, **kwargs)

        services.start_raylet = start_raylet
        result = hpsearch.run({config!r})
        print("OUTCOME", result.outcome, [int(signum) for signum in noted], flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert "OUTCOME complete [15]" in out.stdout, (out.returncode, out.stdout, out.stderr[-3000:])


def _holding(exp_root, seconds: float = 60, graceful: bool = False):
    """A process that holds the study as a search's driver does (``study_lock``), and says so;
    ``graceful``: with a SIGTERM handler of hpsearch's kind (the command line's), which ends
    it with 130 as a Ctrl+C would end the command."""
    import subprocess
    import sys

    code = ("import signal, sys, time; from hpsearch.search.experiment import ExperimentDir; "
            "from hpsearch.search.study_lock import GRACEFUL, study_lock\n"
            "def stop(signum, frame): sys.exit(130)\n"
            "setattr(stop, GRACEFUL, True)\n"
            f"{'signal.signal(signal.SIGTERM, stop)' if graceful else ''}\n"
            f"with study_lock(ExperimentDir.existing({str(exp_root)!r})):\n"
            f"    print('held', flush=True); time.sleep({seconds})")
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "held\n"
    return process


def _study(tmp_path, shrunk):
    from hpsearch.search.experiment import ExperimentDir, write_config

    exp = ExperimentDir.make(tmp_path / "study")
    write_config(exp, shrunk)
    return exp


def test_hpsearch_stop_sends_the_studys_driver_a_sigterm_and_waits_until_it_lets_go(tmp_path):
    from conftest import run_cli, shrunk_example

    exp = _study(tmp_path, shrunk_example(tmp_path))
    # A Python process whose SIGTERM is not hpsearch's Ctrl+C (a notebook's kernel, before its
    # trials run or while its best trial is evaluated) is not sent one: it would end outright.
    holder = _holding(exp.root)
    try:
        refused = run_cli("stop", str(exp.root), cwd=tmp_path, timeout=60)
        assert refused.returncode == 1 and "does not take a SIGTERM as a Ctrl+C now" in refused.stderr, \
            refused.stderr
        assert holder.poll() is None
    finally:
        holder.kill()
        holder.wait()
    holder = _holding(exp.root, graceful=True)  # the command line's, from its first moment
    try:
        stopped = run_cli("stop", str(exp.root), cwd=tmp_path, timeout=60)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert f"asked pid {holder.pid} (-c) to stop, as Ctrl+C would (a first stop" in stopped.stdout, stopped.stdout
        assert f"stopped. Continue it with: hpsearch resume {exp.root}" in stopped.stdout, stopped.stdout
        assert holder.wait(timeout=10) == 130
    finally:
        holder.kill()
    nothing = run_cli("stop", str(exp.root), cwd=tmp_path, timeout=60)
    assert nothing.returncode == 1 and f"error: no search holds {exp.root}: nothing to stop" in nothing.stderr


def test_driver_json_says_a_python_search_takes_sigterm_as_ctrl_c_only_while_its_handler_is_in_place(tmp_path):
    """hpsearch.run in a Python process: its own handler is in place around the trials only
    (``api._stop_signals_interrupt``); a resume that only evaluates the best trial, and
    every moment before the trials, has none, and ``stop`` there ended the process (audit 44)."""
    import json

    from conftest import shrunk_example

    from hpsearch.search.study_lock import GRACEFUL, sigterm_stops_gracefully, study_lock

    def graceful() -> bool:
        return json.loads((exp.root / "driver.json").read_text())["sigterm_graceful"]

    def as_ctrl_c(signum, frame) -> None:
        raise KeyboardInterrupt

    exp = _study(tmp_path, shrunk_example(tmp_path))
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with study_lock(exp):
            assert graceful() is False
            setattr(as_ctrl_c, GRACEFUL, True)
            signal.signal(signal.SIGTERM, as_ctrl_c)
            with sigterm_stops_gracefully(exp):
                assert graceful() is True
            assert graceful() is False
            signal.signal(signal.SIGTERM, lambda signum, frame: None)  # a user's own: not hpsearch's
            with sigterm_stops_gracefully(exp):
                assert graceful() is False
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_hpsearch_stop_signals_no_process_that_driver_json_cannot_vouch_for(tmp_path):
    """A driver elsewhere is named, with the way to stop it there; a pid that is not the
    process driver.json recorded (reused, or an older driver.json without its start) is
    not signalled."""
    import json
    import socket

    from conftest import run_cli, shrunk_example

    import subprocess

    exp = _study(tmp_path, shrunk_example(tmp_path))
    holder = _holding(exp.root)
    bystander = subprocess.Popen(["sleep", "60"])  # a live process that is not the holder
    try:
        recorded = json.loads((exp.root / "driver.json").read_text())
        for changed, said in (({"host": "gpu-node-7"}, f"is being searched on gpu-node-7 (pid {holder.pid}): stop "
                                                       f"it there, with hpsearch stop, or kill -TERM {holder.pid}"),
                              ({"pid": bystander.pid}, f"driver.json names pid {bystander.pid}"),
                              ({"process_started": None}, "which may not be the one holding it now")):
            (exp.root / "driver.json").write_text(json.dumps({**recorded, **changed}))
            refused = run_cli("stop", str(exp.root), cwd=tmp_path, timeout=60)
            assert refused.returncode == 1 and said in refused.stderr, (changed, refused.stderr)
            assert holder.poll() is None and bystander.poll() is None  # neither signalled
        assert recorded["host"] == socket.gethostname()
    finally:
        holder.kill()
        bystander.kill()


def test_status_names_the_running_search_and_how_to_stop_it(tmp_path):
    import time

    from rich.console import Console

    from conftest import shrunk_example
    from hpsearch.search.experiment import record_session
    from hpsearch.search.status_view import print_status

    exp = _study(tmp_path, shrunk_example(tmp_path))  # 4 trials
    # begun 1,000 s ago with one trial finished; two more since: the fourth in about 500 s
    record_session(exp, time.time() - 1000, None, "running", finished_before=1)
    exp.trials_csv.write_text("trial,state,reason,best,epochs\n0,COMPLETE,,0.5,2\n1,PRUNED,,0.4,1\n"
                              "2,COMPLETE,,0.6,2\n3,RUNNING,,,\n")
    holder = _holding(exp.root)
    try:
        console = Console(width=300, record=True)
        print_status(exp, console)
        said = console.export_text()
        assert f"A search is running on the study: pid {holder.pid} on " in said
        assert " (about 8m 2" in said and f"`hpsearch stop {exp.root}` stops it." in said, said
    finally:
        holder.kill()
        holder.wait()
    console = Console(width=300, record=True)
    print_status(exp, console)  # its driver gone: said so, and no word of stopping it
    said = console.export_text()
    assert "A search is running" not in said and "is gone, so trial 3 is not running" in said, said


def test_hpsearch_stop_by_the_studys_uri_on_the_drivers_machine(tmp_path):
    """A study in cloud storage is searched in its working copy here: status names it by
    its URI, and stop takes that (nothing fetched, which would write into the copy in use)."""
    from conftest import run_cli, shrunk_example

    from hpsearch.search.experiment import ExperimentDir, record_session, write_config
    from hpsearch.search.storage import HOME_FILE, working_copy

    uri, cache = "s3://bucket/exps/study", tmp_path / "cache"
    env = {"HPSEARCH_CACHE": str(cache)}
    nowhere = run_cli("stop", uri, cwd=tmp_path, timeout=60, env=env)
    assert nowhere.returncode == 1 and f"no search of {uri} has run on this machine" in nowhere.stderr, nowhere.stderr
    os.environ["HPSEARCH_CACHE"] = str(cache)
    try:
        local = working_copy(uri)
    finally:
        del os.environ["HPSEARCH_CACHE"]
    exp = ExperimentDir.make(local)
    write_config(exp, shrunk_example(tmp_path))
    (local / HOME_FILE).write_text(uri + "\n")
    record_session(exp, time.time(), None, "running")
    holder = _holding(exp.root, graceful=True)
    try:
        stopped = run_cli("stop", uri, cwd=tmp_path, timeout=60, env=env)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert f"stopped. Continue it with: hpsearch resume {uri}" in stopped.stdout, stopped.stdout
        assert holder.wait(timeout=10) == 130
    finally:
        holder.kill()
