"""The searcher: an Optuna study, persisted in the experiment directory, behind Ray Tune.

Why not Ray's ``OptunaSearch``: it tells Optuna that ASHA-pruned trials COMPLETED (so
the sampler learns from truncated curves as if they were final), it pickles the whole
study for resume, and it cannot cap the number of trials on resume. This searcher keeps
all of its state in the Optuna journal file (``optuna.journal``), which Optuna appends
to safely and which optuna-dashboard opens as is; its Ray checkpoint is only a marker.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState
from ray.tune.search import Searcher

from .config import ExperimentConfig
from .experiment import STUDY_FILE
from .outcome import (COMPLETE, DISK_FULL, EPOCH, FAILED, FIRST_TRIAL, KNOWN_EPOCHS, PRUNED, STOP_REASON, TRAINING_SEED,
                      TRIAL_NUMBER, PruneLog, best_of, classify)
from .seeding import resumed_seed, training_seed
from .space import grid_values, is_sampled, to_distributions, trial_limit

RAY_TRIAL_ID = "ray_trial_id"
SETTINGS = "hps_settings"  # the study's: what it was searched with, that a resume may not change
RETRY_OF = "hps_retry_of"  # a trial's: the failed trial whose configuration it runs again (resume --retry-failed)
GRID_SEED = "hps_grid_seed"  # the study's: the seed its grid was shuffled with, kept across resumes


def repair_journal(path: Path) -> int:
    """Drop a torn last record (a crash or full disk mid-append); returns the bytes dropped.

    Optuna skips a torn last line when reading, but the next append would land after it
    and make the whole journal unreadable; cutting it first keeps every whole record.
    Run by the study's holder (``study_lock``) only, before it appends: so the journal's
    own lock file, if there is one, was left by a driver killed as it appended, and is
    removed. Optuna waited 30 s for it, with four warnings (audit 37).
    """
    for stale in (path.with_name(path.name + ".lock"), *path.parent.glob(f"{path.name}.lock*.rename")):
        stale.unlink(missing_ok=True)  # Optuna's JournalFileSymlinkLock's file, and its release's rename
    if not path.is_file():
        return 0
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return 0
    keep = data.rfind(b"\n") + 1
    with path.open("r+b") as handle:
        handle.truncate(keep)
    warnings.warn(f"{path.name}: dropped a torn last record ({len(data) - keep} bytes) left by an interruption",
                  stacklevel=2)
    return len(data) - keep


def open_study(experiment_dir: Path, study_name: str, mode: str, sampler=None) -> optuna.Study:
    """The experiment's study (created on first use); the same call serves the CLI readers."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    repair_journal(experiment_dir / STUDY_FILE)
    storage = JournalStorage(JournalFileBackend(str(experiment_dir / STUDY_FILE)))
    return optuna.create_study(
        study_name=study_name, storage=storage, sampler=sampler, load_if_exists=True,
        direction="maximize" if mode == "max" else "minimize",
    )


def keep_settings(experiment_dir: Path, config: ExperimentConfig, keys: tuple[str, ...]) -> None:
    """Record in the study the settings a resume may not change, once: experiment.yaml can
    be edited, so it cannot be what a resume checks itself against."""
    study = open_study(experiment_dir, config.name, config.mode)
    if SETTINGS not in study.user_attrs:
        dumped = config.model_dump(mode="json")
        study.set_user_attr(SETTINGS, {key: dumped[key] for key in keys})


def existing_study(experiment_dir: Path, study_name: str, repair: bool = True) -> optuna.Study | None:
    """The study as its journal holds it, None if it has none; nothing is appended.
    ``repair=False`` for readers, which do not hold the study (``study_lock``): cutting a
    torn-looking last record there could cut the record a running driver is writing
    (Optuna itself skips a torn last line when it reads)."""
    path = experiment_dir / STUDY_FILE
    if not path.is_file():
        return None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if repair:
        repair_journal(path)
    try:
        return optuna.load_study(study_name=study_name, storage=JournalStorage(JournalFileBackend(str(path))))
    except KeyError:  # the journal holds no such study
        return None


def make_sampler(config: ExperimentConfig, seed_offset: int = 0,
                 grid_seed: int | None = None) -> optuna.samplers.BaseSampler:
    """The configured sampler. ``seed_offset`` (trials the study has handed out) keeps a resumed
    search from replaying the random stream it drew before the interruption (see
    ``resumed_seed``). Not for a
    grid: its seed shuffles the grid's points, which the study's trials name by their
    place (``grid_id``), so another seed on resume repeated points and skipped others.
    A grid takes the seed its study began with (``grid_seed``), whatever a resume sets;
    it needs no offset, since it picks only among the points no trial has taken."""
    kind = config.search.sampler
    if kind == "grid":
        seed = grid_seed if grid_seed is not None else config.search.seed
    else:
        seed = None if config.search.seed is None else resumed_seed(config.search.seed, seed_offset)
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "cmaes":
        # Pruned trials count, at their last value, as Optuna suggests beside a Hyperband
        # pruner (ASHA's kind): by default CMA-ES waited for a population of complete trials,
        # and in a search that pruned two thirds it never left its first generation (audit 78).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.CmaEsSampler(seed=seed, consider_pruned_trials=True,
                                                warn_independent_sampling=False)
    if kind == "gp":
        return optuna.samplers.GPSampler(seed=seed, warn_independent_sampling=False)  # check_sampler says it
    if kind == "grid":
        return _Grid({k: grid_values(p) for k, p in config.space.items()}, seed=seed)
    # constant_liar keeps concurrent trials from being sampled at the same point.
    return optuna.samplers.TPESampler(seed=seed, constant_liar=config.search.max_concurrent > 1)


class _Grid(optuna.samplers.GridSampler):
    """Optuna's grid, without its own stop at the last point: ``Study.stop`` works only
    inside ``study.optimize``, so told from Tune it raised, and the grid's last trial was
    retried as if it had failed. The searcher stops at the grid's size itself."""

    def after_trial(self, study, trial, state, values) -> None:
        pass


def runs_again(study: optuna.Study | None) -> int:
    """How many of the study's trials run a failed trial's configuration again."""
    return 0 if study is None else sum(RETRY_OF in t.user_attrs for t in study.get_trials(deepcopy=False))


def run_failed_again(study: optuna.Study) -> dict[int, int]:
    """Queue the configuration of each failed trial that no later trial runs again, as a
    new trial (``enqueue_trial``: the sampler gives it those values). The failed trials
    stay in the study as they ended. New trial number by failed one."""
    trials = study.get_trials(deepcopy=False)
    latest = {_configuration(t): t.number for t in trials}  # the last trial of each configuration
    failed = [t for t in trials if t.state == TrialState.FAIL and latest[_configuration(t)] == t.number]
    for trial in failed:
        study.enqueue_trial(dict(trial.params), user_attrs={RETRY_OF: trial.number}, skip_if_exists=False)
    queued = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.WAITING]
    return {t.user_attrs[RETRY_OF]: t.number for t in queued if RETRY_OF in t.user_attrs}


def failed_configurations_run_since(study: optuna.Study) -> dict[int, int]:
    """Each failed trial whose configuration a later trial has (sampled again, or queued to
    run again): that trial's number by the failed one's. ``run_failed_again`` leaves these."""
    trials = study.get_trials(deepcopy=False)
    latest = {_configuration(t): t.number for t in trials}
    return {t.number: latest[_configuration(t)] for t in trials
            if t.state == TrialState.FAIL and latest[_configuration(t)] != t.number}


def first_trials_to_queue(study: optuna.Study | None, config: ExperimentConfig) -> tuple[list[int], list[int]]:
    """The places in ``search.first_trials`` of the trials the study has not been given yet
    (a resume may add some), split into those that fit under ``num_trials`` and those
    that do not. A first trial is known by its values, so an edited one is a new one."""
    trials = study.get_trials(deepcopy=False) if study is not None else []
    given = [trial.user_attrs[FIRST_TRIAL] for trial in trials if FIRST_TRIAL in trial.user_attrs]
    new = [index for index, point in enumerate(config.search.first_trials) if point not in given]
    room = max(0, trial_limit(config) - (len(trials) - runs_again(study)))
    return new[:room], new[room:]


def queue_first_trials(study: optuna.Study, config: ExperimentConfig) -> dict[int, int]:
    """Queue the first trials that fit (``first_trials_to_queue``): Optuna's queue, which the
    study hands out before it samples, and which a resume finds still queued if the session
    ended first. Parameters a first trial leaves out are sampled. Trial number by place."""
    fits, _ = first_trials_to_queue(study, config)
    for index in fits:
        point = config.search.first_trials[index]
        study.enqueue_trial(dict(point), user_attrs={FIRST_TRIAL: point}, skip_if_exists=False)
    trials = study.get_trials(deepcopy=False)
    return {index: next(t.number for t in trials if t.user_attrs.get(FIRST_TRIAL) == config.search.first_trials[index])
            for index in fits}


def _configuration(trial) -> tuple:
    """A trial's values, as a key; a queued trial's are those it was queued with (it has
    no params until it is handed out)."""
    values = trial.params or trial.system_attrs.get("fixed_params", {})
    return tuple(sorted((name, repr(value)) for name, value in values.items()))


class OptunaSearcher(Searcher):
    """Suggests ``{"params": {...}, "hps_trial_number": n}`` until ``num_trials`` exist in the study."""

    def __init__(self, config: ExperimentConfig, experiment_dir: Path, prunes: PruneLog) -> None:
        super().__init__(metric=config.metric, mode=config.mode)
        self.config = config
        self.experiment_dir = Path(experiment_dir)
        self.prunes = prunes
        self.distributions = to_distributions(config)
        self._limit = trial_limit(config)
        self._runs_again = 0  # counted as the study opens
        self._study: optuna.Study | None = None
        self._numbers: dict[str, int] = {}
        self._to_resume: list[int] = []
        self._told: set[int] = set()  # trials this searcher ended in the study
        self._epochs_recorded: dict[int, int] = {}  # trials.csv's epochs of each trial (see epochs_recorded)

    # The study holds an open file; it is reopened lazily after unpickling (Tune pickles
    # the searcher with the Tuner), never pickled itself.
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_study"] = None
        state["_numbers"] = {}
        state["_to_resume"] = []
        state["_told"] = set()
        return state

    @property
    def trial_limit(self) -> int:
        """The trials the study holds when done: ``num_trials`` (or a smaller grid's size),
        and beyond them the failed trials' configurations run again (resume --retry-failed)."""
        self.study  # opened once, which counts the configurations run again
        return self._limit + self._runs_again

    @property
    def study(self) -> optuna.Study:
        if self._study is None:
            existing = open_study(self.experiment_dir, self.config.name, self.config.mode)
            # The trials handed out so far: a queued one (a first trial, a failed one's values
            # to run again) drew nothing yet. Counted, the first session of a study with
            # first trials, and a resume that had handed out only queued ones, began from
            # one seed, and the resume replayed the draws for what they left out (audit 42).
            offset = sum(trial.state != TrialState.WAITING for trial in existing.get_trials(deepcopy=False))
            if self.config.search.sampler == "grid" and GRID_SEED not in existing.user_attrs:
                existing.set_user_attr(GRID_SEED, self.config.search.seed)
            # Optuna shuffles a grid given no seed as by seed 0: a grid begun with search.seed
            # null and resumed with a seed took the new one, and ran some points twice and
            # others never (audit 66)
            grid_seed = (existing.user_attrs[GRID_SEED] or 0) if GRID_SEED in existing.user_attrs else None
            self._study = open_study(self.experiment_dir, self.config.name, self.config.mode,
                                     make_sampler(self.config, offset, grid_seed))
            self._runs_again = runs_again(self._study)
            for trial in self._study.get_trials(deepcopy=False):
                if RAY_TRIAL_ID in trial.user_attrs:
                    self._numbers[trial.user_attrs[RAY_TRIAL_ID]] = trial.number
                if trial.state == TrialState.RUNNING:
                    # Interrupted in an earlier session: handed out again before any new
                    # sample, with the same number and params, so it continues from its
                    # own checkpoint instead of being lost or duplicated.
                    self._to_resume.append(trial.number)
        return self._study

    def settle_finished(self, rows: dict[int, dict[str, Any]]) -> list[int]:
        """Tell the study how the trials ended that trials.csv has as finished and the study
        still has as running: the journal's record of that end was lost (torn by a kill
        mid-append and dropped), and such a trial was trained again, over its best.ckpt.
        Returns their numbers."""
        ends = {COMPLETE: TrialState.COMPLETE, PRUNED: TrialState.PRUNED, FAILED: TrialState.FAIL}
        settled = []
        for trial in self.study.get_trials(deepcopy=False):
            row = rows.get(trial.number) or {}
            state = ends.get(row.get("state"))
            if trial.state != TrialState.RUNNING or state is None:
                continue
            key = self._trial_key(trial.number)
            self.study._storage.set_trial_user_attr(key, STOP_REASON, row.get("reason") or "")
            if str(row.get("epochs", "")).isdigit():
                self.study._storage.set_trial_user_attr(key, EPOCH, int(row["epochs"]))
            value = self._best_intermediate(trial.intermediate_values)
            if value is None and row.get("best") not in (None, ""):
                value = float(row["best"])
            if state == TrialState.COMPLETE and value is not None:
                self.study.tell(trial.number, value, state=state)
            else:
                self.study.tell(trial.number, state=TrialState.FAIL if state == TrialState.COMPLETE else state)
            self._to_resume = [number for number in self._to_resume if number != trial.number]
            settled.append(trial.number)
        return settled

    def handed_out_without_a_row(self, rows: Mapping[int, Any]) -> dict[int, dict[str, Any]]:
        """The params, by number, of the trials the study handed out that ``rows``
        (trials.csv's) lacks: sampled, and not yet started when the session ended (a row
        comes when a trial starts). Resume continues them as it does the paused ones."""
        return {trial.number: dict(trial.params) for trial in self.study.get_trials(deepcopy=False)
                if trial.state == TrialState.RUNNING and trial.number not in rows}

    def finished_trials(self) -> list[dict[str, Any]]:
        """Finished trials as trials-table fields: the study is the source of truth for them."""
        states = {TrialState.COMPLETE: COMPLETE, TrialState.PRUNED: PRUNED, TrialState.FAIL: FAILED}
        finished = []
        for trial in self.study.get_trials(deepcopy=False):
            if trial.state in states:
                values = [v for v in trial.intermediate_values.values() if math.isfinite(v)]
                # The best epoch's value, as the trial reported it live: a PRUNED trial's
                # value in the study is its last epoch's (Optuna's rule), not its best.
                best = best_of(values, self.config.mode) if values else trial.value
                finished.append({
                    "trial": trial.number, "state": states[trial.state],
                    "reason": trial.user_attrs.get(STOP_REASON, ""),
                    **({"best": best} if best is not None else {}),
                    **({"last": trial.intermediate_values[max(trial.intermediate_values)]} if values else {}),
                    **({"epochs": trial.user_attrs[EPOCH]} if EPOCH in trial.user_attrs else {}),
                    **trial.params,
                })
        return finished

    def history(self) -> dict[int, dict[int, float]]:
        """Every trial's reported metric by epoch, for seeding ASHA's rungs on resume."""
        return {t.number: dict(t.intermediate_values) for t in self.study.get_trials(deepcopy=False)
                if t.intermediate_values}

    def is_complete(self) -> bool:
        """True when the study holds ``trial_limit`` trials and none is left unfinished."""
        trials = self.study.get_trials(deepcopy=False)
        return len(trials) >= self.trial_limit and all(t.state.is_finished() for t in trials)

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        # Metric and mode come from the experiment file only; refuse a second source.
        return metric in (None, self.config.metric) and mode in (None, self.config.mode)

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        study = self.study
        if trial_id not in self._numbers and self._to_resume:
            number = self._to_resume.pop(0)
            self._numbers[trial_id] = number
            study._storage.set_trial_user_attr(self._trial_key(number), RAY_TRIAL_ID, trial_id)
            self._sample_what_is_missing(number)
        if trial_id not in self._numbers:
            # a trial queued to run again (resume --retry-failed) is in the study before it is handed out
            handed_out = [t for t in study.get_trials(deepcopy=False) if t.state != TrialState.WAITING]
            if len(handed_out) >= self.trial_limit:
                return Searcher.FINISHED
            trial = study.ask()
            self._sample(trial)
            trial.set_user_attr(RAY_TRIAL_ID, trial_id)
            trial.set_user_attr(TRAINING_SEED, training_seed(self.config.search.seed, trial.number))
            self._numbers[trial_id] = trial.number
        frozen = study.get_trials(deepcopy=False)[self._numbers[trial_id]]
        # A resumed trial sends again the epochs its checkpoint holds beyond these
        known = max(frozen.intermediate_values, default=0)
        # A trial handed out before it was recorded (a study from before 2026-12-07) keeps the
        # seed the study's seed gives it now, as it did.
        seed = frozen.user_attrs[TRAINING_SEED] if TRAINING_SEED in frozen.user_attrs else \
            training_seed(self.config.search.seed, frozen.number)
        return {"params": dict(frozen.params), TRIAL_NUMBER: frozen.number, TRAINING_SEED: seed,
                KNOWN_EPOCHS: min(known, self._epochs_recorded.get(frozen.number, known)),
                **({RETRY_OF: frozen.user_attrs[RETRY_OF]} if RETRY_OF in frozen.user_attrs else {})}

    def epochs_recorded(self, rows: dict[int, dict[str, Any]]) -> None:
        """The epochs trials.csv has of each trial: a resumed trial sends again those its
        checkpoint holds beyond the fewer of these and the study's. trials.csv is written
        at most every few seconds while trials report, so at a kill it may lag the study;
        the epochs it missed were in the study, not sent again, and their time never
        reached the trial's ``compute_s``. The study and ASHA take an epoch sent twice once."""
        self._epochs_recorded = {number: int(float(row.get("epochs") or 0)) for number, row in rows.items()}

    def _sample_what_is_missing(self, number: int) -> None:
        """An interrupted trial gets the values of the space it lacks before it resumes.
        Each sampled value is its own journal record, so a driver killed while a trial was
        being sampled left it with some of them; it then trained with the model's defaults
        for the rest, values outside the search, and could be reported as the best."""
        params = self.study.get_trials(deepcopy=False)[number].params
        if any(name not in params and is_sampled(self.config.space[name], params) for name in self.distributions):
            self._sample(optuna.Trial(self.study, self._trial_key(number)))

    def _sample(self, trial: optuna.Trial) -> None:
        """Sample the trial's values in the space's order, each parameter whose condition
        its earlier values meet (one it has already is kept, as Optuna keeps it)."""
        for name, distribution in self.distributions.items():
            if is_sampled(self.config.space[name], trial.params):
                _suggest(trial, name, distribution)

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        number = self._numbers.get(trial_id)
        # A result can still arrive for a trial Tune already ended (e.g. when stopping it
        # failed); the study keeps what it was told at the end. A set, not a study read:
        # this runs for every result.
        if number is not None and number not in self._told:
            self._record_intermediate(number, result)

    def _record_intermediate(self, number: int, result: dict[str, Any] | None) -> None:
        value, epoch = (result or {}).get(self.config.metric), (result or {}).get(EPOCH)
        if value is None or epoch is None or not math.isfinite(float(value)):
            return
        self.study._storage.set_trial_intermediate_value(self._trial_key(number), int(epoch), float(value))

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        number = self._numbers.get(trial_id)
        if number is None or self.study.get_trials(deepcopy=False)[number].state.is_finished():
            return
        if result and result.get(DISK_FULL):
            return  # paused, not ended: the study keeps it running, and a resume continues it
        # Tune withholds the result that ended a trial from on_trial_result (ASHA's STOP,
        # the last epoch), so it is recorded here before the trial is told.
        self._record_intermediate(number, result)
        frozen = self.study.get_trials(deepcopy=False)[number]
        outcome = classify(trial_id, result, error, self.config.metric, self.prunes)
        storage, key = self.study._storage, self._trial_key(number)
        storage.set_trial_user_attr(key, STOP_REASON, outcome.reason)
        if result and EPOCH in result:
            storage.set_trial_user_attr(key, EPOCH, int(result[EPOCH]))
        best = self._best_intermediate(frozen.intermediate_values)
        self._told.add(number)
        if outcome.state == COMPLETE and best is not None:
            self.study.tell(number, best, state=TrialState.COMPLETE)
        elif outcome.state == PRUNED:
            self.study.tell(number, state=TrialState.PRUNED)
        else:
            self.study.tell(number, state=TrialState.FAIL)

    def _best_intermediate(self, values: dict[int, float]) -> float | None:
        return best_of((v for v in values.values() if math.isfinite(v)), self.config.mode)

    def _trial_key(self, number: int) -> int:
        return self.study.get_trials(deepcopy=False)[number]._trial_id

    def save(self, checkpoint_path: str) -> None:
        # Everything lives in the journal; the marker only tells Tune a state exists.
        Path(checkpoint_path).write_text(self.config.name, encoding="utf-8")

    def restore(self, checkpoint_path: str) -> None:
        self._study = None
        self._numbers = {}
        self._to_resume = []
        self._told = set()


def _suggest(trial: optuna.Trial, name: str, distribution: optuna.distributions.BaseDistribution) -> None:
    """Sample one value of ``distribution`` into ``trial``, through the study's sampler."""
    if isinstance(distribution, optuna.distributions.CategoricalDistribution):
        trial.suggest_categorical(name, distribution.choices)
    elif isinstance(distribution, optuna.distributions.IntDistribution):
        trial.suggest_int(name, distribution.low, distribution.high, step=distribution.step, log=distribution.log)
    else:
        trial.suggest_float(name, distribution.low, distribution.high, step=distribution.step, log=distribution.log)
