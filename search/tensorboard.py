"""``hpsearch tensorboard``: a real TensorBoard over one or more experiments, on localhost."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from .experiment import ExperimentDir


def logdir_spec(experiments: list[ExperimentDir]) -> list[str]:
    """TensorBoard arguments: one experiment is its log directory; several are named run groups."""
    if len(experiments) == 1:
        return ["--logdir", str(experiments[0].tensorboard_dir)]
    names: dict[str, int] = {}
    parts = []
    for exp in experiments:
        name = exp.root.name
        names[name] = names.get(name, 0) + 1
        label = name if names[name] == 1 else f"{name}-{names[name]}"
        parts.append(f"{label}:{_without_commas(exp.tensorboard_dir)}")
    return ["--logdir_spec", ",".join(parts)]


def _without_commas(path: Path) -> str:
    """``path`` as TensorBoard's ``--logdir_spec`` can hold it: the list is split at commas,
    with no escape, so a study under a folder named with a comma was silently dropped. The
    path relative to here is used when that has none; otherwise the study is refused."""
    if "," not in str(path):
        return str(path)
    relative = os.path.relpath(path)
    if "," not in relative:
        return relative
    from .errors import HpsearchError

    raise HpsearchError(f"TensorBoard cannot show {path} beside other studies: its path holds a comma, which "
                        "TensorBoard's list of studies cannot; run hpsearch tensorboard on it alone, or from a "
                        "folder whose relative path to it has no comma")


def serve(experiments: list[ExperimentDir], host: str = "127.0.0.1", port: int = 6006) -> int:
    """Run TensorBoard in the foreground until Ctrl+C; its URL is printed first."""
    _check_port_free(host, port)
    command = [sys.executable, "-m", "tensorboard.main", *logdir_spec(experiments),
               "--host", host, "--port", str(port), "--reload_interval", "5"]
    print(f"TensorBoard at http://{host}:{port}/  (Ctrl+C to stop)", flush=True)
    process = subprocess.Popen(command)
    # SIGTERM (a service manager, a test) stops TensorBoard too, as Ctrl+C does.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)


def _check_port_free(host: str, port: int) -> None:
    """A port in use is said plainly, with the way out, instead of TensorBoard's own log
    line and exit status 255 after the URL was already printed."""
    import socket

    from .errors import HpsearchError

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TensorBoard's server binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise HpsearchError(f"cannot serve TensorBoard on {host}:{port} ({exc.strerror}); "
                                f"another TensorBoard may be running there: pass --port N") from None
