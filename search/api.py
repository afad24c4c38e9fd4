"""The Python API: ``run`` and ``resume`` a study, or ``check`` its file. The CLI is a
thin layer over these.

    import hpsearch
    result = hpsearch.run("experiment.yaml", {"search.num_trials": 4})
    result.best["params"], result.experiment_dir

The flow reads top to bottom: config -> classes and preflight -> Ray -> experiment
directory -> search session (Optuna + ASHA over Lightning trials) -> best.json.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shlex
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .caller_state import caller_state_kept
from .cluster_join import cluster_address, ensure_joined_cluster_answers
from .config import ExperimentConfig, ResourcesConfig
from .config_loading import flat_settings, load_config
from .errors import (CallbackError, ConfigError, DiskFullError, HpsearchError, Interrupted, Problem, counted,
                     exception_chain, first_line, resume_call, resume_command, warn_user)
from .data_classes import check_classes, classes_of, keep_classes
from .experiment import ExperimentDir, close_killed_sessions, read_sessions, record_session, write_config
from .gc_pause import collector_paused, thawed_at_exit
from .outcome import (FINISHED_STATES, PAUSED, SESSION_COMPLETE, SESSION_DISK_FULL, SESSION_FAILURES_IN_A_ROW,
                      SESSION_CRASHED, SESSION_INTERRUPTED, SESSION_RAY_LOST, SESSION_RUNNING)
from .ray_watch import RayLostWatch
from .storage import Mirror, StudyHome, study_address
from .study_lock import GRACEFUL, sigterm_stops_gracefully, study_lock
from .trials_table import read_rows

# Changing these on resume would make the study's history meaningless.
FROZEN_ON_RESUME = ("name", "model", "data", "space", "metric", "mode", "scheduler")


@dataclass
class SearchResult:
    """What a search left behind: where, how the session ended (``outcome``: "complete",
    "time_budget", "interrupted" or "failures_in_a_row"), the best trial (best.json), and
    every trial."""

    experiment_dir: Path
    outcome: str
    best: dict[str, Any] | None = None
    trials: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0  # from the call to its return: the checks, Ray's start, the search, the evaluation
    already_complete: bool = False  # a resume that found nothing to do, and started nothing
    grid_exhausted: bool = False  # every point of the study's grid has run: more trials would add none
    evaluated_again: bool = False  # a resume of a complete search that ran only its test evaluation
    address: str | None = None  # the cluster the session joined by address, which a resume needs too
    finished_before: int = 0  # trials the study had finished when this session began
    stop_reason: str = ""  # why a session that failures stopped ended, and the failures' errors

    def __post_init__(self) -> None:
        # trials.csv's empty cell is None here: no value (a conditional parameter the trial
        # did not sample, a telemetry figure it never reported), which '' hid from Python's
        # comparisons until they raised TypeError (audit 45)
        self.trials = [{key: None if value == "" else value for key, value in trial.items()} for trial in self.trials]

    def __repr__(self) -> str:
        """One line: the whole best.json and every trial's row made 7,862 characters of a
        notebook's output for 6 trials (audit 51); they are in ``best`` and ``trials``."""
        best = f"<trial {self.best.get('trial')}: {self.best.get('metric', 'value')} = {self.best.get('value')}>" \
            if self.best else "None"
        return (f"SearchResult(experiment_dir={str(self.experiment_dir)!r}, outcome={self.outcome!r}, best={best}, "
                f"trials=<{len(self.trials)}>, elapsed_s={self.elapsed_s:.1f})")

    @property
    def complete(self) -> bool:
        """The study has all its trials."""
        return self.outcome == SESSION_COMPLETE

    @property
    def resume_command(self) -> str:
        return resume_command(self.experiment_dir, self.address)


def run(
    source: str | Path | Mapping[str, Any],
    overrides: Iterable[str] | Mapping[str, Any] = (),
    *,
    name: str | None = None,
    storage: str | None = None,
    address: str | None = None,
    verbose: bool = False,
    callbacks: Iterable[Any] = (),
) -> SearchResult:
    """Validate the experiment, then search; every config mistake is raised before Ray starts.

    ``callbacks``: extra ``ray.tune.Callback`` objects (experiment trackers, timing)."""
    called = time.monotonic()
    callbacks = _tune_callbacks(callbacks)
    config = _run_config(source, overrides, name, storage)
    ensure_joined_cluster_answers(address)
    # prepare() freezes the driver's imports for this search only
    # The storage is checked before the preflight's imports: a storage that was a file was
    # said after 6.5 s of them (audit 36). A URI is checked for writing here.
    home = _new_study_home(config)
    with caller_state_kept(loggers_quieted=not verbose), thawed_at_exit(), _start_up_interrupts_kept() as interrupted:
        classes = prepare(config, new_study=True)
        if starts_a_local_ray(address):
            room_on_this_machine(config)  # a trial too large for it is refused before Ray starts
        interrupted.raise_if_heard()
        from .tuner import ray_for_search

        with ray_for_search(config, address, verbose) as search_ray:
            concurrency = _plan(config, local=starts_a_local_ray(address))
            interrupted.raise_if_heard()  # a Ctrl+C during Ray's start leaves no study behind (audit 56)
            exp = home.create()
            try:
                with study_lock(exp):
                    write_config(exp, config.model_dump(mode="json"))
                    keep_classes(exp, classes)
                    interrupted.raise_if_heard()
                    return _took(called, _search(config, exp, verbose, concurrency, callbacks, home.mirror, address,
                                                 search_ray.local_environment))
            except KeyboardInterrupt:  # before the session began: the study exists, and resume starts it
                if home.mirror is not None:  # from the storage the command names (audit 57: it held nothing)
                    try:
                        home.mirror.push_study_files()
                    except (Exception, KeyboardInterrupt):  # noqa: BLE001 - storage that fails, a second Ctrl+C
                        pass
                raise Interrupted(exp.root, address) from None


def check(
    source: str | Path | Mapping[str, Any],
    overrides: Iterable[str] | Mapping[str, Any] = (),
    *,
    name: str | None = None,
    storage: str | None = None,
    address: str | None = None,
) -> tuple[ExperimentConfig, str]:
    """What ``run`` checks before Ray starts, and nothing after: the file, the classes and
    their arguments, the preflight's batches (two training steps, one validation and one
    test batch), and that the storage can be written; and, for a search that would start
    its own Ray here (no ``address``, no ``RAY_ADDRESS``), that a trial fits this machine.
    Starts no Ray and creates nothing; raises what ``run`` would. Returns the validated
    config and where ``run`` would put the study (a directory or URI)."""
    config = _run_config(source, overrides, name, storage)
    ensure_joined_cluster_answers(address)
    home = _new_study_home(config)  # before the preflight's imports, as run does
    # a first check's imports drew from Python's generator (audit 53); it quiets no logger
    with caller_state_kept(loggers_quieted=False), thawed_at_exit():
        prepare(config, new_study=True)
    from .components import user_code_roots
    from .local_ray_env import refuse_paths_ray_cannot_encode

    refuse_paths_ray_cannot_encode([os.getcwd(), *user_code_roots(config)])  # as run's start of Ray does (audit 84)
    if starts_a_local_ray(address):
        room_on_this_machine(config)  # refuses a trial too large for it, as run does
    return config, home.mirror.uri if home.mirror is not None else str(home.root)


def _new_study_home(config: ExperimentConfig) -> StudyHome:
    """Where a new study goes; a storage that cannot be written is a mistake in the
    config, named as the ``storage`` field (with its line, or the option that set it)."""
    from .storage import StorageError

    try:
        return StudyHome.new(config.storage, config.name)
    except StorageError as exc:
        raise ConfigError([config.problem("storage", str(exc))]) from None


def starts_a_local_ray(address: str | None) -> bool:
    """Whether a search started here runs on a Ray of its own on this machine: no
    ``address``, no ``RAY_ADDRESS``, and no Ray this process already runs (the user's own
    ``ray.init``, which may declare other resources)."""
    ray = sys.modules.get("ray")
    # not address: an empty one (``--address "$UNSET"``) is no address, as an empty RAY_ADDRESS is (audit 36);
    # "local" is Ray's own word for a new Ray here, which the search then starts (audit 38)
    own = address == "local" or not (address or os.environ.get("RAY_ADDRESS"))
    return own and not (ray is not None and ray.is_initialized())


def room_on_this_machine(config: ExperimentConfig) -> tuple[int, dict[str, float]]:
    """How many trials at once the local Ray that ``run`` starts here (no ``address``)
    would hold, and this machine's CPUs and GPUs as Ray counts them. A trial that does not
    fit is a mistake in the file: a ``ConfigError`` naming the resources setting and the
    numbers. CPUs are counted by Ray's own rule (which follows a container's CPU limit);
    GPUs, only when trials ask for some, as torch sees them (``CUDA_VISIBLE_DEVICES``
    included). A temporary folder Ray cannot keep its files in is refused too
    (``refuse_a_temp_folder_ray_cannot_use``)."""
    from ray._private.utils import get_num_cpus

    from .errors import ResourceError
    from .local_ray_env import refuse_a_temp_folder_ray_cannot_use
    from .resources import concurrent_trials_capacity

    refuse_a_temp_folder_ray_cannot_use()

    node = {"CPU": float(get_num_cpus(override_docker_cpu_warning=True)), "GPU": 0.0}
    if config.resources.worker_gpus > 0:
        import torch

        node["GPU"] = float(torch.cuda.device_count())
    try:
        return concurrent_trials_capacity(config.resources, [{"Resources": node}]), node
    except ResourceError as exc:
        message = f"{exc} (on this machine, where the search starts its own Ray unless given --address)"
        raise ConfigError([config.problem(_resource_at_fault(config.resources, node), message)]) from None


def _resource_at_fault(resources: ResourcesConfig, node: Mapping[str, float]) -> str:
    """The ``resources`` setting that makes a trial too large for ``node``."""
    if resources.worker_cpus > node["CPU"]:
        return "resources.cpus_per_worker" if resources.cpus_per_worker is not None else "resources.cpus_per_trial"
    if resources.worker_gpus > node["GPU"]:
        return "resources.gpus_per_worker" if resources.gpus_per_worker is not None else "resources.gpus_per_trial"
    return "resources.workers_per_trial"


def _tune_callbacks(callbacks: Iterable[Any]) -> list[Any]:
    """``callbacks`` as a list, each checked to be a ``ray.tune.Callback`` before anything
    starts: a Lightning callback (an easy mix-up) failed inside Tune after the study's
    directory was made."""
    if not isinstance(callbacks, Iterable):
        raise TypeError(f"callbacks must be a list of ray.tune.Callback objects, not one {type(callbacks).__name__}")
    callbacks = list(callbacks)
    if not callbacks:
        return callbacks
    from ray.tune import Callback

    wrong = [(index, c) for index, c in enumerate(callbacks) if not isinstance(c, Callback)]
    if wrong:
        lightning = any(type(c).__module__.startswith(("pytorch_lightning", "lightning")) for _, c in wrong)
        hint = (" Lightning callbacks go in your LightningModule's configure_callbacks()." if lightning else "")
        raise ConfigError([Problem(f"callbacks[{index}]", f"{type(c).__name__} is not a ray.tune.Callback; "
                                   f"callbacks= takes Ray Tune callbacks, which see the whole search.{hint}")
                           for index, c in wrong])
    return callbacks


def _run_config(source, overrides, name: str | None, storage: str | None) -> ExperimentConfig:
    """The validated config of a new study: the file, ``overrides``, then ``name``/``storage``."""
    options = {key: value for key, value in (("name", name), ("storage", storage)) if value is not None}
    config = load_config(source, overrides, options)
    if (usual := usual_mode(config.metric)) not in (None, config.mode):
        # a study's mode cannot change on resume: a wrong one is said before it starts (audit 45)
        warn_user(f"mode: {config.mode} searches for the {'highest' if config.mode == 'max' else 'lowest'} "
                  f"{config.metric}, which is usually {'minimized' if usual == 'min' else 'maximized'}; set mode: "
                  f"{usual} unless that is meant")
    return config


# Words in a metric's name that say which way it is better, as names are usually written
# (regression's and generation's too: audit 74)
MINIMIZED_WORDS = {"loss", "error", "err", "mse", "mae", "rmse", "msle", "rmsle", "mape", "smape", "nll", "perplexity",
                   "ppl", "wer", "cer", "fid"}
MAXIMIZED_WORDS = {"acc", "accuracy", "top1", "top5", "f1", "auc", "auroc", "precision", "recall", "iou", "dice",
                   "bleu", "rouge", "map", "ap", "ndcg", "mrr", "r2", "psnr", "ssim", "pearson", "spearman",
                   "explained", "kappa", "mcc"}
TURNED_WORDS = {"neg", "negative", "minus"}  # val_neg_loss: the other way
TURNED_AROUND = re.compile(r"(^|[^a-z0-9])1-")  # val_1-acc (not val_loss_1, acc@1, dataloader_idx_1; audit 47)


def usual_mode(metric: str) -> str | None:
    """"min" or "max" where the metric's name says which way it is better (``val_loss``,
    ``val/acc``), else None."""
    words = re.split(r"[^a-z0-9]+", metric.lower())
    if set(words) & TURNED_WORDS or TURNED_AROUND.search(metric.lower()):
        return None
    # a loss or an error word says it, wherever it stands: val_top1_err, val_r2_loss and
    # mmseg's val_loss_dice are each minimized (audits 76 and 79)
    if set(words) & MINIMIZED_WORDS:
        return "min"
    return "max" if set(words) & MAXIMIZED_WORDS else None


def resume(
    experiment_dir: str | Path,
    overrides: Iterable[str] | Mapping[str, Any] = (),
    *,
    address: str | None = None,
    verbose: bool = False,
    callbacks: Iterable[Any] = (),
    retry_failed: bool = False,
) -> SearchResult:
    """Continue an interrupted study: finished trials stay, interrupted ones continue from
    their checkpoints, and the sampler continues from the study's history.

    ``experiment_dir`` may be the study's URI (``s3://bucket/exps/name``): a study
    survives the cluster it ran on and resumes on another. ``retry_failed``: the
    configuration of each failed trial runs again, as a new trial beyond ``num_trials``
    (once the cause of the failures is fixed)."""
    called = time.monotonic()
    callbacks = _tune_callbacks(callbacks)
    exp, mirror = StudyHome.existing(experiment_dir)
    # prepare() freezes the driver's imports for this search only
    with caller_state_kept(loggers_quieted=not verbose), study_lock(exp), thawed_at_exit(), \
            _start_up_interrupts_kept() as interrupted:
        return _took(called, _resume_locked(exp, overrides, address, verbose, callbacks, mirror, interrupted,
                                            retry_failed))


def _took(called: float, result: SearchResult) -> SearchResult:
    """The result, with the time since ``run`` or ``resume`` was called: what the user
    waited, a resume that found nothing to run included."""
    return replace(result, elapsed_s=time.monotonic() - called)


def _resume_locked(exp: ExperimentDir, overrides, address: str | None, verbose: bool, callbacks,
                   mirror: Mirror | None, interrupted: _HeardInterrupt, retry_failed: bool = False) -> SearchResult:
    from .searcher import RETRY_OF, SETTINGS, existing_study, runs_again

    stored = load_config(exp.config_file, stored=True)
    config = load_config(exp.config_file, overrides, stored=True)
    changed = [k for k in FROZEN_ON_RESUME if getattr(stored, k) != getattr(config, k)]
    if changed:
        raise ConfigError([config.problem(config.overridden_under(k) or k,
                                          f"{k} cannot change on resume (the study's history depends on it); "
                                          "start a new experiment instead") for k in changed])
    study = existing_study(exp.root, config.name)  # the study's own record, which experiment.yaml may not match
    recorded, dumped = (study.user_attrs.get(SETTINGS) if study else None) or {}, config.model_dump(mode="json")
    edited = [k for k in FROZEN_ON_RESUME if k in recorded and _differs(recorded[k], dumped[k], k == "space")]
    if edited:
        raise ConfigError([config.problem(k, f"{k} differs from what the study was searched with "
                                             f"({json.dumps(recorded[k])[:200]}): was {exp.config_file} edited? "
                                             f"{k} cannot change on resume; put it back, or start a new experiment")
                           for k in edited])
    if config.search.sampler == "grid" and study is not None and any(
            "grid_id" not in trial.system_attrs and RETRY_OF not in trial.user_attrs
            for trial in study.get_trials(deepcopy=False)):
        # Optuna's grid gives the study's trial n its point n, taken or not by a trial sampled
        # before: points 0-5 of a study that ran 6 random trials never ran (audit 66). Judged
        # by the study's own trials, which hold their grid place: an edited experiment.yaml
        # got past a check of the file's sampler (audit 67).
        raise ConfigError([config.problem(
            "search.sampler", "a study whose trials were sampled otherwise cannot go on as a grid: they hold no "
                              "place in the grid, which would run some of their points again and never run "
                              "others; start a new experiment for the grid")])
    # trials.csv lags the study: a trial gets its row only once it starts. Failed trials'
    # configurations run again are beyond num_trials.
    again = runs_again(study)
    started = max(len(read_rows(exp.trials_csv)) if exp.trials_csv.is_file() else 0,
                  len(study.get_trials(deepcopy=False)) if study else 0) - again
    if config.search.num_trials < started:
        waiting = sum(t.state.name == "WAITING" and RETRY_OF not in t.user_attrs for t in study.get_trials(
            deepcopy=False)) if study else 0
        queued = f" ({waiting} of them queued to run first, by search.first_trials)" if waiting else ""
        raise ConfigError([config.problem("search.num_trials", f"{config.search.num_trials} is fewer than the "
                                                               f"{started} trials the study already has{queued}; give "
                                                               f"at least {started}")])
    close_killed_sessions(exp)  # before reading the last one's outcome
    if retry_failed and study is not None:
        _run_failed_again(study)
    first_trials = _first_trials_that_fit(study, config)  # queued as the session starts
    # trials queued to run again or first, by this resume or by one stopped before they ran
    queued = study is not None and any(t.state.name == "WAITING" for t in study.get_trials(deepcopy=False))
    searched = _search_complete(exp, config, again) and not queued and not first_trials
    say_what_resume_changes(stored, config, exp.root, trials_run=not searched)
    if searched and (_best_evaluated(exp, config) or not _has_a_result(exp, config)):
        # Nothing is left to run: neither Ray nor a session starts (both used to, only for
        # Tune to find every trial done). A study whose every trial failed has no best
        # trial to evaluate either.
        from .space import grid_size

        if config.search.keep_checkpoints != stored.search.keep_checkpoints:
            _keep_checkpoints_now(exp, config, mirror)
        trials = read_rows(exp.trials_csv)
        return SearchResult(exp.root, SESSION_COMPLETE, exp.stored_best(), trials, already_complete=True,
                            grid_exhausted=config.search.sampler == "grid" and len(trials) >= grid_size(config),
                            finished_before=_finished(trials))
    if not searched:  # else Ray starts only for a GPU evaluation
        ensure_joined_cluster_answers(address)
    # The preflight again: this machine, directory or environment may not be the first
    # session's, and a trial that fails for it is FAILED for good (resume reruns no failed trial).
    try:
        check_classes(exp, prepare(config))
    except ConfigError as exc:
        raise _naming_the_last_sessions_directory(exc, exp) from None
    interrupted.raise_if_heard()
    if searched:
        return _evaluate_again(config, exp, address, verbose, mirror)
    if starts_a_local_ray(address):
        room_on_this_machine(config)  # a trial too large for it is refused before Ray starts
    from .tuner import ray_for_search

    with ray_for_search(config, address, verbose) as search_ray:
        concurrency = _plan(config, local=starts_a_local_ray(address))
        write_config(exp, config.model_dump(mode="json"))
        interrupted.raise_if_heard()
        return _search(config, exp, verbose, concurrency, callbacks, mirror, address, search_ray.local_environment)


def _keep_checkpoints_now(exp: ExperimentDir, config: ExperimentConfig, mirror: Mirror | None) -> None:
    """A complete study's resume runs no session, but the ``search.keep_checkpoints`` it is
    given applies now, as a session's start would apply it: the only way to trim a finished
    study's checkpoints was to add a trial (audit 40). experiment.yaml keeps it, as it keeps
    every setting a resume is given."""
    from .trials_table import TrialsTable
    from .checkpoint_retention import KeepBestCheckpoints

    write_config(exp, config.model_dump(mode="json"))
    if mirror is not None:
        mirror.push_study_files()
    if config.search.keep_checkpoints is None:
        return  # every trial keeps its checkpoint from now on; those removed are gone
    table = TrialsTable.load(exp.trials_csv, config.metric, config.mode, list(config.space))
    before = len(list(exp.root.glob("trials/*/checkpoints/best.ckpt")))
    KeepBestCheckpoints(config.search.keep_checkpoints, table, exp, mirror).setup()
    removed = before - len(list(exp.root.glob("trials/*/checkpoints/best.ckpt")))
    print(f"search.keep_checkpoints {config.search.keep_checkpoints} applied: {counted(removed, 'best.ckpt')} of "
          f"ended trials removed", flush=True)


def _run_failed_again(study) -> None:
    """Queue the failed trials' configurations to run again (``searcher.run_failed_again``),
    saying which; those queued by an earlier resume and not yet run included."""
    from .searcher import failed_configurations_run_since, run_failed_again

    since = failed_configurations_run_since(study)
    queued = run_failed_again(study)
    if queued:
        pairs = ", ".join(f"{failed} as {new}" for failed, new in sorted(queued.items()))
        print(f"running again the configurations of {counted(len(queued), 'failed trial')} (trial {pairs}); "
              f"the failed trials stay in the study as they ended", flush=True)
    elif not since:
        print("no failed trial to run again", flush=True)
    # (not those whose later trial failed too: that one runs again, as said above; audit 46)
    run_since = {failed: later for failed, later in since.items() if failed not in queued and later not in queued}
    if run_since:  # (audit 45: they were left without a word)
        pairs = ", ".join(f"{failed} as {later}" for failed, later in sorted(run_since.items()))
        print(f"not running again {counted(len(run_since), 'failed trial')} whose configuration a later trial has "
              f"(trial {pairs})", flush=True)


def _first_trials_that_fit(study, config: ExperimentConfig) -> list[int]:
    """The places of the first trials a resume adds (``searcher.first_trials_to_queue``);
    those ``num_trials`` leaves no room for are said, with the resume that runs them."""
    from .searcher import first_trials_to_queue, runs_again

    fits, no_room = first_trials_to_queue(study, config)
    if no_room:
        held = len(study.get_trials(deepcopy=False)) - runs_again(study) if study is not None else 0
        room = (f"search.num_trials ({config.search.num_trials}) leaves room for {counted(len(fits), 'more trial')} "
                f"besides the study's {held}" if fits else
                f"the study holds {held} trials, all that search.num_trials ({config.search.num_trials}) allows")
        # a resume that runs no session keeps experiment.yaml as it was: both are needed at once (audit 42)
        warn_user(f"{', '.join(f'search.first_trials.{index}' for index in no_room)} will not run: {room}; "
                  f"resume with --set search.num_trials={held + len(fits) + len(no_room)} and this "
                  f"search.first_trials to run {'it' if len(no_room) == 1 else 'them'}")
    return fits


def _queue_first_trials(exp: ExperimentDir, config: ExperimentConfig) -> None:
    """Queue the trials of ``search.first_trials`` that the study does not have yet
    (``searcher.queue_first_trials``), saying which trial runs which."""
    from .outcome import FIRST_TRIAL
    from .searcher import open_study, queue_first_trials

    study = open_study(exp.root, config.name, config.mode)
    queued = queue_first_trials(study, config)
    if queued:
        pairs = ", ".join(f"{number} (search.first_trials.{index})" for index, number in queued.items())
        print(f"running {counted(len(queued), 'trial')} with given values first: trial {pairs}", flush=True)
    earlier = [trial.number for trial in study.get_trials(deepcopy=False) if trial.state.name == "WAITING"
               and trial.user_attrs.get(FIRST_TRIAL) not in (None, *config.search.first_trials)]
    if earlier:  # Optuna's queue has no way to take a trial out
        print(f"trial {', '.join(map(str, earlier))} still run{'s' if len(earlier) == 1 else ''} first the values "
              f"an earlier session's search.first_trials gave (queued before it ended)", flush=True)


def _best_evaluated(exp: ExperimentDir, config: ExperimentConfig) -> bool:
    """Whether best.json holds a finished evaluation of the trial trials.csv ranks best now,
    at its value now. A session that found a better trial (or took the best one further)
    and was stopped or killed during its evaluation left the earlier best's best.json,
    which every later resume then kept (audit 24)."""
    from .trials_table import TrialsTable

    stored = exp.stored_best()
    if stored is None or stored.get("test_error") is not None:
        return False
    row = TrialsTable.load(exp.trials_csv, config.metric, config.mode, list(config.space)).best_row()
    return row is not None and (str(stored.get("trial")), str(stored.get("value")), str(stored.get("epochs"))) \
        == (str(row["trial"]), str(row["best"]), str(row.get("epochs")))


def _has_a_result(exp: ExperimentDir, config: ExperimentConfig) -> bool:
    """Whether some trial finished with a result: a best trial to evaluate."""
    from .trials_table import TrialsTable

    return TrialsTable.load(exp.trials_csv, config.metric, config.mode, list(config.space)).best_row() is not None


def _naming_the_last_sessions_directory(error: ConfigError, exp: ExperimentDir,
                                        advice: str = "resume it from there") -> ConfigError:
    """A user package that does not import here, with the directory the study's last
    session ran from: its packages imported from there (the current directory)."""
    directory = next((s["directory"] for s in reversed(read_sessions(exp)) if s.get("directory")), None)
    if directory is None or directory == os.getcwd():
        return error
    return ConfigError([replace(problem, message=f"{problem.message}; this study's last session ran from "
                                                 f"{directory}: {advice}")
                        if "No module named" in problem.message else problem for problem in error.problems])


# Settings of a session rather than of its trials, which a resume changes as a matter of course
# (first trials a resume adds are said as they are queued).
SESSION_SETTINGS = ("search.num_trials", "search.max_concurrent", "search.time_budget_s",
                    "failure.max_consecutive_failures", "storage", "search.first_trials")


def say_what_resume_changes(stored: ExperimentConfig, config: ExperimentConfig, root: Path,
                            trials_run: bool = True) -> None:
    """Warn of each setting of the trials a resume changes (not ``SESSION_SETTINGS``): it
    applies to every trial from now on, the paused ones included, which continue with it
    (another precision, say); not said when no trial will run (a complete study). A
    changed ``storage`` changes nothing: the study stays where it is."""
    before, after = flat_settings(stored.model_dump(mode="json")), flat_settings(config.model_dump(mode="json"))
    changed = [key for key in sorted(set(before) | set(after))
               if before.get(key) != after.get(key) and key not in SESSION_SETTINGS] if trials_run else []
    # how trials are sampled: paused trials keep their values
    sampling = [key for key in changed if key in ("search.sampler", "search.seed")]
    keeping = "search.keep_checkpoints" in changed and after.get("search.keep_checkpoints") is not None
    training = [key for key in changed if key not in sampling and key != "search.keep_checkpoints"]

    def listed(keys: list[str]) -> str:
        return ", ".join(f"{key} ({before.get(key)!r} -> {after.get(key)!r})" for key in keys)

    if training:
        warn_user(f"resume changes {listed(training)}: trials from now on use "
                  f"{'it' if len(training) == 1 else 'them'}, paused trials included")
    if keeping:  # it said "trials from now on use it", and removed 1,595 of 1,600 ended trials' (audit 40)
        warn_user(f"resume changes {listed(['search.keep_checkpoints'])}: as the session starts, the trials already "
                  f"ended keep their best.ckpt only if among the best {after['search.keep_checkpoints']} (or the "
                  f"study's best); the others' are removed")
    if sampling == ["search.seed"] and after.get("search.sampler") == "grid":
        # a grid keeps the order of the seed it began with (searcher.make_sampler; audit 66)
        warn_user(f"resume changes {listed(sampling)}: only the seeds trials started from now on train with (each "
                  f"started trial keeps its own: trials.csv's seed column); the grid keeps the order of the seed "
                  f"it began with")
    elif sampling:
        seeded = ("; trials started from now on also train with seeds drawn from the new seed (each started "
                  "trial keeps its own: trials.csv's seed column)") if "search.seed" in sampling else ""
        warn_user(f"resume changes {listed(sampling)}: the trials sampled from now on are sampled so "
                  f"(paused trials keep their values){seeded}")
    if before.get("storage") != after.get("storage"):
        warn_user(f"storage is ignored on resume: the study stays in {root}")


def _differs(recorded: Any, current: Any, user_keyed: bool = False) -> bool:
    """A setting as the study recorded it against the same now. Keys that the user writes
    (the space's parameters, a class's ``init_args``, a parameter's ``when``, which is
    written only where set) must match both ways; a key that a later version of hpsearch
    added to a section is no difference."""
    if isinstance(recorded, dict) and isinstance(current, dict):
        if user_keyed and set(recorded) != set(current):
            return True
        if "type" in current and "when" in current and "when" not in recorded:
            return True  # a condition added to a parameter
        return any(key not in current or _differs(value, current[key], key in ("init_args", "when"))
                   for key, value in recorded.items())
    return recorded != current


def _search_complete(exp: ExperimentDir, config: ExperimentConfig, runs_again: int = 0) -> bool:
    """Whether the study's last session completed its search, with every trial finished:
    the session completed, or its Tune run did before the session was stopped during the
    test evaluation. (Only then do trials.csv and the Optuna journal surely agree.)
    ``runs_again``: the study's trials that ran failed ones' configurations again, which
    are beyond num_trials (a num_trials between the two counts ran nothing; audit 29)."""
    from .space import trial_limit

    sessions = sorted(read_sessions(exp), key=lambda s: float(s["started_at"]))
    if not sessions or not (sessions[-1].get("outcome") == SESSION_COMPLETE or sessions[-1].get("search_complete")):
        return False
    trials = read_rows(exp.trials_csv) if exp.trials_csv.is_file() else []
    return len(trials) - runs_again >= trial_limit(config) and all(t.get("state") in FINISHED_STATES for t in trials)


def _evaluate_again(config: ExperimentConfig, exp: ExperimentDir, address: str | None, verbose: bool,
                    mirror: Mirror | None) -> SearchResult:
    """The search is complete, but its test evaluation of the best trial failed (or its
    best.json is missing): run only the evaluation, not another Tune session. Ray starts
    only when the evaluation needs a trial's GPUs (see ``results.evaluate_on_cluster``).
    It is a session of the study all the same (sessions.json: its time counts in the
    study's wall time)."""
    from .results import evaluation_needs_ray, finalize

    started_at = time.time()
    record_session(exp, started_at, None, SESSION_RUNNING, search_complete=True, address=cluster_address(address))
    outcome = SESSION_CRASHED
    try:
        if evaluation_needs_ray(config):
            from .tuner import ray_for_search

            with ray_for_search(config, address, verbose):
                best = finalize(config, exp, mirror)
        else:
            best = finalize(config, exp, mirror)
        outcome = SESSION_COMPLETE
    except KeyboardInterrupt:
        outcome = SESSION_INTERRUPTED
        raise Interrupted(exp.root, address) from None
    finally:
        try:
            record_session(exp, started_at, time.time(), outcome, search_complete=True)
            if mirror is not None:
                mirror.push_study_files()
        except HpsearchError:
            pass  # a full disk: the error that caused it is the one to report
    trials = read_rows(exp.trials_csv)
    return SearchResult(exp.root, SESSION_COMPLETE, best, trials, evaluated_again=True, address=address,
                        finished_before=_finished(trials))


def prepare(config: ExperimentConfig, preflight: bool | None = None, new_study: bool = False) -> list[str] | None:
    """Resolve the user's classes and check their arguments; run the preflight batch.
    Returns the data's class names, if its DataModule names them (``data_classes``).
    ``new_study``: the checks a study's own config is spared on resume (``run`` and ``check``).

    The user's modules import torch and Lightning: with the garbage collector paused, and
    what they leave is frozen for the search that follows (see ``gc_pause``); the caller
    thaws it with ``thawed_at_exit``."""
    from .components import check_components, check_split_not_searched
    from .distributed import check_strategy_available
    from .space import check_sampler, check_steps

    with collector_paused(freeze_survivors=True):
        model_class, data_class = check_components(config)
        from .devices import datamodule_worker_counts, loader_setting_warnings, precision_fallback_warning
    if new_study:
        check_split_not_searched(config, data_class)
    check_strategy_available(config)
    check_sampler(config)
    check_steps(config)
    precision_fallback_warning(config.trainer, config.resources, config.space)
    loader_setting_warnings(config.loader, config.resources,
                            datamodule_worker_counts(config.data.init_args, config.space), data_class)
    if not (config.search.preflight if preflight is None else preflight):
        from .preflight import data_classes_from_constructor

        return data_classes_from_constructor(config, data_class)
    from .preflight import run_preflight

    found: dict[str, list[str] | None] = {}

    def keep_classes_of(datamodule) -> None:
        found["classes"] = classes_of(datamodule)

    run_preflight(config, model_class, data_class, on_data=keep_classes_of)
    return found.get("classes")


def _paused_by_a_full_disk(exp: ExperimentDir) -> str:
    """What the trials that a full disk paused said (their rows in trials.csv)."""
    rows = [row for row in read_rows(exp.trials_csv) if row.get("state") == PAUSED
            and str(row.get("reason") or "").startswith("disk full")] if exp.trials_csv.is_file() else []
    said = "; ".join(f"trial {row['trial']}: {row['reason']}" for row in rows) or "a trial's disk filled"
    return f"{said}. {'It is' if len(rows) == 1 else 'They are'} paused, with {'its' if len(rows) == 1 else 'their'} " \
           f"checkpoints, not failed"


def _plan(config: ExperimentConfig, local: bool) -> int:
    """Concurrent trials the cluster (``local``: this machine's own Ray) can hold, at full
    scale if it autoscales (a ``ResourceError`` if none fits)."""
    import ray

    from .autoscaling import addable_nodes
    from .tuner import plan_concurrency

    return plan_concurrency(config, ray.nodes(), addable_nodes(), place="this machine" if local else "the cluster")


def _search(config: ExperimentConfig, exp: ExperimentDir, verbose: bool, concurrency: int,
            callbacks: Iterable[Any] = (), mirror: Mirror | None = None, address: str | None = None,
            local_environment: Mapping[str, str] | None = None) -> SearchResult:
    from .results import finalize
    from .searcher import keep_settings
    from .space import trial_limit
    from .tune_callbacks import RaisedAtTheNextStep
    from .tuner import run_session

    started_at = time.time()
    close_killed_sessions(exp)
    rows_before = read_rows(exp.trials_csv) if exp.trials_csv.is_file() else []
    finished_before = _finished(rows_before)
    record_session(exp, started_at, None, SESSION_RUNNING, address=cluster_address(address),
                   finished_before=finished_before)
    keep_settings(exp.root, config, FROZEN_ON_RESUME)
    _queue_first_trials(exp, config)
    if mirror is not None:
        mirror.push_study_files()
    outcome, search_complete = SESSION_CRASHED, False
    ended_before = {str(row["trial"]) for row in rows_before if row.get("state") in FINISHED_STATES}
    held_before = _reservations()

    def ray_lost(silent_s: float) -> None:  # from the watch's thread; the process ends after it
        # ended when Ray fell silent: the wait since was no work (compare's wall time; audit 32)
        record_session(exp, started_at, max(started_at, time.time() - silent_s), SESSION_RAY_LOST, search_complete)
        if mirror is not None:
            mirror.push_study_files()
        here = f"hpsearch resume {shlex.quote(str(exp.root))}"
        print(f"\nhpsearch: the search's Ray has not answered for {silent_s:.0f} s (its GCS, at {watch.gcs_address}: "
              f"the cluster's head process or node is gone), and Ray is about to end this process. Finished "
              f"trials are kept; the running ones continue from their last checkpoints when the study is "
              f"resumed, on another cluster with: {here} --address ADDRESS, or on this machine with: {here}",
              file=sys.stderr, flush=True)

    try:
        with _stop_signals_interrupt() as tune_ended, sigterm_stops_gracefully(exp), \
                RayLostWatch(ray_lost) as watch:
            wrapped = [RaisedAtTheNextStep(callback) for callback in callbacks]
            ended = run_session(config, exp, verbose, concurrency, wrapped, mirror, local_environment)
            tune_ended()
            if ended == SESSION_DISK_FULL:
                outcome = ended
                raise DiskFullError(_paused_by_a_full_disk(exp))
            if ended == SESSION_COMPLETE:
                search_complete = True  # recorded now, in case the evaluation below is killed
                record_session(exp, started_at, None, SESSION_RUNNING, search_complete)
            # After a graceful stop too: best.json then holds the best trial so far.
            best = finalize(config, exp, mirror) if exp.trials_csv.is_file() else None
            for callback in wrapped:  # one that raised once the trials had ended, now the result is saved
                callback.raise_kept()
        outcome = ended
    except KeyboardInterrupt:
        # A second Ctrl+C while Tune winds down, or the first during the test evaluation:
        # stop at once. Everything finished is on disk; resume evaluates the best trial again.
        outcome = SESSION_INTERRUPTED
        _release_reservations_since(held_before)
        raise Interrupted(exp.root, address) from None
    except Exception as exc:
        _release_reservations_since(held_before)  # a Python session's next search needs them
        # A full disk, also one Ray Tune met in a callback as it ended a trial and raised as
        # that trial's failure (audit 58: it ended the session as "crashed", without this)
        full = next((error for error in exception_chain(exc) if isinstance(error, DiskFullError)), None)
        if full is None:
            raise _user_error_in(exc) or _callback_error_in(exc, callbacks, exp) or exc
        outcome = SESSION_DISK_FULL  # recorded if there is room for it
        # the search stops there; nothing finished is lost (audit 27: it said only the first part)
        raise DiskFullError(f"{full}. The search stopped; finished trials are kept, and the running ones "
                            f"continue from their last checkpoints: once there is space, continue the study "
                            f"with: {resume_command(exp.root, address)}") from exc
    finally:
        try:
            record_session(exp, started_at, time.time(), outcome, search_complete)
            if mirror is not None:
                mirror.push_study_files()
        except HpsearchError:
            pass  # a full disk: the error that caused it is the one to report
    trials = read_rows(exp.trials_csv) if exp.trials_csv.is_file() else []
    stop_reason = ""
    if outcome == SESSION_FAILURES_IN_A_ROW:  # this session's failures, not the study's older ones (audit 29)
        session_trials = [trial for trial in trials if str(trial["trial"]) not in ended_before]
        stop_reason = failures_stop_reason(config.failure.max_consecutive_failures, session_trials)
    for warning in outcome_warnings(outcome, best, trials, trial_limit(config), stop_reason, exp.root, address):
        warn_user(warning)
    return SearchResult(exp.root, outcome, best, trials, address=address,
                        finished_before=finished_before, stop_reason=stop_reason)


def outcome_warnings(outcome: str, best: dict[str, Any] | None, trials: list[dict[str, Any]], limit: int,
                     stop_reason: str, root: Path, address: str | None) -> list[UserWarning]:
    """What a session's end must say from Python, where the call otherwise returns as if
    all went well (the command line prints it, and exits with 1 or 130): that no trial has
    a result, and how a stopped search goes on."""
    said: list[UserWarning] = []
    if best is None and outcome in (SESSION_COMPLETE, SESSION_FAILURES_IN_A_ROW):
        failed = sum(1 for trial in trials if trial.get("state") == "FAILED")
        said.append(NoResultWarning(f"no trial finished with a result ({failed} of {len(trials)} failed); "
                                    f"result.best is None. See why in result.trials or with: "
                                    f"hpsearch status {study_address(root)}"))
    go_on = f"{resume_call(root, address)}, or: {resume_command(root, address)}"
    if outcome == SESSION_FAILURES_IN_A_ROW:
        said.append(StoppedEarlyWarning(f"{stop_reason}; once the cause is fixed, continue the study with {go_on}"))
    if outcome == SESSION_INTERRUPTED:  # by a Ctrl+C or SIGTERM, gracefully
        said.append(StoppedEarlyWarning(f"search stopped before the study was complete "
                                        f"({finished_of(trials, limit)}); continue it with {go_on}"))
    return said


def failures_stop_reason(in_a_row: int, trials: list[dict[str, Any]]) -> str:
    """Why failure.max_consecutive_failures stopped the session, with the commonest errors
    of ``trials`` (the session's; one traceback file each), so that the fault to fix is
    named where the stop is."""
    errors: Counter[str] = Counter()
    traceback_of: dict[str, str] = {}
    for trial in trials:
        if trial.get("state") == "FAILED":
            text = str(trial.get("error") or trial.get("reason") or "no error recorded")
            error = re.sub(r" \(traceback: [^)]*\)", "", text)
            errors[error] += 1
            found = re.search(r"\(traceback: ([^)]*)\)", text)
            if found:
                traceback_of.setdefault(error, found.group(1))
    named = "; ".join(f"{error} ({counted(count, 'trial')}" + (f"; traceback: {traceback_of[error]})"
                                                               if error in traceback_of else ")")
                      for error, count in errors.most_common(2))
    more = f"; and {counted(len(errors) - 2, 'other error')}" if len(errors) > 2 else ""
    return (f"search stopped: {counted(in_a_row, 'trial')} in a row failed (failure.max_consecutive_failures), "
            f"as a fault every trial meets makes them, or one of much of the space. This session's failures: "
            f"{named}{more}")


def _finished(trials: list[dict[str, Any]]) -> int:
    return sum(1 for trial in trials if trial.get("state") in FINISHED_STATES)


def finished_of(trials: list[dict[str, Any]], limit: int) -> str:
    """How far a study got, out of its ``limit`` (num_trials, or a grid's size): the failed
    trials' configurations run again (resume --retry-failed) are beyond it, and counted
    apart, lest more trials than num_trials seem to have finished."""
    again = [trial for trial in trials if trial.get("retry_of") not in (None, "")]
    first_runs = [trial for trial in trials if trial.get("retry_of") in (None, "")]
    text = f"{_finished(first_runs)} of {counted(limit, 'trial')} finished"
    return text + (f"; of the failed trials' configurations run again, {_finished(again)} of {len(again)}"
                   if again else "")


def _reservations() -> set[str]:
    """The placement groups Ray holds now (Tune reserves each trial's resources in one)."""
    import ray
    from ray.util.placement_group import placement_group_table

    return set(placement_group_table()) if ray.is_initialized() else set()


def _release_reservations_since(held_before: set[str]) -> None:
    """Removes the placement groups a search made that are still held, and so the trial
    processes in them. A second Ctrl+C (or an error, a user's callback's say) leaves Tune's
    loop before it stops its trials: in a Python session, whose Ray stays up for the next
    search, those trials held every CPU, and the next ``resume`` or ``run`` waited for
    them without end, saying nothing. Only this driver's own: a placement group's id ends
    with the id of the job that made it (its actors', Ray Train's ranks' too), and other
    jobs on a shared cluster make theirs meanwhile."""
    import ray

    from .tune_callbacks import remove_reservation

    if not ray.is_initialized():
        return
    try:
        job = ray.get_runtime_context().get_job_id()
        for group_id in _reservations() - held_before:
            if group_id.endswith(job):
                remove_reservation(group_id)
    except Exception as exc:  # noqa: BLE001 - the stop goes on; say what may still be held
        warn_user(f"the stopped search's trials may still hold Ray's resources ({first_line(exc)}); "
                  f"ray.shutdown() frees them")


class NoResultWarning(UserWarning):
    """A search ended with every trial failed (or none reporting its metric): no best trial."""


class StoppedEarlyWarning(UserWarning):
    """A search was stopped (Ctrl+C, SIGTERM) before its study was complete; it can be resumed."""


class _HeardInterrupt:
    """Whether a Ctrl+C (SIGINT) arrived during a search's start-up."""

    def __init__(self) -> None:
        self.heard = False

    def raise_if_heard(self) -> None:
        if self.heard:
            raise KeyboardInterrupt


@contextmanager
def _start_up_interrupts_kept() -> Iterator[_HeardInterrupt]:
    """A Ctrl+C during start-up raises ``KeyboardInterrupt`` where it lands, unless it lands
    while Python runs an at-fork hook (each subprocess an import or Ray's start spawns):
    Python swallows it there ("Exception ignored in: <function _releaseLock>"), and the
    whole search ran (seen 1 in 8 at one moment of the start-up, on a loaded machine). The
    handler also remembers it, and the start-up checks before Ray starts and before the
    search. The previous handler is put back on exit (the search installs its own)."""
    interrupted = _HeardInterrupt()
    if threading.current_thread() is not threading.main_thread():
        yield interrupted
        return

    def remember_and_raise(signum, frame):
        interrupted.heard = True
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, remember_and_raise)
    try:
        yield interrupted
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


_TUNE_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGUSR1") if hasattr(signal, name))


@contextmanager
def _stop_signals_interrupt():
    """SIGTERM (a scheduler's or a pre-emption's stop) stops gracefully, like Ctrl+C; the
    second of either stops at once. On exit every handler it or Ray Tune changed is put back.
    It yields ``tune_ended``, to call once Ray Tune's run has returned: from there no trial
    is left to stop, and the first signal interrupts at once (the test evaluation, which a
    resume runs again), instead of being announced as a graceful stop that never comes.

    That holds in a process started with SIGINT ignored too, as a job script's background
    ``hpsearch run ... &`` is: Ray Tune takes the first Ctrl+C or SIGTERM regardless, then
    puts the ignoring back, so the second would have been lost."""
    if threading.current_thread() is not threading.main_thread():
        yield lambda: None
        return
    # Ray Tune installs its own SIGINT and SIGUSR1 handlers and leaves them: after a
    # search, a notebook's or REPL's next Ctrl+C only set an event on the finished Tuner.
    previous = {signum: signal.getsignal(signum) for signum in _TUNE_SIGNALS}
    def as_ctrl_c(signum, frame) -> None:
        os.kill(os.getpid(), signal.SIGINT)

    setattr(as_ctrl_c, GRACEFUL, True)  # hpsearch stop may send it (study_lock.sigterm_stops_gracefully)
    previous_term = signal.signal(signal.SIGTERM, as_ctrl_c)
    if previous[signal.SIGINT] == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    ours = signal.getsignal(signal.SIGINT) or signal.default_int_handler  # None: set outside Python
    try:
        with _graceful_stop_announced():
            yield lambda: signal.signal(signal.SIGINT, ours)  # Tune leaves its handler after a fit
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        for signum, handler in previous.items():
            if handler is not None:  # None: set outside Python, cannot be put back
                signal.signal(signum, handler)


GRACEFUL_STOP_MESSAGE = ("hpsearch: stopping. Running trials stop now (resume continues them from their last "
                         "checkpoint), then the best trial so far, if one has ended, is evaluated. A second "
                         "Ctrl+C or SIGTERM stops at once.")


class _GracefulStopAnnouncer(logging.Filter):
    """Prints ``GRACEFUL_STOP_MESSAGE`` in place of the warning Ray Tune logs when it takes
    the first stop signal; passes the logger's other records as the logger's own level
    (``level``, or its parent's when that is unset) would."""

    TUNE_STOP_WARNING = "Stop signal received"

    def __init__(self, logger: logging.Logger, level: int) -> None:
        super().__init__()
        self.logger, self.level = logger, level

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith(self.TUNE_STOP_WARNING):
            print(GRACEFUL_STOP_MESSAGE, file=sys.stderr, flush=True)
            return False
        parent = self.logger.parent
        return record.levelno >= (self.level or (parent.getEffectiveLevel() if parent else logging.WARNING))


@contextmanager
def _graceful_stop_announced():
    """Say at once what the first Ctrl+C or SIGTERM does. Ray Tune only logs it, and
    hpsearch keeps Ray Tune's logs quiet: without this, nothing is printed until the
    running trials have stopped and the best one is evaluated, which can take minutes,
    and a user who sees nothing presses again."""
    logger = logging.getLogger("ray.tune.tune")  # where Tune's stop-signal handler logs
    previous_level = logger.level
    announcer = _GracefulStopAnnouncer(logger, previous_level)
    logger.setLevel(min(logger.getEffectiveLevel(), logging.WARNING))
    logger.addFilter(announcer)
    try:
        yield
    finally:
        logger.removeFilter(announcer)
        logger.setLevel(previous_level)


def _callback_error_in(exc: BaseException, callbacks: Iterable[Any], exp: ExperimentDir) -> CallbackError | None:
    """The user's own callback's exception that Ray Tune re-raised as a ``TuneError``
    holding only its traceback's text: found by the frame the callback's method ran in."""
    import traceback

    mine = list(callbacks)
    for error in exception_chain(exc) if mine else ():
        for frame, _ in traceback.walk_tb(error.__traceback__):
            owner = frame.f_locals.get("self")
            if any(owner is callback for callback in mine):
                return CallbackError(owner, frame.f_code.co_name, error, exp.root)
    return None


def _user_error_in(exc: BaseException) -> HpsearchError | None:
    """An hpsearch error raised inside Ray Tune (e.g. a full disk in a callback), unwrapped."""
    return next((error for error in exception_chain(exc) if isinstance(error, HpsearchError)), None)
