"""One search session on Ray: start or join Ray, check resources, run the Tuner.

A study may take several sessions (``run``, then ``resume`` after an interruption).
The Optuna journal is the study's memory between them; each session is a fresh Ray
Tune experiment under ``EXP_DIR/tune/session-N``, so nothing depends on unpickling
Ray's own state across versions or machines.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import threading
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Iterator, Mapping

from .caller_state import QUIET_LEVEL, QUIETED_LOGGERS
from .cluster_join import cluster_address, ensure_cluster_answers, join_error
from .components import DRIVER_HOST_ENV, user_code_roots
from .config import ExperimentConfig
from .errors import counted, warn_user
from .experiment import ExperimentDir
from .local_ray_env import local_ray_variables, refuse_paths_ray_cannot_encode
from .outcome import (RUNNING, SESSION_COMPLETE, SESSION_DISK_FULL, SESSION_FAILURES_IN_A_ROW, SESSION_INTERRUPTED,
                      SESSION_TIME_BUDGET, TRAINING_SEED, TRIAL_NUMBER, PruneLog)
from .storage import Mirror
from .tensorboard_layout import backfill_trial_sessions
from .trials_table import TrialsTable

# Ray reads these in the driver and in every worker: no per-trial CSV/JSON/TensorBoard
# loggers of its own (hpsearch writes TensorBoard where users look for it), and trials
# keep the working directory they started in, so relative paths in a config resolve.
RAY_ENV = {"TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1", "RAY_CHDIR_TO_TRIAL_DIR": "0", "RAY_AIR_NEW_OUTPUT": "0",
           "RAY_TRAIN_V2_ENABLED": "1",
           # A trial that ends on a fault reports once without the metric (see trial.py).
           "TUNE_DISABLE_STRICT_METRIC_CHECKING": "1"}

# What trials.csv says of a trial that was running when its session ended.
PAUSE_REASONS = {SESSION_TIME_BUDGET: "time budget reached", SESSION_INTERRUPTED: "search stopped",
                 SESSION_FAILURES_IN_A_ROW: "search stopped: trials kept failing", SESSION_COMPLETE: "session ended",
                 SESSION_DISK_FULL: "search stopped: a trial's disk filled"}

# Defaults that a user's own environment overrides. Ray Train checks on a distributed
# trial's workers this often (its default: every 2 s), and only then sees that they
# finished: each DDP trial here ended 5.1-6.6 s after its last report at 2 s, and
# 0.6-1.5 s after it at 0.25 s (README, Performance). A check is one small task per worker.
#
# Ray Train's preemption watcher is off: a new process for every distributed trial, which
# polls for draining nodes only to tell a training function that asks
# (``ray.train.get_preemption_info``); hpsearch's does not, and retries a trial whose node
# was lost on its own. Its start competed with the ranks' imports for the CPUs.
RAY_DEFAULTS = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.25", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}
# Starting a local Ray, Ray warns at every start that token authentication is on (its
# default, which hpsearch keeps; nothing else connects to that private Ray). Joining a
# cluster, what it logs there is left as is.
RAY_TOKEN_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"
# Ray's warning when ray.init runs outside the main thread (a web app's or a notebook
# tool's search): true, and nothing the user can act on; the search stops as it should.
RAY_NO_SIGTERM_HANDLER_NOTICE = ("ray._private.worker", "SIGTERM handler is not set")
# Ray Tune's warning at the end of every session, as it builds the results it returns,
# which hpsearch does not use: with Tune's own result files off (hpsearch keeps trials.csv,
# TensorBoard and the journal), it says that each trial's results were not found (audit 30).
TUNE_NO_RESULT_FILES_NOTICE = ("ray.tune.analysis.experiment_analysis", "Failed to fetch metrics")
# ... and its ERROR line listing the trials that did not end as TERMINATED, Tune's internal
# trial objects, when any failed: hpsearch's display has named each one (audit 32)
TUNE_INCOMPLETE_NOTICE = ("ray.tune.tune", "Trials did not complete")
# Ray's ERROR with the whole traceback of a trial's error that no one fetched, when a
# session stopped (failures in a row, a time budget) as a trial's try failed: hpsearch
# names that failure in a line and keeps its traceback in error.txt (audit 56: about 80
# lines on a console that promises one line a failure). ``-v`` keeps it.
RAY_UNHANDLED_ERROR_NOTICE = ("ray._private.worker", "Unhandled error")


def ray_settings() -> dict[str, str]:
    """The variables every Ray process of a search gets: ``RAY_ENV``, and ``RAY_DEFAULTS``
    where this process's environment does not set them (on an autoscaling cluster, a
    distributed trial also waits longer for its nodes: ``autoscaling``)."""
    from .autoscaling import WORKER_GROUP_START_TIMEOUT_S, addable_nodes

    defaults = dict(RAY_DEFAULTS)
    if addable_nodes():
        defaults["RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"] = str(WORKER_GROUP_START_TIMEOUT_S)
    return {**{name: os.environ.get(name, value) for name, value in defaults.items()}, **RAY_ENV,
            DRIVER_HOST_ENV: socket.gethostname()}  # see components.shipped_code_first


@dataclass(frozen=True)
class SearchRay:
    """The Ray that a search runs on, as ``start_ray`` found or started it."""

    started: bool  # by this search: a local Ray, or this process's connection to a cluster
    # A local Ray that this search started: the environment its processes inherited (they
    # are this process's children); None for any other Ray.
    local_environment: Mapping[str, str] | None = None
    # This process's values of the variables ``ray_settings`` set (None: unset), given back
    # when the search ends (``ray_for_search``).
    environment_before: Mapping[str, str | None] = field(default_factory=dict)


@contextmanager
def ray_for_search(config: ExperimentConfig, address: str | None, verbose: bool) -> Iterator[SearchRay]:
    """Ray for one search (see ``start_ray``). A Ray that the search started stays up for
    the next search of this Python session, except when the search ran in a thread other
    than the main one: there it is shut down, because Ray's exit handler, run from the main
    thread at the interpreter's end, then waited 60 s for its GCS and exited with status 1."""
    search_ray = start_ray(config, address, verbose)
    try:
        with _message_dropped(RAY_UNHANDLED_ERROR_NOTICE, quiet=not verbose):
            yield search_ray
    finally:
        # The user's own Ray Tune work later in this Python session gets its environment
        # back: with hpsearch's settings left in place, a plain Tuner run after
        # ``hpsearch.run`` wrote none of its result files (audit 22).
        _restore_environment(search_ray.environment_before)
        if search_ray.started and threading.current_thread() is not threading.main_thread():
            shutdown_ray()


def start_ray(config: ExperimentConfig, address: str | None, verbose: bool) -> SearchRay:
    """Join the cluster at ``address`` (or at ``RAY_ADDRESS``, which ``ray job submit``
    sets), else start a private local Ray: never an unrelated Ray that happens to run on
    this machine. Ship the user's code to the workers. A Ray this process had already
    started (the user's own ``ray.init``, an earlier search) is used as it is, with Ray
    Tune's logs quieted all the same."""
    import ray

    settings = ray_settings()  # the driver's Ray Tune reads them too
    environment_before = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    shipping = _code_shipped(config)
    if ray.is_initialized() and _ray_started_here.ships_other_code(shipping):
        # A Ray an earlier search of this session started ships that search's code, from its
        # folder, to every worker: a second project's trials trained the first project's
        # module of the same name (audit 81). A new one ships this search's.
        shutdown_ray()
    if ray.is_initialized():
        _quiet_tune_logs(verbose)
        if address:
            warn_user(f"address={address!r} is ignored: this process already runs Ray (ray.init was called); "
                      "the search uses that one")
        return SearchRay(started=False, environment_before=environment_before)
    refuse_paths_ray_cannot_encode([os.getcwd(), *shipping[1]])
    target = cluster_address(address) or "local"
    if target != "local":
        ensure_cluster_answers(target)
    runtime_env = worker_runtime_env(list(shipping[1]), joins_cluster=target != "local")
    local_environment = None
    # A local Ray's processes also inherit Ray Tune's trial settings (see trial_actors_inherit_tune_env).
    inherited: dict[str, str | None] = {}
    if target == "local":
        inherited = {"RAY_ADDRESS": "local", **(tune_trial_env() or {}), **local_ray_variables()}
        if "RAY_AUTH_TOKEN" in inherited:  # the driver's own connections to that Ray need it too, while it is up
            os.environ["RAY_AUTH_TOKEN"] = _ray_started_here.own_token = inherited.pop("RAY_AUTH_TOKEN")
    else:
        _ray_started_here.drop_own_token()  # a cluster's token is its own
    with _logger_quiet(RAY_TOKEN_NOTICE_LOGGER, target == "local" and not verbose), \
            _message_dropped(RAY_NO_SIGTERM_HANDLER_NOTICE, quiet=not verbose), \
            _inherited_by_local_ray(inherited), local_ray_without_idle_services(target == "local", verbose), \
            _local_ray_in_its_own_session(target == "local"), _stop_signals_held_until_ray_started():
        if target == "local":
            local_environment = dict(os.environ)
        try:
            ray.init(
                address=target,
                runtime_env=runtime_env or None,
                include_dashboard=False,
                logging_level=logging.INFO if verbose else logging.WARNING,
                log_to_driver=verbose,
                configure_logging=True,
            )
        except (ConnectionError, RuntimeError, ray.exceptions.RayError) as exc:  # RayError: AuthenticationError
            if target == "local":
                raise
            raise join_error(target, exc) from exc
    _quiet_tune_logs(verbose)
    _ray_started_here.record(shipping)
    return SearchRay(started=True, local_environment=local_environment, environment_before=environment_before)


def _code_shipped(config: ExperimentConfig) -> tuple[str, tuple[str, ...]]:
    """What a Ray started now gives its workers to import from: the driver's folder (which
    Ray puts first on their path) and the user's code shipped (``user_code_roots``)."""
    return os.getcwd(), tuple(user_code_roots(config))


@dataclass
class _StartedRay:
    """The Ray a search of this process started, by its node and job (a new local Ray has a
    new node, a new connection to a cluster a new job), with the code it ships: Ray is one
    per process, so this record is too."""

    connection: tuple[str, str] | None = None
    shipping: tuple[str, tuple[str, ...]] | None = None
    own_token: str | None = None  # the token a local Ray was given (``local_ray_variables``), while it is up

    def drop_own_token(self) -> None:
        """Take the token this process gave its local Ray out of its environment: sent to
        another Ray (a cluster joined later in the session), it was refused as this
        process's (audit 84)."""
        if self.own_token is not None and os.environ.get("RAY_AUTH_TOKEN") == self.own_token:
            del os.environ["RAY_AUTH_TOKEN"]
        self.own_token = None

    def record(self, shipping: tuple[str, tuple[str, ...]]) -> None:
        self.connection, self.shipping = _connection(), shipping

    def ships_other_code(self, shipping: tuple[str, tuple[str, ...]]) -> bool:
        """Whether the running Ray is one a search started, shipping other code (a Ray
        the user started is theirs, and used as it is)."""
        return self.connection == _connection() and self.shipping != shipping


def _connection() -> tuple[str, str]:
    import ray

    context = ray.get_runtime_context()
    return context.get_node_id(), context.get_job_id()


_ray_started_here = _StartedRay()


def tune_trial_env() -> dict[str, str] | None:
    """The variables Ray Tune would now set in every trial actor through a runtime env of
    its own: ``PL_DISABLE_FORK``, and AWS credentials and Ray Train settings copied from
    this process's environment. None if this Ray does not say (another version)."""
    try:
        from ray.tune.execution import class_cache

        copied = {name: os.environ[name] for name in class_cache.ENV_VARS_TO_PROPAGATE if name in os.environ}
        return {**class_cache.DEFAULT_ENV_VARS, **copied}
    except (ImportError, AttributeError):
        return None


@contextmanager
def trial_actors_inherit_tune_env(local_environment: Mapping[str, str] | None) -> Iterator[None]:
    """On a local Ray that this search started, whose processes inherited every variable
    Ray Tune would set in a trial actor (``tune_trial_env``, the same values), Tune's trial
    actors get no runtime env of their own while the search runs. With one, Ray starts a
    new worker process for each trial actor, through its runtime-env agent, and leaves
    idle the workers it started with itself: a search's first two trials started four
    workers rather than two, and its first result came about 1 s later (README, Performance)."""
    tune_env = tune_trial_env()
    if (tune_env is None or local_environment is None
            or any(local_environment.get(name) != value for name, value in tune_env.items())):
        yield
        return
    from ray.tune.execution import class_cache

    shipped = class_cache.DEFAULT_ENV_VARS, class_cache.ENV_VARS_TO_PROPAGATE
    class_cache.DEFAULT_ENV_VARS, class_cache.ENV_VARS_TO_PROPAGATE = {}, set()
    try:
        yield
    finally:
        class_cache.DEFAULT_ENV_VARS, class_cache.ENV_VARS_TO_PROPAGATE = shipped


@contextmanager
def _stop_signals_held_until_ray_started() -> Iterator[None]:
    """A Ctrl+C or SIGTERM while ``ray.init`` starts Ray is acted on once it has: landing
    inside it, a Ctrl+C left the half-started Ray's GCS, autoscaler monitor and dashboard
    running (about 250 MB), which ``ray.shutdown()`` did not stop, and a Python session
    kept them until it ended (its next search started a second Ray beside them). So the
    signal is acted on once Ray has started: a Ctrl+C shuts the new Ray down and raises
    ``KeyboardInterrupt``; a SIGTERM goes to the handler the process has from then on, and
    Ray is shut down if that ends the process or raises (a handler that only returns, a
    user's that logs it, leaves the search going).

    That handler: ``ray.init`` sets its own at its start, which exits with status 15. It
    ended a command given SIGTERM during Ray's start with 15, silently, and left Ray's
    agents running (audit 37), and replaced a handler the process had set for good (the
    command line's, which takes SIGTERM as a Ctrl+C; a user's own: audit 30). So Ray's is
    kept from it while Ray starts, and set after only where the process had none."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    import ray._private.utils as ray_utils

    heard: list[int] = []
    rays_handler: list[Any] = []

    def hold(signum, frame) -> None:
        heard.append(signum)

    previous_int, previous_term = signal.signal(signal.SIGINT, hold), signal.signal(signal.SIGTERM, hold)
    setter = getattr(ray_utils, "set_sigterm_handler", None)
    if setter is not None:
        ray_utils.set_sigterm_handler = rays_handler.append
    try:
        yield
    finally:
        if setter is not None:
            ray_utils.set_sigterm_handler = setter
        signal.signal(signal.SIGINT, previous_int if previous_int is not None else signal.default_int_handler)
        signal.signal(signal.SIGTERM, previous_term if callable(previous_term) or not rays_handler
                      else rays_handler[-1])
    if not heard:
        return
    if heard[0] == signal.SIGINT:
        shutdown_ray()
        raise KeyboardInterrupt
    handler = signal.getsignal(signal.SIGTERM)  # the process's, or Ray's where it had none
    if handler == signal.SIG_IGN:
        return
    if not callable(handler):  # the default action, which ends the process: Ray first
        shutdown_ray()
        signal.raise_signal(signal.SIGTERM)
        return
    try:
        handler(signal.SIGTERM, None)
    except BaseException:  # it stops the search (a Ctrl+C, Ray's exit): Ray stops first
        shutdown_ray()
        raise
    # A handler that returned (a user's that logs it) keeps the search going, with its Ray:
    # Ray had been shut down, and the search went on without one (audit 38).


def shutdown_ray() -> None:
    """``ray.shutdown()``, and the process's SIGTERM handler set again: Ray's shutdown leaves
    its own failure handler in place below Python's, so a SIGTERM then killed the process
    with a stack dump and Python's handler (the command line's, a user's) never ran."""
    import ray

    ray.shutdown()
    _ray_started_here.drop_own_token()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.getsignal(signal.SIGTERM))


@contextmanager
def local_ray_without_idle_services(local: bool, verbose: bool) -> Iterator[None]:
    """A local Ray that the search starts comes up without three processes that serve it
    nothing, and that ``ray.init`` has no argument to leave out:

    - the dashboard's server, which with ``include_dashboard=False`` only reports Ray's
      usage statistics, and whose start ``ray.init`` waits for (1-2 s here);
    - the autoscaler's monitor: a local Ray has no nodes to add;
    - the log monitor, which streams the workers' output to a driver that asks for none
      (``log_to_driver`` is off, except with ``-v``, which keeps it).

    ``ray.init`` took 2.0 s instead of 4.1 s on two CPUs, and Ray's processes about 2 CPU
    seconds less (README, Performance). A Ray whose internals differ starts whole."""
    import inspect

    from ray._private import node, parameter

    full_params = parameter.RayParams
    try:
        accepted = inspect.signature(full_params).parameters
    except (TypeError, ValueError):
        accepted = {}
    if not local or not {"no_monitor", "include_log_monitor"} <= accepted.keys() \
            or not callable(getattr(node.Node, "start_api_server", None)):
        yield
        return

    class LeanRayParams(full_params):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("no_monitor", True)
            if not verbose:
                kwargs.setdefault("include_log_monitor", False)
            super().__init__(*args, **kwargs)

    start_api_server = node.Node.start_api_server
    parameter.RayParams = LeanRayParams
    node.Node.start_api_server = lambda self, **kwargs: None
    try:
        yield
    finally:
        parameter.RayParams = full_params
        node.Node.start_api_server = start_api_server


@contextmanager
def _local_ray_in_its_own_session(local: bool) -> Iterator[None]:
    """While ``ray.init`` starts a local Ray, its processes (GCS, raylet, and through the
    raylet the agents and workers) start in a session of their own, out of this process's
    group. A stop sent to the group (``timeout``, ``kill -- -PGID``, a job script's
    ``kill 0``) then reaches only the driver, which stops the search gracefully and shuts
    its Ray down. In the driver's group, that SIGTERM killed the GCS under the driver: the
    search hung 60 s and died with its session left "running". Ray's processes still die
    with the driver (Ray sets them to on Linux) and ignore Ctrl+C as before."""
    if not local:
        yield
        return
    from ray._private import services

    ray_popen = services.ConsolePopen

    class OwnSessionPopen(ray_popen):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("start_new_session", True)
            super().__init__(*args, **kwargs)

    services.ConsolePopen = OwnSessionPopen
    try:
        yield
    finally:
        services.ConsolePopen = ray_popen


@contextmanager
def _inherited_by_local_ray(variables: dict[str, str | None]) -> Iterator[None]:
    """Set while ``ray.init`` starts a local Ray, whose processes keep the environment they
    started with; this process's is restored after.

    ``RAY_ADDRESS=local``: Ray's state API, called with no address inside a worker, finds
    its cluster from ``RAY_ADDRESS``, else from ``/tmp/ray/ray_current_cluster``, which
    names the last Ray that ``ray start`` began on this machine: an unrelated one. Ray
    Train's placement-group cleaner asks it whether a distributed trial's controller is
    alive, is told "no such actor", and removes the trial's reservation: the ranks die
    (a DDP trial failed so in a test run beside another Ray). With ``local``, the state
    API finds no other cluster by that file, and answers nothing rather than wrongly."""
    previous = {name: os.environ.get(name) for name in variables}
    _restore_environment(variables)  # set, and unset those that are None (see local_ray_variables)
    try:
        yield
    finally:
        _restore_environment(previous)


def _restore_environment(previous: Mapping[str, str | None]) -> None:
    """Give variables back their ``previous`` values, unsetting those that were unset (None)."""
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _quiet_tune_logs(verbose: bool) -> None:
    """Ray Tune's INFO and WARNING lines stay off the console unless ``verbose``: hpsearch's
    own progress display says what happens (the failed-metrics-fetch warning at a search's
    end, for one, is about files hpsearch does not use)."""
    if not verbose:  # caller_state_kept puts them back after the search
        for name in QUIETED_LOGGERS:
            logging.getLogger(name).setLevel(QUIET_LEVEL)


@contextmanager
def _logger_quiet(name: str, quiet: bool) -> Iterator[None]:
    """Below ERROR, the named logger says nothing inside the block (when ``quiet``)."""
    logger = logging.getLogger(name)
    previous = logger.level
    if quiet:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(previous)


class _DropMessage(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


@contextmanager
def _tune_staging_removed(session: str) -> Iterator[None]:
    """Ray Tune stages its run's files on the driver, under Ray's session directory
    (``/tmp/ray/session_*/artifacts/<time>/<session>``), and copies them to
    ``EXP_DIR/tune/<session>``; the staged copy stayed after the run, 20-25 MB for every
    600 trials, in /tmp (audit 40). It is removed once the run is over: nothing reads it,
    and the study keeps its copy. Only the folder this run made goes (a Python session's
    earlier searches may have staged one of the same name)."""
    try:
        from ray.train.constants import _get_ray_train_session_dir

        staging = Path(_get_ray_train_session_dir())
        before = set(staging.glob(f"*/{session}"))
    except Exception:  # noqa: BLE001 - a private Ray API: without it the copy stays, as Ray leaves it
        yield
        return
    try:
        yield
    finally:
        for made in set(staging.glob(f"*/{session}")) - before:
            shutil.rmtree(made, ignore_errors=True)
            with suppress(OSError):  # its run's folder, once empty
                made.parent.rmdir()


@contextmanager
def _message_dropped(notice: tuple[str, str], quiet: bool) -> Iterator[None]:
    """The named logger's lines that start with the notice's text are dropped inside the
    block (when ``quiet``); its other lines still appear."""
    logger, dropped = logging.getLogger(notice[0]), _DropMessage(notice[1])
    if quiet:
        logger.addFilter(dropped)
    try:
        yield
    finally:
        logger.removeFilter(dropped)


def worker_runtime_env(user_code: list[str], joins_cluster: bool) -> dict:
    """What Ray must set up in every worker: the user's modules (``py_modules``), and on a
    cluster started elsewhere the variables of ``ray_settings``.

    A local Ray's processes are children of this driver and inherit its environment, so
    there the variables need no runtime environment: with one, every new worker goes
    through Ray's runtime-env agent first, which delayed two trial workers' start by
    0.8 s here (1.17 s against 0.37 s, median of 5)."""
    runtime_env: dict = {}
    if joins_cluster:
        runtime_env["env_vars"] = ray_settings()
    if user_code:
        runtime_env["py_modules"] = list(user_code)
    return runtime_env


def plan_concurrency(config: ExperimentConfig, nodes: list[dict], addable: list[dict] = (),
                     place: str = "the cluster") -> int:
    """Concurrent trials: the file's ``max_concurrent``, lowered to what ``place`` holds,
    at full scale when it autoscales (``addable``: the worker nodes its autoscaler may add,
    see ``autoscaling``; trials wait for them, which is what makes it add them).

    Raises ``ResourceError`` if not even one trial fits. The cap matters for distributed
    trials: their Tune driver holds no CPU, so Tune alone would start more trials than
    the cluster has workers for, and their worker groups would wait, then time out.
    """
    from .autoscaling import head_nodes
    from .errors import ResourceError
    from .resources import concurrent_trials_capacity

    try:
        now = concurrent_trials_capacity(config.resources, nodes)
    except ResourceError as too_big_now:
        now, refusal = 0, too_big_now
    at_full_scale = 0
    if addable:
        try:
            at_full_scale = concurrent_trials_capacity(config.resources, head_nodes(nodes) + list(addable))
        except ResourceError:
            pass
    if now == at_full_scale == 0:
        if addable:
            raise ResourceError(f"{refusal}; nor do the {len(addable)} nodes the cluster's autoscaler may add "
                                f"hold one (see available_node_types in its launcher config)") from None
        raise refusal
    capacity = max(now, at_full_scale)
    if at_full_scale > now:
        warn_user(f"the cluster holds {counted(now, 'trial')} of this size now and {at_full_scale} once its "
                  f"autoscaler has added nodes; trials wait for them")
    if capacity < config.search.max_concurrent:
        warn_user(f"search.max_concurrent={config.search.max_concurrent} but {place} holds "
                  f"{counted(capacity, 'trial')} of this size at once; running {capacity} at a time")
    return min(capacity, config.search.max_concurrent)


def _new_tune_session(tune_dir: Path) -> str:
    """The name of this session's folder of Ray Tune's own files, after removing all but
    the last session's: nothing reads them (resume never unpickles Ray's state), and each
    session's, about 27 KB a trial, was half of a large study's directory (112 of 225 MB
    at 3,300 trials over 11 sessions: audit 20, D5). A session that ends as hpsearch ends
    one removes its own (``run_session``); one that raised keeps it, for a look at a
    session that went wrong, so the folder left is the newest such session's."""
    tune_dir.mkdir(exist_ok=True)
    numbers = sorted(int(path.name.split("-", 1)[1]) for path in tune_dir.glob("session-*")
                     if path.name.split("-", 1)[1].isdigit())
    for number in numbers[:-1]:
        shutil.rmtree(tune_dir / f"session-{number}", ignore_errors=True)
    return f"session-{(numbers[-1] if numbers else 0) + 1}"


def run_session(config: ExperimentConfig, exp: ExperimentDir, verbose: bool, concurrency: int,
                extra_callbacks: list | None = None, mirror: Mirror | None = None,
                local_environment: Mapping[str, str] | None = None) -> str:
    """Run trials until the study is complete, the time budget is spent or the user
    interrupts, and say which (a ``SESSION_*`` outcome). Trials still running then are
    PAUSED in trials.csv, saying why; resume continues them.

    Trials get the study's location: its URI when it has one (they sync their own files
    through it), else its directory. ``local_environment``: see ``SearchRay``."""
    from ray import tune
    from ray.tune.stopper import CombinedStopper

    from .scheduler import StudyASHA, make_scheduler
    from .searcher import OptunaSearcher
    from .distributed import RankZeroLastReports, driver_resources, train_distributed_trial
    from .trial import train_trial
    from .checkpoint_retention import DropResumeCheckpoints, KeepBestCheckpoints
    from .trial_faults import KeepTracebacks, RetryPolicy, quiet_trial_tracebacks
    from .tune_callbacks import (DiskFilled, FailuresInARow, FinishedTrials, FreeRankReservations, ProgressDisplay,
                                 PushStudyFiles, TensorBoardSessions, TimeBudget, TrialsTableRecorder)

    prunes = PruneLog()
    searcher = OptunaSearcher(config, exp.root, prunes)
    scheduler = make_scheduler(config, prunes)
    if isinstance(scheduler, StudyASHA):
        scheduler.seed_rungs(searcher.history())
    table = TrialsTable.load(exp.trials_csv, config.metric, config.mode, list(config.space))
    # trials.csv may lag the study (a crash or full disk between the two writes): the
    # study's finished trials win. The study may lag trials.csv too, by a torn last record.
    searcher.settle_finished(table.rows)
    searcher.epochs_recorded(table.rows)
    finished = searcher.finished_trials()
    for fields in finished:
        table.row(fields["trial"]).update(fields)
    backfill_trial_sessions(exp.tensorboard_dir, config, finished)
    limit = config.failure.max_consecutive_failures
    failing = FailuresInARow(table, limit) if limit else None
    disk_filled = DiskFilled()
    # A distributed trial's ranks go first, before its files are touched.
    last_reports = RankZeroLastReports() if config.resources.distributed else None
    ranks = [FreeRankReservations(last_reports)] if last_reports is not None else []
    # DiskFilled before the trials table: that write may meet the full disk too.
    callbacks = [*ranks, disk_filled, DropResumeCheckpoints(exp, mirror), KeepTracebacks(exp),
                 RetryPolicy(table, config.failure.max_retries, exp),
                 TrialsTableRecorder(table, exp.trials_csv, prunes, planned=planned_columns(config)),
                 *([failing] if failing is not None else []),
                 *([KeepBestCheckpoints(config.search.keep_checkpoints, table, exp, mirror)]
                   if config.search.keep_checkpoints else []),
                 TensorBoardSessions(config, table, exp.tensorboard_dir),
                 *([PushStudyFiles(mirror)] if mirror is not None else []),
                 ProgressDisplay(table, searcher.trial_limit, exp, config.search.time_budget_s),
                 *(extra_callbacks or [])]
    decisions = getattr(scheduler, "decisions", None)  # ASHA's, for distributed trials' ranks
    if config.resources.distributed:
        function = partial(train_distributed_trial, decisions=decisions, last_reports=last_reports)
        resources = driver_resources()
    else:
        function = train_trial
        resources = {"cpu": config.resources.cpus_per_trial, "gpu": config.resources.gpus_per_trial}
    trainable = tune.with_resources(
        tune.with_parameters(function, experiment=config.model_dump(mode="json"),
                             experiment_dir=mirror.uri if mirror is not None else str(exp.root)),
        resources,
    )
    budget = TimeBudget(config.search.time_budget_s) if config.search.time_budget_s else None
    session = _new_tune_session(exp.tune_dir)
    tuner = tune.Tuner(
        trainable,
        tune_config=tune.TuneConfig(
            search_alg=searcher,
            scheduler=scheduler,
            num_samples=-1,  # the searcher says when the study has all its trials
            max_concurrent_trials=concurrency,
            # One warm worker process serves many short trials (distributed trials start
            # a worker group each, so there is nothing to reuse).
            reuse_actors=not config.resources.distributed,
        ),
        run_config=tune.RunConfig(
            name=session,
            storage_path=str(exp.tune_dir),
            callbacks=callbacks,
            stop=CombinedStopper(FinishedTrials(), disk_filled, *(s for s in (budget, failing) if s is not None)),
            verbose=2 if verbose else 0,
            # Tune's own choice in a notebook clears the cell's output as the search starts:
            # the warnings just given, and every earlier search's lines in the cell
            progress_reporter=tune.CLIReporter(),
            # One more than max_retries: RetryPolicy ends a trial whose own faults used them up,
            # and keeps node losses off the count.
            failure_config=tune.FailureConfig(max_failures=config.failure.max_retries + 1),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),
        ),
    )
    outcome = SESSION_INTERRUPTED
    quiet_trial_tracebacks(not verbose)
    try:
        with trial_actors_inherit_tune_env(local_environment), _message_dropped(TUNE_NO_RESULT_FILES_NOTICE, True), \
                _message_dropped(TUNE_INCOMPLETE_NOTICE, True), _tune_staging_removed(session):
            tuner.fit()
        outcome = _session_outcome(searcher.is_complete(), budget is not None and budget.reached,
                                   failing is not None and failing.reached, disk_filled.reached)
        # Ray Tune's files of a session that ended as hpsearch ends one: Tune's experiment
        # state, about 50 KB a trial, was the largest part of large studies (40 of 85 MB at
        # 700 trials), and nothing reads it (audit 83). A session that raised keeps its own.
        shutil.rmtree(exp.tune_dir / session, ignore_errors=True)
    finally:
        quiet_trial_tracebacks(False)
        if decisions is not None:
            decisions.clear()
        if last_reports is not None:
            last_reports.clear()
        if pause_the_unfinished(table, searcher, PAUSE_REASONS[outcome]):
            table.save(exp.trials_csv)
    return outcome


def pause_the_unfinished(table: TrialsTable, searcher, reason: str) -> int:
    """Mark the trials a session leaves unfinished PAUSED in ``table``, saying why: those
    that were running, and those sampled but not yet started, which had no row and were
    missing from trials.csv, status and the count of paused trials (audit 22). How many."""
    for number, params in searcher.handed_out_without_a_row(table.rows).items():
        table.row(number).update(state=RUNNING, **params)
    return table.pause_running(reason)


def planned_columns(config: ExperimentConfig):
    """A trial's trials.csv columns known from its params before it reports: the device,
    precision (a CPU trial's as it will run it; a GPU without bf16 may change a GPU
    trial's, which its reports then say), strategy and world size."""
    from .devices import resolve_precision, without_auto
    from .distributed import strategy_name
    from .seeding import training_seed

    on_gpu = config.resources.worker_gpus > 0
    fixed = {"device": "gpu" if on_gpu else "cpu", "world_size": config.resources.workers_per_trial,
             "strategy": strategy_name(config)}

    def planned(trial_config: dict) -> dict:
        precision = config.with_trainer_params(trial_config.get("params", {})).precision
        # a GPU trial's as asked, until its reports say what its GPU ran (one without bf16)
        planned_precision = without_auto(precision, on_gpu=True) if on_gpu else resolve_precision(precision, False)
        # The one the trial trains with: fixed when the study handed it out (``searcher``), not
        # drawn again from search.seed, which a resume may have changed since (a trial handed out
        # and paused before it started had none in its row; audit 64). A resumed trial goes on
        # with its checkpoint's random state.
        seed = trial_config[TRAINING_SEED] if TRAINING_SEED in trial_config else \
            training_seed(config.search.seed, int(trial_config[TRIAL_NUMBER]))
        return {**fixed, "precision": planned_precision, "seed": seed}

    return planned


def _session_outcome(complete: bool, budget_reached: bool, failures_reached: bool, disk_filled: bool) -> str:
    """Tune returns from ``fit`` for five reasons; a stop signal is the one left when the
    study is not complete and neither the budget, failing trials nor a full disk ended it
    (a trial paused by a full disk leaves the study incomplete)."""
    if disk_filled:
        return SESSION_DISK_FULL
    if complete:
        return SESSION_COMPLETE
    if failures_reached:
        return SESSION_FAILURES_IN_A_ROW
    return SESSION_TIME_BUDGET if budget_reached else SESSION_INTERRUPTED
