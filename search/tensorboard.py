"""``hpsearch tensorboard``: a real TensorBoard over one or more experiments, on localhost."""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from .experiment import ExperimentDir, distinct_labels

RELOAD_S = 5  # how often TensorBoard reads new events (and new trials' runs are linked)


class StudiesSideBySide:
    """Several studies in one TensorBoard: a directory with one folder per study, holding
    its trials' runs as links to their event files, and one set of HParams columns
    covering every study (TensorBoard shows the columns of one study only). Each trial's
    HParams record is a copy that makes it a row of its own. Runs, files and columns that
    appear later are added by ``link_new_runs``."""

    def __init__(self, directory: Path, experiments: list[ExperimentDir]) -> None:
        self.directory = directory
        self.studies = dict(zip(distinct_labels([exp.root for exp in experiments]),
                                (exp.tensorboard_dir for exp in experiments)))
        self._merged_from: tuple | None = None  # the studies' column files the merged set was made of
        self.link_new_runs()

    def _merge_columns_when_changed(self) -> None:
        """The merged columns again whenever a study's own set changed: merged once, at the
        start, a study that had no ended trial yet (a new search shown beside a finished
        one) never had its parameters' columns, for as long as TensorBoard ran."""
        from .tensorboard_layout import merge_hparams_columns

        try:
            sources = tuple((str(path), path.stat().st_mtime_ns) for folder in self.studies.values()
                            for path in sorted(folder.glob("events.out.tfevents.*")))
        except FileNotFoundError:  # a study's set replaced while we looked: next time
            return
        if sources == self._merged_from:
            return
        earlier = sorted(self.directory.glob("events.out.tfevents.*"))
        if merge_hparams_columns(list(self.studies.values()), self.directory, list(self.studies)):
            for path in earlier:  # TensorBoard reads one set: the newest only
                path.unlink(missing_ok=True)
        self._merged_from = sources

    def link_new_runs(self) -> None:
        from .tensorboard_layout import copy_as_own_group

        self._merge_columns_when_changed()
        for label, tensorboard_dir in self.studies.items():
            runs = sorted(run for run in tensorboard_dir.iterdir() if run.is_dir()) if tensorboard_dir.is_dir() else []
            for run in runs:
                folder = self.directory / label / run.name
                folder.mkdir(parents=True, exist_ok=True)
                for shown in folder.iterdir():
                    if shown.is_symlink() and not shown.exists():  # the study removed its file
                        shown.unlink()
                for path in sorted(run.iterdir()):
                    shown = folder / path.name
                    if shown.exists() or shown.is_symlink():
                        continue
                    if path.name.endswith(".hparams"):
                        copy_as_own_group(path, shown, study=label)
                    else:
                        shown.symlink_to(path.resolve(), target_is_directory=path.is_dir())


def serve(experiments: list[ExperimentDir], host: str = "127.0.0.1", port: int = 6006) -> int:
    """Run TensorBoard in the foreground until Ctrl+C; its URL is printed first. One study
    is its own log directory; several are shown side by side (``StudiesSideBySide``)."""
    _check_port_free(host, port)
    experiments = list({exp.root.resolve(): exp for exp in experiments}.values())  # each study once
    if len(experiments) == 1:
        return _tensorboard(experiments[0].tensorboard_dir, host, port, every_reload=lambda: None)
    with tempfile.TemporaryDirectory(prefix="hpsearch-tensorboard-") as combined:
        studies = StudiesSideBySide(Path(combined), experiments)
        # Which group is which study: two of one name are named with the folders above them.
        legend = "".join(f"  {label}: {tensorboard_dir.parent}\n" for label, tensorboard_dir in studies.studies.items())
        return _tensorboard(Path(combined), host, port, every_reload=studies.link_new_runs, legend=legend)


def _tensorboard(logdir: Path, host: str, port: int, every_reload, legend: str = "") -> int:
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir),
               "--host", host, "--port", str(port), "--reload_interval", str(RELOAD_S)]
    print(f"TensorBoard at http://{host}:{port}/  (Ctrl+C to stop)\n{legend}", end="", flush=True)
    process = subprocess.Popen(command, preexec_fn=_ended_with_its_parent if sys.platform == "linux" else None)
    # SIGTERM (a service manager, a test) stops TensorBoard too, as Ctrl+C does; so does a
    # Ctrl+C (kill -INT) to a script's background job, which starts with SIGINT ignored.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: (_ for _ in ()).throw(KeyboardInterrupt()))
    previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        while True:
            try:
                return process.wait(timeout=RELOAD_S)
            except subprocess.TimeoutExpired:
                every_reload()
    except KeyboardInterrupt:
        return 0
    finally:  # also when every_reload raised: TensorBoard never outlives the command
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        signal.signal(signal.SIGTERM, previous)
        if previous_int is not None:  # None: set outside Python, cannot be put back
            signal.signal(signal.SIGINT, previous_int)


def _ended_with_its_parent() -> None:
    """In TensorBoard's process, before it starts (Linux): the kernel sends it SIGTERM when
    the command dies, also killed outright (SIGKILL, the out-of-memory killer), which no
    handler of the command's sees. It then served on, holding the port (audit 32)."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _check_port_free(host: str, port: int) -> None:
    """A port in use is said plainly, with the way out, instead of TensorBoard's own log
    line and exit status 255 after the URL was already printed."""
    import socket

    from .errors import HpsearchError

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TensorBoard's server binds
        try:
            probe.bind((host, port))
        except socket.gaierror as exc:  # a name that does not resolve has nothing to do with the port (audit 39)
            raise HpsearchError(f"cannot serve TensorBoard on {host}:{port}: --host {host!r} is no address of "
                                f"this machine ({exc.strerror})") from None
        except OSError as exc:
            raise HpsearchError(f"cannot serve TensorBoard on {host}:{port} ({exc.strerror}); "
                                f"another TensorBoard may be running there: pass --port N") from None
