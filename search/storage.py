"""Where a study lives: a local or shared directory, or a cloud URI.

A plain path (or ``file://``) is the experiment directory itself; on a cluster it must
be a filesystem every node mounts (NFS, EFS, Lustre...). A cloud URI (``s3://``,
``gs://``, ``abfs://``, ``hdfs://``; any filesystem ``pyarrow.fs`` opens from a URI) is
the study's home, and every process works in a local working copy of it:

* the driver pulls the study's own files (config, Optuna journal, trials.csv...) at
  the start of a session and pushes them whenever a trial ends and at the end;
* each trial pulls its own checkpoints and TensorBoard run when it starts (a trial
  resumed on another node, or after the cluster was torn down) and pushes them after
  every validated epoch, before it reports; so a checkpoint the study knows of is in
  storage even if the node that wrote it is gone.

Object stores write whole objects, so a reader sees an old or a new file, never a mix.
``pyarrow.fs`` is used because Ray already depends on it and it reads credentials the
standard way (``AWS_*`` variables, ``AWS_ENDPOINT_URL`` for S3-compatible servers,
instance roles, gcloud's application-default credentials).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from .errors import ExperimentError, HpsearchError
from .experiment import ExperimentDir, free_name

# The study's own files: small, and what ``status``/``best``/``report``/``resume`` read.
STUDY_FILES = ("experiment.yaml", "optuna.journal", "trials.csv", "sessions.json", "best.json", "driver.json",
               "data.json")
# In a working copy on the driver's machine: the URI of the study it mirrors (never pushed).
HOME_FILE = ".hpsearch-home"


class StorageError(HpsearchError):
    """The storage location cannot be reached or written."""


def is_uri(location: str | os.PathLike) -> bool:
    """True for a remote URI; plain paths and ``file://`` are local directories."""
    text = str(location)
    return "://" in text and not text.startswith("file://")


def local_path(location: str) -> Path:
    """A local or shared directory, from a path or a ``file://`` URI; ``~`` and environment
    variables (``$HOME/runs``, as a file may say) are expanded."""
    text = os.path.expandvars(str(location))
    return Path(urlsplit(text).path if text.startswith("file://") else text).expanduser().resolve()



def join_uri(base: str, name: str) -> str:
    """``s3://bucket/exps`` + ``name`` (a query string, e.g. endpoint options, stays at the end)."""
    parts = urlsplit(base)
    path = parts.path.rstrip("/") + "/" + name
    return parts._replace(path=path).geturl()


def working_copy(uri: str) -> Path:
    """The local directory that mirrors ``uri``: the same path on every node of a cluster
    (``HPSEARCH_CACHE``, default ``~/.cache/hpsearch``), readable by a person."""
    parts = urlsplit(uri)
    root = Path(os.environ.get("HPSEARCH_CACHE", "~/.cache/hpsearch")).expanduser()
    tag = hashlib.sha1(uri.encode()).hexdigest()[:8]  # two endpoints with the same bucket name stay apart
    return (root / parts.scheme / f"{parts.netloc}-{tag}" / parts.path.strip("/")).resolve()


def study_address(root: str | os.PathLike) -> str:
    """How a person names the study at ``root``: the URI of a study in cloud storage when
    ``root`` is its working copy (the commands hpsearch prints must reach the study, not
    the copy: a resume of the copy pushed nothing to storage, audit 30), else the path."""
    try:
        home = (Path(root) / HOME_FILE).read_text(encoding="utf-8").strip()
    except OSError:
        return str(root)
    return home if is_uri(home) else str(root)


def study_root(location: str) -> Path:
    """The directory a process works in for the study at ``location`` (a path or URI):
    the same on the driver and on every worker."""
    return working_copy(location) if is_uri(location) else local_path(location)


# How long Google Cloud Storage's client retries: its default has no limit, and `check` of
# a gs:// storage on a machine without the network hung silently (audit 36: killed at 540 s).
GCS_RETRY_LIMIT_S = 60


def _with_retry_limit(uri: str) -> str:
    """``uri`` with ``GCS_RETRY_LIMIT_S`` for a gs:// one that sets no limit of its own
    (pyarrow reads ``retry_limit_seconds`` from the URI's query)."""
    if uri.split("://", 1)[0] not in ("gs", "gcs") or "retry_limit_seconds=" in uri:
        return uri
    return f"{uri}{'&' if '?' in uri else '?'}retry_limit_seconds={GCS_RETRY_LIMIT_S}"


@dataclass
class Mirror:
    """A remote directory and its local working copy, synced file by file.

    ``push`` uploads files that changed since this process last pushed them and deletes
    remote files it had pushed that are gone locally (checkpoints rotated away); ``pull``
    downloads remote files that are missing locally or newer than the local copy.
    """

    uri: str
    local: Path
    _pushed: dict[str, tuple[int, int]] = field(default_factory=dict, repr=False)

    @classmethod
    def for_uri(cls, uri: str) -> "Mirror":
        return cls(uri, working_copy(uri))

    def _fs(self):
        import pyarrow.fs as pafs

        try:
            filesystem, base = pafs.FileSystem.from_uri(_with_retry_limit(self.uri))
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for a bad URI
            raise StorageError(f"cannot open storage {self.uri!r}: {exc}") from None
        return filesystem, base.rstrip("/")

    def address_of(self, path: Path) -> str:
        """Where a file or folder of the working copy lives in storage: what a message names
        (the working copy is a folder the user never made)."""
        return join_uri(self.uri, path.relative_to(self.local).as_posix())

    def exists(self, relative: str = "experiment.yaml") -> bool:
        import pyarrow.fs as pafs

        filesystem, base = self._fs()
        try:
            return filesystem.get_file_info(f"{base}/{relative}").type != pafs.FileType.NotFound
        except OSError as exc:
            raise StorageError(f"cannot read storage {self.uri!r}: {exc}") from None

    def check_writable(self) -> None:
        """Write and delete a probe object, so a wrong bucket or missing credentials is an
        error before Ray starts, naming the location."""
        filesystem, base = self._fs()
        probe = f"{base}/.hpsearch-probe"
        try:
            with filesystem.open_output_stream(probe) as handle:
                handle.write(b"ok")
            filesystem.delete_file(probe)
        except OSError as exc:
            raise StorageError(f"cannot write to storage {self.uri!r}: {exc}") from None

    def push(self, *relatives: str) -> int:
        """Upload the given files or directories (relative to the study); returns files sent."""
        filesystem, base = self._fs()
        sent = 0
        for relative in relatives:
            source = self.local / relative
            files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file()) \
                if source.is_dir() else []
            present = set()
            for path in files:
                key = path.relative_to(self.local).as_posix()
                if path.name.startswith(".") and path.name.endswith(".tmp"):
                    continue  # an atomic write in progress
                try:
                    stat = path.stat()
                except FileNotFoundError:
                    continue  # rotated away while we walked
                if stat.st_size == 0:
                    # nothing to keep: a trial's crash account while the trial lives (every
                    # trial's was uploaded empty; audit 30); nothing else hpsearch writes is empty
                    continue
                present.add(key)
                signature = (stat.st_size, stat.st_mtime_ns)
                if self._pushed.get(key) == signature:
                    continue
                try:
                    with path.open("rb") as reader, filesystem.open_output_stream(f"{base}/{key}") as writer:
                        shutil.copyfileobj(reader, writer, 1 << 20)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    raise StorageError(f"cannot upload {key} to {self.uri!r}: {exc}") from None
                self._pushed[key] = signature
                sent += 1
            prefix = relative.rstrip("/") + "/"
            for key in [k for k in self._pushed if (k == relative or k.startswith(prefix)) and k not in present]:
                try:
                    filesystem.delete_file(f"{base}/{key}")
                except (FileNotFoundError, OSError):
                    pass
                del self._pushed[key]
        return sent

    def delete_matching(self, folder: str, pattern: str) -> int:
        """Delete the stored files and folders (a sharded checkpoint's) directly in ``folder``
        (relative to the study) whose names match ``pattern`` (``fnmatch``); returns how many."""
        import fnmatch

        import pyarrow.fs as pafs

        filesystem, base = self._fs()
        try:
            infos = filesystem.get_file_info(pafs.FileSelector(f"{base}/{folder}", allow_not_found=True))
            doomed = [i for i in infos if i.type in (pafs.FileType.File, pafs.FileType.Directory)
                      and fnmatch.fnmatch(i.base_name, pattern)]
            for info in doomed:
                if info.type == pafs.FileType.Directory:
                    filesystem.delete_dir(info.path)
                else:
                    filesystem.delete_file(info.path)
        except OSError as exc:
            raise StorageError(f"cannot delete {folder}/{pattern} in {self.uri!r}: {exc}") from None
        for key in list(self._pushed):
            inside = key[len(folder) + 1:] if key.startswith(f"{folder}/") else None
            if inside is not None and fnmatch.fnmatch(inside.split("/", 1)[0], pattern):
                del self._pushed[key]
        return len(doomed)

    def pull(self, *relatives: str, missing_only: bool = False) -> int:
        """Download the given files or directories that are missing or older here (only
        those missing, with ``missing_only``)."""
        import pyarrow.fs as pafs

        filesystem, base = self._fs()
        received = 0
        for relative in relatives:
            remote = f"{base}/{relative}"
            info = filesystem.get_file_info(remote)
            if info.type == pafs.FileType.NotFound:
                continue
            infos = [info] if info.type == pafs.FileType.File else [
                i for i in filesystem.get_file_info(pafs.FileSelector(remote, recursive=True))
                if i.type == pafs.FileType.File]
            for item in infos:
                key = item.path[len(base) + 1:]
                target = self.local / key
                here = target.stat() if target.is_file() else None
                if here is not None and missing_only:
                    continue
                if here is not None and item.mtime_ns is not None and (
                        here.st_mtime_ns > item.mtime_ns  # written here after the upload: keep it
                        or (here.st_mtime_ns == item.mtime_ns and here.st_size == item.size)):  # in sync
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                temporary = target.with_name(f".{target.name}.pull.tmp")
                with filesystem.open_input_stream(item.path) as reader, temporary.open("wb") as writer:
                    shutil.copyfileobj(reader, writer, 1 << 20)
                os.replace(temporary, target)
                stat = target.stat()
                self._pushed[key] = (stat.st_size, stat.st_mtime_ns)  # in sync: no need to send it back
                received += 1
        return received

    def push_study_files(self) -> int:
        return self.push(*[name for name in STUDY_FILES if (self.local / name).exists()])

    def mark_working_copy(self) -> None:
        """Record in the working copy which study it mirrors (see ``study_address``)."""
        (self.local / HOME_FILE).write_text(self.uri + "\n", encoding="utf-8")


# Set by Ray's job supervisor for a job's entrypoint: the job's runtime environment.
RAY_JOB_CONFIG = "RAY_JOB_CONFIG_JSON_ENV_VAR"


def check_outside_a_ray_jobs_copy(base: Path) -> None:
    """A study inside a Ray job's working directory (``ray job submit --working-dir``),
    whose entrypoint runs in Ray's unpacked copy of the upload: on one node, and deleted
    by Ray. The example's ``storage: ./runs`` put the study there, with no word (audit 34)."""
    import json

    try:
        runtime_env = json.loads(os.environ.get(RAY_JOB_CONFIG) or "{}").get("runtime_env") or {}
    except (ValueError, AttributeError):
        return
    if not runtime_env.get("working_dir"):
        return
    copy, place = Path.cwd().resolve(), base.resolve()
    if place == copy or copy in place.parents:
        raise StorageError(f"storage {str(base)!r} is inside this Ray job's working directory ({copy}): Ray's "
                           f"unpacked copy of --working-dir, on one node, which Ray deletes. Give a directory "
                           f"every node mounts (--storage /mnt/shared/runs) or a URI (--storage s3://bucket/runs)")


def nearest_existing(path: Path) -> Path:
    """``path``, or its nearest ancestor that exists: where a folder made at ``path`` would
    be made."""
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_local_writable(base: Path) -> None:
    """That studies can be made under ``base``: a directory made and removed in its
    nearest existing ancestor, so a file, a read-only or a virtual file system (``/proc``)
    is an error before Ray starts, naming the location."""
    existing = nearest_existing(base)
    try:
        if not existing.is_dir():
            raise NotADirectoryError(f"{str(existing)!r} is a file")
        os.rmdir(tempfile.mkdtemp(prefix=".hpsearch-probe-", dir=existing))
    except OSError as exc:
        # the error's own words, without the name of the probe that hit it
        probe_failed = bool(exc.strerror and exc.filename)
        reason = exc.strerror if probe_failed else str(exc)
        where = f" (writing in {str(existing)!r})" if probe_failed and existing != base else ""
        raise StorageError(f"cannot write to storage {str(base)!r}: {reason}{where}") from None


@dataclass(frozen=True)
class StudyHome:
    """Where a new or existing study's files are: ``root`` is the directory hpsearch
    works in, ``mirror`` its remote home when the storage is a URI (else None)."""

    root: Path
    mirror: Mirror | None = None

    @classmethod
    def new(cls, storage: str, name: str) -> "StudyHome":
        """Choose the new study's place without creating it; for a URI, check now that it
        can be written, so a wrong bucket or credentials fail before Ray starts."""
        if not is_uri(storage):
            base = local_path(storage)
            check_outside_a_ray_jobs_copy(base)
            check_local_writable(base)
            return cls(base / free_name(name, lambda candidate: (base / candidate).exists()))
        chosen = free_name(name, lambda candidate: Mirror.for_uri(join_uri(storage, candidate)).exists())
        # probed in the storage location, not in the study's place: deleting the probe there
        # left an empty folder of the study's name, though `check` makes no study (audit 30)
        Mirror.for_uri(storage).check_writable()
        mirror = Mirror.for_uri(join_uri(storage, chosen))
        return cls(mirror.local, mirror)

    def create(self) -> ExperimentDir:
        """The study's directory, made now. A local name taken since ``new`` chose it (two
        runs of one file started together) gets the next free name instead."""
        if self.mirror is not None:
            if self.root.exists():
                shutil.rmtree(self.root)  # a stale working copy of a study no longer in storage
            exp = ExperimentDir.make(self.root)
            self.mirror.mark_working_copy()
            return exp
        root = self.root
        while True:
            try:
                return ExperimentDir.make(root)
            except FileExistsError:
                root = root.parent / free_name(self.root.name, lambda candidate: (root.parent / candidate).exists())

    @classmethod
    def existing(cls, location: str | os.PathLike, *parts: str) -> tuple[ExperimentDir, "Mirror | None"]:
        """An existing study, from its directory or URI; for a URI, the study's files (and
        the given ``parts``, e.g. ``tensorboard``) are pulled into the working copy first."""
        if not is_uri(location):
            # a working copy given by its path stands for its study in storage
            location = study_address(local_path(str(location)))
            if not is_uri(location):
                return ExperimentDir.existing(Path(location)), None
        mirror = Mirror.for_uri(str(location))
        if not mirror.exists():
            raise ExperimentError(f"{location!r} holds no hpsearch study (no experiment.yaml)")
        # A search running on this machine works in this copy: its files are the newest, and
        # a pull replaced those it writes (the study's TensorBoard run, whose later events then
        # went to a deleted file; the Optuna journal it appends to), since each upload is newer
        # than its local write. Only what is missing here is fetched then: other nodes' files.
        mirror.pull(*STUDY_FILES, *parts, missing_only=_searched_here(mirror.local))
        mirror.mark_working_copy()
        return ExperimentDir.existing(mirror.local), mirror


def _searched_here(working_copy: Path) -> bool:
    """Whether a search on this machine holds the study whose working copy this is."""
    from .study_lock import LOCK_FILE, is_held

    return (working_copy / LOCK_FILE).is_file() and is_held(ExperimentDir(working_copy))
