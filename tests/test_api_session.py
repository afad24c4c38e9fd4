"""hpsearch.run called from the user's own Python: in a thread, on the user's own Ray."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import FIXTURES, free_port, run_cli, shrunk_example, stop_ray_at, write_yaml


@pytest.mark.e2e
@pytest.mark.slow
def test_a_search_in_a_thread_and_one_on_the_users_own_ray_end_cleanly(tmp_path):
    """A web app or notebook tool runs the search in a thread: the interpreter then exits
    at once with status 0 (Ray's exit handler waited 60 s for its GCS and exited 1). A
    user's own ray.init is used as it is, with Ray Tune's log lines still kept quiet."""
    config = shrunk_example(tmp_path, **{"search/num_trials": 1, "scheduler/max_epochs": 1})
    script = textwrap.dedent(f"""
        import json, random, threading, time
        import ray
        import ray.tune.tune
        import hpsearch

        def notebook_reporter(*args, **kwargs):  # in a notebook it clears the cell's output
            raise AssertionError("Tune chose its own progress reporter")

        ray.tune.tune._detect_reporter = notebook_reporter
        config = json.loads({json.dumps(config)!r})
        results = []
        thread = threading.Thread(target=lambda: results.append(hpsearch.run(config)))
        random.seed(3)
        drawn = []
        thread.start()
        while thread.is_alive():  # the main thread goes on drawing while the search runs
            drawn.append(random.random())
            time.sleep(0.05)
        thread.join()
        after = [random.random() for _ in range(20)]
        print("THREAD", len(results[0].trials), ray.is_initialized(), flush=True)
        # put back from the search's thread, the generator rewound and drew these again (audit 53)
        print("DRAWN AGAIN", len(set(after) & set(drawn)), flush=True)
        ray.init(address="local", num_cpus=2, include_dashboard=False)
        result = hpsearch.run({{**config, "name": "on-my-ray"}})
        print("OWN", len(result.trials), ray.is_initialized(), flush=True)
        from pathlib import Path
        from ray.train.constants import _get_ray_train_session_dir
        staged = Path(_get_ray_train_session_dir())
        print("STAGED", sorted(p.name for p in staged.glob("*/*")), (Path(result.experiment_dir) / "tune").is_dir())
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "THREAD 1 False" in out.stdout and "OWN 1 True" in out.stdout, out.stdout
    assert "DRAWN AGAIN 0" in out.stdout, out.stdout
    # Tune's staged copy of its files, 20-25 MB per 600 trials in /tmp, is gone; the study keeps its own (audit 40)
    assert "STAGED [] True" in out.stdout, out.stdout
    assert "Failed to fetch metrics" not in out.stderr and "Failed to connect to GCS" not in out.stderr, out.stderr[-3000:]
    # Ray's notice that a ray.init outside the main thread sets no SIGTERM handler is not the user's concern
    assert "SIGTERM handler" not in out.stderr, out.stderr[-3000:]


@pytest.mark.e2e
@pytest.mark.slow
def test_one_python_session_through_a_ctrl_c_at_ray_start_a_failed_search_and_a_stopped_one(tmp_path):
    """Three things a Python caller (a notebook) must be told or spared, in one session, as
    a notebook would meet them one after the other:
    - a Ctrl+C landing inside ray.init left the half-started Ray's GCS (with its monitor
      and dashboard) running as the session's children, which ray.shutdown() did not stop;
    - a search whose every trial failed returned as if all went well (the command line
      exits with 1 saying so; from Python, result.best is None);
    - a search stopped by one Ctrl+C returned as if all went well too: a notebook showed
      nothing of the stop, or of how to continue the study (the command line prints it);
    - and a search leaves the session's generators, loggers and breakpoint() as they were."""
    shutil.copytree(FIXTURES / "userpkg", tmp_path / "userpkg")
    at_start = shrunk_example(tmp_path, **{"name": "at-start", "search/num_trials": 1, "scheduler/max_epochs": 1})
    failing = shrunk_example(tmp_path, **{"name": "failing", "search/num_trials": 2, "scheduler/max_epochs": 1})
    failing["model"] = {"class_path": "userpkg.faulty:FaultyCNN",
                        "init_args": {"channels": 4, "faults": {"0": "init_error", "1": "init_error"}}}
    stopped = shrunk_example(tmp_path, **{"name": "stopped", "search/num_trials": 3, "scheduler/max_epochs": 2})
    script = textwrap.dedent(f"""
        import json, os, signal, time, warnings
        from pathlib import Path
        import ray
        import ray._private.services as services
        from ray import tune
        import hpsearch
        from hpsearch.search.api import NoResultWarning, StoppedEarlyWarning

        def own_sigterm_handler(signum, frame):  # a user's; ray.init replaced it for good (audit 30)
            pass

        signal.signal(signal.SIGTERM, own_sigterm_handler)
        real_start_raylet = services.start_raylet

        def start_raylet(*args, **kwargs):  # the GCS runs by now: Ctrl+C here
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            return real_start_raylet(*args, **kwargs)

        services.start_raylet = start_raylet
        try:
            hpsearch.run(json.loads({json.dumps(at_start)!r}))
        except KeyboardInterrupt:
            print("INTERRUPTED", ray.is_initialized(), flush=True)
        services.start_raylet = real_start_raylet
        ray.shutdown()
        time.sleep(3)

        def children():
            for stat in Path("/proc").glob("[0-9]*/stat"):
                try:
                    if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == os.getpid():
                        yield (stat.parent / "cmdline").read_bytes().split(b"\\0")[0].decode()
                except (OSError, ValueError):
                    pass

        print("LEFT", sorted(Path(c).name for c in children()), flush=True)

        import logging, random, numpy, optuna

        def callers_state():  # what a notebook goes on with: its generators, loggers and breakpoint()
            return (random.getstate(), numpy.random.get_state()[1].tolist(), logging.getLogger("ray.tune").level,
                    optuna.logging.get_verbosity(), os.environ.get("PYTHONBREAKPOINT"))

        random.seed(7), numpy.random.seed(7)
        os.environ.pop("PYTHONBREAKPOINT", None)  # the session's own breakpoint(): the first ray.init set Ray's
        before = callers_state()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = hpsearch.run(json.loads({json.dumps(failing)!r}))
        said = [str(w.message) for w in caught if issubclass(w.category, NoResultWarning)]
        print("FAILED", result.outcome, result.best, said, flush=True)
        print("CALLER'S STATE KEPT", [a == b for a, b in zip(before, callers_state())], ray.is_initialized(),
              flush=True)

        class CtrlCOnce(tune.Callback):
            def on_trial_result(self, iteration, trials, trial, result, **info):
                if not getattr(self, "pressed", False):
                    self.pressed = True
                    os.kill(os.getpid(), signal.SIGINT)

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = hpsearch.run(json.loads({json.dumps(stopped)!r}), callbacks=[CtrlCOnce()])
        said = [str(w.message) for w in caught if issubclass(w.category, StoppedEarlyWarning)]
        print("STOPPED", result.outcome, "|".join(said), flush=True)
        print("SIGTERM HANDLER KEPT", signal.getsignal(signal.SIGTERM) is own_sigterm_handler, flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert "INTERRUPTED False" in out.stdout, out.stdout + out.stderr[-3000:]
    assert "LEFT []" in out.stdout, out.stdout
    assert "SIGTERM HANDLER KEPT True" in out.stdout, out.stdout
    # Ray Tune's driver shuffled with Python's generator, and a search left its loggers quiet, Optuna's
    # verbosity at WARNING and ray.init's breakpoint() hook, with its Ray up for the next search (audit 51)
    assert "CALLER'S STATE KEPT [True, True, True, True, True] True" in out.stdout, out.stdout
    assert not (tmp_path / "at-start").exists()  # stopped before the study was made
    assert "FAILED complete None ['no trial finished with a result (2 of 2 failed); result.best is None" \
        in out.stdout, out.stdout + out.stderr[-3000:]
    study = tmp_path / "stopped"
    assert re.search(r"STOPPED interrupted search stopped before the study was complete \([0-2] of 3 trials "
                     rf"finished\); continue it with hpsearch.resume\('{re.escape(str(study))}'\), or: hpsearch "
                     rf"resume {re.escape(str(study))}\n", out.stdout), out.stdout + out.stderr[-3000:]


@pytest.mark.e2e
@pytest.mark.slow
def test_callbacks_that_raise_and_a_second_ctrl_c_stop_searches_that_free_the_sessions_cpus(tmp_path):
    """In one Python session, as a notebook's kernel keeps the Ray the first search started:
    - a user's callback that raises stops the search with an error naming it (Ray Tune
      re-raised it as a TuneError holding only a traceback's text); at a trial's end Tune
      took it for the trial's own failure: the complete trial was retried, then FAILED,
      and the search ended "complete" with no word of the callback;
    - a second Ctrl+C left Tune's loop before it stopped its trials, which went on holding
      every CPU: the next resume in that kernel waited for them without end, saying nothing."""
    config = shrunk_example(tmp_path, **{"search/num_trials": 2, "scheduler/max_epochs": 1})
    twice = shrunk_example(tmp_path, **{"name": "twice", "search/num_trials": 2, "scheduler/max_epochs": 2})
    script = textwrap.dedent(f"""
        import csv, json, os, signal, time
        import ray
        from ray import tune
        import hpsearch
        from hpsearch.search.errors import CallbackError, Interrupted

        def free_cpus():  # a removed reservation is given back within a moment
            deadline = time.monotonic() + 30
            while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
                time.sleep(0.5)
            return ray.available_resources().get("CPU", 0)

        class Broken(tune.Callback):
            def on_trial_result(self, iteration, trials, trial, result, **info):
                raise ValueError("my callback is broken")

        try:
            hpsearch.run(json.loads({json.dumps(config)!r}), callbacks=[Broken()])
        except CallbackError as error:
            print("CAUGHT", error.hook, error, flush=True)

        class TrackerDown(tune.Callback):
            def on_trial_complete(self, iteration, trials, trial, **info):
                raise RuntimeError("tracker down")

        try:
            hpsearch.run({{**json.loads({json.dumps(config)!r}), "name": "at-the-end"}}, callbacks=[TrackerDown()])
        except CallbackError as error:
            print("CAUGHT", error.hook, error, flush=True)
        rows = list(csv.DictReader(open({str(tmp_path / "at-the-end" / "trials.csv")!r})))
        print("ROWS", [(r["state"], r["attempts"]) for r in rows], flush=True)

        class EndBoom(tune.Callback):
            def on_experiment_end(self, trials, **info):
                raise RuntimeError("boom at the end")

        try:
            hpsearch.run({{**json.loads({json.dumps(config)!r}), "name": "end-boom"}}, callbacks=[EndBoom()])
        except CallbackError as error:
            print("CAUGHT", error.hook, error, flush=True)
        best = json.load(open({str(tmp_path / "end-boom" / "best.json")!r}))
        session = json.load(open({str(tmp_path / "end-boom" / "sessions.json")!r}))[-1]
        print("AFTER THE END", sorted(best["test_metrics"]), session["search_complete"], flush=True)
        print("FREE CPUS AFTER CALLBACKS", free_cpus(), flush=True)

        class CtrlCTwice(tune.Callback):  # as a user presses it, in the middle of the search
            def on_trial_result(self, iteration, trials, trial, result, **info):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)

        try:
            hpsearch.run(json.loads({json.dumps(twice)!r}), callbacks=[CtrlCTwice()])
        except Interrupted as stopped:
            print("INTERRUPTED", flush=True)
        cpus = free_cpus()
        print("FREE CPUS AFTER TWO CTRL+C", cpus, flush=True)
        if cpus >= 2:
            result = hpsearch.resume({str(tmp_path / "twice")!r})
            print("RESUMED", result.outcome, len(result.trials), flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert "CAUGHT on_trial_result your callback Broken.on_trial_result raised ValueError: my callback is broken" \
        in out.stdout, out.stdout + out.stderr[-3000:]
    assert "hpsearch.resume(" in out.stdout and "TuneError" not in out.stdout
    assert "CAUGHT on_trial_complete your callback TrackerDown.on_trial_complete raised RuntimeError: tracker down" \
        in out.stdout, out.stdout + out.stderr[-3000:]
    # one raising at the search's end, once every trial had ended, cost the search its
    # evaluation and best.json, and the session read as not searched (audit 25)
    assert "CAUGHT on_experiment_end your callback EndBoom.on_experiment_end raised RuntimeError: boom at the end" \
        in out.stdout, out.stdout + out.stderr[-3000:]
    assert "AFTER THE END ['test_acc', 'test_loss'] True" in out.stdout, out.stdout + out.stderr[-3000:]
    # the trial that ended is COMPLETE after one attempt (the other, still running then, is paused)
    [table] = [ast.literal_eval(line[len("ROWS "):]) for line in out.stdout.splitlines() if line.startswith("ROWS ")]
    assert ("COMPLETE", "1") in table and not [row for row in table if row[0] == "FAILED"], out.stdout
    assert "Error stopping trial" not in out.stderr, out.stderr[-3000:]
    # and the trials the stopped searches left running gave their CPUs back to the session's Ray
    assert "FREE CPUS AFTER CALLBACKS 2.0" in out.stdout, out.stdout
    assert "INTERRUPTED" in out.stdout and "FREE CPUS AFTER TWO CTRL+C 2.0" in out.stdout, \
        out.stdout + out.stderr[-3000:]
    assert "RESUMED complete 2" in out.stdout, out.stdout + out.stderr[-3000:]


@pytest.mark.e2e
def test_trials_beside_an_unrelated_ray_never_ask_it_about_themselves(tmp_path):
    """Another Ray started with ``ray start`` on this machine (its dashboard on): Ray's state
    API, called inside a trial with no address, used to find that cluster by
    /tmp/ray/ray_current_cluster and say the trial's own actor did not exist. Ray Train's
    placement-group cleaner asks exactly that of a DDP trial's controller, and removed the
    trial's reservation on that answer: its ranks died mid-epoch."""
    import os

    port = free_port()
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    unrelated = [str(Path(sys.executable).parent / "ray"), "start", "--head", f"--port={port}", "--num-cpus=0",
                 "--include-dashboard=true", f"--dashboard-port={free_port()}",
                 f"--dashboard-agent-listen-port={free_port()}", "--disable-usage-stats"]
    shutil.copytree(FIXTURES / "userpkg", tmp_path / "userpkg")
    answer = tmp_path / "answer.json"
    config = shrunk_example(tmp_path / "runs", **{
        "search/num_trials": 1, "scheduler/max_epochs": 1,
        "model/class_path": "userpkg.state_probe:StateApiProbe", "model/init_args/log_to": str(answer)})
    path = write_yaml(tmp_path / "exp.yaml", config)
    try:
        subprocess.run(unrelated, env=env, check=True, capture_output=True, timeout=120)
        result = run_cli("run", str(path), cwd=tmp_path, env=env, timeout=300)
    finally:
        stop_ray_at(port)
    assert result.returncode == 0, result.stdout + result.stderr
    said = json.loads(answer.read_text())["answer"]
    assert said != "not found", "the trial's state API asked the unrelated Ray about the trial"
    print(f"state API inside a trial, beside an unrelated Ray: {said[:120]}")


def test_a_stopped_search_frees_only_its_own_jobs_new_reservations(monkeypatch):
    """On a shared cluster other jobs make placement groups meanwhile: a group's id ends
    with its job's id, and only this driver's new ones are removed."""
    from types import SimpleNamespace

    import importlib

    import ray

    from hpsearch.search.api import _release_reservations_since

    groups = importlib.import_module("ray.util.placement_group")  # (ray.util's function of that name hides it)

    mine, theirs, earlier = "aa" * 14 + "01000000", "bb" * 14 + "02000000", "cc" * 14 + "01000000"
    table = {mine: {"state": "CREATED"}, theirs: {"state": "CREATED"}, earlier: {"state": "CREATED"},
             "dd" * 14 + "01000000": {"state": "REMOVED"}}
    removed = []
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: SimpleNamespace(get_job_id=lambda: "01000000"))
    monkeypatch.setattr(groups, "placement_group_table",
                        lambda group=None: table if group is None else table[group.id.hex()])
    monkeypatch.setattr(groups, "remove_placement_group", lambda group: removed.append(group.id.hex()))
    _release_reservations_since(held_before={earlier})
    assert removed == [mine]


def test_a_stopped_studys_count_keeps_the_failed_configurations_run_again_apart():
    """The stopped search's warning said "(5 of 4 trials finished)" once resume
    --retry-failed had run failed trials' configurations again, beyond num_trials."""
    from hpsearch.search.api import finished_of

    trials = [{"trial": 0, "state": "COMPLETE", "retry_of": ""}, {"trial": 1, "state": "FAILED", "retry_of": ""},
              {"trial": 2, "state": "PRUNED", "retry_of": ""}, {"trial": 3, "state": "FAILED", "retry_of": ""},
              {"trial": 4, "state": "COMPLETE", "retry_of": "1"}, {"trial": 5, "state": "RUNNING", "retry_of": "3"}]
    assert finished_of(trials, 4) == ("4 of 4 trials finished; of the failed trials' configurations run again, "
                                      "1 of 2")
    assert finished_of(trials[:3], 4) == "3 of 4 trials finished"


def test_a_session_that_failures_stopped_with_no_result_says_both(tmp_path):
    """Every trial failed and failure.max_consecutive_failures stopped the session:
    result.best is None, which only a session that completed warned of (audit 30)."""
    from hpsearch.search.api import NoResultWarning, StoppedEarlyWarning, outcome_warnings

    failed = [{"trial": n, "state": "FAILED", "retry_of": ""} for n in range(2)]
    said = outcome_warnings("failures_in_a_row", None, failed, 4, "2 trials in a row failed", tmp_path, None)
    assert [type(w) for w in said] == [NoResultWarning, StoppedEarlyWarning], said
    assert str(said[0]).startswith("no trial finished with a result (2 of 2 failed)"), said
    assert str(said[1]).startswith("2 trials in a row failed; once the cause is fixed, continue the study with "
                                   f"hpsearch.resume('{tmp_path}'), or: hpsearch resume {tmp_path}"), said
    best = {"trial": 0}
    assert [type(w) for w in outcome_warnings("complete", best, failed, 2, "", tmp_path, None)] == []
    assert [type(w) for w in outcome_warnings("complete", None, failed, 2, "", tmp_path, None)] == [NoResultWarning]
    assert [type(w) for w in outcome_warnings("interrupted", None, failed, 4, "", tmp_path, None)] == \
        [StoppedEarlyWarning]


def test_a_sessions_first_check_keeps_its_generators(tmp_path):
    """The first ``check`` of a Python session moved Python's generator (its imports drew
    from it), so a notebook seeded before it drew otherwise after (audit 53)."""
    config = shrunk_example(tmp_path)
    script = textwrap.dedent(f"""
        import json, random
        import hpsearch

        random.seed(5)
        before = random.getstate()
        hpsearch.check(json.loads({json.dumps(config)!r}))
        print("CHECK KEPT", random.getstate() == before, flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert "CHECK KEPT True" in out.stdout, out.stdout + out.stderr[-3000:]


def test_a_verbose_search_leaves_a_logger_the_caller_quiets_meanwhile():
    """A verbose search quiets no logger, and put back one the caller had set to ERROR
    while it ran (audit 54); a quiet search's own quieting is put back."""
    import logging

    from hpsearch.search.caller_state import caller_state_kept

    logger = logging.getLogger("ray.tune")
    before = logger.level
    try:
        with caller_state_kept(loggers_quieted=False):
            logger.setLevel(logging.ERROR)  # the caller's own, while a verbose search runs
        assert logger.level == logging.ERROR
        logger.setLevel(logging.DEBUG)
        with caller_state_kept():
            logger.setLevel(logging.ERROR)  # as a quiet search sets it
        assert logger.level == logging.DEBUG
    finally:
        logger.setLevel(before)


@pytest.mark.e2e
@pytest.mark.slow
def test_a_second_projects_search_in_one_session_trains_its_own_module_of_the_same_name(tmp_path):
    """Two projects with a mymodel.py each, searched one after the other in one Python
    session: the second's trials trained the first's module (the Ray the first search
    started shipped its folder to every worker), and every trial scored the first's
    values, as did load_trial (audit 81)."""
    for project, value in (("a", 0.111), ("b", 0.222)):
        (tmp_path / project).mkdir()
        (tmp_path / project / "mymodel.py").write_text(textwrap.dedent(f"""
            from hpsearch.models.cnn import CNNClassifier

            class Net(CNNClassifier):
                def validation_step(self, batch, batch_idx):
                    self.log("val_acc", {value})
        """))
    config = shrunk_example(tmp_path / "runs", **{"search/num_trials": 1, "scheduler/max_epochs": 1,
                                                  "model/class_path": "mymodel:Net"})
    script = textwrap.dedent(f"""
        import json, os
        import hpsearch

        config = json.loads({json.dumps(config)!r})
        for project in ("a", "b"):
            os.chdir({str(tmp_path)!r} + "/" + project)
            result = hpsearch.run({{**config, "name": project}})
            loaded = hpsearch.load_trial(result.experiment_dir)
            print("PROJECT", project, round(result.best["value"], 3), type(loaded.model).__module__,
                  os.path.dirname(__import__("sys").modules[type(loaded.model).__module__].__file__), flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    said = [line.split()[1:] for line in out.stdout.splitlines() if line.startswith("PROJECT")]
    assert said == [["a", "0.111", "mymodel", str(tmp_path / "a")], ["b", "0.222", "mymodel", str(tmp_path / "b")]], \
        out.stdout + out.stderr[-3000:]
