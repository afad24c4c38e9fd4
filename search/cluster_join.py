"""Joining a Ray cluster started elsewhere (``--address``, ``RAY_ADDRESS``): a wrong
address or a refused token is said at once, in words.

Left to Ray, an address where nothing listens makes ``ray.init`` retry for about 14
minutes (20 tries of about 40 s each, measured here) before it fails with a traceback, and a
cluster that requires token authentication refuses a process that sends no token with
"Failed to connect to Ray cluster" and a traceback: Ray turns token mode on by itself
only for ``address="auto"``, never for an address given by hand.
"""

from __future__ import annotations

import os
import socket
import sys

from .errors import HpsearchError, exception_chain, first_line

# How long the address may take to accept a connection: a head that is up answers at once.
ANSWER_TIMEOUT_S = 5.0
AUTH_MODE_VARIABLE = "RAY_AUTH_MODE"  # Ray's switch for token authentication
REFUSED_TOKEN = "InvalidAuthToken"  # the GCS's status for a missing or wrong token


class ClusterError(HpsearchError):
    """The Ray cluster to join does not answer, or refuses this process; the message
    says what to do."""


def cluster_address(address: str | None) -> str | None:
    """The address a search joins (``--address``, else ``RAY_ADDRESS``, which ``ray job
    submit`` sets); None when it starts a Ray of its own."""
    return address or os.environ.get("RAY_ADDRESS") or None


def ensure_joined_cluster_answers(address: str | None) -> None:
    """Before the preflight's seconds: the cluster a search would join answers (see
    ``ensure_cluster_answers``). Nothing to check for a search that starts its own Ray, or
    that runs on the Ray this process already runs (the user's own ``ray.init``)."""
    ray = sys.modules.get("ray")
    target = cluster_address(address)
    if target and not (ray is not None and ray.is_initialized()):
        ensure_cluster_answers(target)
        ensure_token_accepted(target)


def ensure_token_accepted(address: str) -> None:
    """Raise ``join_error``'s refusal when the cluster's GCS refuses the token this process
    would send (or its lack): one ``GetClusterId`` call with Ray's own token lookup. Left
    to ``ray.init``, the refusal came after the preflight and 20 s of Ray's retries, with
    20 lines of its log, and ``check --address`` passed (audit 24). Any other answer is
    left to Ray, and so is ``auto``, for which Ray turns token mode on by itself."""
    split = _host_and_port(address)
    if address == "auto" or split is None:
        return
    host, port = split
    try:
        import grpc
        from ray._raylet import AuthenticationTokenLoader
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError:  # another Ray: its own join says it
        return
    loader = AuthenticationTokenLoader.instance()
    token = tuple(loader.get_token_for_http_header().items()) if loader.has_token() else ()
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        try:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(), timeout=ANSWER_TIMEOUT_S, metadata=token)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                raise join_error(address, ConnectionError(f"{REFUSED_TOKEN}: {exc.details()}")) from None


def ensure_cluster_answers(address: str) -> None:
    """Raise ``ClusterError`` unless something accepts a connection at a ``host:port``
    address, or at the one ``auto`` stands for (``started_by_ray_start``). ``ray://``
    addresses are left to Ray, which answers them at once."""
    if not _is_ray_address(address):
        # passed the check, then failed the run with a traceback after the preflight (audit 36)
        raise ClusterError(f"{address!r} (--address, or RAY_ADDRESS) is not a Ray address: give the head's "
                           f"host:port (its port is 6379 by default), ray://host:10001 for Ray Client, auto "
                           f"(the Ray that `ray start` runs on this machine), or local (a new Ray here, as with no "
                           f"address)")
    if address == "auto":
        address = started_by_ray_start()
    split = _host_and_port(address)
    if split is None:
        return
    host, port = split
    try:
        with socket.create_connection((host, port), timeout=ANSWER_TIMEOUT_S):
            return
    except OSError as exc:
        reason = "timed out" if isinstance(exc, socket.timeout) else (exc.strerror or str(exc))
        raise ClusterError(
            f"no Ray cluster answers at {address} ({reason}): is the cluster up, and is this its head's "
            f"address? (the head's IP and the --port its `ray start --head` was given, 6379 by default; "
            f"on the head itself, --address auto finds it)") from None


def _is_ray_address(address: str) -> bool:
    """The forms ``ray.init`` takes: auto, local, ray://..., host:port."""
    return address in ("auto", "local") or address.startswith("ray://") or _host_and_port(address) is not None


def _host_and_port(address: str) -> tuple[str, int] | None:
    """``host:port`` split (an IPv6 host without its brackets), or None for another form."""
    host, separator, port = address.rpartition(":")
    if not (separator and host and port.isdigit()) or "://" in address:
        return None
    return host.strip("[]"), int(port)


def join_error(address: str, error: BaseException) -> ClusterError:
    """What a failed ``ray.init(address=...)`` means for the user: a token refused (or
    none sent), or the cluster's own words."""
    from ray.exceptions import AuthenticationError

    # Ray raises the refusal itself where it checks the token before connecting, and keeps
    # only its traceback's text where the GCS refused it (its last try, in the message).
    refusal = next((cause for cause in exception_chain(error)
                    if isinstance(cause, AuthenticationError) or REFUSED_TOKEN in str(cause)), None)
    if refusal is None:
        return ClusterError(f"could not join the Ray cluster at {address}: {first_line(error)}")
    if os.environ.get(AUTH_MODE_VARIABLE, "").lower() != "token" or not _token_given():
        return ClusterError(
            f"the Ray cluster at {address} requires token authentication, and this process sent no token: "
            f"set {AUTH_MODE_VARIABLE}=token, with the cluster's token in ~/.ray/auth_token (or in the file "
            f"RAY_AUTH_TOKEN_PATH names, or in RAY_AUTH_TOKEN). A cluster started from cluster.yaml sets both "
            f"on every node.")
    return ClusterError(
        f"the Ray cluster at {address} refused this process's token: the token Ray sends (RAY_AUTH_TOKEN, "
        f"else the file RAY_AUTH_TOKEN_PATH names, else ~/.ray/auth_token) must be the one the cluster "
        f"started with (`ray get-auth-token` on its head prints it)")


def _token_given() -> bool:
    """Whether Ray finds a token to send, where its documentation says it looks."""
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.expanduser("~/.ray/auth_token")
    return bool(os.environ.get("RAY_AUTH_TOKEN")) or os.path.isfile(path)


def started_by_ray_start() -> str:
    """The address ``--address auto`` joins: the Ray that ``ray start`` last began on this
    machine, as Ray's address file names it. Finding no such file, Ray joins whatever Ray
    runs here: another search's own private Ray among them, whose end then took the
    joined search's trials with it (audit 21). ``auto`` itself where this Ray keeps no such
    file (Ray's lookup then decides, as before)."""
    try:
        from ray._private.utils import read_ray_address
    except ImportError:
        return "auto"
    found = read_ray_address()
    if not found:
        raise ClusterError(
            "--address auto joins the Ray that `ray start` began on this machine, and none was (Ray keeps its address "
            "in ray_current_cluster, in its temporary folder, /tmp/ray by default: a Ray started with --temp-dir "
            "keeps it there, out of sight): start one with `ray start --head`, or give the cluster's address "
            "(a search's own Ray, started without --address, is private to it)")
    return found
