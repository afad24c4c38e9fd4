"""Where a study's TensorBoard data lives and what the HParams dashboard is told.

    EXP_DIR/tensorboard/                      the log directory (``hpsearch tensorboard``)
      events...hparams                        the HParams columns: every searched parameter
                                              with its type and range, the trial's state,
                                              and the metrics to compare trials by
      trial_0003-lr=0.0012-channels=16/       one run per trial, named by number and values,
                                              its scalars stepped by the epoch (``trial_logger``)
        steps/                                what the model logs at training steps, if any
      study/                                  the study's own run: its best value so far and
                                              its best trial, as trials end (``StudyRun``)

A trial's scalars are written by its Lightning logger. Its HParams record (sampled
values, final state, epochs) is written by the driver when the trial ends, because
TensorBoard keeps only the first HParams record of a run and the state is known only
then: a trial joins the HParams table when it is COMPLETE, PRUNED or FAILED.

TensorBoard's own protobuf helpers are used (no TensorFlow needed).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

from .config import CategoricalParam, ExperimentConfig, FloatParam, IntParam
from .errors import counted
from .outcome import FINISHED_STATES

STATE_HPARAM, EPOCHS_HPARAM = "state", "epochs"
TEST_RECORD = ".test"  # the suffix of the file of the best trial's test metrics (write_test_metrics)
STEPS_RUN = "steps"  # a trial's metrics logged at training steps: a run inside its own (trial_logger)
# Speed series every trial writes (see reporting.SPEED_KEYS), offered as HParams metrics.
SPEED_METRICS = ("speed/samples_per_s", "speed/epoch_time_s")
VALIDATION_NAME = re.compile(r"(^|[/_.-])e?val", re.IGNORECASE)  # val_loss, val/acc, valid_f1, eval_acc, epoch/val-acc
_RUN_NAME_LIMIT = 96
STUDY_RUN = "study"  # the study's own run (``StudyRun``); a trial's run is named trial_NNNN-...


def run_name(number: int, params: dict[str, Any]) -> str:
    """``trial_0003-lr=0.0012-channels=16``: the trial number, then its values, shortest
    unambiguous parameter names first (``model.lr`` -> ``lr``), cut to a readable length."""
    short = _short_names(list(params))
    parts = [f"trial_{number:04d}"]
    for key, value in params.items():
        parts.append(f"{short[key]}={_compact(value)}")
    name = "-".join(parts)
    return name if len(name) <= _RUN_NAME_LIMIT else name[:_RUN_NAME_LIMIT - 1] + "~"


def run_dir(tensorboard_dir: Path, number: int, params: dict[str, Any]) -> Path:
    return tensorboard_dir / run_name(number, params)


def _short_names(keys: list[str]) -> dict[str, str]:
    last = [key.rsplit(".", 1)[-1] for key in keys]
    return {key: (tail if last.count(tail) == 1 else key) for key, tail in zip(keys, last)}


def _compact(value: Any) -> str:
    if isinstance(value, float):
        text = f"{value:.3g}"
    else:
        text = str(value)
    return re.sub(r"[^\w.+=-]", "_", text)


def _as_hparam_value(param, value: Any) -> Any:
    """The value as TensorBoard types it: numbers stay numbers, mixed choices become text.
    Numeric choices that mix ints and floats (``[0, 1.0e-4]``) are all floats: TensorBoard
    wants one Python type per column, and refused the study's whole HParams record."""
    if isinstance(param, CategoricalParam) and not _uniform_choice_type(param.choices):
        return str(value)
    if value is None:
        return "None"
    if isinstance(param, CategoricalParam) and not isinstance(value, bool) and isinstance(value, int) \
            and any(isinstance(c, float) for c in param.choices):
        return float(value)
    return value


def _uniform_choice_type(choices: list[Any]) -> bool:
    kinds = {"bool" if isinstance(c, bool) else "number" if isinstance(c, (int, float)) else
             "str" if isinstance(c, str) else "other" for c in choices}
    return len(kinds) == 1 and "other" not in kinds


def hparams_columns(config: ExperimentConfig, logged_metrics: list[str], at_steps: set[str] = frozenset()) -> Any:
    """The experiment-level HParams summary: typed parameters with their ranges, the
    state and epochs columns, and the metrics: best and last search metric first, then
    the other validation metrics and the speed, then the rest (training metrics, the
    learning rate). TensorBoard shows five parameter columns and the first five metric
    columns until the user ticks more: with four parameters searched, ``state`` (they sort
    by name) and ``val_loss`` and the speed (behind ``lr-AdamW`` and ``train_*``) were
    hidden, and pruned trials looked like complete ones. A metric in ``at_steps`` is read
    from the trial's steps run, where it is logged (``trial_logger``)."""
    from tensorboard.plugins.hparams import summary_v2 as hp

    hparams = []
    for key, param in config.space.items():
        if isinstance(param, FloatParam):
            domain = hp.RealInterval(float(param.low), float(param.high))
        elif isinstance(param, IntParam):
            domain = hp.IntInterval(int(param.low), int(param.high))
        else:
            domain = hp.Discrete([_as_hparam_value(param, c) for c in param.choices])
        hparams.append(hp.HParam(key, domain))
    hparams.append(hp.HParam(STATE_HPARAM, hp.Discrete(list(FINISHED_STATES))))
    hparams.append(hp.HParam(EPOCHS_HPARAM, hp.IntInterval(0, config.scheduler.max_epochs)))
    metric = config.metric
    # the search metric logged on_step and on_epoch reaches TensorBoard as NAME_epoch only:
    # its "last" column read NAME, empty in every trial (audit 74)
    last = f"{metric}_epoch" if f"{metric}_epoch" in logged_metrics else metric
    own = sorted(_own_metric_columns(config, logged_metrics) - {last})
    validation = [name for name in own if VALIDATION_NAME.search(name)]
    metrics = [hp.Metric(f"hp/{metric}", display_name=f"best {metric}"),
               hp.Metric(last, display_name=f"last {metric}")]
    rest = sorted(set(own) - set(validation), key=lambda n: (n.startswith("lr-"), n))
    metrics += [hp.Metric(name, group=STEPS_RUN if name in at_steps else None)
                for name in (*validation, *SPEED_METRICS, *rest)]
    summary = hp.hparams_config_pb(hparams=hparams, metrics=metrics, time_created_secs=time.time())
    _state_column_first(summary)
    return summary


def _state_column_first(summary: Any) -> None:
    """Marks the ``state`` column as one whose values differ between trials (the HParams
    field TensorBoard orders its columns by: those first, then by name), so it is among
    the five shown. The searched parameters' own columns keep TensorBoard's order."""
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    for value in summary.value:
        experiment = metadata.parse_experiment_plugin_data(value.metadata.plugin_data.content)
        for info in experiment.hparam_infos:
            info.differs = info.name == STATE_HPARAM
        value.metadata.plugin_data.content = plugin_data_pb2.HParamsPluginData(
            version=metadata.PLUGIN_DATA_VERSION, experiment=experiment).SerializeToString()


def _own_metric_columns(config: ExperimentConfig, logged_metrics: list[str]) -> set[str]:
    """The columns of the metrics the model logs, besides the search metric's. A metric
    logged on_step and on_epoch reaches TensorBoard as NAME_step and NAME_epoch only;
    NAME itself, which Lightning's callback metrics also hold, would be an empty column."""
    return {name for name in logged_metrics if name != config.metric and f"{name}_epoch" not in logged_metrics}


def write_hparams_columns(tensorboard_dir: Path, config: ExperimentConfig, logged_metrics: list[str],
                          at_steps: set[str] = frozenset()) -> set[str]:
    """The study's HParams columns, with a column for each of ``logged_metrics``. TensorBoard
    reads one set, and the first set was final: written when the first trial ended, it
    had no column for the model's own metrics when that trial failed before reporting
    any. A set that lacks one of ``logged_metrics`` is now written anew, keeping its
    columns, and the earlier set's file removed. Returns the columns of the model's own
    metrics it holds."""
    earlier = sorted(tensorboard_dir.glob("events.out.tfevents.*"))
    fixed = {f"hp/{config.metric}", config.metric, *SPEED_METRICS}
    covered = {metric.name.tag for path in earlier for columns in _stored_columns(path)
               for metric in columns.metric_infos} - fixed
    wanted = _own_metric_columns(config, logged_metrics)
    if earlier and wanted <= covered:
        return covered
    covered |= wanted
    _write_summaries(tensorboard_dir, [hparams_columns(config, sorted(covered), at_steps | _at_steps(earlier))])
    for path in earlier:
        path.unlink(missing_ok=True)
    return covered


def _at_steps(column_files: list[Path]) -> set[str]:
    """The metrics earlier columns read from the trials' steps run."""
    return {metric.name.tag for path in column_files for columns in _stored_columns(path)
            for metric in columns.metric_infos if metric.name.group == STEPS_RUN}


def write_trial_session(tensorboard_dir: Path, config: ExperimentConfig, number: int, params: dict[str, Any],
                        state: str, epochs: int) -> Path:
    """The trial's row in the HParams table: its values, final state and epochs run."""
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2
    from tensorboard.plugins.hparams import summary_v2 as hp
    from tensorboard.compat.proto.summary_pb2 import Summary

    values = {key: _as_hparam_value(config.space[key], value) for key, value in params.items()
              if key in config.space}
    values[STATE_HPARAM] = state
    values[EPOCHS_HPARAM] = int(epochs)
    start = hp.hparams_pb(values, trial_id=run_name(number, params))
    status = {"COMPLETE": api_pb2.STATUS_SUCCESS, "PRUNED": api_pb2.STATUS_SUCCESS}.get(state, api_pb2.STATUS_FAILURE)
    end_content = plugin_data_pb2.HParamsPluginData(
        version=metadata.PLUGIN_DATA_VERSION,
        session_end_info=plugin_data_pb2.SessionEndInfo(status=status, end_time_secs=time.time()),
    )
    end = Summary(value=[Summary.Value(tag=metadata.SESSION_END_INFO_TAG,
                                       metadata=metadata.create_summary_metadata(end_content),
                                       tensor=metadata.NULL_TENSOR)])
    directory = run_dir(tensorboard_dir, number, params)
    _write_summaries(directory, [start, end])
    return directory


def write_test_metrics(tensorboard_dir: Path, config: ExperimentConfig, number: int, params: dict[str, Any],
                       metrics: dict[str, float], epoch: int) -> Path:
    """The best trial's test metrics in its run, at the epoch of the checkpoint evaluated,
    and as HParams columns: TensorBoard had the search's validation only, and the test
    metrics were in best.json and the report. One evaluation's: an earlier one's file (this
    trial's, or an earlier best's, before a resume) is removed. Returns the file."""
    from tensorboard.compat.proto.summary_pb2 import Summary

    for earlier in tensorboard_dir.glob(f"*/events.out.tfevents.*{TEST_RECORD}"):
        earlier.unlink(missing_ok=True)
    write_hparams_columns(tensorboard_dir, config, sorted(metrics))
    summary = Summary(value=[Summary.Value(tag=name, simple_value=float(value)) for name, value in metrics.items()])
    return _write_summaries(run_dir(tensorboard_dir, number, params), [summary], step=epoch, suffix=TEST_RECORD)


def backfill_trial_sessions(tensorboard_dir: Path, config: ExperimentConfig, finished: list[dict[str, Any]]) -> int:
    """HParams rows for finished trials that have none (the driver died between the
    trial's end and writing it); returns how many were written."""
    written = 0
    for fields in finished:
        params = {key: fields[key] for key in config.space if key in fields}
        directory = run_dir(tensorboard_dir, int(fields["trial"]), params)
        if directory.is_dir() and not any(directory.glob("*.hparams")):
            write_hparams_columns(tensorboard_dir, config, [])
            write_trial_session(tensorboard_dir, config, int(fields["trial"]), params, fields["state"],
                                int(fields.get("epochs") or 0))
            written += 1
    return written


STUDY_COLUMN = "study"  # studies shown side by side: each trial's, by its group's name (a space key has a dot)


def merge_hparams_columns(tensorboard_dirs: list[Path], into: Path, labels: list[str]) -> bool:
    """One set of HParams columns for studies shown side by side, written to ``into``:
    TensorBoard reads the columns of one study only (the first it finds), which hid the
    others' parameters and metrics. A parameter several studies search keeps one column,
    its range widened to cover theirs (its choices joined). A column ``study``, beside
    the state, holds each trial's study (``labels``, the names of their groups of runs): the same
    values in two studies were two lines no view could tell apart (audit 49). False if no
    study has columns yet."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    merged, params, metrics = api_pb2.Experiment(), {}, set()
    # marked as differing, as the state is (_state_column_first), so TensorBoard orders it among
    # the five columns its views show at first: it was sixth, and shown nowhere (audit 52)
    study = merged.hparam_infos.add(name=STUDY_COLUMN, type=api_pb2.DATA_TYPE_STRING, differs=True)
    for label in labels:
        study.domain_discrete.values.add(string_value=label)
    for columns in (c for directory in tensorboard_dirs for c in _stored_columns(directory)):
        for info in columns.hparam_infos:
            if info.name in params:
                _widen(params[info.name], info)
            else:
                params[info.name] = merged.hparam_infos.add()
                params[info.name].CopyFrom(info)
        for metric in columns.metric_infos:
            if (metric.name.group, metric.name.tag) not in metrics:
                metrics.add((metric.name.group, metric.name.tag))
                merged.metric_infos.add().CopyFrom(metric)
    if not params:
        return False
    content = plugin_data_pb2.HParamsPluginData(version=metadata.PLUGIN_DATA_VERSION, experiment=merged)
    _write_summaries(into, [Summary(value=[Summary.Value(tag=metadata.EXPERIMENT_TAG,
                                                         metadata=metadata.create_summary_metadata(content),
                                                         tensor=metadata.NULL_TENSOR)])])
    return True


def copy_as_own_group(record: Path, target: Path, study: str) -> bool:
    """A trial's HParams record (``write_trial_session``) copied to ``target`` as a session
    group of its own, for studies shown side by side: TensorBoard groups sessions by the
    group name the record holds, the trial's run name, so the same trial number with the
    same values in two studies (one study run again with one change) became one row, with
    their metrics averaged. Its ``study`` column is set (``merge_hparams_columns``). False,
    writing nothing, while the record is incomplete (being written)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    events = [event for event in EventFileLoader(str(record)).Load() if not event.HasField("file_version")]
    values = [value for event in events for value in event.summary.value]
    if not any(value.tag == metadata.SESSION_END_INFO_TAG for value in values):
        return False
    for value in values:
        if value.tag == metadata.SESSION_START_INFO_TAG:
            content = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
            content.session_start_info.group_name = ""  # TensorBoard then names the group by its run
            content.session_start_info.hparams[STUDY_COLUMN].string_value = study
            value.metadata.plugin_data.content = content.SerializeToString()
    partial = target.with_name("copy.part")  # no 'tfevents' in its name: TensorBoard leaves it alone
    with partial.open("wb") as handle:
        writer = RecordWriter(handle)
        for event in events:
            writer.write(event.SerializeToString())
    partial.rename(target)
    return True


def _stored_columns(location: Path) -> list[Any]:
    """The HParams columns a study's log directory (or one file of it) holds
    (``write_hparams_columns``)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams import metadata

    found = []
    paths = sorted(location.glob("events.out.tfevents.*")) if location.is_dir() else [location] * location.is_file()
    for path in paths:
        for event in EventFileLoader(str(path)).Load():
            found += [metadata.parse_experiment_plugin_data(value.metadata.plugin_data.content)
                      for value in event.summary.value if value.tag == metadata.EXPERIMENT_TAG]
    return found


def _widen(column: Any, other: Any) -> None:
    """``column``'s domain made to cover ``other``'s too: an interval over both when each
    is a range or numeric choices, the choices of both when both are choices of one type;
    else none."""
    kind, other_kind = column.WhichOneof("domain"), other.WhichOneof("domain")
    low_high = [_numeric_span(column), _numeric_span(other)]
    if "domain_interval" in (kind, other_kind) and None not in low_high:
        column.domain_interval.min_value = min(low for low, _ in low_high)
        column.domain_interval.max_value = max(high for _, high in low_high)
    elif kind == other_kind == "domain_discrete" and column.type == other.type:
        for value in other.domain_discrete.values:
            if value not in column.domain_discrete.values:
                column.domain_discrete.values.add().CopyFrom(value)
    elif kind:
        column.ClearField(kind)


def _numeric_span(column: Any) -> tuple[float, float] | None:
    """The lowest and highest value a column's domain holds, if they are all numbers."""
    kind = column.WhichOneof("domain")
    if kind == "domain_interval":
        return column.domain_interval.min_value, column.domain_interval.max_value
    if kind == "domain_discrete" and column.domain_discrete.values \
            and all(value.WhichOneof("kind") == "number_value" for value in column.domain_discrete.values):
        numbers = [value.number_value for value in column.domain_discrete.values]
        return min(numbers), max(numbers)
    return None


class StudyRun:
    """The study's own run (``study/``), added to as each trial ends: the best value of the
    metric so far (``study/best_<metric>``), and which trial holds it (the Text tab), each
    time that changes. Stepped by the trials ended so far, the study's earlier sessions'
    included: TensorBoard drops a tag's points that come after a point of a lower step, so
    trial numbers, which end out of order, cannot be the steps; its relative-time axis
    shows the same against the time searched. TensorBoard's HParams table marks no trial
    as the best, and sorting it by the metric shows the best value of every trial, pruned
    ones included, which are no candidates (``TrialsTable.best_row``). One event file per
    session, kept open; a driver killed mid-write costs at most that point."""

    def __init__(self, tensorboard_dir: Path, metric: str, best_before: dict[str, Any] | None = None) -> None:
        """``best_before``: the best trial's row as the session starts, which an earlier
        session named (its text is not written again until the best changes)."""
        self.directory, self.metric = tensorboard_dir / STUDY_RUN, metric
        self._writer = None
        self._best_said = self._said(best_before) if best_before is not None else None

    @staticmethod
    def _said(best: dict[str, Any]) -> tuple[int, float]:
        return int(best["trial"]), float(best["best"])

    def add(self, ended: int, best: dict[str, Any], params: dict[str, Any]) -> None:
        """After ``ended`` trials: ``best`` is the best trial's row (trials.csv's), ``params``
        its values, by which its run is named in the text."""
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.plugins.text.summary_v2 import text_pb
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        if self._writer is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            _past_the_newest_file(self.directory)
            self._writer = EventFileWriter(str(self.directory), filename_suffix=".study")
        value = float(best["best"])
        summary = Summary(value=[Summary.Value(tag=f"study/best_{self.metric}", simple_value=value)])
        if self._said(best) != self._best_said:
            self._best_said = self._said(best)
            epochs = str(best.get("epochs") or "").strip()
            epochs = f" after {counted(int(float(epochs)), 'epoch')}" if epochs else ""
            summary.value.extend(text_pb("study/best_trial", f"{run_name(int(best['trial']), params)}: "
                                                              f"{self.metric} = {value:.6g}{epochs}").value)
        self._writer.add_event(Event(wall_time=time.time(), step=ended, summary=summary))
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __getstate__(self) -> dict[str, Any]:  # Ray Tune pickles its callbacks, which hold this
        return {**self.__dict__, "_writer": None}


def _past_the_newest_file(directory: Path) -> None:
    """Waits, where need be, until the clock's second is past every event file's in
    ``directory``. TensorBoard reads a run's files in the order of their names, which
    begin with that second, then the writer's host, process and a counter written without
    padding (``.10`` sorts before ``.9``): a session's file made in the same second as the
    last one's could be read first, its points before the earlier session's, which
    TensorBoard then dropped as out of order (a test of two sessions in one process)."""
    seconds = [int(name.split(".")[3]) for name in os.listdir(directory)
               if name.startswith("events.out.tfevents.") and name.split(".")[3].isdigit()]
    wait = max(seconds, default=0) + 1 - time.time()
    if wait > 0:
        time.sleep(min(wait, 1.0))  # at most a second: a clock set back since cannot hold the search


def _write_summaries(directory: Path, summaries: list[Any], step: int = 0, suffix: str = ".hparams") -> Path:
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    directory.mkdir(parents=True, exist_ok=True)
    before = set(directory.glob(f"*{suffix}"))
    writer = EventFileWriter(str(directory), filename_suffix=suffix)
    try:
        for summary in summaries:
            writer.add_event(Event(wall_time=time.time(), step=step, summary=summary))
    finally:
        writer.close()
    [written] = set(directory.glob(f"*{suffix}")) - before
    return written

