"""Studies whose home is a cloud URI, against a real S3-compatible server (moto's server
mode on loopback): nothing here mocks hpsearch's own code."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import run_cli
from test_fault_tolerance import experiment, stop_slowing_epochs, wait_for, wait_until_quiet

BUCKET = "hpsearch-test"


@pytest.fixture(scope="module")
def s3_server():
    """A moto S3 server on a free port; yields the environment a client needs."""
    pytest.importorskip("moto")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_EC2_METADATA_DISABLED": "true"}
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.2)
        client(env).create_bucket(Bucket=BUCKET)
        yield env
    finally:
        server.terminate()
        server.wait(timeout=10)


def client(env: dict):
    import boto3

    return boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name=env["AWS_DEFAULT_REGION"])


def keys(env: dict, prefix: str) -> set[str]:
    """Object keys under ``prefix``, less pyarrow's empty directory markers (``dir/``)."""
    pages = client(env).get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return {item["Key"] for page in pages for item in page.get("Contents", []) if not item["Key"].endswith("/")}


def read_object(env: dict, key: str) -> bytes:
    return client(env).get_object(Bucket=BUCKET, Key=key)["Body"].read()


def test_mirror_pushes_changes_deletes_rotated_files_and_pulls_into_a_fresh_copy(s3_server, tmp_path, monkeypatch):
    from hpsearch.search.storage import Mirror

    for name, value in s3_server.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HPSEARCH_CACHE", str(tmp_path / "node-a"))
    uri = f"s3://{BUCKET}/unit/study"
    first = Mirror.for_uri(uri)
    checkpoints = first.local / "trials" / "trial_0000" / "checkpoints"
    checkpoints.mkdir(parents=True)
    (checkpoints / "epoch-0000.ckpt").write_bytes(b"a" * 1000)
    (checkpoints / "epoch-0001.ckpt").write_bytes(b"b" * 2000)
    (checkpoints.parent / "crash.txt").write_bytes(b"")  # the crash account while the trial lives
    assert first.push("trials/trial_0000") == 2  # the empty file is not uploaded
    assert first.push("trials/trial_0000") == 0  # nothing changed: nothing sent
    (checkpoints / "epoch-0000.ckpt").unlink()  # rotated away
    (checkpoints / "epoch-0002.ckpt").write_bytes(b"c" * 3000)
    assert first.push("trials/trial_0000") == 1
    assert keys(s3_server, "unit/study/") == {"unit/study/trials/trial_0000/checkpoints/epoch-0001.ckpt",
                                              "unit/study/trials/trial_0000/checkpoints/epoch-0002.ckpt"}

    monkeypatch.setenv("HPSEARCH_CACHE", str(tmp_path / "node-b"))  # another machine
    second = Mirror.for_uri(uri)
    assert second.local != first.local
    assert second.pull("trials/trial_0000") == 2
    assert (second.local / "trials/trial_0000/checkpoints/epoch-0002.ckpt").read_bytes() == b"c" * 3000
    (second.local / "trials/trial_0000/checkpoints/epoch-0002.ckpt").write_bytes(b"newer, not pushed yet")
    assert second.pull("trials/trial_0000") == 0  # a file written here after the upload is kept
    assert second.pull("trials/trial_9999") == 0  # absent remotely: nothing, no error

    # A third process (the driver) deletes an ended trial's epoch checkpoints it never held.
    (checkpoints / "best.ckpt").write_bytes(b"best")
    first.push("trials/trial_0000")
    driver = Mirror.for_uri(uri)
    assert driver.delete_matching("trials/trial_0000/checkpoints", "epoch-*.ckpt") == 2
    assert keys(s3_server, "unit/study/") == {"unit/study/trials/trial_0000/checkpoints/best.ckpt"}
    assert driver.delete_matching("trials/trial_9999/checkpoints", "epoch-*.ckpt") == 0  # none there: no error
    # a sharded (DeepSpeed) checkpoint is a folder of files: it goes whole
    shards = checkpoints / "epoch-0003.ckpt" / "checkpoint"
    shards.mkdir(parents=True)
    (shards / "mp_rank_00_model_states.pt").write_bytes(b"rank 0")
    first.push("trials/trial_0000")
    assert driver.delete_matching("trials/trial_0000/checkpoints", "epoch-*.ckpt") == 1
    assert keys(s3_server, "unit/study/") == {"unit/study/trials/trial_0000/checkpoints/best.ckpt"}


def test_a_working_copy_given_by_its_path_stands_for_its_study_in_storage(s3_server, tmp_path, monkeypatch):
    """hpsearch printed the working copy's path in its resume commands, and resuming that
    ran the study's trials but pushed nothing to storage (audit 30)."""
    from hpsearch.search.errors import resume_command
    from hpsearch.search.storage import StudyHome

    for name, value in s3_server.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HPSEARCH_CACHE", str(tmp_path / "cache"))
    home = StudyHome.new(f"s3://{BUCKET}/copies", "study")
    exp = home.create()
    (exp.root / "experiment.yaml").write_text("name: study\n")
    home.mirror.push_study_files()
    uri = f"s3://{BUCKET}/copies/study"
    assert resume_command(exp.root) == f"hpsearch resume {uri}"
    (exp.root / "experiment.yaml").unlink()  # the copy lags behind the study
    again, mirror = StudyHome.existing(str(exp.root))
    assert mirror is not None and mirror.uri == uri and again.root == exp.root
    assert (again.root / "experiment.yaml").read_text() == "name: study\n"  # pulled from the study
    assert keys(s3_server, "copies/study/") == {"copies/study/experiment.yaml"}  # the marker stays local
    plain = tmp_path / "local-study"
    plain.mkdir()
    assert resume_command(plain) == f"hpsearch resume {plain}"

    StudyHome.new(f"s3://{BUCKET}/copies", "checked")  # as `check` does: chooses the place, makes nothing there
    listed = client(s3_server).list_objects_v2(Bucket=BUCKET, Prefix="copies/checked")
    assert [item["Key"] for item in listed.get("Contents", [])] == [], listed


def test_a_command_on_the_machine_a_search_runs_on_never_replaces_the_files_it_writes(s3_server, tmp_path,
                                                                                     monkeypatch):
    """``status`` or ``tensorboard`` given the study (or its working copy, as README's live
    TensorBoard on the head is) pulled the study's files into the working copy the search
    writes in: each upload is newer than its local write, so the pull replaced the files,
    and the search's later TensorBoard events went to a deleted file, and its journal's
    appends could be lost (audit 64). Files only storage has (another node's trial) come."""
    import os
    import time

    from hpsearch.search.storage import StudyHome
    from hpsearch.search.study_lock import study_lock

    for name, value in s3_server.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HPSEARCH_CACHE", str(tmp_path / "cache"))
    home = StudyHome.new(f"s3://{BUCKET}/live", "study")
    exp = home.create()
    (exp.root / "experiment.yaml").write_text("name: study\n")
    written = [exp.root / "optuna.journal", exp.root / "tensorboard" / "study" / "events.out.tfevents.1"]
    for path in written:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("appended to by the search\n")
    home.mirror.push_study_files()
    home.mirror.push("tensorboard")
    for path in written:  # written before their upload, as the search's files are
        os.utime(path, (time.time() - 60, time.time() - 60))
    client(s3_server).put_object(Bucket=BUCKET, Key="live/study/tensorboard/trial_0001/events.out.tfevents.2",
                                 Body=b"another node's trial")
    files = [*written, exp.root / "experiment.yaml"]
    with study_lock(exp):
        open_files = [path.stat().st_ino for path in files]
        StudyHome.existing(f"s3://{BUCKET}/live/study", "tensorboard")
        StudyHome.existing(str(exp.root), "tensorboard")
        assert [path.stat().st_ino for path in files] == open_files
        assert (exp.root / "tensorboard/trial_0001/events.out.tfevents.2").read_bytes() == b"another node's trial"
    StudyHome.existing(str(exp.root), "tensorboard")  # no search: the copy is brought up to date
    assert written[0].stat().st_ino != open_files[0]


def test_a_gcs_storage_that_cannot_be_reached_is_an_error_not_a_hang(tmp_path):
    """Without the network, `check` of a gs:// storage hung silently in GCS's retries, which
    have no limit of their own (audit 36: killed at 540 s). With the limit at 2 s the probe
    ends: an error naming the storage (or, where GCS answers, an answer)."""
    from hpsearch.search.storage import _with_retry_limit

    assert _with_retry_limit("gs://b/x") == "gs://b/x?retry_limit_seconds=60"
    assert _with_retry_limit("gs://b/x?endpoint_override=h") == "gs://b/x?endpoint_override=h&retry_limit_seconds=60"
    assert _with_retry_limit("gs://b/x?retry_limit_seconds=5") == "gs://b/x?retry_limit_seconds=5"
    assert _with_retry_limit("s3://b/x") == "s3://b/x"
    code = ("from hpsearch.search import storage\n"
            "storage.GCS_RETRY_LIMIT_S = 2\n"
            "try:\n    print('exists', storage.Mirror('gs://hpsearch-no-such-bucket/x', storage.Path('.')).exists())\n"
            "except storage.StorageError as exc:\n    print('error', exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.stdout.startswith(("error cannot read storage 'gs://hpsearch-no-such-bucket/x'", "exists")), \
        done.stdout + done.stderr


def test_a_bad_storage_uri_is_refused_before_ray_starts(s3_server, tmp_path, example_config):
    config = {**example_config, "storage": f"s3://no-such-bucket-{os.getpid()}/exps"}
    (tmp_path / "exp.yaml").write_text(yaml.safe_dump(config))
    result = run_cli("run", "exp.yaml", cwd=tmp_path, timeout=120, env={**s3_server, "HPSEARCH_CACHE": str(tmp_path)})
    assert "cannot write to storage" in result.stderr and "no-such-bucket" in result.stderr
    # A mistake in the config like any other: exit 2, naming the field and its line.
    assert result.returncode == 2 and "- storage (exp.yaml, line " in result.stderr, result.stderr
    assert "Ray" not in result.stderr  # refused before Ray started


@pytest.mark.e2e
@pytest.mark.slow
def test_a_study_in_s3_survives_its_machine_and_resumes_from_a_fresh_process(s3_server, tmp_path):
    """SIGKILL the driver mid-trial, delete its local working copy (the cluster is gone),
    resume from the URI in a fresh process with an empty cache: nothing is lost and the
    interrupted trial continues from the checkpoint it had uploaded."""
    path = experiment(tmp_path, "cloud", epoch_sleep=1.5)
    config = yaml.safe_load(path.read_text())
    config["storage"] = f"s3://{BUCKET}/exps"
    config["search"]["num_trials"] = 4
    path.write_text(yaml.safe_dump(config))
    uri, prefix = f"s3://{BUCKET}/exps/cloud", "exps/cloud/"
    cache_a, cache_b = tmp_path / "machine-a", tmp_path / "machine-b"
    local_a = None

    env = {**os.environ, **s3_server, "PYTHONUNBUFFERED": "1", "HPSEARCH_CACHE": str(cache_a)}
    driver = subprocess.Popen([sys.executable, "-m", "hpsearch.search.cli", "run", path.name], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    def a_trial_is_mid_way_in_storage() -> bool:
        stored = keys(s3_server, prefix)
        done = "exps/cloud/trials.csv" in stored and any(
            r["state"] == "COMPLETE" for r in csv.DictReader(io.StringIO(read_object(s3_server, prefix + "trials.csv")
                                                                          .decode())))
        return done and any(k.endswith("epoch-0000.ckpt") for k in stored)

    wait_for(a_trial_is_mid_way_in_storage, what="a finished trial and an uploaded checkpoint")
    local_a = next(cache_a.rglob("experiment.yaml")).parent
    driver.send_signal(signal.SIGKILL)
    driver.communicate(timeout=60)
    wait_until_quiet(local_a)
    shutil.rmtree(cache_a)  # the machine and its disk are gone; only the bucket remains
    stop_slowing_epochs(tmp_path)

    result = run_cli("resume", uri, cwd=tmp_path, timeout=400, env={**s3_server, "HPSEARCH_CACHE": str(cache_b)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"experiment: {uri}  (" in result.stdout, result.stdout  # the study, not its working copy

    table = list(csv.DictReader(io.StringIO(read_object(s3_server, prefix + "trials.csv").decode())))
    assert [r["state"] for r in table] == ["COMPLETE"] * 4, table
    assert any(r["resumed"] == "True" for r in table), table  # continued from a checkpoint pulled from S3
    stored = keys(s3_server, prefix)
    assert not [k for k in stored if k.endswith(".ckpt") and "/epoch-" in k], stored  # ended: only best.ckpt
    for number in range(4):
        assert f"{prefix}trials/trial_{number:04d}/checkpoints/best.ckpt" in stored
        assert any(k.startswith(f"{prefix}tensorboard/trial_{number:04d}") for k in stored)
    best = json.loads(read_object(s3_server, prefix + "best.json"))
    assert best["checkpoint_uri"].startswith(uri) and best["test_metrics"]
    sessions = json.loads(read_object(s3_server, prefix + "sessions.json"))
    # The killed session never ended itself; the resumed one closed it, in storage too.
    assert [s["outcome"] for s in sessions] == ["killed", "complete"]
    assert sessions[0]["seconds"] is not None

    status = run_cli("status", uri, cwd=tmp_path, timeout=60,
                     env={**s3_server, "HPSEARCH_CACHE": str(tmp_path / "laptop")})
    assert status.returncode == 0 and status.stdout.count("COMPLETE") >= 4, status.stdout + status.stderr
    # one trial in full from the URI: its folder in storage, loadable from there; its checkpoints not fetched
    resumed = next(int(r["trial"]) for r in table if r["resumed"] == "True")
    shown = run_cli("status", uri, "--trial", str(resumed), cwd=tmp_path, timeout=60,
                    env={**s3_server, "HPSEARCH_CACHE": str(tmp_path / "laptop")})
    assert shown.returncode == 0 and f"folder      {uri}/trials/trial_{resumed:04d} (" in shown.stdout, \
        shown.stdout + shown.stderr
    assert "experiment.json" in shown.stdout and "resumed from a checkpoint" in shown.stdout, shown.stdout
    assert f"hpsearch.load_trial({uri!r}, {resumed})" in shown.stdout, shown.stdout
    assert not list((tmp_path / "laptop").rglob("*.ckpt"))
    assert not Path(cache_a).exists()


def test_a_ctrl_c_as_a_study_in_storage_is_made_leaves_it_there_to_resume(s3_server, tmp_path, monkeypatch,
                                                                          example_config):
    """The resume command a Ctrl+C printed once the study was made named the study in
    storage, where nothing had been pushed yet: "holds no hpsearch study" (audit 57)."""
    from contextlib import nullcontext

    import hpsearch
    from hpsearch.search import api, tuner
    from hpsearch.search.errors import Interrupted

    real_write_config = api.write_config

    def written_then_interrupted(exp, config):
        real_write_config(exp, config)
        raise KeyboardInterrupt

    for name, value in s3_server.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HPSEARCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(api, "prepare", lambda config, preflight=None, new_study=False: None)
    monkeypatch.setattr(api, "_plan", lambda config, local: 1)
    monkeypatch.setattr(tuner, "ray_for_search", lambda config, address, verbose: nullcontext(tuner.SearchRay(False)))
    monkeypatch.setattr(api, "write_config", written_then_interrupted)
    example_config["storage"] = f"s3://{BUCKET}/interrupted"
    try:
        with pytest.raises(Interrupted) as caught:
            hpsearch.run(example_config)
    except KeyboardInterrupt:
        pytest.fail("the Ctrl+C passed out of run as it was, not as Interrupted")
    uri = f"s3://{BUCKET}/interrupted/{example_config['name']}"
    assert str(caught.value).endswith(f"hpsearch resume {uri}"), str(caught.value)
    assert f"interrupted/{example_config['name']}/experiment.yaml" in keys(s3_server, "interrupted/")


@pytest.mark.e2e
def test_load_trial_of_a_study_in_storage_names_the_study_and_checkpoint_there(s3_server, tmp_path, monkeypatch,
                                                                                finished_search):
    """Its errors named the working copy it pulled into, a folder the user never made."""
    from hpsearch import HpsearchError, load_trial

    exp_dir, _, _ = finished_search
    for path in exp_dir.rglob("*"):
        if path.is_file() and not path.name.endswith(".ckpt"):
            client(s3_server).upload_file(str(path), BUCKET, f"loaded/{exp_dir.name}/{path.relative_to(exp_dir)}")
    for name, value in s3_server.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HPSEARCH_CACHE", str(tmp_path / "cache"))
    uri = f"s3://{BUCKET}/loaded/{exp_dir.name}"
    with pytest.raises(HpsearchError, match=rf"^{uri} has no trial 99 \(its trials: 0-5\)"):
        load_trial(uri, trial=99)
    best = json.loads((exp_dir / "best.json").read_text())["trial"]
    with pytest.raises(HpsearchError, match=rf"has no best.ckpt any more.*: {uri}/trials/trial_{best:04d}/checkpoints/"
                                            r"best.ckpt$"):
        load_trial(uri, trial=best)  # its checkpoint was not uploaded
