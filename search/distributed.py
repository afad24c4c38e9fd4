"""Trials of several processes: DDP, FSDP or DeepSpeed ranks started by Ray Train.

This is Ray's supported way to run distributed training under Tune since Train V2:
the Tune trial is only a driver that starts a ``TorchTrainer``, whose workers train
and report through Train, and ``TuneReportCallback`` forwards rank 0's reports to Tune.
Two details keep it from starving itself on small machines:

* the Tune trial (the driver) holds no CPU, only a token of memory, and Train's
  controller holds none either, so every CPU and GPU goes to the training ranks;
* the tuner caps concurrent trials at what the cluster can hold at once, so a trial's
  worker group never waits on resources another trial holds (it would time out).

The ranks' reports reach Tune without waiting for its decision, so at ASHA's rungs rank 0
waits for it and tells the other ranks (``stopped_at_rung``, ``rung_decisions``).

A rank that ends its trial on a fault of its own (a NaN, a bug, a full disk) raises
``RankEndedTrial`` rather than reporting it: one rank's report waits for every rank's, and
the others wait in their next collective for it, so the trial hung (audit 61). Its error
ends the worker group, and the Tune trial reports the ending as a one-process trial does.
Ray Train passes an epoch on to Tune only once it has every rank's report: a rank that
crashed outright (a segfault) just after its report took that report with it, so rank 0
also keeps its last report where the Tune trial reads it (``RankZeroLastReports``).

The Lightning glue (cluster environment, strategies) is written against
``pytorch_lightning`` here, because Ray's own helpers import the ``lightning`` package
first whenever it is installed, and the two must not be mixed.
"""

from __future__ import annotations

import importlib.util
import pickle
import time
import warnings
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from .config import ExperimentConfig
from .errors import ConfigError, HpsearchError
from .experiment import ExperimentDir, trial_name
from .outcome import DISK_FULL, EPOCH, FAILURE, FINISHED, GIVE_UP, PLACEMENT_GROUP, RESTORED, TRIAL_NUMBER
from .rung_decisions import WAIT_LIMIT_S, RungDecisions
from .session_store import SessionStore
from .storage import study_root
from .trial import Parallelism, fit_trial, load_training_stack
from .trial_watch import drop_empty_accounts

# The Tune trial that drives a Train run asks for this much memory and no CPU
# (Ray cannot place an empty resource request).
DRIVER_MEMORY_BYTES = 1024 * 1024


class RankEndedTrial(HpsearchError):
    """A rank ends its trial with this report (a failure, or a full disk that pauses it);
    raised, so that Ray Train ends the other ranks too (see the module's docstring)."""

    def __init__(self, final_report: dict[str, Any]) -> None:
        super().__init__(str(final_report.get(FAILURE) or final_report.get(DISK_FULL)))
        self.final_report = final_report

    def __reduce__(self):
        return self.__class__, (self.final_report,)


@dataclass(frozen=True)
class RankZeroLastReports:
    """Rank 0's last report of each distributed trial of one search session, kept in Ray's
    key-value store (kept by the cluster's head, which every node reaches), for the Tune
    trial to send on when its run fails before Ray Train passed it on: Train forwards an
    epoch only once it has polled every rank's report, and a rank that crashed outright
    just after its own took it with it. The trial then failed with no value, its retries
    crashing the same way (audit 62). The driver removes a trial's once it ends (Tune may
    end the Tune trial's process before its own clean-up: audit 65 found every trial's
    left), and the session's at its end: a cluster outlives its searches."""

    store: SessionStore = field(default_factory=lambda: SessionStore("hpsearch-last-report"))

    def keep(self, trial_number: int, report: dict[str, Any]) -> None:
        """Rank 0's side, before it reports."""
        self.store.put(str(trial_number), pickle.dumps(report))

    def take(self, trial_number: int) -> dict[str, Any] | None:
        """The last report rank 0 kept (None if none), removed."""
        if not self.store.available():
            return None
        kept = self.store.get(str(trial_number))
        self.store.delete(str(trial_number))
        return None if kept is None else pickle.loads(kept)

    def clear(self) -> None:
        """Drop this session's reports."""
        self.store.clear()


def driver_resources() -> dict[str, float]:
    return {"cpu": 0, "memory": DRIVER_MEMORY_BYTES}


def check_strategy_available(config: ExperimentConfig) -> None:
    """DeepSpeed is an optional extra: say how to get it before anything starts."""
    if config.trainer.strategy == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        raise ConfigError([config.problem(
            "trainer.strategy", "'deepspeed' needs the deepspeed package: pip install 'hpsearch[deepspeed]'")])


def strategy_name(config: ExperimentConfig) -> str:
    if not config.resources.distributed:
        return "single"
    return "ddp" if config.trainer.strategy == "auto" else config.trainer.strategy


def train_distributed_trial(trial_config: dict[str, Any], *, experiment: dict[str, Any], experiment_dir: str,
                            decisions: RungDecisions | None = None,
                            last_reports: RankZeroLastReports | None = None) -> None:
    """Ray Tune function trainable for trials of ``workers_per_trial`` > 1 processes.
    ``decisions``: where the scheduler publishes its decisions at rungs (None: it stops no trial).
    ``last_reports``: where rank 0 keeps its last report (the search session's)."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig, TrainingFailedError
    from ray.train.torch import TorchConfig
    from ray.tune.integration.ray_train import TuneReportCallback

    trial_started_at = time.time()  # its ranks count their worker group's start in the trial's start-up
    config = ExperimentConfig.model_validate(experiment)
    resources = config.resources
    use_gpu = resources.worker_gpus > 0
    per_worker = {"CPU": resources.worker_cpus, **({"GPU": resources.worker_gpus} if use_gpu else {})}
    last_reports = last_reports or RankZeroLastReports()
    number = int(trial_config[TRIAL_NUMBER])
    trainer = lean_torch_trainer()(
        _train_rank,
        train_loop_config={"trial_config": trial_config, "experiment": experiment, "experiment_dir": experiment_dir,
                           "trial_started_at": trial_started_at, "decisions": decisions,
                           "last_reports": last_reports},
        torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        scaling_config=ScalingConfig(num_workers=resources.workers_per_trial, use_gpu=use_gpu,
                                     resources_per_worker=per_worker, placement_strategy="PACK"),
        run_config=RunConfig(
            name=trial_name(number),
            storage_path=str(study_root(experiment_dir) / "tune" / "train"),
            callbacks=[TuneReportCallback()],
            # Retries belong to Tune's FailureConfig (failure.max_retries), once, not twice;
            # a rank's pre-empted node too, which Ray Train would otherwise restart within
            # the trial, without end and unseen: the driver counts it as a node loss.
            failure_config=FailureConfig(max_failures=0, max_preemption_failures=0),
        ),
    )
    try:
        trainer.fit()
    except TrainingFailedError as error:
        from ray import tune

        ended = rank_ended_trial(error)
        if ended is None:
            kept = last_reports.take(number)
            if kept is not None:
                # Sent again: the study keeps its record of it if it had one (trials_table).
                forwarded_reports_taken()
                tune.report({**kept, RESTORED: True})
                if kept.get(FINISHED):
                    return  # the trial had ended as rank 0 said; a rank crashed after that
            raise  # Tune retries it (failure.max_retries)
        forwarded_reports_taken()
        tune.report(ended.final_report)
    finally:
        last_reports.take(number)
        trial_dir = ExperimentDir(study_root(experiment_dir)).trial_dir(trial_name(number))
        drop_empty_accounts(trial_dir)


def forwarded_reports_taken(limit_s: float = 10.0) -> None:
    """Waits (up to ``limit_s``) until the Tune session has taken the ranks' reports that
    ``TuneReportCallback`` forwarded, so a report from this thread comes after them.

    The session's main thread takes a forwarded report from a queue between actors and
    puts it on the queue that this thread's ``tune.report`` also puts on, which holds one,
    and only the main thread empties. Reported while a forwarded one was still pending, the
    ending either overtook it (the epoch was lost: 9 of 23 trials in audit 61) or filled that
    queue first, and the main thread then waited on it for good (a trial hung, once in about
    a dozen). Ray's own last report of a finished function meets the same race, with the
    controller's shutdown as its margin."""
    import sys
    import threading

    from ray.train._internal.session import get_session

    session = get_session()
    pending = getattr(session, "_inter_actor_queue", None)
    if pending is None:  # nothing forwarded; or another Ray, whose reports take another way
        return
    main = threading.main_thread().ident

    def handing_over() -> bool:  # the main thread is passing a taken report on (its ``report``)
        frame = sys._current_frames().get(main)
        while frame is not None:
            if frame.f_code.co_name in ("report", "_report_training_result") and "session" in frame.f_code.co_filename:
                return True
            frame = frame.f_back
        return False

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and (not pending.empty() or handing_over()):
        time.sleep(0.02)


def rank_ended_trial(error: BaseException) -> RankEndedTrial | None:
    """The ending that a rank raised into Ray Train's ``error`` (the lowest rank's, if several
    did); None if none did, a fault a retry may outlive."""
    failures = getattr(error, "worker_failures", None) or {}
    for rank in sorted(failures):
        if isinstance(failures[rank], RankEndedTrial):
            return failures[rank]
    return None


def lean_torch_trainer() -> type:
    """Ray Train's ``TorchTrainer`` without two helper actors it starts for every run, each
    a new Python process, which hpsearch's trials never use: the Ray Data shard manager
    (hpsearch passes no Ray Datasets; the manager imports Ray Data on start) and the
    placement-group cleaner (the driver frees each trial's group itself, see
    ``FreeRankReservations``; and the cleaner needs Ray's dashboard, which a local Ray
    started by hpsearch does not run). On 2 CPUs their start competed with the ranks':
    a two-rank run took 11.9-12.6 s without them against 13.8-14.5 s with them."""
    from ray.train.torch import TorchTrainer
    from ray.train.v2._internal.callbacks.datasets import DatasetsCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback

    class LeanTorchTrainer(TorchTrainer):
        def _create_default_callbacks(self):
            return [callback for callback in super()._create_default_callbacks()
                    if not isinstance(callback, (DatasetsCallback, PlacementGroupCleanerCallback))]

    return LeanTorchTrainer


def _train_rank(loop_config: dict[str, Any]) -> None:
    """One rank of a distributed trial, inside a Ray Train worker."""
    import ray.train

    # Ray Train started this worker process for the trial: seconds the trial waited for it
    # (the nodes' clocks are assumed to agree, as NTP keeps them).
    workers_start_s = max(0.0, time.time() - loop_config["trial_started_at"])
    started_at = time.perf_counter()  # the imports below are the trial's start-up too
    config = ExperimentConfig.model_validate(loop_config["experiment"])
    # Before the strategy's Lightning import (see trial.load_training_stack); not for a trial
    # out of retries, which fit_trial ends at once: its tries may have failed in these imports.
    if not loop_config["trial_config"].get(GIVE_UP):
        load_training_stack(config)
    context = ray.train.get_context()
    parallel = Parallelism(
        world_size=context.get_world_size(),
        strategy=make_strategy(config),
        strategy_name=strategy_name(config),
        report_on_every_rank=True,
        rank=context.get_world_rank(),
    )
    # Every report names the placement group that holds this trial's ranks, so the driver
    # can free it once the trial ends, however it ends (see FreeRankReservations).
    reservation = ray.util.get_current_placement_group()
    named = {PLACEMENT_GROUP: reservation.id.hex()} if reservation is not None else {}
    decisions = loop_config["decisions"]
    kept_by_rank_zero = loop_config["last_reports"] if parallel.rank == 0 else None
    number = int(loop_config["trial_config"][TRIAL_NUMBER])
    _quiet_report_log()

    last_epoch: dict[str, Any] = {}

    def report(metrics: dict[str, Any]) -> None:
        if metrics.get(FAILURE) or metrics.get(DISK_FULL):
            # With this rank's last epoch, sent again: Ray Train may not have passed its report
            # on to Tune before this error ends the worker group (audit 61: a finished epoch
            # lost in 9 of 23 trials ended so). Tune's record of it, if it had one, stands.
            raise RankEndedTrial({**last_epoch, **({RESTORED: True} if last_epoch else {}), **metrics, **named})
        if kept_by_rank_zero is not None:
            kept_by_rank_zero.keep(number, {**metrics, **named})
        ray.train.report({**metrics, **named})
        if not metrics.get(FINISHED):
            last_epoch.clear()
            last_epoch.update(metrics)

    fit_trial(loop_config["trial_config"], loop_config["experiment"], loop_config["experiment_dir"],
              report=report, parallel=parallel,
              workers_start_s=workers_start_s, started_at=started_at,
              stopped_by_scheduler=None if decisions is None else partial(
                  stopped_at_rung, decisions, number))


def _quiet_report_log() -> None:
    """Ray Train logs every report of every rank at INFO, the whole report with hpsearch's
    own fields in one long line, to a logger named by its file: in each epoch, a line a
    rank in the trial's output.log, which is for what the user's code prints (audit 31)."""
    import logging

    try:
        from ray.train.v2._internal.execution import context
    except ImportError:  # another Ray: its reports say what they say
        return
    logging.getLogger(context.__file__).setLevel(logging.WARNING)


def stopped_at_rung(decisions: RungDecisions, trial_number: int, trainer, report: dict[str, Any]) -> bool:
    """Whether the scheduler stopped this trial at the report just sent, as every rank
    learns it from rank 0. Only reports at a rung wait (see ``rung_decisions``); a report
    that ends the trial needs no decision. Rank 0 trains on, and says so, if no decision
    arrives in time."""
    epoch = int(report[EPOCH])
    if report.get(FINISHED) or not decisions.awaited(epoch, bool(report.get(RESTORED))):
        return False
    stop = None
    if trainer.global_rank == 0:
        stop = decisions.wait_for(trial_number, epoch)
        if stop is None:
            warnings.warn(f"trial {trial_number}: no scheduler decision on epoch {epoch} within "
                          f"{WAIT_LIMIT_S:.0f} s; training on", stacklevel=2)
    return bool(trainer.strategy.broadcast(stop, src=0))


def make_strategy(config: ExperimentConfig):
    """The Lightning strategy for one rank; its ranks and device come from Ray Train."""
    from ._ray_lightning import RayDDPStrategy, RayDeepSpeedStrategy, RayFSDPStrategy, RayTrainEnvironment

    environment = RayTrainEnvironment()
    name = strategy_name(config)
    if name == "fsdp":
        return RayFSDPStrategy(cluster_environment=environment)
    if name == "deepspeed":
        return RayDeepSpeedStrategy(stage=config.trainer.deepspeed_stage, cluster_environment=environment)
    return RayDDPStrategy(cluster_environment=environment)
