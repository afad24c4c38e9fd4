"""What a failed or retried trial is said to have failed of: the line trials.csv, status
and the console show, and whether a lost node (not the trial's own fault) was the cause.
The end-to-end cases run in test_fault_tolerance.py and test_cluster.py; here, the error
files and errors Ray writes, in the shapes seen in those runs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hpsearch.search.trial_faults import last_error_line, node_was_lost

TRACEBACK_THEN_LOST_ACTOR = """\
Failure # 1 (occurred at 2026-12-05_03-11-05)
\x1b[36mray::ImplicitFunc.train()\x1b[39m (pid=16899, ip=192.0.2.2, actor_id=52fd, repr=train_trial)
  File "/venv/ray/tune/trainable/trainable.py", line 331, in train
    raise skipped from exception_cause(skipped)
RuntimeError: injected failure (once)
Failure # 2 (occurred at 2026-12-05_03-11-32)
The actor died unexpectedly before finishing this task.
\tclass_name: ImplicitFunc
\tactor_id: 3ea5708f8771f9f7ef3c9d0f04000000
\tnamespace: ce1da761-ac9c-4497-85b1-71a18517caac
The actor is dead because all references to the actor were removed including lineage ref count.
The actor never ran - it was cancelled before it started running.
"""

RANK_UNREACHABLE = """\
Failure # 1 (occurred at 2026-12-05_03-17-40)
\x1b[36mray::ImplicitFunc.train()\x1b[39m (pid=16899, ip=192.0.2.2, actor_id=52fd, repr=tune_with_parameters)
  File "/venv/ray/train/v2/api/data_parallel_trainer.py", line 201, in fit
    raise result.error
ray.train.WorkerGroupError: Training failed due to worker errors:
[Rank 0 Error Snippet]:
A worker health check failed.
Worker info: Worker(
  actor=Actor(RayTrainWorker, 234399b3c5c80e79ec455f2c01000000),
)
The actor 2343 is unavailable: The actor is temporarily unavailable: RpcError: Socket closed rpc_code: 14.
"""


def error_file(tmp_path, text: str) -> SimpleNamespace:
    path = tmp_path / "error.txt"
    path.write_text(text)
    return SimpleNamespace(error_file=str(path))


def test_the_last_failure_is_named_by_its_exception_or_by_rays_own_sentences(tmp_path):
    """An actor Ray lost has no exception line: the last line with a colon used to be
    its indented namespace id, shown as the reason ('retrying ... after namespace: ce1d...')."""
    assert last_error_line(error_file(tmp_path, TRACEBACK_THEN_LOST_ACTOR)) == (
        "The actor died unexpectedly before finishing this task. ... "
        "The actor never ran - it was cancelled before it started running.")
    first_only = TRACEBACK_THEN_LOST_ACTOR.split("Failure # 2")[0]
    assert last_error_line(error_file(tmp_path, first_only)) == "RuntimeError: injected failure (once)"
    assert last_error_line(error_file(tmp_path, RANK_UNREACHABLE)) == (
        "ray.train.WorkerGroupError: Training failed due to worker errors: ... The actor 2343 is unavailable: "
        "The actor is temporarily unavailable: RpcError: Socket closed rpc_code: 14.")


def pickled(tmp_path, error: BaseException) -> SimpleNamespace:
    from ray import cloudpickle  # as Tune writes a trial's error

    path = tmp_path / "error.pkl"
    path.write_bytes(cloudpickle.dumps(error))
    return SimpleNamespace(pickled_error_file=str(path), last_result={})


def distributed_trial_error(rank_failure: Exception):
    """A distributed trial's task error as Ray Train raises it (RayTaskError(WorkerGroupError))."""
    from ray.exceptions import RayTaskError
    from ray.train import WorkerGroupError

    group_error = WorkerGroupError(f"[Rank 1 Error Snippet]:\n{rank_failure}", {1: rank_failure})
    return RayTaskError("ImplicitFunc.train", "Traceback ...", group_error).as_instanceof_cause()


def test_a_distributed_trial_whose_rank_lost_its_node_is_a_node_loss(tmp_path):
    """A DDP trial whose rank's node died ended FAILED, its retries used up: only a
    single-process trial's lost actor was recognised."""
    from ray.exceptions import ActorUnavailableError
    from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError

    unreachable = ActorUnavailableError("The actor is temporarily unavailable: RpcError: Socket closed", None)
    health_check = WorkerHealthCheckFailedError(
        "A worker health check failed.\nWorker info: Worker(\n  metadata=ActorMetadata(node_id='8439446321d8'),\n)",
        failure=unreachable)
    assert node_was_lost(pickled(tmp_path, distributed_trial_error(health_check)))

    # a rank's own error is the trial's fault
    assert not node_was_lost(pickled(tmp_path, distributed_trial_error(ValueError("bad lr"))))
    # as is any task error that is not Ray Train's
    from ray.exceptions import RayTaskError

    assert not node_was_lost(pickled(tmp_path, RayTaskError("f", "Traceback ...", ValueError("x")).as_instanceof_cause()))


def test_a_rank_that_failed_on_its_link_to_a_lost_nodes_rank_is_a_node_loss(tmp_path, monkeypatch):
    """A trial's ranks on two nodes, one lost: the rank on the other node failed first, on
    the broken gloo connection, and the trial was counted as failing of its own fault.
    The nodes its rank 0 reported are asked: by the cluster's view, then their raylets."""
    import socket

    import ray

    from hpsearch.search.outcome import RANK_NODES

    listening = socket.create_server(("127.0.0.1", 0))
    closed = socket.create_server(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    nodes = {"a": ("127.0.0.1", listening.getsockname()[1], True), "b": ("127.0.0.1", listening.getsockname()[1], True)}
    monkeypatch.setattr(ray, "nodes", lambda: [{"NodeID": node, "NodeManagerAddress": address, "NodeManagerPort": port,
                                                "Alive": alive} for node, (address, port, alive) in nodes.items()])
    reset = RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:35242: Connection reset by peer.")

    def trial(ranks_on: str):
        failed = pickled(tmp_path, distributed_trial_error(reset))
        failed.last_result = {RANK_NODES: ranks_on}
        return failed

    try:
        assert not node_was_lost(trial("a,b"))  # both nodes up: the trial's own fault
        nodes["b"] = ("127.0.0.1", listening.getsockname()[1], False)  # dead by the cluster's view
        assert node_was_lost(trial("a,b"))
        assert not node_was_lost(trial("a"))  # the lost node held none of its ranks
        nodes["b"] = ("127.0.0.1", closed_port, True)  # the cluster has not noticed yet; its raylet is gone
        assert node_was_lost(trial("a,b"))
        del nodes["b"]  # and removed from the cluster
        assert node_was_lost(trial("a,b"))
        assert not node_was_lost(trial(""))  # failed before its first report: not known
    finally:
        listening.close()


def test_a_distributed_trial_ended_by_ray_trains_preemption_error_is_a_node_loss(tmp_path):
    """With Ray Train's preemption watcher on (a user may turn it on), a rank's node that Ray
    was told would be reclaimed ends the trial with ``PreemptionError``, not a
    ``WorkerGroupError``: it was counted as the trial's own fault."""
    from ray.exceptions import RayTaskError
    from ray.train import PreemptionError
    from ray.train.v2.api.preemption import PreemptionInfo

    reclaimed = PreemptionError(PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={"8439446321d8": [0, 1]}),
                                drain_timed_out=True)
    assert node_was_lost(pickled(tmp_path, RayTaskError("ImplicitFunc.train", "Traceback ...",
                                                        reclaimed).as_instanceof_cause()))


PROCESS_DIED = (  # Ray 2.60's account of a trial process killed with SIGKILL, on a node that stayed up
    "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit detail: "
    "Worker unexpectedly exits with a connection error code 2. End of file. Some common causes include: (1) the "
    "process was killed by the OOM killer due to high memory usage, (2) ray stop --force was called, or (3) the "
    "worker crashed unexpectedly due to SIGSEGV or another unexpected error. If the process was killed by the "
    "kernel OOM killer (verifiable by checking for OOM in dmesg of the OOMing node), consider enabling resource "
    "isolation via --enable-resource-isolation to prevent node deaths by resource contention and significant "
    "loss of progress by uninformed kernel OOM killing.")
NODE_DIED = "The actor is dead because its node has died. Node Id: 56b97436e67393f15565e024278867700c2bd0ec"


def dead_actor(account: str):
    """A trial's actor that died, as Tune pickles the error: Ray's generic line, the
    actor's details, then the GCS's account of the death."""
    from ray.exceptions import ActorDiedError

    error = ActorDiedError()
    error.error_msg = ("The actor died unexpectedly before finishing this task.\n\tclass_name: ImplicitFunc\n"
                       f"\tactor_id: 553276cd62e1017e34c3fe3301000000\n\tpid: 9657\n\tip: 192.0.2.2\n{account}")
    return error


def test_a_rank_whose_death_ray_train_holds_as_is_lost_its_node(tmp_path):
    """A rank's actor death held as such in Ray Train's WorkerGroupError (not wrapped in a
    failed health check) was the trial's own fault, with its node gone."""
    assert node_was_lost(pickled(tmp_path, distributed_trial_error(dead_actor(NODE_DIED))))
    assert not node_was_lost(pickled(tmp_path, distributed_trial_error(dead_actor(PROCESS_DIED))))


def test_a_trial_process_killed_on_a_live_node_is_the_trials_own_fault_and_said_so(tmp_path):
    """Ray's account of a killed process speaks of nodes ("the OOMing node", "node deaths"),
    and it was taken for a node loss: a trial killed by the OOM killer at every try was
    retried forever, never counted in failure.max_retries."""
    assert not node_was_lost(pickled(tmp_path, dead_actor(PROCESS_DIED)))
    assert node_was_lost(pickled(tmp_path, dead_actor(NODE_DIED)))
    # the line shown for it: what happened in a few words, not Ray's 800 characters cut at 300
    written = error_file(tmp_path, f"Failure # 1 (occurred at 2026-12-05_06-24-08)\n{dead_actor(PROCESS_DIED)}\n")
    in_short = ("its process died without a Python error: killed (by the system's out-of-memory killer, most "
                "often) or crashed in native code (Ray: Worker unexpectedly exits with a connection error code 2. "
                "End of file.)")
    assert last_error_line(written) == in_short
    # a distributed trial's rank killed so: Ray Train's error holds the same account, after the rank's details
    rank_killed = error_file(tmp_path, RANK_UNREACHABLE.replace(
        "The actor 2343 is unavailable: The actor is temporarily unavailable: RpcError: Socket closed rpc_code: 14.\n",
        f"{dead_actor(PROCESS_DIED)}\n"))
    assert last_error_line(rank_killed) == f"ray.train.WorkerGroupError: Training failed due to worker errors: ... " \
                                            f"{in_short}"


@pytest.mark.parametrize("detail, named", [
    # os._exit(4): a code the trial chose is neither a kill nor a native crash (audit 21)
    ("Worker exits unexpectedly. Worker exits with an exit code 4.",
     "it exited with code 4 (os._exit, or an exit in native code or in a thread of its own)"),
    # Ray's handler ends a worker sent SIGTERM with code 1: no exit of its own (audit 32)
    ("Worker exits with an exit code 1. The process receives a SIGTERM.",
     "it was sent SIGTERM (by a person, a script or the machine)"),
], ids=["os._exit", "SIGTERM"])
def test_a_trial_process_that_ended_itself_or_was_sent_sigterm_is_not_said_to_be_killed(tmp_path, detail, named):
    """Such deaths were shown as a process killed by the out-of-memory killer or crashed in
    native code."""
    ended = PROCESS_DIED.replace("Worker unexpectedly exits with a connection error code 2. End of file.", detail)
    written = error_file(tmp_path, f"Failure # 1 (occurred at 2026-12-06_05-50-00)\n{dead_actor(ended)}\n")
    assert last_error_line(written) == f"its process died without a Python error: {named} (Ray: {detail})"
    assert not node_was_lost(pickled(tmp_path, dead_actor(ended)))


def test_node_losses_are_forgiven_a_bounded_number_of_times(tmp_path):
    """A fault taken for a node loss is not counted in max_retries, but never without end."""
    from hpsearch.search.experiment import ExperimentDir
    from hpsearch.search.outcome import EPOCH, GIVE_UP, KNOWN_EPOCHS, TRIAL_NUMBER
    from hpsearch.search.trials_table import TrialsTable
    from hpsearch.search.trial_faults import NODE_LOSSES_FORGIVEN, NODE_LOST, RetryPolicy

    table = TrialsTable("val_acc", "max", [])
    policy = RetryPolicy(table, max_retries=2, exp=ExperimentDir(tmp_path))
    trial = pickled(tmp_path, dead_actor(NODE_DIED))
    trial.config, trial.run_metadata, trial.error_file = {TRIAL_NUMBER: 3}, SimpleNamespace(num_failures=0), None
    for loss in range(1, NODE_LOSSES_FORGIVEN + 1):
        trial.run_metadata.num_failures += 1  # Tune's count, before the callback
        trial.last_result = {EPOCH: loss}  # each time a later epoch: no repeated fault
        policy.on_trial_recover(0, [], trial)
        assert (table.row(3)["node_losses"], table.row(3)["error"]) == (loss, NODE_LOST)
        assert trial.run_metadata.num_failures == 0 and GIVE_UP not in trial.config
        # the retry sends again only the epochs its checkpoint holds beyond these
        assert trial.config[KNOWN_EPOCHS] == loss
    for attempt in (2, 3):
        trial.last_result = {EPOCH: 10 + attempt}
        policy.on_trial_recover(0, [], trial)
        assert table.row(3)["attempts"] == attempt and table.row(3)["node_losses"] == NODE_LOSSES_FORGIVEN
    trial.last_result = {EPOCH: 20}
    policy.on_trial_recover(0, [], trial)
    assert trial.config[GIVE_UP].startswith("failed 3 times: "), trial.config


def test_a_process_killed_twice_at_one_point_is_tried_again(tmp_path):
    """The same error at the same point ends a trial after two tries, since its third would
    run the same code on the same batches; a killed process is not such an error: the
    out-of-memory killer's choice turns on what else runs on the node."""
    from hpsearch.search.experiment import ExperimentDir
    from hpsearch.search.outcome import EPOCH, GIVE_UP, TRIAL_NUMBER
    from hpsearch.search.trials_table import TrialsTable
    from hpsearch.search.trial_faults import RetryPolicy

    table = TrialsTable("val_acc", "max", [])
    policy = RetryPolicy(table, max_retries=2, exp=ExperimentDir(tmp_path))
    trial = pickled(tmp_path, dead_actor(PROCESS_DIED))
    trial.error_file = error_file(tmp_path, f"Failure # 1 (occurred at x)\n{dead_actor(PROCESS_DIED)}\n").error_file
    trial.config, trial.run_metadata, trial.last_result = {TRIAL_NUMBER: 0}, SimpleNamespace(num_failures=1), {EPOCH: 1}
    policy.on_trial_recover(0, [], trial)
    policy.on_trial_recover(0, [], trial)  # killed again at the same point
    assert GIVE_UP not in trial.config and table.row(0)["attempts"] == 3
    policy.on_trial_recover(0, [], trial)
    assert trial.config[GIVE_UP].startswith("failed 3 times: its process died without a Python error"), trial.config


def test_a_fault_repeated_after_the_epoch_a_retry_restored_is_at_the_same_point(tmp_path):
    """An epoch's report follows the write of its checkpoint; a crash or kill in between lost
    it, and the retry's report of that epoch, sent again from the checkpoint, made its
    repeated fault look like one at a later point: a third try, which would fail the same way."""
    from hpsearch.search.experiment import ExperimentDir
    from hpsearch.search.outcome import EPOCH, GIVE_UP, RESTORED, TRIAL_NUMBER
    from hpsearch.search.trials_table import TrialsTable
    from hpsearch.search.trial_faults import RetryPolicy

    table = TrialsTable("val_acc", "max", [])
    policy = RetryPolicy(table, max_retries=2, exp=ExperimentDir(tmp_path))
    trial = error_file(tmp_path, "Failure # 1 (occurred at x)\nTraceback (most recent call last):\n"
                                 "RuntimeError: stuck in epoch 2\n")
    trial.config, trial.run_metadata, trial.last_result = {TRIAL_NUMBER: 0}, SimpleNamespace(num_failures=1), None
    policy.on_trial_recover(0, [], trial)  # its epoch 1 trained and checkpointed, never reported
    assert GIVE_UP not in trial.config and table.row(0)["attempts"] == 2
    trial.last_result = {EPOCH: 1, RESTORED: True}
    policy.on_trial_result(0, [], trial, trial.last_result)  # the retry starts from epoch 1's checkpoint
    policy.on_trial_recover(0, [], trial)  # and meets the same fault in epoch 2
    assert trial.config[GIVE_UP].startswith("failed 2 times the same way, at the same point: RuntimeError: stuck")


def test_a_config_error_raised_in_a_trial_reaches_the_driver_whole_and_its_problem_is_the_reason(tmp_path):
    """A trial whose class fails to import on its worker raises a ConfigError. Ray pickles
    it to the driver, which rebuilt it from its message, one problem per character ("137
    problems: - i - n - v ..."), and the reason shown stopped at the header line."""
    import traceback

    from ray import cloudpickle

    from hpsearch.search.errors import ConfigError

    error = ConfigError.single("data.class_path", "cannot import module 'apkg.data': No module named 'yaml'")
    arrived = cloudpickle.loads(cloudpickle.dumps(error))
    assert arrived.problems == error.problems and str(arrived) == str(error)

    written = error_file(tmp_path, "Failure # 1 (occurred at 2026-12-05_11-25-15)\n"
                                   + "".join(traceback.format_exception(arrived)))
    assert last_error_line(written) == (
        "hpsearch.search.errors.ConfigError: invalid experiment config, 1 problem: "
        "- data.class_path: cannot import module 'apkg.data': No module named 'yaml'")


def test_an_exception_without_a_message_or_of_a_local_class_is_named_the_same_at_every_try(tmp_path):
    """Neither matched the exception line, so Ray's header of the task, with its process
    id, stood for the error: it differed at every try, and RetryPolicy never saw the same
    error twice (three tries of a fault that recurs at the same point, not two; audit 27)."""
    def failure(pid: int, exception: str) -> str:
        return (f"Failure # 1 (occurred at 2026-12-06_10-30-0{pid % 10})\n"
                f"\x1b[36mray::ImplicitFunc.train()\x1b[39m (pid={pid}, ip=10.0.0.1, actor_id=b50{pid}, "
                f"repr=train_trial)\n"
                f'  File "/work/faulty.py", line 12, in training_step\n    raise error\n{exception}\n')

    for exception in ("RuntimeError", "faulty.make.<locals>.DataError: broken batch", "mymod.DataError"):
        first = last_error_line(error_file(tmp_path, failure(18164, exception)))
        again = last_error_line(error_file(tmp_path, failure(18355, exception)))
        assert first == again == exception, (first, again)


CRASHING = """
import sys, time
from pathlib import Path
from hpsearch.search.trial_watch import TrialWatch

def training_step(how):
    if how == "segfault":
        import ctypes
        ctypes.string_at(0)
    time.sleep(60)

watch = TrialWatch(hang_timeout_s=1.0)
with watch.recording(Path(sys.argv[2])):
    watch.callbacks()[0].on_fit_start(None, None)  # the training starts
    training_step(sys.argv[1])
"""


def test_a_trials_process_writes_its_native_crash_or_its_hang_with_the_users_line(tmp_path):
    """Ray says only that the worker's connection ended, for a kill, a segfault, or a hang
    ended by hand (audit 27): the process's own account names the fault and the line."""
    import subprocess
    import sys

    from hpsearch.search.trial_watch import HUNG_EXIT_CODE, crash_account, crash_line

    (tmp_path / "crasher.py").write_text(CRASHING)
    for how, ended_by in (("segfault", -11), ("hang", HUNG_EXIT_CODE)):
        trial_dir = tmp_path / how
        trial_dir.mkdir()
        done = subprocess.run([sys.executable, "crasher.py", how, str(trial_dir / "crash.txt")], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == ended_by, (how, done.returncode, done.stderr)
        line = crash_line(crash_account(trial_dir))
        where = f"(at {tmp_path / 'crasher.py'}:{9 if how == 'segfault' else 10} in training_step)"
        expected = {"segfault": f"its process crashed: Segmentation fault {where}",
                    "hang": f"hung: no batch finished for 1 s (failure.hang_timeout_s) {where}"}[how]
        assert line == expected, (line, crash_account(trial_dir))


def test_a_trial_that_ends_on_its_own_leaves_no_account_and_faulthandler_as_it_was(tmp_path):
    import faulthandler

    from hpsearch.search.trial_watch import TrialWatch

    was = faulthandler.is_enabled()
    with TrialWatch(hang_timeout_s=30).recording(tmp_path / "crash.txt"):
        assert faulthandler.is_enabled()
    assert not (tmp_path / "crash.txt").exists() and faulthandler.is_enabled() == was
    # without a watchdog, no hook at every step of every trial
    assert TrialWatch(hang_timeout_s=None).callbacks() == [] and len(TrialWatch(hang_timeout_s=5).callbacks()) == 1


PEER_CRASHED = """\
Failure # 1 (occurred at 2026-12-07_14-20-00)
\x1b[36mray::ImplicitFunc.train()\x1b[39m (pid=16899, ip=192.0.2.2, actor_id=52fd, repr=tune_with_parameters)
  File "/venv/ray/train/v2/api/data_parallel_trainer.py", line 201, in fit
    raise result.error
ray.train.WorkerGroupError: Training failed due to worker errors:
[Rank 0 Error Snippet]:
RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer \
[127.0.0.1]:{port}. This is typically caused by a remote worker crashing. Check the logs of the remote worker \
before reporting an error. GLHF
"""

RANK_SEGFAULT = """\
Fatal Python error: Segmentation fault

Current thread 0x00007fb698b2a6c0 (most recent call first):
  File "/home/me/userpkg/model.py", line 42 in training_step
  File "/venv/pytorch_lightning/core/module.py", line 1 in step
"""


def test_a_rank_that_crashed_is_the_fault_of_its_distributed_trial_not_its_peers_lost_connection(tmp_path):
    """Every try of a segfault in one rank was named by another rank's error, "Connection
    closed by peer [127.0.0.1]:41882", its port new at each try: the crash went unnamed, and
    a crash repeated at one point got a third try (audit 61)."""
    from hpsearch.search.experiment import ExperimentDir
    from hpsearch.search.outcome import EPOCH, GIVE_UP, TRIAL_NUMBER
    from hpsearch.search.trials_table import TrialsTable
    from hpsearch.search.trial_faults import PEER_ENDED, RetryPolicy

    exp = ExperimentDir(tmp_path)
    trial = error_file(tmp_path, PEER_CRASHED.format(port=41882))
    trial.config, trial.run_metadata, trial.last_result = {TRIAL_NUMBER: 0}, SimpleNamespace(num_failures=1), {EPOCH: 1}
    # no rank left an account (os._exit in a rank): said so, the same at every try (left by audit 61)
    assert last_error_line(trial, exp) == f"{PEER_ENDED} (Connection closed by peer)"
    ended = RetryPolicy(TrialsTable("val_acc", "max", []), max_retries=2, exp=exp)
    ended.on_trial_recover(0, [], trial)
    trial.error_file = error_file(tmp_path, PEER_CRASHED.format(port=9615)).error_file
    ended.on_trial_recover(0, [], trial)  # the same line, but a kill may live on a retry, as one process's may
    assert GIVE_UP not in trial.config and ended.table.row(0)["error"] == f"{PEER_ENDED} (Connection closed by peer)"
    trial.config, trial.run_metadata = {TRIAL_NUMBER: 0}, SimpleNamespace(num_failures=1)
    trial.error_file = error_file(tmp_path, PEER_CRASHED.format(port=41882)).error_file
    exp.trial_dir("trial_0000").mkdir(parents=True)
    (exp.trial_dir("trial_0000") / "crash-rank1.txt").write_text(RANK_SEGFAULT)
    (exp.trial_dir("trial_0000") / "crash.txt").write_text("")  # rank 0's, ended with its worker group
    crashed = "its process crashed: Segmentation fault (at /home/me/userpkg/model.py:42 in training_step)"
    assert last_error_line(trial, exp) == crashed
    policy = RetryPolicy(TrialsTable("val_acc", "max", []), max_retries=2, exp=exp)
    policy.on_trial_recover(0, [], trial)
    trial.error_file = error_file(tmp_path, PEER_CRASHED.format(port=9615)).error_file
    policy.on_trial_recover(0, [], trial)  # the same crash at the same point, another port
    assert trial.config[GIVE_UP].startswith(f"failed 2 times the same way, at the same point: {crashed}")


def test_a_ranks_own_error_is_the_trials_not_the_lost_connection_its_peer_met(tmp_path):
    """Ray Train lists the ranks' errors in rank order, and the last line was taken: a
    rank 0 that raised was named by rank 1's broken connection to it."""
    from hpsearch.search.experiment import ExperimentDir

    both = PEER_CRASHED.format(port=41882).replace("[Rank 0 Error Snippet]:\n", "[Rank 0 Error Snippet]:\n"
                                                   "ValueError: bad shape in rank 0\n[Rank 1 Error Snippet]:\n")
    assert last_error_line(error_file(tmp_path, both)) == "ValueError: bad shape in rank 0"
    # a one-process trial's own lost connection (a model streaming its data) is its error (audit 76)
    own = "Failure # 1 (occurred at x)\nTraceback (most recent call last):\n  File \"m.py\", line 16, in " \
          "training_step\nConnectionResetError: [Errno 104] Connection reset by peer\n"
    trial = error_file(tmp_path, own)
    trial.config = {"hps_trial_number": 0}
    said = last_error_line(trial, ExperimentDir(tmp_path))
    assert said == "ConnectionResetError: [Errno 104] Connection reset by peer", said


def test_a_rank_hung_in_a_collective_is_not_said_to_hang_in_tensorboard(tmp_path):
    """The rank whose watchdog fired first waited in DDP's backward for a rank that slept:
    no frame of the user's in its training thread, and the line named TensorBoard's writer
    thread, which waits in every trial (audit 62); its place then differed at every try."""
    from pathlib import Path

    import tensorboard

    from hpsearch.search.trial_watch import crash_line

    writer = Path(tensorboard.__file__).parent / "summary" / "writer" / "event_file_writer.py"
    torch_file = Path(__import__("torch").__file__).parent / "autograd" / "graph.py"
    ours = Path(crash_line.__code__.co_filename).parent
    account = (
        "hung: no batch finished for 15 s (failure.hang_timeout_s); the stack of every thread, most recent call first:\n"
        "Thread 0x00007f0000000001 (most recent call first):\n"
        f'  File "{writer}", line 269 in _run\n'
        "Thread 0x00007f0000000002 (most recent call first):\n"
        f'  File "{torch_file}", line 829 in _engine_run_backward\n'
        f'  File "{ours / "trial.py"}", line 250 in fit_trial\n'
        "Current thread 0x00007f0000000003 (most recent call first):\n"
        f'  File "{ours / "trial_watch.py"}", line 120 in _watch\n')
    assert crash_line(account) == "hung: no batch finished for 15 s (failure.hang_timeout_s)"


def test_a_failed_evaluation_names_the_file_a_loader_worker_could_not_read(tmp_path):
    """torch raises a worker's error again as "Caught UnreadableDataFile in DataLoader
    worker process 0.", the file named only in the traceback file (audit 71)."""
    from torch.utils.data import DataLoader, Dataset

    from hpsearch.search.errors import UnreadableDataFile
    from hpsearch.search.experiment import ExperimentDir
    from hpsearch.search.results import _evaluation_failure

    class BadFile(Dataset):
        def __len__(self) -> int:
            return 2

        def __getitem__(self, index):
            raise UnreadableDataFile("cannot decode image file 'imgs/dog/broken.jpg': OSError: truncated")

    for workers in (1, 0):
        with pytest.raises(UnreadableDataFile) as caught:
            next(iter(DataLoader(BadFile(), num_workers=workers)))
        said = _evaluation_failure(caught.value, ExperimentDir(tmp_path))
        assert said.startswith("UnreadableDataFile: cannot decode image file 'imgs/dog/broken.jpg': OSError: "
                               "truncated"), said

    class TwoLines(Dataset):  # a message over two lines was cut to its last (audit 72)
        def __len__(self) -> int:
            return 2

        def __getitem__(self, index):
            raise ValueError("cannot decode 'a/b.png'\nsecond line")

    from hpsearch.search.errors import own_line

    with pytest.raises(ValueError) as caught:
        next(iter(DataLoader(TwoLines(), num_workers=1)))
    assert own_line(caught.value) == "cannot decode 'a/b.png' second line"
