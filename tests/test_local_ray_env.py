"""What a local Ray needs of the environment, settled before it starts (audit 81): Ray's own
failures there were tracebacks from inside its start, or a timeout naming its GCS."""

from __future__ import annotations

import os

import pytest

from hpsearch.search import local_ray_env
from hpsearch.search.errors import HpsearchError
from hpsearch.search.local_ray_env import (SOCKET_PATH_LIMIT, local_ray_variables, longest_socket,
                                           refuse_a_temp_folder_ray_cannot_use)


def test_a_temp_folder_too_deep_for_rays_sockets_is_refused_naming_the_variable_and_the_limit(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    socket = longest_socket()
    fits = "/" + "t" * (SOCKET_PATH_LIMIT - len(socket) - 2)  # its sockets' paths exactly at the limit
    assert len(os.path.join(fits, socket)) == SOCKET_PATH_LIMIT
    monkeypatch.setenv("TMPDIR", fits)
    monkeypatch.setattr(local_ray_env.os, "access", lambda path, mode: True)  # a folder Ray would make
    refuse_a_temp_folder_ray_cannot_use()
    monkeypatch.setenv("TMPDIR", fits + "u")
    with pytest.raises(HpsearchError, match=rf"TMPDIR is {fits}u \(\d+ bytes\): Ray keeps its local sockets below "
                                            rf"it, .* up to {SOCKET_PATH_LIMIT + 1} bytes, past a Unix socket's limit"
                                            rf" of {SOCKET_PATH_LIMIT}; set RAY_TMPDIR"):
        refuse_a_temp_folder_ray_cannot_use()
    monkeypatch.setenv("RAY_TMPDIR", "/tmp")  # which Ray takes first
    refuse_a_temp_folder_ray_cannot_use()


def test_a_temp_folder_this_process_cannot_write_is_refused(monkeypatch):
    import tempfile
    from pathlib import Path

    tmp_path = Path(tempfile.mkdtemp(prefix="h", dir="/tmp"))  # short enough for Ray's sockets below it
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path / "not" / "made" / "yet"))
    refuse_a_temp_folder_ray_cannot_use()  # Ray makes it, inside a folder it can write
    seen = []

    def read_only(path, mode):
        seen.append(str(path))
        return False

    monkeypatch.setattr(local_ray_env.os, "access", read_only)
    with pytest.raises(HpsearchError, match=f"RAY_TMPDIR is {tmp_path}/not/made/yet, which this process cannot "
                                            f"write"):
        refuse_a_temp_folder_ray_cannot_use()
    assert seen == [str(tmp_path)]  # the nearest folder that exists
    tmp_path.rmdir()


def test_the_socket_limit_follows_the_machines_longest_process_id(monkeypatch):
    """With 7-digit pids assumed, folders of 40 and 41 bytes were refused where Ray works
    with them, on a machine whose pids have 5 digits (audit 84)."""
    read = local_ray_env.Path.read_text
    for pid_max, digits in (("32768", 5), ("4194304", 7)):
        monkeypatch.setattr(local_ray_env.Path, "read_text",
                            lambda self, *args, value=pid_max, **kwargs: value + "\n" if str(self).endswith(
                                "pid_max") else read(self, *args, **kwargs))
        assert longest_socket().split("/")[1].endswith("_" + "9" * digits)
        assert len(longest_socket()) == 60 + digits


@pytest.mark.parametrize("setting,kept", [("error", None), ("error::DeprecationWarning", None),
                                          ("ignore::UserWarning,error", "ignore::UserWarning"),
                                          ("e", None), ("err::DeprecationWarning,d", "d"),  # as Python reads them
                                          ("default", "keep"), ("i,once", "keep")])
def test_rays_processes_start_without_pythonwarnings_error_filters(monkeypatch, setting, kept):
    """Ray's dashboard agent raised its own deprecation warning, and the start timed out
    naming an overloaded GCS."""
    monkeypatch.setenv("PYTHONWARNINGS", setting)
    monkeypatch.setenv("RAY_AUTH_TOKEN", "given")
    variables = local_ray_variables()
    if kept == "keep":
        assert "PYTHONWARNINGS" not in variables
    else:
        assert variables == {"PYTHONWARNINGS": kept}


def test_a_local_ray_that_cannot_save_its_token_in_a_read_only_home_gets_one_of_its_own(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert local_ray_variables() == {}  # Ray saves its token in ~/.ray itself
    monkeypatch.setattr(local_ray_env.os, "access", lambda path, mode: str(path) != str(tmp_path))
    token = local_ray_variables()["RAY_AUTH_TOKEN"]
    assert len(token) == 64 and token != local_ray_variables()["RAY_AUTH_TOKEN"]
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("saved before")
    assert local_ray_variables() == {}  # the saved one
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    (tmp_path / ".ray" / "auth_token").unlink()
    assert local_ray_variables() == {}


def test_a_path_the_locale_cannot_encode_is_refused_before_ray_starts(monkeypatch):
    """LC_ALL=C without Python's UTF-8 mode, run from a folder named with an é: Ray's start
    failed in a traceback, "surrogates not allowed"."""
    from hpsearch.search.local_ray_env import refuse_paths_ray_cannot_encode

    monkeypatch.setattr(local_ray_env.sys, "getfilesystemencoding", lambda: "ascii")
    refuse_paths_ray_cannot_encode(["/work/plain", "/work/user code"])
    with pytest.raises(HpsearchError, match=r"^/work/projet é has characters this process's locale \(ascii\) "
                                            r"cannot encode, .* PYTHONUTF8=1"):
        refuse_paths_ray_cannot_encode(["/work/plain", "/work/projet \udcc3\udca9"])  # é's bytes, as ascii decodes them


def test_check_refuses_a_folder_the_locale_cannot_encode_as_run_does(tmp_path, monkeypatch):
    """check said ok in a folder run then refused (audit 84)."""
    import hpsearch
    from conftest import shrunk_example

    folder = tmp_path / "café"
    folder.mkdir()
    monkeypatch.chdir(folder)
    monkeypatch.setattr(local_ray_env.sys, "getfilesystemencoding", lambda: "ascii")
    with pytest.raises(HpsearchError, match="café has characters this process's locale \\(ascii\\) cannot encode"):
        hpsearch.check(shrunk_example(tmp_path / "runs"))


def test_the_token_a_local_ray_was_given_leaves_the_environment_with_it(monkeypatch):
    """Left in the environment, it went to a cluster joined later in the session, which
    refused it as this process's token (audit 84); a token of the user's own stays."""
    from hpsearch.search.tuner import _StartedRay

    started = _StartedRay()
    monkeypatch.setenv("RAY_AUTH_TOKEN", "the users own")
    started.drop_own_token()
    assert local_ray_env.os.environ["RAY_AUTH_TOKEN"] == "the users own"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "given")
    started.own_token = "given"
    started.drop_own_token()
    assert "RAY_AUTH_TOKEN" not in local_ray_env.os.environ and started.own_token is None
