"""One trial: build the user's DataModule and model with the sampled values, train, report.

``train_trial`` is the Ray Tune function trainable. A trial keeps its checkpoints in
``EXP_DIR/trials/<trial name>/`` and its TensorBoard run under ``EXP_DIR/tensorboard/``.
When it is started again (a retry after a failure, a lost node, or ``hpsearch resume``)
it continues from its newest readable checkpoint there, so the global step and epoch
continue rather than restart.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .components import build_datamodule, build_model, raised_at, raised_by, resolve_class, shipped_code_first
from .config import ExperimentConfig
from .errors import (NO_TRAINING_BATCH, ConfigError, HpsearchError, UnreadableDataFile, exception_chain, first_line,
                     own_line)
from .experiment import TRIAL_SETTINGS, TRIAL_TRACEBACK, ExperimentDir, atomic_write_text, trial_name, write_json
from .checkpoints import latest_good_checkpoint, resumed_at
from .gc_pause import collector_paused
from .seeding import training_seed
from .outcome import (DISK_FULL, EPOCH, FAILURE, FINISHED, GIVE_UP, KNOWN_EPOCHS, RANK_NODES, RESTORED, TRAINING_SEED,
                      TRIAL_NUMBER)
from .storage import Mirror, is_uri, study_root
from .tensorboard_layout import run_dir
from .trial_output import output_kept
from .trial_watch import TrialWatch, crash_file
from .worker_data import IN_TRIAL_ENV, WORKER_DATA


@dataclass(frozen=True)
class Parallelism:
    """How this process takes part in its trial: alone, or as one DDP/FSDP/DeepSpeed rank."""

    world_size: int = 1
    strategy: Any = "auto"  # a Lightning strategy object for distributed ranks
    strategy_name: str = "single"
    report_on_every_rank: bool = False  # Ray Train collects a report from every rank
    rank: int = 0  # this process's, among the trial's

    @property
    def traceback_rank(self) -> int | None:
        """The rank that names this process's traceback file: None for a one-process trial."""
        return self.rank if self.world_size > 1 else None


def train_trial(trial_config: dict[str, Any], *, experiment: dict[str, Any], experiment_dir: str) -> None:
    """Ray Tune function trainable for single-process trials: trains in the Tune worker itself.

    The worker's first imports come here, before ``fit_trial``: the frame that makes them
    stays alive after them (held by something outside the objects Python's collector
    tracks), and a frame keeps its caller's. Made inside ``fit_trial``, they kept the
    worker's first trial alive, model and optimizer included, after the trial and after
    repeated full collections: on a GPU, its memory."""
    from ray import tune

    started_at = time.perf_counter()
    if not trial_config.get(GIVE_UP):  # a trial out of retries ends at once (fit_trial)
        load_training_stack(ExperimentConfig.model_validate(experiment))
    try:
        fit_trial(trial_config, experiment, experiment_dir, report=tune.report, parallel=Parallelism(),
                  started_at=started_at)
    finally:
        _free_for_the_next_trial()


def _free_for_the_next_trial() -> None:
    """After a trial, free what it leaves in its worker, which Ray Tune reuses for the next
    trials. Lightning's Trainer, the model, its optimizer and the DataModule hold one another
    in reference cycles, which only Python's cyclic collector frees: until its next full
    pass, the finished trials' data and weights stayed beside the next trial's. On CPU that
    was up to 11 earlier DataModules, each with its splits: a worker of 147 MB of data grew
    to 2.7 GB, and ``once_per_worker``'s dropped versions of a dataset stayed alive with them
    (audit 85; 1.2 GB with the pass). A pass costs about 6 ms (the imports' objects are
    frozen: ``gc_pause``). Then the memory the C allocator keeps goes back to the system
    (glibc's ``malloc_trim``; 750-800 MB flat over 100 such trials), and on a GPU the memory
    PyTorch keeps cached goes back to the driver, for the other processes sharing the GPU
    (fractional ``gpus_per_trial``)."""
    import gc

    gc.collect()
    _trim_the_allocator()
    if _used_a_gpu():
        import torch

        torch.cuda.empty_cache()


def _trim_the_allocator() -> None:
    """glibc's ``malloc_trim(0)``: the heap's free pages back to the system; nothing where
    the C library is another."""
    import ctypes

    try:
        trim = ctypes.CDLL(None).malloc_trim  # the process's own symbols, the C library's among them
    except (OSError, AttributeError):
        return
    trim(0)


def _used_a_gpu() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


def load_training_stack(config: ExperimentConfig) -> tuple[type, type]:
    """The user's DataModule and model classes, imported into this Ray worker together
    with torch, Lightning and hpsearch's Lightning glue, with the garbage collector paused
    and, the first time, the survivors frozen (see ``gc_pause``): a worker's first trial
    starts sooner, and later full collections skip the half-million objects the imports
    leave. Later calls cost next to nothing. Only for Ray worker processes, which
    hpsearch owns, and for the driver inside a search (``api`` thaws it at the end).
    A class that the driver imported but this machine cannot is an ``ImportError`` naming
    the machine (retried, as such errors are), not an "invalid experiment config"."""
    with collector_paused(freeze_survivors=True):
        from . import devices, lightning_trainer, reporting  # noqa: F401  (torch, Lightning)

        shipped_code_first()
        try:
            return resolve_class("data", config.data.class_path), resolve_class("model", config.model.class_path)
        except ConfigError as exc:  # the driver imported them: what fails is this machine's
            raise ImportError(f"on {socket.gethostname()}: {'; '.join(map(str, exc.problems))}") from None


def fit_trial(trial_config: dict[str, Any], experiment: dict[str, Any], experiment_dir: str, *,
              report: Callable[[dict], None], **how: Any) -> None:
    """Train one sampled configuration (``_fit_trial``, which ``how`` is passed to). A full
    disk met anywhere in it pauses the trial (``outcome.DISK_FULL``): met in its set-up
    (its folder, its settings file, a constructor), it was retried, then FAILED for good
    (audits 58 and 59); met in its training, ``_fit_trial`` reports it with its figures.
    (A rank of a distributed trial reports its ending by raising it, see ``distributed``.)"""
    try:
        _fit_trial(trial_config, experiment, experiment_dir, report=report, **how)
    except Exception as exc:
        if not _disk_full(exc):
            raise
        report({TRIAL_NUMBER: int(trial_config[TRIAL_NUMBER]), FINISHED: True,
                DISK_FULL: f"disk full: {first_line(exc)}"[:300]})


def _fit_trial(trial_config: dict[str, Any], experiment: dict[str, Any], experiment_dir: str, *,
               report: Callable[[dict], None], parallel: Parallelism, workers_start_s: float = 0.0,
               stopped_by_scheduler: Callable[[Any, dict], bool] | None = None,
               started_at: float | None = None) -> None:
    """Train one sampled configuration in this process (a Ray worker), reporting after
    every validation; what the process prints meanwhile is also kept in the trial's
    ``output.log`` (see ``trial_output``). ``workers_start_s``: how long the trial had
    already waited for this process (a distributed trial's worker group); its start-up and
    first result count it.
    ``stopped_by_scheduler``: for ranks whose report does not wait for Tune, whether the
    scheduler stopped the trial at a report (see ``TuneReporter``). ``started_at``: the
    ``time.perf_counter()`` at which this process took the trial up, when the caller did
    work of the trial's before (the imports); its start-up counts from there."""
    started = (time.perf_counter() if started_at is None else started_at) - workers_start_s
    config = ExperimentConfig.model_validate(experiment)
    params: dict[str, Any] = trial_config["params"]
    number = int(trial_config[TRIAL_NUMBER])
    if trial_config.get(GIVE_UP):
        # Out of retries for its own faults (see RetryPolicy): end as failed, with the reason.
        report({TRIAL_NUMBER: number, FAILURE: str(trial_config[GIVE_UP]), FINISHED: True})
        return
    data_class, model_class = load_training_stack(config)
    exp = ExperimentDir(study_root(experiment_dir))
    trial_dir = exp.trial_dir(trial_name(number))
    tensorboard_run = run_dir(exp.tensorboard_dir, number, params)
    # With URI storage this trial's files travel through the study's storage: it may
    # resume on another node, or after the cluster that started it is gone.
    mirror = Mirror.for_uri(experiment_dir) if is_uri(experiment_dir) else None
    own_files = [str(p.relative_to(exp.root)) for p in (trial_dir, tensorboard_run)]
    if mirror is not None:
        mirror.pull(*own_files)
    trial_dir.mkdir(parents=True, exist_ok=True)
    with output_kept(trial_dir):  # from here: a trial with cloud storage has pulled its earlier output
        # User code may want to know which trial it is part of (e.g. to write files beside it).
        os.environ[IN_TRIAL_ENV], os.environ["HPSEARCH_TRIAL_DIR"] = str(number), str(trial_dir)
        import pytorch_lightning as pl
        import torch

        from .devices import loader_in_use, trial_device, use_sharing_strategy
        from .lightning_trainer import build_trainer, quiet_lightning, remember_callback_factories
        from .reporting import NoTrainingBatchError, TuneReporter

        quiet_lightning()
        remember_callback_factories()

        torch.set_num_threads(max(1, int(config.resources.worker_cpus)))
        sharing = use_sharing_strategy(config.loader)
        # fixed when the trial was first handed out (``searcher``): a resume that changed
        # search.seed re-seeded a paused trial, whose data a global-generator split then
        # split anew (audit 44); a config without it (a caller of its own) draws it here
        seed = trial_config[TRAINING_SEED] if TRAINING_SEED in trial_config else \
            training_seed(config.search.seed, number)
        if seed is not None:
            # Each trial's weights and shuffling are reproducible, and differ between trials;
            # every rank of a trial starts from the same weights.
            pl.seed_everything(seed, workers=True, verbose=False)
        settings = config.with_trainer_params(params)
        # What the trial trains with, its sampled trainer settings applied: the best trial is
        # evaluated and described by it (each rank writes the same, atomically).
        write_json(trial_dir / TRIAL_SETTINGS, {**experiment, "trainer": settings.model_dump(mode="json")})
        device = trial_device(settings, config.loader, config.resources)
        reuses_before = WORKER_DATA.reuses
        try:
            datamodule = build_datamodule(config, data_class, params, device.loader_options)
            model = build_model(config, model_class, params, datamodule)
        except Exception as exc:
            if _disk_full(exc) or isinstance(exc, OSError) and not _unreadable_file(exc):
                raise  # reading files: another try, or another node, may succeed; a full disk pauses
            # The sampled values themselves are at fault (a bad combination the constructor
            # rejects), or a file that fails whenever read (audit 50: UnreadableDataFile was
            # retried): every retry would raise the same, so the trial fails at once. Named
            # by the user's line, its traceback kept, as a fault in training is (audit 61).
            where, saved = raised_at(exc), _save_traceback(exc, trial_dir, parallel.traceback_rank)
            if mirror is not None and parallel.rank == 0:
                mirror.push(*own_files)
            reason = (f"building the trial's {_class_name(raised_by(exc, data_class, model_class))} raised "
                      f"{type(exc).__name__}: {first_line(exc)[:200]}{f' (at {where})' if where else ''}")
            report({TRIAL_NUMBER: number, FINISHED: True,
                    FAILURE: f"{reason} (traceback: {saved})"[:400] if saved else reason[:300]})
            return
        resume_from, checkpoint_notes = latest_good_checkpoint(trial_dir)
        if resume_from is not None:
            from .trial_logger import after_earlier_event_files

            after_earlier_event_files(tensorboard_run)
        static_fields = {
            TRIAL_NUMBER: number,
            "hps_trial_dir": str(trial_dir),
            "hps_device": device.accelerator,
            "hps_precision": device.precision,
            "hps_world_size": parallel.world_size,
            "hps_workers_start_s": workers_start_s,
            "hps_strategy": parallel.strategy_name,
            # hpsearch's loader options until the training starts; then what its DataLoaders use
            "hps_num_workers": device.loader_options["num_workers"],
            "hps_pin_memory": device.loader_options["pin_memory"],
            "hps_loader_sharing": sharing,
            "hps_batch_slots": getattr(datamodule, "uses_batch_slots", False),
            "hps_resumed": resume_from is not None,
            "hps_notes": "; ".join(checkpoint_notes),
            **_placement(),
        }
        trial_files, tensorboard_files = own_files
        store_files = (lambda: mirror.push(trial_files)) if mirror is not None else None  # its checkpoints
        store_events = (lambda: mirror.push(tensorboard_files)) if mirror is not None else None
        reporter = TuneReporter(config.metric, config.mode, config.scheduler.max_epochs,
                                report=_timed(report, started), static_fields=static_fields,
                                store_epoch_files=store_files, store_epoch_events=store_events,
                                report_on_every_rank=parallel.report_on_every_rank, started=started,
                                stopped_by_scheduler=stopped_by_scheduler,
                                known_epochs=int(trial_config.get(KNOWN_EPOCHS, 0)),
                                # by the training's start, the DataModule's setup has asked for its data
                                fields_at_train_start=lambda trainer: {
                                    "hps_data_reused": WORKER_DATA.reuses > reuses_before,
                                    **loader_in_use(trainer.train_dataloader),
                                    **(_ranks_placement() if parallel.world_size > 1 else {})})
        watch = TrialWatch(config.failure.hang_timeout_s)
        trainer = build_trainer(settings, device=device, metric=config.metric, mode=config.mode,
                                max_epochs=config.scheduler.max_epochs, trial_dir=trial_dir,
                                tensorboard_run=tensorboard_run, callbacks=[reporter, *watch.callbacks()],
                                strategy=parallel.strategy, profiler=reporter.phase_timer,
                                resumed_at=resumed_at(resume_from) if resume_from else None)
        try:
            with watch.recording(crash_file(trial_dir, parallel.traceback_rank)):
                trainer.fit(model, datamodule=datamodule, ckpt_path=str(resume_from) if resume_from else None)
            if reporter.stopped_by_tune:
                raise SystemExit(0)  # the end of the trial's thread that Ray's stop at a report asks for
            reporter.send_final(trainer)  # Tune may stop the trial here: SystemExit, as above
            if resume_from is not None and not reporter.reported:
                reporter.report_restored(trainer, _validate_quietly(model, datamodule, device))
            elif not reporter.reported and reporter.batches_run == 0:
                raise NoTrainingBatchError(f"the training DataLoader gave no batch: {NO_TRAINING_BATCH}")
        except (Exception, SystemExit) as exc:
            reason = _failure_reason(exc, stopped_by_tune=reporter.stopped_by_tune)
            if reason is None:
                stand_in = _stand_in_ray_can_copy(exc)
                if stand_in is not None:
                    raise stand_in from None
                raise  # Tune retries it from the last checkpoint (failure.max_retries); Tune's stop ends the thread
            # Not worth a retry: end the trial as failed, with the reason and where its
            # traceback is kept, and let the search go on.
            saved = _save_traceback(exc, trial_dir, parallel.traceback_rank)
            if mirror is not None and trainer.global_rank == 0:
                mirror.push(*own_files)
            said = f"{reason} (traceback: {saved})"[:400] if saved else reason
            # a full disk pauses the trial and stops the session (tune_callbacks.DiskFilled)
            report({**static_fields, DISK_FULL if _disk_full(exc) else FAILURE: said,
                    FINISHED: True, EPOCH: trainer.current_epoch})


def _placement() -> dict[str, str]:
    """The Ray node this process runs on (rank 0's, for a distributed trial)."""
    import ray

    if not ray.is_initialized():
        return {}
    return {"hps_node_id": ray.get_runtime_context().get_node_id(), "hps_node_ip": ray.util.get_node_ip_address()}


def _ranks_placement() -> dict[str, str]:
    """The Ray nodes that a distributed trial's ranks run on, gathered from every rank (a
    collective: each rank calls it at the training's start). When one of them is lost, the
    other ranks often fail first, on the broken connection to it, and the driver tells
    that from a fault of the trial's own only by these nodes (``trial_faults.node_was_lost``)."""
    import ray
    import torch.distributed as dist

    if not (ray.is_initialized() and dist.is_available() and dist.is_initialized()):
        return {}
    nodes: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(nodes, ray.get_runtime_context().get_node_id())
    return {RANK_NODES: ",".join(sorted({node for node in nodes if node}))}


def _timed(report: Callable[[dict], None], started: float) -> Callable[[dict], None]:
    """``report`` that also records, once, how long the trial took to produce its first result."""
    first = {"done": False}

    def timed_report(metrics: dict[str, Any]) -> None:
        if not first["done"] and not metrics.get(RESTORED):  # a resumed epoch's is no new result
            metrics["hps_first_result_s"] = time.perf_counter() - started
            first["done"] = True
        report(metrics)

    return timed_report


def _validate_quietly(model, datamodule, device) -> dict[str, Any]:
    """Validation metrics of the model as it is, logging nothing (TensorBoard already has them)."""
    import pytorch_lightning as pl

    trainer = pl.Trainer(accelerator=device.accelerator, devices=1, precision=device.precision, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.validate(model, datamodule=datamodule, verbose=False)
    return dict(trainer.callback_metrics)


def _class_name(klass: type | None) -> str:
    return klass.__name__ if klass is not None else "model or DataModule"


# Raised by code, not by the world around it: a retry from the last checkpoint runs the
# same code on the same batches and raises again, so the trial fails at once. Faults a
# retry may outlive stay retried: RuntimeError (a lost DDP peer, a killed loader worker,
# a CUDA error), OSError (files, network), ImportError (a package missing on one node).
_PROGRAMMING_ERRORS = (TypeError, AttributeError, NameError, NotImplementedError, AssertionError,
                       KeyError, IndexError, ValueError, ZeroDivisionError)
# PyTorch's own checks of shapes, sizes, dtypes and devices raise RuntimeError too: code
# meeting values it cannot take (a sampled width that does not fit the input, a kernel
# larger than the feature map), which a retry meets again. Each retry cost a new worker
# process and torch's and Lightning's imports (README, "Failing trials").
_TORCH_SHAPE_CHECKS = re.compile("|".join((
    r"shapes cannot be multiplied", r"must have the same dtype", r"Kernel size can't be greater than actual input",
    r"Output size is too small", r"to have \d+ channels, but got \d+ channels", r"is invalid for input of size",
    r"The size of tensor a \(\d+\) must match the size of tensor b", r"Sizes of tensors must match",
    r"should contain \d+ elements not \d+", r"must be equal to input_size",
    r"Expected all tensors to be on the same device", r"Input type \(.*\) and weight type \(.*\) should be the same",
)))


def _failure_reason(exc: BaseException, stopped_by_tune: bool = False) -> str | None:
    """A one-line reason for faults that a retry cannot fix; None for those it might.
    ``stopped_by_tune``: a ``SystemExit`` came from Tune's stop at a report."""
    import torch
    from pytorch_lightning.utilities.exceptions import MisconfigurationException, SIGTERMException

    from .reporting import MetricNotLoggedError, NonFiniteError, NoTrainingBatchError

    interrupt = next((error for error in exception_chain(exc) if isinstance(error, KeyboardInterrupt)), None)
    if interrupt is not None:
        # Raised by the trial's code: the trial runs outside the main thread, where no
        # Ctrl+C arrives. Lightning's handler of it then failed ("signal only works in main
        # thread"), and that ValueError was the reason given (audit 27).
        where = raised_at(interrupt)
        return (f"KeyboardInterrupt raised{f' at {where}' if where else ''}; "
                f"not retried: the same code would raise it again")
    if isinstance(exc, SystemExit):
        # Tune's stop at a report carries no code, nor Lightning's on SIGTERM. Any other is the
        # trial's own ``sys.exit``: with a code it ended the worker, which was taken for a
        # process killed by the out-of-memory killer; with none, or 0, it was taken for Tune's
        # stop, and Ray's complaint that the trial ended unasked was the reason (audit 27).
        if isinstance(exc, SIGTERMException) or (exc.code in (0, None) and stopped_by_tune):
            return None
        where = raised_at(exc)
        return (f"SystemExit({exc.code!r}): sys.exit() called{f' at {where}' if where else ''}; "
                f"not retried: the same code would call it again")[:300]
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return f"OOM: {type(exc).__name__}: {first_line(exc) or 'out of memory'}"[:300]
    if isinstance(exc, (NonFiniteError, MetricNotLoggedError, NoTrainingBatchError)):
        return str(exc)
    if _disk_full(exc):
        return f"disk full: {exc}"[:300]
    if _unreadable_file(exc):  # an OSError, but the same file fails every time (audits 26 and 48)
        return f"unreadable file: {own_line(exc)[:240]}; not retried: the same file would fail again"
    if isinstance(exc, (*_PROGRAMMING_ERRORS, MisconfigurationException)) or (
            isinstance(exc, RuntimeError) and _TORCH_SHAPE_CHECKS.search(first_line(exc))):
        where = raised_at(exc)
        return (f"{type(exc).__name__}: {own_line(exc)[:200]}{f' (at {where})' if where else ''}; "
                f"not retried: the same code would raise it again")
    return None


def _stand_in_ray_can_copy(exc: BaseException) -> RuntimeError | None:
    """A ``RuntimeError`` naming ``exc``, with its traceback in the message, where Ray cannot
    copy ``exc`` (or what it was raised from), as it does every failure of a trial: an
    exception whose constructor takes other arguments than its ``args`` (``__init__(self,
    code, detail)`` passing one message up). Ray's copy raised a ``TypeError`` about that
    constructor, which became the trial's error (audit 27). None where Ray can copy it."""
    import copy
    import traceback

    error: BaseException | None = exc
    while error is not None:  # Ray copies the chain of causes
        try:
            copy.copy(error)
        except Exception:  # noqa: BLE001 - any failure to rebuild it
            name = f"{type(exc).__module__}.{type(exc).__qualname__}"
            return RuntimeError(f"{name}: {first_line(exc)}\n(raised as this RuntimeError, since Ray cannot copy "
                                f"{type(error).__qualname__}; the traceback:)\n"
                                + "".join(traceback.format_exception(exc)))
        error = error.__cause__
    return None


def _disk_full(exc: BaseException | None) -> bool:
    """A full disk, raised as it is or as the cause of another error (hpsearch's own
    ``DiskFullError`` of a file it writes, a library's error raised from it). Not an error
    raised while an ENOSPC was being handled: the user's code may have handled it, and
    its next error is its own (audit 59: a sampled value's ValueError paused its trial at
    every resume)."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return True
        exc = exc.__cause__
    return False


def _unreadable_file(exc: BaseException) -> bool:
    """A file that fails whenever it is read: one hpsearch's DataModules (or yours) say so
    of, or an image PIL cannot identify."""
    try:
        from PIL import UnidentifiedImageError
    except ImportError:
        UnidentifiedImageError = UnreadableDataFile
    return isinstance(exc, (UnreadableDataFile, UnidentifiedImageError))


def _save_traceback(exc: BaseException, trial_dir: Path, rank: int | None) -> Path | None:
    """The full traceback of the fault that ended the trial, beside its checkpoints (where
    the driver copies a retried fault's too: ``trial_faults.KeepTracebacks``); None if
    it could not be written (on a full disk, the file an earlier try left stays whole: it
    was left empty; audit 59)."""
    import traceback

    path = trial_dir / (TRIAL_TRACEBACK if rank is None else f"error-rank{rank}.txt")
    try:
        atomic_write_text(path, "".join(traceback.format_exception(exc)))
    except (OSError, HpsearchError):  # HpsearchError: DiskFullError
        return None
    return path
