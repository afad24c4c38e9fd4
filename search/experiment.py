"""The experiment directory: where every file of a study lives, and how it is written.

    EXP_DIR/
      experiment.yaml    the validated config the study was started with
      optuna.journal     the Optuna study (open with optuna-dashboard)
      trials.csv         one row per trial, rewritten atomically as trials progress
      best.json          the best trial, its checkpoint and test metrics
      trials/<name>/     checkpoints of one trial
      tensorboard/       TensorBoard: one run per trial (see tensorboard_layout.py)
      sessions.json      when each run/resume session started and ended
      tune/              Ray Tune's own files of the last session, for a look; nothing reads them

Platform files are written to a temporary file and renamed into place, so a crash
never leaves one half-written.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .errors import DiskFullError, ExperimentError, first_line, resume_command
from .outcome import SESSION_KILLED, TRIAL_NUMBER
from .yaml_io import dump_yaml, load_yaml


@dataclass(frozen=True)
class ExperimentDir:
    root: Path

    @property
    def config_file(self) -> Path:
        return self.root / "experiment.yaml"

    @property
    def trials_csv(self) -> Path:
        return self.root / "trials.csv"

    @property
    def best_json(self) -> Path:
        return self.root / "best.json"

    @property
    def trials_dir(self) -> Path:
        return self.root / "trials"

    @property
    def tensorboard_dir(self) -> Path:
        return self.root / "tensorboard"

    @property
    def sessions_json(self) -> Path:
        return self.root / "sessions.json"

    @property
    def data_json(self) -> Path:
        return self.root / "data.json"  # the data's class names (``data_classes``)

    @property
    def tune_dir(self) -> Path:
        return self.root / "tune"

    def trial_dir(self, trial_name: str) -> Path:
        return self.trials_dir / trial_name

    def stored_config(self) -> dict[str, Any]:
        """experiment.yaml as written by run/resume; an ``ExperimentError`` naming the file
        when it was emptied or edited into something else (the readers crashed on it)."""
        config = _readable(self.config_file, lambda text: load_yaml(text, stored=True), "YAML mapping")
        missing = [key for key in ("name", "metric", "mode", "space") if key not in config]
        if missing:  # another tool's experiment.yaml: status crashed on KeyError 'metric' (audit 36)
            raise ExperimentError(f"{self.config_file} is not an hpsearch study's (it has no {', '.join(missing)}); "
                                  "hpsearch writes every one of them")
        return config

    def stored_best(self) -> dict[str, Any] | None:
        """best.json, or None before a search has written it (same errors as ``stored_config``).
        Its paths are this directory's: a study copied or moved elsewhere (from a cluster to
        a laptop) named the checkpoint where the study was written, gone once that is."""
        best = _readable(self.best_json, json.loads, "JSON object") if self.best_json.is_file() else None
        written_in = best.get("experiment_dir") if isinstance(best, dict) else None
        if written_in and Path(written_in) != self.root:
            best["experiment_dir"] = str(self.root)
            checkpoint = best.get("checkpoint")
            if checkpoint and Path(written_in) in Path(checkpoint).parents:
                best["checkpoint"] = str(self.root / Path(checkpoint).relative_to(written_in))
        return best

    @classmethod
    def existing(cls, path: str | Path) -> "ExperimentDir":
        """An experiment directory that must already hold a study started by hpsearch."""
        root = Path(path).expanduser().resolve()
        if not root.exists():
            raise ExperimentError(f"{str(path)!r} does not exist; an experiment directory is STORAGE/NAME "
                                  f"(`hpsearch run` prints it as it starts)")
        if root.is_file() and root.name == "experiment.yaml" and (root.parent / "trials.csv").exists():
            raise ExperimentError(f"{str(path)!r} is the saved config of the study in {root.parent}; "
                                  f"continue that study with: {resume_command(root.parent)}")
        if root.is_file() and root.suffix in (".yaml", ".yml"):
            raise ExperimentError(f"{str(path)!r} is an experiment file, not an experiment directory; "
                                  f"start a search from it with: hpsearch run {path}")
        if not (root / "experiment.yaml").is_file():
            studies = sorted(p.parent.name for p in root.glob("*/experiment.yaml")) if root.is_dir() else []
            inside = (f"; it holds the studies {', '.join(studies[:10])}{' ...' if len(studies) > 10 else ''}: "
                      f"give one of them, e.g. {root / studies[0]}") if studies else ""
            raise ExperimentError(f"{str(path)!r} is not an hpsearch experiment directory (no experiment.yaml){inside}")
        return cls(root)

    @classmethod
    def create(cls, storage: str, name: str) -> "ExperimentDir":
        """A new directory ``storage/name`` (see ``free_name``)."""
        base = Path(storage).expanduser().resolve()
        return cls.make(base / free_name(name, lambda candidate: (base / candidate).exists()))

    @classmethod
    def make(cls, root: Path) -> "ExperimentDir":
        root.mkdir(parents=True)
        (root / "trials").mkdir()
        return cls(root)


def _readable(path: Path, parse, kind: str) -> dict[str, Any]:
    try:
        data = parse(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ExperimentError(f"{path} cannot be read ({type(exc).__name__}: {first_line(exc)}); "
                              "it is written whole by hpsearch, so it was damaged or edited") from None
    if not isinstance(data, dict):
        raise ExperimentError(f"{path} holds no {kind} (it is empty or was edited); it is written whole by hpsearch, "
                              "so it was damaged")
    return data


def distinct_labels(roots: list[Path]) -> list[str]:
    """Names for studies shown together (``compare``'s rows, TensorBoard's groups): each
    directory's name; where two share one (the same file run into two storages), with as
    many folders above it as tell it from the others of that name (``a/runs/s`` beside
    ``b/runs/s``: they were ``runs/s`` and ``runs/s-2``, as if the second were another
    study's name; audit 56); and a label still taken, numbered. TensorBoard numbered every
    repeat NAME-2, beside a study really named NAME-2, which became NAME-2-2 (audit 39)."""
    names = [root.name for root in roots]
    labels, taken = [], set()
    for name, root in zip(names, roots):
        label = candidate = name if names.count(name) == 1 else _shortest_distinct_tail(
            root, [other for other in roots if other.name == name and other != root])
        copy = 1
        while candidate in taken:
            copy += 1
            candidate = f"{label}-{copy}"
        taken.add(candidate)
        labels.append(candidate)
    return labels


def _shortest_distinct_tail(root: Path, others: list[Path]) -> str:
    """The last parts of ``root``'s path, at least its folder and the one above it, that no
    path of ``others`` ends with (its whole path if every one of them does). Never
    absolute: TensorBoard's side-by-side view makes it a folder in its own directory."""
    parts = root.relative_to(root.anchor).parts if root.anchor else root.parts
    for count in range(2, len(parts) + 1):
        tail = parts[-count:]
        if all(other.parts[-count:] != tail for other in others):
            return "/".join(tail)
    return "/".join(parts)


def free_name(name: str, taken) -> str:
    """``name``, or ``name-<date>-<time>[-N]`` if ``taken(name)``: a second run of the same
    file never mixes with, or overwrites, the first."""
    if not taken(name):
        return name
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate, suffix = f"{name}-{stamp}", 1
    while taken(candidate):
        suffix += 1
        candidate = f"{name}-{stamp}-{suffix}"
    return candidate


STUDY_FILE = "optuna.journal"  # the Optuna study (searcher.py)
# Beside a trial's checkpoints: the traceback of the fault that ended it, or of its last
# failed try (written by the trial, or copied there by the driver).
TRIAL_TRACEBACK = "error.txt"
# Beside a trial's checkpoints: the experiment's settings the trial last trained with (a
# resume may change some, the precision say), for its evaluation and best.json's config.
TRIAL_SETTINGS = "experiment.json"


def trial_dir_of(trial, exp: "ExperimentDir") -> Path:
    """The study's folder of a Ray Tune trial."""
    return exp.trial_dir(trial_name(int(trial.config[TRIAL_NUMBER])))


def trial_name(number: int) -> str:
    return f"trial_{number:04d}"


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so readers see the old or the new file, never a mix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _new_file_beside(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if exc.errno == 28:  # ENOSPC
            raise DiskFullError(f"disk full while writing {path}; the previous version is intact") from exc
        raise


def _new_file_beside(path: Path) -> tuple[int, str]:
    """A new temporary file in ``path``'s folder, with the permissions the umask gives
    (``tempfile.mkstemp`` makes them 0600: on a study shared over NFS, teammates could read
    the journal and the events but not trials.csv or best.json, and status, best, report
    and compare failed for them)."""
    while True:
        tmp = str(path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue


def write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def read_sessions(exp: ExperimentDir) -> list[dict[str, Any]]:
    """Every run/resume session of the study: start, end (None if it never ended cleanly),
    seconds and how it ended; the study's wall time is their sum."""
    try:
        return json.loads(exp.sessions_json.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []


def latest_session(exp: ExperimentDir) -> dict[str, Any]:
    """The study's latest session in ``sessions.json`` (by its start), or {} before any."""
    return max(read_sessions(exp), key=lambda session: float(session.get("started_at") or 0), default={})


def record_session(exp: ExperimentDir, started_at: float, ended_at: float | None, outcome: str,
                   search_complete: bool = False, address: str | None = None,
                   finished_before: int | None = None) -> None:
    """Add or update (same ``started_at``) one session's entry in ``sessions.json``.
    ``search_complete``: its Tune run ended with every trial finished, so whatever stopped
    the session later (a Ctrl+C or a kill during the test evaluation) left only the
    evaluation to do. ``address``: the cluster it joined, kept from the session's first
    entry on (status names it in the command that resumes a study whose driver died).
    ``finished_before``: the trials the study had finished as it began, kept the same
    way (status estimates a running search's time left from the pace it has ended trials
    since)."""
    sessions = read_sessions(exp)
    entry = next((s for s in sessions if s.get("started_at") == started_at), None)
    if entry is None:
        entry = {"started_at": started_at, "versions": software_versions()}
        sessions.append(entry)
    entry.update({"ended_at": ended_at, "outcome": outcome,
                  "seconds": None if ended_at is None else round(ended_at - started_at, 3),
                  "directory": os.getcwd(),  # where the user's packages imported from
                  "search_complete": search_complete})
    if address is not None:
        entry["address"] = address
    if finished_before is not None:
        entry["finished_before"] = finished_before
    write_json(exp.sessions_json, sessions)


# What a session's results depend on besides the experiment file and the user's code.
VERSIONED = ("hpsearch", "torch", "pytorch-lightning", "ray", "optuna", "numpy")


def software_versions() -> dict[str, str]:
    """Python's and the installed packages' versions (read from their metadata, importing
    none of them), recorded with each session: the same file and seed can give other
    values under another torch (audit 28)."""
    import platform
    from importlib import metadata

    versions = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def close_killed_sessions(exp: ExperimentDir) -> int:
    """Mark as ``killed`` the sessions that never ended (their driver got SIGKILL or ran out
    of memory), as of trials.csv's last write before the next session: the last moment each
    is known to have worked. Called by a new session, which holds the study's lock, so none
    of them is still running. Returns how many were closed."""
    sessions = sorted(read_sessions(exp), key=lambda s: float(s["started_at"]))
    last_write = exp.trials_csv.stat().st_mtime if exp.trials_csv.is_file() else 0.0
    closed = 0
    for index, session in enumerate(sessions):
        if session.get("ended_at") is not None:
            continue
        started = float(session["started_at"])
        next_start = float(sessions[index + 1]["started_at"]) if index + 1 < len(sessions) else time.time()
        ended = min(max(last_write, started), next_start)
        session.update(ended_at=ended, outcome=SESSION_KILLED, seconds=round(ended - started, 3))
        closed += 1
    if closed:
        write_json(exp.sessions_json, sessions)
    return closed


def write_config(exp: ExperimentDir, config_dump: dict[str, Any]) -> None:
    atomic_write_text(exp.config_file, dump_yaml(config_dump))
