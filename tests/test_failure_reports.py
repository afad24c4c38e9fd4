"""What a failed or retried trial is said to have failed of: the line trials.csv, status
and the console show, and whether a lost node (not the trial's own fault) was the cause.
The end-to-end cases run in test_fault_tolerance.py and test_cluster.py; here, the error
files and errors Ray writes, in the shapes seen in those runs."""

from __future__ import annotations

from types import SimpleNamespace

from hpsearch.search.tune_callbacks import _last_error_line, node_was_lost

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
    assert _last_error_line(error_file(tmp_path, TRACEBACK_THEN_LOST_ACTOR)) == (
        "The actor died unexpectedly before finishing this task. ... "
        "The actor never ran - it was cancelled before it started running.")
    first_only = TRACEBACK_THEN_LOST_ACTOR.split("Failure # 2")[0]
    assert _last_error_line(error_file(tmp_path, first_only)) == "RuntimeError: injected failure (once)"
    assert _last_error_line(error_file(tmp_path, RANK_UNREACHABLE)) == (
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
