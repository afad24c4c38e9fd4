"""Noticing that the search's Ray stopped answering, before Ray itself ends the driver.

When a search's Ray loses its GCS (the head node of a joined cluster stopped, preempted or
unplugged; a local Ray's GCS killed), Ray's core worker in the driver ends the process once
the GCS has not answered for ``gcs_rpc_server_reconnect_timeout_s`` (60 s by default), with
exit status 1 and a line of its own log. The session stayed "running" in sessions.json,
and nothing said how to go on. ``RayLostWatch`` connects to the GCS's port every second
and, once it has not answered for three quarters of Ray's timeout (a GCS that comes back
within Ray's timeout is waited for, as Ray waits), lets the search record its session and
say how to resume, then ends the process with ``EXIT_RAY_LOST``.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Callable

EXIT_RAY_LOST = 75  # sysexits' EX_TEMPFAIL: try again later; a resume continues the study
POLL_S = 1.0
RAY_RECONNECT_TIMEOUT_S = 60.0  # Ray's default gcs_rpc_server_reconnect_timeout_s


def ray_reconnect_timeout_s() -> float:
    """How long this process's Ray waits for a silent GCS before ending the process: Ray's
    default, or the ``RAY_gcs_rpc_server_reconnect_timeout_s`` its core worker reads."""
    try:
        return float(os.environ.get("RAY_gcs_rpc_server_reconnect_timeout_s", RAY_RECONNECT_TIMEOUT_S))
    except ValueError:
        return RAY_RECONNECT_TIMEOUT_S


class RayLostWatch:
    """While the ``with`` block runs: once the connected Ray's GCS has not accepted a
    connection for ``lost_after_s`` (three quarters of Ray's own timeout), call
    ``on_lost(silent_seconds)`` from the watch's thread and end the process with
    ``EXIT_RAY_LOST``. The main thread is then blocked inside Ray and cannot be reached."""

    def __init__(self, on_lost: Callable[[float], None], lost_after_s: float | None = None) -> None:
        self.on_lost = on_lost
        self.lost_after_s = 0.75 * ray_reconnect_timeout_s() if lost_after_s is None else lost_after_s
        self._ended = threading.Event()
        self.gcs_address = ""

    def __enter__(self) -> RayLostWatch:
        import ray

        if not ray.is_initialized():  # nothing to watch; and asking Ray would start one (auto-init)
            return self
        try:
            self.gcs_address = ray.get_runtime_context().gcs_address
        except Exception:  # a Ray Client connection (ray://) has no GCS of its own to watch
            return self
        host, _, port = self.gcs_address.rpartition(":")
        threading.Thread(target=self._watch, args=(host, int(port)), name="hpsearch-ray-watch", daemon=True).start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._ended.set()

    def _watch(self, host: str, port: int) -> None:
        answered = time.monotonic()
        while not self._ended.wait(POLL_S):
            if _accepts(host, port):
                answered = time.monotonic()
                continue
            silent = time.monotonic() - answered
            if silent >= self.lost_after_s and not self._ended.is_set():
                try:
                    self.on_lost(silent)
                finally:
                    os._exit(EXIT_RAY_LOST)


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=POLL_S):
            return True
    except OSError:
        return False
