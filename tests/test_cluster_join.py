"""Joining a cluster that is not there, or that refuses this process's token, is said at
once and in words (test_cluster.py joins a real one that requires a token)."""

from __future__ import annotations

import socket

import pytest

from conftest import free_port, run_cli, shrunk_example, write_yaml
from hpsearch.search.cluster_join import ClusterError, ensure_joined_cluster_answers, join_error


@pytest.mark.parametrize("command", ["run", "check"])
def test_an_address_where_nothing_answers_is_refused_before_the_preflight(tmp_path, command):
    """Left to Ray, ``ray.init`` retries such an address for about 14 minutes."""
    address = f"127.0.0.1:{free_port()}"  # a free port: nothing listens there
    path = write_yaml(tmp_path / "exp.yaml", shrunk_example(tmp_path / "runs"))
    result = run_cli(command, str(path), "--address", address, cwd=tmp_path, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"error: no Ray cluster answers at {address} (Connection refused)" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert "torch" not in result.stderr and not (tmp_path / "runs").exists()  # no preflight, no study


def test_ray_address_from_the_environment_is_checked_too(monkeypatch):
    """``ray job submit`` gives a job's driver its cluster as ``RAY_ADDRESS``."""
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{free_port()}")
    with pytest.raises(ClusterError, match="no Ray cluster answers at 127.0.0.1:"):
        ensure_joined_cluster_answers(None)


def test_what_is_not_a_ray_address_is_refused_and_an_empty_one_is_none(tmp_path, monkeypatch):
    """``--address nonsense`` passed the check and failed the run with a traceback after the
    preflight; ``--address ""`` (an unset variable) skipped the check's fit test, and the run
    then started a local Ray anyway and failed without naming the field (audit 36)."""
    from hpsearch.search import api
    from hpsearch.search.errors import ConfigError

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for address in ("nonsense", "10.0.0.5", "10.0.0.5:port"):
        with pytest.raises(ClusterError, match=f"'{address}' \\(--address, or RAY_ADDRESS\\) is not a Ray address"):
            ensure_joined_cluster_answers(address)
    monkeypatch.setenv("RAY_ADDRESS", "nonsense")
    with pytest.raises(ClusterError, match="is not a Ray address"):
        ensure_joined_cluster_answers(None)
    monkeypatch.delenv("RAY_ADDRESS")
    assert api.starts_a_local_ray("") and not api.starts_a_local_ray("10.0.0.5:6379")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert api.starts_a_local_ray("local")  # Ray's word for a new Ray here: the fit check runs (audit 38)
    monkeypatch.delenv("RAY_ADDRESS")
    config = shrunk_example(tmp_path / "runs", **{"resources/cpus_per_trial": 64, "search/preflight": False})
    with pytest.raises(ConfigError, match="resources.cpus_per_trial"):
        api.check(write_yaml(tmp_path / "exp.yaml", config), address="")


def test_auto_joins_only_the_ray_that_ray_start_began(tmp_path, monkeypatch):
    """Finding no address file of ``ray start``, Ray's "auto" joined any Ray running on the
    machine: another search's private Ray, whose end took the joined trials with it (audit 21)."""
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # where Ray keeps ray/ray_current_cluster
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    with pytest.raises(ClusterError, match="--address auto joins the Ray that `ray start` began on this machine"):
        ensure_joined_cluster_answers(None)
    (tmp_path / "ray").mkdir()
    address = f"127.0.0.1:{free_port()}"
    (tmp_path / "ray" / "ray_current_cluster").write_text(address)  # one that has since stopped
    with pytest.raises(ClusterError, match=f"no Ray cluster answers at {address}"):
        ensure_joined_cluster_answers("auto")
    with socket.create_server(("127.0.0.1", 0)) as listening:  # and one that is up
        (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{listening.getsockname()[1]}")
        ensure_joined_cluster_answers(None)


def refused_by_the_gcs() -> ConnectionError:
    """How ``ray.init`` (Ray 2.60) fails when the GCS refuses its token: the refusal
    survives only as text in the cause's message, the last try's traceback."""
    try:
        try:
            raise RuntimeError("Failed to connect to GCS. Last connection error: Traceback ...\n"
                               "ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: "
                               "Authentication token is missing or incorrect.")
        except RuntimeError as cause:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.5:6379") from cause
    except ConnectionError as error:
        return error


def test_a_refused_token_says_what_to_set(monkeypatch, tmp_path):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    message = str(join_error("10.0.0.5:6379", refused_by_the_gcs()))
    assert "requires token authentication, and this process sent no token: set RAY_AUTH_MODE=token" in message

    # token mode on, and a token sent: it is the wrong one
    token = tmp_path / "token"
    token.write_text("not the cluster's")
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(token))
    assert "refused this process's token" in str(join_error("10.0.0.5:6379", refused_by_the_gcs()))
    # token mode on, but no token where Ray looks: Ray refuses before connecting
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "absent"))
    from ray.exceptions import AuthenticationError

    message = str(join_error("10.0.0.5:6379", AuthenticationError("Token authentication is enabled but no token")))
    assert "this process sent no token" in message

    other = ConnectionError("Failed to connect to Ray cluster at 10.0.0.5:6379")
    assert str(join_error("10.0.0.5:6379", other)) == (
        "could not join the Ray cluster at 10.0.0.5:6379: Failed to connect to Ray cluster at 10.0.0.5:6379")
