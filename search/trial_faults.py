"""A trial's failed tries, in the driver: whether each is tried again (``RetryPolicy``:
the trial's own faults against ``failure.max_retries``, a lost node forgiven), what it
is said to be (one line, from Ray's error file or the process's own account of a native
crash), and where its traceback is kept (``KeepTracebacks``)."""

from __future__ import annotations

import itertools
import logging
import re
from pathlib import Path
from typing import Any

from ray.tune import Callback

from .errors import DiskFullError, HpsearchError
from .experiment import atomic_write_text, trial_dir_of
from .outcome import EPOCH, GIVE_UP, KNOWN_EPOCHS, RANK_NODES, RESTORED, TRIAL_NUMBER
from .trial_watch import crash_account, crash_line
from .trials_table import TrialsTable


NODE_LOST = "its node was lost"  # a fault's error line, when it was taken for a node loss
NODE_LOSSES_FORGIVEN = 5  # per trial: node losses beyond these count as the trial's own faults
PROCESS_DIED = "its process died without a Python error"  # a fault's line, for a killed or crashed process


class RetryPolicy(Callback):
    """``failure.max_retries`` counts the trial's own faults only; a node that dies under a
    trial (a lost or pre-empted machine) is retried from the last checkpoint on another
    node without using up a retry, up to ``NODE_LOSSES_FORGIVEN`` times a trial (a bound,
    so that a fault taken for a node loss can never retry a trial forever).

    Ray Tune counts every failure against ``FailureConfig.max_failures``, so Tune is given
    one more than ``max_retries`` and this callback, which runs before the retry starts,
    (a) takes a node loss back off Tune's count (``Trial.run_metadata.num_failures``, a
    Ray internal this relies on; tested by the node-loss test), and (b) when the trial's
    own faults exceed ``max_retries``, or (c) when a retry failed with the same error as
    the attempt before it without reporting a later epoch, marks its config so the
    restarted trial ends at once as FAILED with the last error: a retry starts from the
    same checkpoint and runs the same batches, so a third try would fail the same way
    (not so a killed process, whose killer may choose otherwise next time). (A bug the
    trial itself recognises, say a ``TypeError``, is not retried at all: see
    ``trial._failure_reason``.) The row's ``error`` says what this fault was taken for,
    which the other callbacks read rather than judge it again.
    """

    def __init__(self, table: TrialsTable, max_retries: int, exp) -> None:
        self.table, self.max_retries, self.exp = table, max_retries, exp
        self._last_fault: dict[int, tuple[str, Any]] = {}  # trial number -> (error line, last epoch reported)

    def on_trial_result(self, iteration, trials, trial, result, **info) -> None:
        """A retry's report, again, of an epoch its checkpoint holds: the attempt before it
        had got that far, though its own report of that epoch may never have left it (a
        crash or kill after the epoch's checkpoint was written and before its report), so
        that attempt's fault came after that epoch."""
        number = int(trial.config[TRIAL_NUMBER])
        if result.get(RESTORED) and number in self._last_fault:
            error, epoch = self._last_fault[number]
            if result.get(EPOCH) is not None and (epoch is None or result[EPOCH] > epoch):
                self._last_fault[number] = (error, result[EPOCH])

    def on_trial_recover(self, iteration, trials, trial, **info) -> None:
        number = int(trial.config[TRIAL_NUMBER])
        row = self.table.row(number)
        # The retry sends again only the epochs its checkpoint holds beyond those the study has.
        reported = int((trial.last_result or {}).get(EPOCH) or 0)
        trial.config[KNOWN_EPOCHS] = max(int(trial.config.get(KNOWN_EPOCHS) or 0), reported)
        node_losses = int(row.get("node_losses") or 0)
        if node_losses < NODE_LOSSES_FORGIVEN and node_was_lost(trial):
            trial.run_metadata.num_failures = max(0, trial.run_metadata.num_failures - 1)
            row["node_losses"], row["error"] = node_losses + 1, NODE_LOST
            return
        faults = int(row.get("attempts") or 1)  # attempts so far, each ended by a fault
        fault = (last_error_line(trial, self.exp), (trial.last_result or {}).get(EPOCH))
        row["error"] = fault[0]
        # A killed process may live on a retry: the out-of-memory killer's choice turns on
        # what else runs on the node, not only on the trial's own batches (a rank's too).
        repeated = self._last_fault.get(number) == fault and PROCESS_DIED not in fault[0] \
            and not fault[0].startswith(PEER_ENDED)
        self._last_fault[number] = fault
        if faults > self.max_retries or repeated:
            how = " the same way, at the same point" if repeated else ""
            # not where a peer rank met the lost connection: the ended rank's place is unknown
            where = None if fault[0].startswith(PEER_ENDED) else _raised_at(trial)
            trial.config[GIVE_UP] = f"failed {faults} time{'s' if faults != 1 else ''}{how}: {fault[0]}" \
                                    f"{f' (at {where})' if where else ''}{traceback_at(trial, self.exp)}"
        else:
            row["attempts"] = faults + 1


def node_was_lost(trial) -> bool:
    """True when the trial's worker, or one rank of a distributed trial, died with its
    node (not of an error of its own): the actor is gone or unreachable and, by Ray's
    message or by the cluster's view, the node it last ran on is dead; or, for a
    distributed trial, a rank failed while a node that held one of its ranks is gone."""
    from ray.exceptions import RayActorError, RayTaskError

    error = _pickled_error(trial)
    if isinstance(error, RayTaskError):
        return _a_rank_lost_its_node(error) or _a_rank_failed_beside_a_lost_node(error, trial)
    last_node = (trial.last_result or {}).get("hps_node_id")
    return isinstance(error, RayActorError) and _actor_lost_its_node(error, last_node)


def _a_rank_failed_beside_a_lost_node(error, trial) -> bool:
    """A distributed trial over several nodes, one of which is lost: the ranks on the
    others often fail first, on their broken connection to its ranks (gloo's "Connection
    reset by peer", NCCL's errors), before Ray Train hears of the lost ranks themselves.
    Whether one of the nodes that held the trial's ranks (rank 0 reports them, see
    ``trial._ranks_placement``) is gone tells that from a fault of the trial's own, which
    leaves every node up. A node lost before the trial's first report is not seen so."""
    from ray.train import WorkerGroupError

    nodes = str((trial.last_result or {}).get(RANK_NODES) or "")
    return isinstance(getattr(error, "cause", None), WorkerGroupError) and any(
        _node_is_gone(node) for node in nodes.split(",") if node)


def _node_is_gone(node: str) -> bool:
    """Dead by the cluster's view, or its raylet not answering: the survivors' errors come
    as soon as the node's processes die, and Ray declares a node dead only after several
    missed health checks (half a minute by default)."""
    import socket

    import ray

    known = next((n for n in ray.nodes() if n["NodeID"] == node), None)
    if known is None or not known.get("Alive"):
        return True
    try:
        socket.create_connection((known["NodeManagerAddress"], known["NodeManagerPort"]), timeout=2).close()
    except OSError:
        return True
    return False


def _a_rank_lost_its_node(error) -> bool:
    """A distributed trial's rank whose node died: the trial's own task fails with Ray
    Train's ``WorkerGroupError``, which holds, per rank, the failed health check of that
    rank's actor (the worker's node is named only in its text); or with its
    ``PreemptionError``, for a node that Ray was told would be reclaimed, when Ray Train's
    preemption watcher runs (off by default, see ``tuner.RAY_DEFAULTS``)."""
    from ray.exceptions import RayActorError
    from ray.train import PreemptionError, WorkerGroupError

    cause = getattr(error, "cause", None)
    if isinstance(cause, PreemptionError):
        return True
    if not isinstance(cause, WorkerGroupError):
        return False
    for failure in cause.worker_failures.values():
        # the failed health check's cause, or the actor's own death as Ray Train may hold it
        unreachable = failure if isinstance(failure, RayActorError) else getattr(failure, "health_check_failure", None)
        node = re.search(r"node_id='([0-9a-f]+)'", str(failure))
        if isinstance(unreachable, RayActorError) and _actor_lost_its_node(unreachable, node and node.group(1)):
            return True
    return False


def _actor_lost_its_node(error, node: str | None) -> bool:
    """By Ray's own account of the actor's death (the GCS names a dead node's actors so),
    a pre-emption, an actor Ray cannot reach, or, failing those, the cluster's view of the
    node it last ran on. A process that died on a node still up, killed (the system's
    out-of-memory killer) or crashed (a segfault), is the trial's own fault: Ray's words
    for it also speak of nodes ("the OOMing node"), and taking it for a node loss retried
    such a trial forever."""
    from ray.exceptions import ActorUnavailableError

    if getattr(error, "preempted", False) or isinstance(error, ActorUnavailableError) \
            or "because its node has died" in str(error):
        return True
    return node is not None and node not in _alive_nodes()


def _alive_nodes() -> set[str]:
    import ray

    return {n["NodeID"] for n in ray.nodes() if n.get("Alive")}


def _pickled_error(trial):
    from ray import cloudpickle  # the pickler Tune wrote the error file with (ray/tune/experiment/trial.py)

    path = getattr(trial, "pickled_error_file", None)
    try:
        with open(path, "rb") as handle:
            return cloudpickle.load(handle)
    except Exception:  # noqa: BLE001 - no error file, or an error that cannot unpickle here
        return None


def traceback_at(trial, exp) -> str:
    """Where the traceback of the trial's last failed try is: its copy beside the trial's
    checkpoints (``KeepTracebacks``), else Ray's own file."""
    kept = kept_traceback(exp, trial)
    path = kept if kept.is_file() else getattr(trial, "error_file", None)
    return f" (traceback: {path})" if path else ""


def kept_traceback(exp, trial) -> Path:
    from .experiment import TRIAL_TRACEBACK

    return trial_dir_of(trial, exp) / TRIAL_TRACEBACK


class KeepTracebacks(Callback):
    """Copies the traceback of a trial's failed try from Ray's session directory (under
    /tmp, gone at the next reboot) to ``error.txt`` beside the trial's checkpoints, where a
    fault that ends a trial without a retry leaves its own (``trial._save_traceback``).
    Runs before ``RetryPolicy`` and ``ProgressDisplay``, which name the copy."""

    def __init__(self, exp) -> None:
        self.exp = exp

    def on_trial_recover(self, iteration, trials, trial, **info) -> None:
        self._keep(trial)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._keep(trial)

    def _keep(self, trial) -> None:
        source = getattr(trial, "error_file", None)
        if not source:
            return
        kept = kept_traceback(self.exp, trial)
        # after what the trial's process wrote of its own death, which Ray's text, guessing
        # at a kill, cannot say (audit 29: it came after Ray's guess)
        account = crash_account(kept.parent)
        own = f"The trial's process's own account (trials/.../crash*.txt):\n{account}\nRay's:\n" if account else ""
        try:
            atomic_write_text(kept, own + without_colours(Path(source).read_text(encoding="utf-8", errors="replace")))
        except (OSError, HpsearchError):  # a full disk too
            pass  # Ray's own file stays, and is named instead


class _TrialTracebacks(logging.Filter):
    """Drops Ray Tune's log of a failed trial task, a full traceback for every try of every
    failing trial: ``ProgressDisplay`` says it in one line, and the traceback stays in the
    trial's error file. Also its log of a full disk met by a callback as a trial ended
    ("Error stopping trial", 40 lines): the search stops at its next write, saying so."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], DiskFullError):
            return False
        return not str(record.msg).startswith("Trial task failed for trial")


TRIAL_TRACEBACKS = _TrialTracebacks()


def quiet_trial_tracebacks(quiet: bool) -> None:
    """Whether the driver's console shows Ray Tune's traceback of each failed trial try
    (it does with ``-v``)."""
    logger = logging.getLogger("ray.tune.execution.tune_controller")
    (logger.addFilter if quiet else logger.removeFilter)(TRIAL_TRACEBACKS)


def _last_failure(trial) -> str:
    """The text of a trial's last failure: Tune's error file holds every failure of the
    trial, each under a "Failure # N" line."""
    path = getattr(trial, "error_file", None)
    try:
        text = Path(path).read_text(encoding="utf-8") if path else ""
    except OSError:
        text = ""
    return without_colours(re.split(r"^Failure # \d+ \(occurred at [^)]*\)\s*$", text, flags=re.MULTILINE)[-1])


def without_colours(text: str) -> str:
    """Ray's error text without the terminal's colour codes it holds (``\\x1b[36m``)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _raised_at(trial) -> str | None:
    """Where the user's code raised the trial's last failure, as a trial that is not
    retried says it (``trial._failure_reason``): read from the traceback's text."""
    from .components import innermost_user_frame

    frames = re.findall(r'^\s*File "(.+)", line (\d+), in (.+)$', _last_failure(trial), flags=re.MULTILINE)
    return innermost_user_frame((name, int(line), function.strip()) for name, line, function in frames)


def last_error_line(trial, exp=None) -> str:
    """The exception line of a trial's last failure, e.g. 'ValueError: bad lr'; where Ray
    wrote no traceback (an actor it lost), Ray's first and last sentences about it, not
    the indented details (actor id, namespace) under them. For a process that died, with
    ``exp``: what the process wrote of it itself, a native crash or a hang (trial_watch.py)."""
    last_failure = _last_failure(trial)
    # not Ray's header of the task (``ray::ImplicitFunc.train() (pid=..., actor_id=...)``),
    # which differs at every try: the same error must read the same (RetryPolicy compares)
    raw = [line.rstrip() for line in last_failure.splitlines() if line.strip() and not line.startswith("ray::")]
    lines = [line for line in raw if not line[0].isspace()]
    # 'ValueError: bad lr', 'mod.f.<locals>.DataError: x', or a class alone ('RuntimeError',
    # raised without a message)
    exception = [line for line in lines if re.match(r"[\w.<>]+(\([\w.]+\))?: ", line)
                 or re.fullmatch(r"(?:[\w<>]+\.)*[A-Z]\w*", line)]
    # Ray Train's account of a distributed trial's ranks (one-process trials have no ranks)
    distributed = "WorkerGroupError" in last_failure or "[Rank " in last_failure
    if exception:
        # a rank's own error, not the lost connection its peers met because of it (a
        # one-process trial's own ConnectionResetError is its error: audit 76)
        line = ([text for text in exception if not (distributed and _PEER_LOST.search(text))] or exception)[-1]
        below = raw[len(raw) - raw[::-1].index(line):]
        indented = [text.strip() for text in itertools.takewhile(lambda text: text[0].isspace(), below)]
        if line.endswith(":") and indented:  # its message goes on indented below (a ConfigError's problems)
            line = f"{line} {' '.join(indented)}"
        elif line.endswith(":") and line != lines[-1]:  # its message goes on below (Ray Train's worker errors)
            line = f"{line} ... {lines[-1]}"
    elif lines:
        line = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    else:
        return "unknown error"
    line = _PROCESS_DEATH.sub(_process_death_in_short, line)[:300]
    if exp is not None and (PROCESS_DIED in line or _PEER_LOST.search(line)):
        told = crash_line(crash_account(trial_dir_of(trial, exp)))
        if told:
            return told[:300]
        lost = _PEER_LOST.search(line) if distributed else None
        if lost:  # os._exit in a rank was named by its peer's error, a new port at each try (left by audit 61)
            line = f"{PEER_ENDED} ({lost.group(0)})"
    return line[:300]


# The line of a distributed trial one of whose ranks' processes ended without a Python
# error or an account of a crash or a hang: only its peers' lost connections tell of it.
PEER_ENDED = ("a rank's process ended without a Python error (os._exit, a kill, or an exit in native code): "
              "its peers lost their connection to it")


# What a rank of a distributed trial raises when another rank's process is gone: a crash or
# a hang that rank's own account names, which is the trial's fault, not this (audit 61:
# every try of a segfault in one rank said only "Connection closed by peer [127.0.0.1]:41882")
_PEER_LOST = re.compile(r"Connection (closed|reset) by peer|remote process exited|communicator was aborted")


# Ray's account of a trial's (or a rank's) process that died without a Python error
_PROCESS_DEATH = re.compile(r"(The actor died unexpectedly before finishing this task\. \.\.\. )?"
                            r"The actor is dead because its worker process has died\..*?"
                            r"Worker exit detail: (.*?)(?: Some common causes.*|$)")


# Ray's detail for a worker that ended itself with a code (``os._exit(4)``), where a kill
# leaves "a connection error code 2. End of file."
_EXIT_CODE = re.compile(r"exits with an exit code (\d+)\b")


def _process_death_in_short(death: re.Match) -> str:
    """Ray's account runs to 800 characters, its likely causes in the middle, and was cut at 300."""
    detail = death.group(2).strip()
    exited = _EXIT_CODE.search(detail)
    if "SIGTERM" in detail:  # Ray's handler exits with 1 on it: no code of the trial's own (audit 32)
        return f"{PROCESS_DIED}: it was sent SIGTERM (by a person, a script or the machine) (Ray: {detail})"
    if exited and int(exited.group(1)) > 0:
        return (f"{PROCESS_DIED}: it exited with code {exited.group(1)} (os._exit, or an exit in native code "
                f"or in a thread of its own) (Ray: {detail})")
    return (f"{PROCESS_DIED}: killed (by the system's out-of-memory killer, most often) "
            f"or crashed in native code (Ray: {detail})")
