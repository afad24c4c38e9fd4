"""What a local Ray needs of this process's environment, settled before it starts.

Ray's own failures there come as tracebacks from inside its start, or as a timeout naming
an "overloaded GCS" (audit 81): a temporary folder too deeply nested for its Unix
sockets, or one that cannot be written; a home folder it cannot write its token into;
``PYTHONWARNINGS=error``, which fails Ray's own processes on their first warning.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

from .errors import HpsearchError
from .storage import nearest_existing

# The longest path a Unix socket can have on Linux (sun_path's 108 bytes, less its end).
SOCKET_PATH_LIMIT = 107


def longest_socket() -> str:
    """Ray's longest socket path below its temporary folder: a session name of a date, a
    time, microseconds and a process id as long as this machine's can be (``pid_max``; 7
    digits where it cannot be read: a limit of 39 bytes refused folders of 40 and 41 that
    work on a machine of 5-digit pids; audit 84)."""
    try:
        digits = len(Path("/proc/sys/kernel/pid_max").read_text(encoding="utf-8").strip())
    except OSError:
        digits = 7
    return os.path.join("ray", f"session_2026-12-07_23-39-11_123456_{'9' * digits}", "sockets", "plasma_store")


def ray_temp_folder() -> tuple[str, str]:
    """The variable that names the folder a local Ray keeps its files in, and the folder,
    by Ray's own rule (``ray._common.utils.get_default_system_temp_dir``)."""
    if "RAY_TMPDIR" in os.environ:
        return "RAY_TMPDIR", os.environ["RAY_TMPDIR"]
    if sys.platform.startswith("linux") and "TMPDIR" in os.environ:
        return "TMPDIR", os.environ["TMPDIR"]
    return "the system's temporary folder", "/tmp"


def refuse_a_temp_folder_ray_cannot_use() -> None:
    """Raise, before Ray starts, where its temporary folder would make it fail: a path so
    long that its sockets' paths pass the limit, or a folder this process cannot write."""
    variable, folder = ray_temp_folder()
    socket = longest_socket()
    longest = len(os.path.join(os.path.abspath(folder), socket).encode())
    if longest > SOCKET_PATH_LIMIT:
        raise HpsearchError(
            f"{variable} is {folder} ({len(folder.encode())} bytes): Ray keeps its local sockets below it, and "
            f"their paths would be up to {longest} bytes, past a Unix socket's limit of {SOCKET_PATH_LIMIT}; set "
            f"RAY_TMPDIR to a shorter folder (at most {SOCKET_PATH_LIMIT - len(socket) - 1} bytes, "
            f"e.g. /tmp), which Ray uses in place of TMPDIR")
    if not os.access(nearest_existing(Path(folder)), os.W_OK | os.X_OK):  # Ray makes the missing part
        raise HpsearchError(f"{variable} is {folder}, which this process cannot write, and Ray keeps its local "
                            f"files there: set RAY_TMPDIR to a folder it can write")


def refuse_paths_ray_cannot_encode(paths: list[str]) -> None:
    """Raise where the driver's folder or the user code shipped has a path this process's
    locale cannot encode (``LC_ALL=C`` without Python's UTF-8 mode, a folder named with
    an é): Ray's start failed on it in a traceback ("surrogates not allowed"; audit 81)."""
    encoding = sys.getfilesystemencoding()
    for path in paths:
        try:
            path.encode(encoding)
        except UnicodeEncodeError:
            shown = path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")  # its bytes as UTF-8
            raise HpsearchError(f"{shown} has characters this process's locale ({encoding}) cannot encode, and "
                                f"Ray cannot start on it: run with PYTHONUTF8=1, or in a UTF-8 locale "
                                f"(LC_ALL=C.UTF-8)") from None


def local_ray_variables() -> dict[str, str | None]:
    """Variables to set (None: to unset) while a local Ray starts, for its processes to
    keep: ``PYTHONWARNINGS`` without its "error" filters (Ray's dashboard agent failed on a
    deprecation warning of its own, and the start timed out, naming an overloaded GCS);
    and, where Ray would have to save a new token in a home folder it cannot write, a
    token of this Ray's own (``RAY_AUTH_TOKEN``, which Ray reads first)."""
    variables: dict[str, str | None] = {}
    warnings_setting = os.environ.get("PYTHONWARNINGS")
    if warnings_setting is not None:
        filters = warnings_setting.split(",")
        kept = [part for part in filters if not _is_error_filter(part)]
        if len(kept) < len(filters):
            variables["PYTHONWARNINGS"] = ",".join(kept) or None
    if _needs_a_token_it_cannot_save():
        variables["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
    return variables


def _is_error_filter(text: str) -> bool:
    """Whether a ``PYTHONWARNINGS`` filter's action is "error", which Python also takes
    abbreviated ("e", "err": the first of its actions that starts so; audit 84)."""
    action = text.split(":", 1)[0].strip().lower()
    known = ("default", "always", "all", "ignore", "module", "once", "error")
    return bool(action) and next((name for name in known if name.startswith(action)), None) == "error"


def _needs_a_token_it_cannot_save() -> bool:
    """Whether Ray, starting a local cluster with token authentication (its default for
    one), would have no token and fail to save a new one in ``~/.ray`` (a read-only home)."""
    if os.environ.get("RAY_AUTH_MODE", "token").lower() != "token":
        return False
    if os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH"):
        return False
    token = Path.home() / ".ray" / "auth_token"
    if token.exists():
        return False
    return not os.access(nearest_existing(token.parent), os.W_OK | os.X_OK)
